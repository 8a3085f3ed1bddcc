#include "process_fixture.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"

extern char** environ;

namespace capstan::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Every child that has been forked and not yet reaped. The atexit handler
// SIGKILLs whatever is left, so a test that forgets to stop a server (or
// fails an ASSERT before it can) leaks no process.
// Leaked on purpose: the atexit handler may run after static destructors.
std::mutex& LiveMu() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::set<pid_t>& LivePids() {
  static auto* pids = new std::set<pid_t>;
  return *pids;
}

void KillAllLive() {
  std::lock_guard<std::mutex> lock(LiveMu());
  for (pid_t pid : LivePids()) {
    kill(pid, SIGKILL);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  }
  LivePids().clear();
}

void RegisterLive(pid_t pid) {
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(KillAllLive); });
  std::lock_guard<std::mutex> lock(LiveMu());
  LivePids().insert(pid);
}

void UnregisterLive(pid_t pid) {
  std::lock_guard<std::mutex> lock(LiveMu());
  LivePids().erase(pid);
}

bool KeepDirs() {
  const char* v = std::getenv("CAPSTAN_KEEP_TEST_DIRS");
  return v != nullptr && *v != '\0';
}

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return (v != nullptr && *v != '\0') ? std::string(v) : fallback;
}

// The environment for children: ours without ETCD_* / ETCDCTL_*, which etcd,
// etcdctl (and capstan, which reads etcd's variables) would take as flags.
std::vector<std::string> ChildEnv() {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    if (kv.starts_with("ETCD_") || kv.starts_with("ETCDCTL_")) continue;
    env.emplace_back(kv);
  }
  return env;
}

std::vector<char*> CStrings(std::vector<std::string>& v) {
  std::vector<char*> out;
  out.reserve(v.size() + 1);
  for (auto& s : v) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

void CloseFdsFrom(int lowfd) {
#ifdef SYS_close_range
  if (syscall(SYS_close_range, lowfd, ~0U, 0) == 0) return;
#endif
  for (int fd = lowfd; fd < 4096; ++fd) close(fd);
}

// fork + exec with stdin/stdout/stderr redirected to the given fds, and
// `extra_env` ("NAME=value") added to ChildEnv(). Only async-signal-safe calls
// between fork and exec. The child dies with us (PR_SET_PDEATHSIG). Returns
// the pid or -errno.
pid_t ForkExec(std::vector<std::string> argv, int in_fd, int out_fd, int err_fd,
               const std::vector<std::string>& extra_env = {}) {
  std::vector<std::string> env = ChildEnv();
  env.insert(env.end(), extra_env.begin(), extra_env.end());
  std::vector<char*> cargv = CStrings(argv);
  std::vector<char*> cenv = CStrings(env);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return -errno;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);  // parent died before prctl
    setpgid(0, 0);  // terminal signals meant for the test runner don't hit it
    if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) _exit(126);
    CloseFdsFrom(3);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(cargv[0], cargv.data(), cenv.data());
    const char msg[] = "capstan-test: execve failed\n";
    ssize_t ignored = write(2, msg, sizeof(msg) - 1);
    (void)ignored;
    _exit(127);
  }
  return pid;
}

ExitInfo DecodeWaitStatus(int status) {
  ExitInfo e;
  if (WIFEXITED(status)) {
    e.exited = true;
    e.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    e.term_signal = WTERMSIG(status);
  }
  return e;
}

std::string ReadFile(const std::string& path, size_t max_tail = 0) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (max_tail != 0 && s.size() > max_tail) s = "...\n" + s.substr(s.size() - max_tail);
  return s;
}

}  // namespace

bool IsPortInUseFailure(const std::string& log) {
  return log.find("address already in use") != std::string::npos ||
         log.find("Address already in use") != std::string::npos ||
         log.find("Failed to add :") != std::string::npos;  // gRPC C++ on a taken port
}

namespace {

// Binds a loopback port to see that it is free (0: any); returns the port
// bound, or -1.
int TryBind(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  int bound = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    socklen_t len = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
      bound = ntohs(addr.sin_port);
    }
  }
  close(fd);
  return bound;
}

// Ports above the kernel's range for outgoing connections
// (/proc/sys/net/ipv4/ip_local_port_range, 32768-60999 by default): a client
// connection never takes one of them while its server is stopped for a
// restart, which reuses its ports. {0, 0} when that range leaves too few.
std::pair<int, int> PortsAboveEphemeralRange() {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (!(in >> lo >> hi) || hi > 65535 - 1000) return {0, 0};
  return {hi + 1, 65535};
}

