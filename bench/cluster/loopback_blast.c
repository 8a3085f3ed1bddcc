// loopback_blast: moves bytes over loopback TCP with no server involved, as
// a follower answering big lists moves them to a list client, so that the
// cost of the transfer itself to a cluster on the same machine can be told
// apart from the server's (bench/cluster/loopback.sh).
//
//   loopback_blast MIB STREAMS RECEIVER_NICE SENDER_NICE [PORT]
//
// STREAMS sender threads (at SENDER_NICE) each write MIB MiB to a receiver
// process of its own (at RECEIVER_NICE) that reads and discards them, or,
// with RECV_ALLOC set in the environment, reads them into one fresh buffer
// of MIB MiB, as a client that keeps a whole response does.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int port;
static long mib;

static struct sockaddr_in Loopback(void) {
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((unsigned short)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

static void* Send(void* unused) {
  (void)unused;
  int s = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a = Loopback();
  while (connect(s, (struct sockaddr*)&a, sizeof a) != 0) usleep(1000);
  static char buf[1 << 20];
  for (long left = mib << 20; left > 0;) {
    ssize_t n = write(s, buf, left < (1 << 20) ? (size_t)left : sizeof buf);
    if (n <= 0) break;
    left -= n;
  }
  close(s);
  return NULL;
}

static void Receive(int s) {
  if (getenv("RECV_ALLOC") != NULL) {
    const long size = mib << 20;
    char* b = malloc((size_t)size);
    long off = 0;
    ssize_t n;
    while (off < size && (n = read(s, b + off, (size - off) < (1 << 20) ? (size_t)(size - off)
                                                                        : (size_t)(1 << 20))) > 0) {
      off += n;
    }
    free(b);
  } else {
    static char b[1 << 20];
    while (read(s, b, sizeof b) > 0) {
    }
  }
}

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: loopback_blast MIB STREAMS RECEIVER_NICE SENDER_NICE [PORT]\n");
    return 2;
  }
  mib = atol(argv[1]);
  const int streams = atoi(argv[2]);
  const int receiver_nice = atoi(argv[3]);
  port = argc > 5 ? atoi(argv[5]) : 25999;
  int l = socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = Loopback();
  if (bind(l, (struct sockaddr*)&a, sizeof a) != 0 || listen(l, 64) != 0) {
    perror("loopback_blast: bind");
    return 1;
  }
  if (fork() == 0) {
    setpriority(PRIO_PROCESS, 0, receiver_nice);
    for (int i = 0; i < streams; ++i) {
      int s = accept(l, NULL, NULL);
      if (fork() == 0) {
        Receive(s);
        _exit(0);
      }
      close(s);
    }
    while (wait(NULL) > 0) {
    }
    _exit(0);
  }
  // Linux: the nice value is per thread; the senders inherit it.
  setpriority(PRIO_PROCESS, 0, atoi(argv[4]));
  pthread_t t[64];
  for (int i = 0; i < streams && i < 64; ++i) pthread_create(&t[i], NULL, Send, NULL);
  for (int i = 0; i < streams && i < 64; ++i) pthread_join(t[i], NULL);
  while (wait(NULL) > 0) {
  }
  return 0;
}
