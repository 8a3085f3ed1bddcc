#include "cluster/fault_proxy.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace capstan::testing::cluster {
namespace {

constexpr int kPollMs = 100;
constexpr size_t kChunk = 64 * 1024;
// At most this much read and waiting out a delay, per direction.
constexpr size_t kMaxPending = 64 << 20;

// The inode of the socket whose local end is 127.0.0.1:`local_port` and
// remote end 127.0.0.1:`remote_port`, from /proc/net/tcp, or from
// /proc/net/tcp6 for a dual-stack socket (gRPC's) with the IPv4-mapped
// addresses; 0 if none.
uint64_t SocketInode(int local_port, int remote_port) {
  struct Table {
    const char* path;
    const char* address;
  };
  for (const Table& t : {Table{"/proc/net/tcp", "0100007F"},
                         Table{"/proc/net/tcp6", "0000000000000000FFFF00000100007F"}}) {
    std::ifstream in(t.path);
    const std::string local = absl::StrFormat("%s:%04X", t.address, local_port);
    const std::string remote = absl::StrFormat("%s:%04X", t.address, remote_port);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
      if (f.size() < 10 || f[1] != local || f[2] != remote) continue;
      uint64_t inode = 0;
      return absl::SimpleAtoi(f[9], &inode) ? inode : 0;
    }
  }
  return 0;
}

// The process holding socket `inode` among every process, or -1.
pid_t OwnerOf(uint64_t inode) {
  const std::string want = absl::StrCat("socket:[", inode, "]");
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return -1;
  pid_t found = -1;
  while (dirent* e = readdir(proc)) {
    int pid = 0;
    if (!absl::SimpleAtoi(e->d_name, &pid)) continue;
    const std::string fd_dir = absl::StrCat("/proc/", pid, "/fd");
    DIR* fds = opendir(fd_dir.c_str());
    if (fds == nullptr) continue;
    char target[64];
    while (dirent* f = readdir(fds)) {
      if (f->d_name[0] == '.') continue;
      const std::string link = absl::StrCat(fd_dir, "/", f->d_name);
      const ssize_t n = readlink(link.c_str(), target, sizeof(target) - 1);
      if (n > 0 && want.compare(0, want.size(), target, n) == 0 &&
          static_cast<size_t>(n) == want.size()) {
        found = pid;
        break;
      }
    }
    closedir(fds);
    if (found > 0) break;
  }
  closedir(proc);
  return found;
}

std::vector<std::string> CommandLine(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/cmdline"), std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return absl::StrSplit(ss.str(), '\0', absl::SkipEmpty());
}

int LocalPort(int fd, bool peer) {
  sockaddr_in a{};
  socklen_t len = sizeof(a);
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  return rc == 0 ? ntohs(a.sin_port) : 0;
}

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

struct FaultProxy::Listener {
  int member = 0;
  int fd = -1;
  int port = 0;
  std::atomic<int> target_port{0};
};

FaultProxy::FaultProxy() = default;

FaultProxy::~FaultProxy() {
  stop_ = true;
  std::vector<std::thread> threads;
  {
    util::MutexLock l(&mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
  std::list<std::unique_ptr<Connection>> connections;
  {
    util::MutexLock l(&mu_);
    connections.swap(connections_);
  }
  for (auto& c : connections) c->thread.join();
  util::MutexLock l(&mu_);
  for (auto& listener : listeners_) {
    if (listener && listener->fd >= 0) close(listener->fd);
  }
}

void FaultProxy::Grow(size_t n) {
  if (data_dirs_.size() >= n) return;
  data_dirs_.resize(n);
  for (auto& row : held_) row.resize(n, false);
  held_.resize(n, std::vector<bool>(n, false));
  delay_ms_.resize(n, 0);
  listeners_.resize(n);
}

absl::StatusOr<int> FaultProxy::Front(int i, const std::string& data_dir, int target_port) {
  util::MutexLock l(&mu_);
  if (i < 0) return absl::InvalidArgumentError(absl::StrCat("no member ", i));
  Grow(static_cast<size_t>(i) + 1);
  data_dirs_[i] = data_dir;
  if (listeners_[i]) {
    listeners_[i]->target_port = target_port;
    return listeners_[i]->port;
  }
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;  // the kernel's choice; held for the proxy's lifetime
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(fd, 128) != 0) {
    const int err = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("bind/listen: ", std::strerror(err)));
  }
  auto listener = std::make_unique<Listener>();
  listener->member = i;
  listener->fd = fd;
  listener->port = LocalPort(fd, /*peer=*/false);
  listener->target_port = target_port;
  Listener* raw = listener.get();
  listeners_[i] = std::move(listener);
  threads_.emplace_back([this, raw] { AcceptLoop(raw); });
  return raw->port;
}