// Reserves port for this process among the processes that call
// PickFreePort: an exclusive flock on a file named after it, held (its
// descriptor left open) until the process exits, when the kernel drops it.
// False if another live process holds it.
bool ReservePortForProcess(int port) {
  static const std::string dir = [] {
    const std::string d = "/tmp/capstan-test-ports";
    mkdir(d.c_str(), 01777);
    chmod(d.c_str(), 01777);  // whoever made it, every user's tests share it
    return d;
  }();
  const std::string path = absl::StrCat(dir, "/", port);
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return true;  // no reservations possible: bind alone decides
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    return false;
  }
  return true;  // fd stays open: the lock lasts as long as this process
}

}  // namespace

int PickFreePort() {
  static std::mutex mu;
  static std::set<int> handed_out;
  static std::mt19937 rng(static_cast<uint32_t>(getpid()) ^
                          static_cast<uint32_t>(std::chrono::steady_clock::now()
                                                    .time_since_epoch()
                                                    .count()));
  static const std::pair<int, int> range = PortsAboveEphemeralRange();
  std::lock_guard<std::mutex> lock(mu);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    int want = 0;
    if (range.first != 0) {
      want = std::uniform_int_distribution<int>(range.first, range.second)(rng);
      if (handed_out.count(want) != 0) continue;
    }
    // With no range, the kernel picks a free port (reserved, then tried again).
    const int port = want != 0 ? want : TryBind(0);
    if (port <= 0 || handed_out.count(port) != 0) continue;
    // Reserved before the bind test: a port another test process reserved,
    // whose server is down for a restart, is free but not to be taken.
    if (!ReservePortForProcess(port)) continue;
    handed_out.insert(port);
    if (TryBind(port) == port) return port;
  }
  std::fprintf(stderr, "capstan-test: no free loopback port\n");
  std::abort();
}

TempDir::TempDir(const std::string& prefix) {
  std::string base = EnvOr("TMPDIR", "/tmp");
  std::string tmpl = base + "/" + prefix + "-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (mkdtemp(buf.data()) == nullptr) {
    std::fprintf(stderr, "capstan-test: mkdtemp(%s): %s\n", tmpl.c_str(), std::strerror(errno));
    std::abort();
  }
  path_ = buf.data();
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  if (KeepDirs()) {
    std::fprintf(stderr, "capstan-test: keeping %s\n", path_.c_str());
    return;
  }
  RemoveTree(path_);
}

bool RemoveTree(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
  return !ec;
}

const char* FlavorName(ServerFlavor f) {
  return f == ServerFlavor::kEtcd ? "etcd" : "capstan";
}

std::string EtcdBinary() {
  return EnvOr("CAPSTAN_ETCD_BINARY", CAPSTAN_REFERENCE_DIR "/usr/bin/etcd");
}
std::string Etcd34Binary() { return EnvOr("CAPSTAN_ETCD34_BINARY", "/usr/bin/etcd"); }
std::string EtcdctlBinary() {
  return EnvOr("CAPSTAN_ETCDCTL_BINARY", CAPSTAN_REFERENCE_DIR "/usr/bin/etcdctl");
}


std::string CapstanBinary() {
#ifdef CAPSTAN_BINARY
  return EnvOr("CAPSTAN_BINARY", CAPSTAN_BINARY);
#else
  return EnvOr("CAPSTAN_BINARY", "");
#endif
}

bool IsExecutable(const std::string& path) {
  struct stat st;
  return !path.empty() && stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         access(path.c_str(), X_OK) == 0;
}

std::string ExitInfo::ToString() const {
  if (exited) return absl::StrCat("exit code ", exit_code);
  return absl::StrCat("killed by signal ", term_signal, " (", strsignal(term_signal), ")");
}

// ---------------------------------------------------------------------------
// ServerProcess

ServerProcess::ServerProcess(ServerOptions options) : options_(std::move(options)) {
  if (options_.binary.empty()) {
    options_.binary =
        options_.flavor == ServerFlavor::kEtcd ? EtcdBinary() : CapstanBinary();
  }
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && running()) Kill();
  if (!dir_.empty()) {
    if (KeepDirs()) {
      std::fprintf(stderr, "capstan-test: keeping %s (%s)\n", dir_.c_str(),
                   FlavorName(options_.flavor));
    } else {
      RemoveTree(dir_);
    }
  }
}

