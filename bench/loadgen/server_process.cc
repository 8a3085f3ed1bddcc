#include "bench/loadgen/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <filesystem>
#include <fstream>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "etcdserverpb/rpc.grpc.pb.h"

namespace capstan::bench {

namespace {

// Pids of running servers, for the signal handler (async-signal-safe access).
constexpr int kMaxServers = 16;
std::array<std::atomic<pid_t>, kMaxServers> g_servers{};

void Register(pid_t pid) {
  for (auto& slot : g_servers) {
    pid_t expected = 0;
    if (slot.compare_exchange_strong(expected, pid)) return;
  }
}

void Unregister(pid_t pid) {
  for (auto& slot : g_servers) {
    pid_t expected = pid;
    slot.compare_exchange_strong(expected, 0);
  }
}

void KillServersAndExit(int sig) {
  for (auto& slot : g_servers) {
    const pid_t pid = slot.load();
    if (pid > 0) kill(pid, SIGKILL);
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

bool Exited(pid_t pid, int* status) { return waitpid(pid, status, WNOHANG) == pid; }

}  // namespace

const char* ServerName(ServerKind kind) {
  return kind == ServerKind::kCapstan ? "capstan" : "etcd";
}

void InstallServerCleanup() {
  struct sigaction sa = {};
  sa.sa_handler = KillServersAndExit;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

std::string Tail(const std::string& path, int lines) {
  std::ifstream in(path);
  std::deque<std::string> last;
  std::string line;
  while (std::getline(in, line)) {
    last.push_back(line);
    if (static_cast<int>(last.size()) > lines) last.pop_front();
  }
  return absl::StrJoin(last, "\n");
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(const ServerOptions& options,
                                                                    absl::Duration ready_timeout) {
  if (access(options.binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat(ServerName(options.kind), " binary not found or not executable: ",
                                            options.binary));
  }
  auto server = std::unique_ptr<ServerProcess>(new ServerProcess());
  server->options_ = options;
  std::string tmpl = absl::StrCat("/tmp/capstan-bench-", ServerName(options.kind), "-XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) return absl::InternalError("mkdtemp failed");
  server->work_dir_ = tmpl;
  const std::string data_dir = tmpl + "/data";
  const std::string log_path = tmpl + "/server.log";
  const int client_port = FreeLoopbackPort(), peer_port = FreeLoopbackPort(),
            metrics_port = FreeLoopbackPort();
  const std::string client_url = absl::StrCat("http://127.0.0.1:", client_port);
  const std::string peer_url = absl::StrCat("http://127.0.0.1:", peer_port);
  server->endpoint_ = absl::StrCat("127.0.0.1:", client_port);

  // The same flags for both: etcd's single-member defaults on private ports.
  std::vector<std::string> args = {
      options.binary,
      "--name=bench",
      "--data-dir=" + data_dir,
      "--listen-client-urls=" + client_url,
      "--advertise-client-urls=" + client_url,
      "--listen-peer-urls=" + peer_url,
      "--initial-advertise-peer-urls=" + peer_url,
      "--initial-cluster=bench=" + peer_url,
      absl::StrCat("--listen-metrics-urls=http://127.0.0.1:", metrics_port),
  };
  args.insert(args.end(), options.extra_flags.begin(), options.extra_flags.end());
  server->command_ = absl::StrJoin(args, " ");

  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  server->pid_ = pid;
  Register(pid);

  // Ready when a linearizable Range succeeds.
  auto channel = grpc::CreateChannel(server->endpoint_, grpc::InsecureChannelCredentials());
  auto kv = etcdserverpb::KV::NewStub(channel);
  const auto deadline = std::chrono::steady_clock::now() + absl::ToChronoMilliseconds(ready_timeout);
  for (;;) {
    int status;
    if (Exited(pid, &status)) {
      Unregister(pid);
      server->pid_ = -1;
      return absl::UnavailableError(absl::StrCat(ServerName(options.kind), " exited at start-up (",
                                                 server->command_, "):\n", Tail(log_path, 20)));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    etcdserverpb::RangeRequest req;
    req.set_key("/capstan-bench/ready");
    etcdserverpb::RangeResponse resp;
    if (kv->Range(&ctx, req, &resp).ok()) break;
    if (std::chrono::steady_clock::now() > deadline) {
      (void)server->Stop();
      return absl::DeadlineExceededError(absl::StrCat(ServerName(options.kind), " not ready after ",
                                                      absl::FormatDuration(ready_timeout), ":\n",
                                                      Tail(log_path, 20)));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return server;
}

absl::Status ServerProcess::Stop() {
  if (pid_ <= 0) return absl::OkStatus();
  absl::Status result = absl::OkStatus();
  int status = 0;
  if (Exited(pid_, &status)) {
    result = absl::InternalError(absl::StrCat(ServerName(options_.kind), " died during the run (",
                                              work_dir_, " kept):\n",
                                              Tail(work_dir_ + "/server.log", 20)));
  } else {
    kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!Exited(pid_, &status)) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  Unregister(pid_);
  pid_ = -1;
  if (!options_.keep_data && result.ok()) {
    std::error_code ec;
    std::filesystem::remove_all(work_dir_, ec);
  }
  return result;
}

ServerProcess::~ServerProcess() { (void)Stop(); }

}  // namespace capstan::bench