void FaultProxy::AcceptLoop(Listener* l) {
  while (!stop_) {
    pollfd p{l->fd, POLLIN, 0};
    if (poll(&p, 1, kPollMs) <= 0) continue;
    const int c = accept4(l->fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    const int target = l->target_port;
    util::MutexLock lock(&mu_);
    if (stop_) {
      close(c);
      return;
    }
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->done) {
        (*it)->thread.join();
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    auto conn = std::make_unique<Connection>();
    Connection* raw = conn.get();
    raw->thread = std::thread([this, c, to = l->member, target, raw] {
      Serve(c, to, target);
      raw->done = true;
    });
    connections_.push_back(std::move(conn));
  }
}

int FaultProxy::Attribute(int client_fd, int listen_port) {
  const int eph = LocalPort(client_fd, /*peer=*/true);
  const uint64_t inode = SocketInode(eph, listen_port);
  if (inode == 0) return -1;
  const pid_t pid = OwnerOf(inode);
  if (pid <= 0) return -1;
  const std::vector<std::string> argv = CommandLine(pid);
  util::MutexLock l(&mu_);
  for (size_t a = 0; a + 1 < argv.size(); ++a) {
    if (argv[a] != "--data-dir") continue;
    for (size_t i = 0; i < data_dirs_.size(); ++i) {
      if (argv[a + 1] == data_dirs_[i]) return static_cast<int>(i);
    }
  }
  for (const std::string& arg : argv) {
    for (size_t i = 0; i < data_dirs_.size(); ++i) {
      if (arg == "--data-dir=" + data_dirs_[i]) return static_cast<int>(i);
    }
  }
  return -1;
}

void FaultProxy::Serve(int client_fd, int to, int target_port) {
  int listen_port = 0;
  {
    util::MutexLock l(&mu_);
    listen_port = listeners_[to]->port;
  }
  const int from = Attribute(client_fd, listen_port);
  {
    util::MutexLock l(&mu_);
    ++stats_.connections;
    if (from < 0) ++stats_.unattributed;
  }
  const int up = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(target_port));
  if (up < 0 || connect(up, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    if (up >= 0) close(up);
    close(client_fd);  // as a refused connection looks to the dialer
    return;
  }
  const int one = 1;
  setsockopt(up, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(client_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::thread back([this, up, client_fd, from, to] { Pump(up, client_fd, to, from); });
  Pump(client_fd, up, from, to);
  back.join();
  close(up);
  close(client_fd);
}

bool FaultProxy::Held(int from, int to) const {
  if (from < 0 || to < 0) return false;
  return held_[from][to];
}

std::chrono::milliseconds FaultProxy::DelayOf(int from, int to) const {
  int ms = 0;
  if (from >= 0) ms = std::max(ms, delay_ms_[from]);
  if (to >= 0) ms = std::max(ms, delay_ms_[to]);
  return std::chrono::milliseconds(from < 0 || to < 0 ? 0 : ms);
}

void FaultProxy::Pump(int src, int dst, int from, int to) {
  // What was read and waits out its delay, in order; an empty chunk is the
  // end of the stream (`reset`: a reset), passed on when its time comes.
  struct Pending {
    std::chrono::steady_clock::time_point due;
    std::vector<char> data;
    bool reset = false;
  };
  std::deque<Pending> pending;
  size_t pending_bytes = 0;
  std::vector<char> buf(kChunk);  // each read's bytes are copied out at their size
  bool ended = false;  // the end of the stream was read
  const auto close_both = [&] {
    shutdown(src, SHUT_RDWR);
    shutdown(dst, SHUT_RDWR);
  };
  while (!stop_) {
    // Nothing moves while the link is held.
    std::chrono::milliseconds delay{0};
    {
      util::MutexLock l(&mu_);
      while (!stop_ && Held(from, to)) {
        mu_.AwaitWithTimeout(absl::Condition(
                                 +[](std::atomic<bool>* s) { return s->load(); }, &stop_),
                             absl::Milliseconds(20));
      }
      delay = DelayOf(from, to);
    }
    if (stop_) break;
    // Pass on what is due.
    auto now = std::chrono::steady_clock::now();
    while (!pending.empty() && pending.front().due <= now) {
      Pending& p = pending.front();
      if (p.data.empty()) {
        if (p.reset) {
          close_both();
        } else {
          shutdown(dst, SHUT_WR);
        }
        return;
      }
      if (!WriteAll(dst, p.data.data(), p.data.size())) {
        close_both();
        return;
      }
      pending_bytes -= p.data.size();
      pending.pop_front();
      now = std::chrono::steady_clock::now();
    }
    // Read on while less than kMaxPending waits, until the next is due.
    int timeout_ms = kPollMs;
    if (!pending.empty()) {
      const auto wait = std::chrono::ceil<std::chrono::milliseconds>(pending.front().due - now);
      timeout_ms = std::min<int>(timeout_ms, static_cast<int>(wait.count()));
    }
    const bool can_read = !ended && pending_bytes < kMaxPending;
    if (!can_read) {
      if (timeout_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
      continue;
    }
    pollfd p{src, POLLIN, 0};
    const int pr = poll(&p, 1, timeout_ms);
    if (pr == 0) continue;
    if (pr < 0 && errno == EINTR) continue;
    const ssize_t n = pr < 0 ? -1 : recv(src, buf.data(), buf.size(), 0);
    if (n < 0 && errno == EINTR) continue;
    const auto read_at = std::chrono::steady_clock::now();
    if (n <= 0) {
      ended = true;
      pending.push_back(Pending{read_at + delay, {}, n < 0});
      continue;
    }
    {
      util::MutexLock l(&mu_);
      stats_.bytes += n;
    }
    pending_bytes += static_cast<size_t>(n);
    pending.push_back(Pending{read_at + delay, std::vector<char>(buf.data(), buf.data() + n), false});
  }
  close_both();
}

void FaultProxy::Hold(int from, int to, bool held) {
  util::MutexLock l(&mu_);
  Grow(static_cast<size_t>(std::max(from, to)) + 1);
  held_[from][to] = held;
}

void FaultProxy::Partition(const std::vector<int>& side) {
  util::MutexLock l(&mu_);
  const int n = static_cast<int>(held_.size());
  std::vector<bool> in(n, false);
  for (int i : side) in[i] = true;
  for (int a = 0; a < n; ++a) {
    for (int b = 0; b < n; ++b) held_[a][b] = in[a] != in[b];
  }
}

void FaultProxy::Delay(int i, std::chrono::milliseconds delay) {
  util::MutexLock l(&mu_);
  Grow(static_cast<size_t>(i) + 1);
  delay_ms_[i] = static_cast<int>(delay.count());
}

void FaultProxy::HealAll() {
  util::MutexLock l(&mu_);
  for (auto& row : held_) row.assign(row.size(), false);
  delay_ms_.assign(delay_ms_.size(), 0);
}

FaultProxy::Stats FaultProxy::stats() const {
  util::MutexLock l(&mu_);
  return stats_;
}

}  // namespace capstan::testing::cluster