absl::StatusOr<std::unique_ptr<ServerProcess>> ServerProcess::Start(ServerOptions options) {
  std::unique_ptr<ServerProcess> p(new ServerProcess(std::move(options)));
  if (!IsExecutable(p->options_.binary)) {
    return absl::NotFoundError(absl::StrCat(FlavorName(p->options_.flavor),
                                            " binary not found or not executable: '",
                                            p->options_.binary, "'"));
  }
  // The ServerProcess owns the directory from here on.
  p->dir_ = TempDir(absl::StrCat("capstan-", FlavorName(p->options_.flavor))).Release();
  absl::Status last;
  for (int attempt = 0; attempt < 4; ++attempt) {
    p->client_port_ = PickFreePort();
    p->peer_port_ = PickFreePort();
    p->metrics_port_ = PickFreePort();
    last = p->Spawn();
    if (last.ok()) last = p->WaitReady(p->options_.start_timeout);
    if (last.ok()) return p;
    if (p->running()) p->Kill();
    // A port taken between PickFreePort and bind: try other ports on a clean dir.
    if (!IsPortInUseFailure(p->ReadLog())) break;
    RemoveTree(p->data_dir());
  }
  return last;
}

std::vector<std::string> ServerProcess::BuildArgv() const {
  const std::string& n = options_.name;
  std::vector<std::string> a = {
      options_.binary,
      "--name", n,
      "--data-dir", data_dir(),
      "--listen-client-urls", client_url(),
      "--advertise-client-urls", client_url(),
      "--listen-peer-urls", peer_url(),
      "--initial-advertise-peer-urls", peer_url(),
      "--initial-cluster", n + "=" + peer_url(),
      "--listen-metrics-urls", absl::StrCat("http://127.0.0.1:", metrics_port_),
  };
  a.insert(a.end(), options_.extra_args.begin(), options_.extra_args.end());
  return a;
}

std::string ServerProcess::endpoint() const { return absl::StrCat("127.0.0.1:", client_port_); }
std::string ServerProcess::client_url() const {
  return absl::StrCat("http://127.0.0.1:", client_port_);
}
std::string ServerProcess::peer_url() const { return absl::StrCat("http://127.0.0.1:", peer_port_); }

absl::Status ServerProcess::Spawn() {
  argv_ = BuildArgv();
  int log_fd = open(log_path().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(absl::StrCat("open ", log_path(), ": ", std::strerror(errno)));
  }
  std::string banner = absl::StrCat("=== capstan-test: starting: ", absl::StrJoin(argv_, " "), "\n");
  ssize_t ignored = write(log_fd, banner.data(), banner.size());
  (void)ignored;
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t pid = ForkExec(argv_, null_fd, log_fd, log_fd);
  close(null_fd);
  close(log_fd);
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(-pid)));
  pid_ = pid;
  exit_ = ExitInfo{};
  RegisterLive(pid);
  return absl::OkStatus();
}

bool ServerProcess::Reap(bool block) {
  if (pid_ <= 0) return true;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  if (r == pid_) exit_ = DecodeWaitStatus(status);
  UnregisterLive(pid_);
  pid_ = -1;
  return true;
}

bool ServerProcess::running() { return pid_ > 0 && !Reap(false); }

ExitInfo ServerProcess::SignalAndWait(int sig, std::chrono::milliseconds timeout) {
  if (pid_ <= 0) return exit_;
  kill(pid_, sig);
  const auto deadline = Clock::now() + timeout;
  while (!Reap(false)) {
    if (Clock::now() >= deadline) {
      kill(pid_, SIGKILL);
      Reap(true);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exit_;
}

ExitInfo ServerProcess::Stop() { return SignalAndWait(SIGTERM, options_.stop_timeout); }

ExitInfo ServerProcess::Kill() { return SignalAndWait(SIGKILL, std::chrono::seconds(30)); }

absl::Status ServerProcess::Restart() {
  if (running()) return absl::FailedPreconditionError("Restart: server still running");
  absl::Status s = Spawn();
  if (s.ok()) s = WaitReady(options_.start_timeout);
  if (!s.ok() && running()) Kill();
  return s;
}

absl::Status ServerProcess::WaitReady(std::chrono::milliseconds timeout) {
  auto channel = NewChannel();
  auto stub = etcdserverpb::Maintenance::NewStub(channel);
  const auto deadline = Clock::now() + timeout;
  std::string last_error = "no attempt";
  while (true) {
    if (!running()) {
      return absl::UnavailableError(absl::StrCat(
          FlavorName(options_.flavor), " exited during start-up (", exit_.ToString(),
          "); command: ", absl::StrJoin(argv_, " "), "\nlog tail:\n", ReadLog(4000)));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    ctx.set_wait_for_ready(true);
    etcdserverpb::StatusRequest req;
    etcdserverpb::StatusResponse resp;
    grpc::Status st = stub->Status(&ctx, req, &resp);
    // etcd answers Status before its election; only a Status that names a
    // leader means it serves linearizable requests. Capstan has no election:
    // its first answer counts (a missing leader is for the tests to find).
    if (st.ok() && (resp.leader() != 0 || options_.flavor == ServerFlavor::kCapstan)) {
      return absl::OkStatus();
    }
    last_error = st.ok() ? "Status answered without a leader"
                         : absl::StrCat(st.error_code(), ": ", st.error_message());
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      FlavorName(options_.flavor), " did not answer Maintenance.Status within ",
      timeout.count(), " ms (last: ", last_error, "); command: ", absl::StrJoin(argv_, " "),
      "\nlog tail:\n", ReadLog(4000)));
}

std::string ServerProcess::ReadLog(size_t max_bytes) const {
  return ReadFile(log_path(), max_bytes);
}

std::shared_ptr<grpc::Channel> ServerProcess::NewChannel() const {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // A fresh connection per channel: the two servers must never share one.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Reconnect quickly while a server starts or restarts (the default backoff
  // grows to seconds and makes WaitReady wait for nothing).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 250);
  return grpc::CreateCustomChannel(endpoint(), grpc::InsecureChannelCredentials(), args);
}

// ---------------------------------------------------------------------------

absl::StatusOr<pid_t> SpawnChild(const std::vector<std::string>& argv,
                                 const std::string& log_path) {
  return SpawnChild(argv, log_path, {});
}

absl::StatusOr<pid_t> SpawnChild(const std::vector<std::string>& argv,
                                 const std::string& log_path,
                                 const std::vector<std::string>& env) {
  int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(absl::StrCat("open ", log_path, ": ", std::strerror(errno)));
  }
  std::string banner = absl::StrCat("=== capstan-test: starting: ",
                                    env.empty() ? "" : absl::StrCat(absl::StrJoin(env, " "), " "),
                                    absl::StrJoin(argv, " "), "\n");
  ssize_t ignored = write(log_fd, banner.data(), banner.size());
  (void)ignored;
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t pid = ForkExec(argv, null_fd, log_fd, log_fd, env);
  close(null_fd);
  close(log_fd);
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", std::strerror(-pid)));
  RegisterLive(pid);
  return pid;
}

bool ReapChild(pid_t pid, bool block, ExitInfo* exit) {
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid, &status, block ? 0 : WNOHANG);
  } while (r < 0 && errno == EINTR);
  if (r == 0) return false;
  if (r == pid && exit != nullptr) *exit = DecodeWaitStatus(status);
  UnregisterLive(pid);
  return true;
}

CommandResult RunCommand(const std::vector<std::string>& argv, const std::string& stdin_data,
                         std::chrono::milliseconds timeout) {
  CommandResult r;
  TempDir dir("capstan-cmd");
  const std::string in_path = dir.path() + "/stdin";
  const std::string out_path = dir.path() + "/stdout";
  const std::string err_path = dir.path() + "/stderr";
  {
    std::ofstream in(in_path, std::ios::binary);
    in << stdin_data;
  }
  int in_fd = open(in_path.c_str(), O_RDONLY | O_CLOEXEC);
  int out_fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  pid_t pid = -1;
  if (in_fd >= 0 && out_fd >= 0 && err_fd >= 0) pid = ForkExec(argv, in_fd, out_fd, err_fd);
  if (in_fd >= 0) close(in_fd);
  if (out_fd >= 0) close(out_fd);
  if (err_fd >= 0) close(err_fd);
  if (pid < 0) {
    r.exit.exited = true;
    r.exit.exit_code = -1;
    r.err = absl::StrCat("capstan-test: could not start ", argv.empty() ? "" : argv[0]);
    return r;
  }
  RegisterLive(pid);
  const auto deadline = Clock::now() + timeout;
  int status = 0;
  while (true) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) break;
    if (Clock::now() >= deadline) {
      r.timed_out = true;
      kill(pid, SIGKILL);
      while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  UnregisterLive(pid);
  r.exit = DecodeWaitStatus(status);
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  return r;
}

}  // namespace capstan::testing
