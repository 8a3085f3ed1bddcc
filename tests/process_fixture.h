// Server processes for integration and differential tests.
//
// A ServerProcess is a real etcd (the reference, 3.5) or a Capstan binary started
// with etcd's flags on loopback ports, its own data directory and a log file:
//
//   auto server = ServerProcess::Start(ServerOptions::Etcd());
//   ASSERT_TRUE(server.ok()) << server.status();
//   auto channel = (*server)->NewChannel();
//   ...
//   (*server)->Kill();                  // crash: SIGKILL
//   ASSERT_TRUE((*server)->Restart().ok());  // same data dir, same ports
//
// No server outlives the test process: each child gets PR_SET_PDEATHSIG
// (SIGKILL when the forking thread dies), every live child is SIGKILLed by an
// atexit handler, and a ServerProcess kills its child in its destructor.
//
// Environment:
//   CAPSTAN_BINARY          path of the capstan binary; overrides the path
//                           compiled in from the CMake target `capstan`.
//   CAPSTAN_ETCD_BINARY     path of the reference etcd, 3.5 (default: the one
//                           scripts/deps.sh extracts from Debian trixie's
//                           package into CAPSTAN_REFERENCE_DIR, by default
//                           ~/.cache/capstan/etcd-3.5, at configure time);
//                           a path with no etcd hides the reference (tests
//                           that need it skip, or fail under CI=true:
//                           reference.h).
//   CAPSTAN_ETCDCTL_BINARY  path of the reference etcdctl (3.5, beside it).
//   CAPSTAN_ETCD34_BINARY   Debian 12's etcd 3.4 (default /usr/bin/etcd), for
//                           the tests about how 3.4 wrote its data dir.
//                           (The tests about etcd's data directories also run
//                           with both set to Debian 12's etcd 3.4:
//                           capstan_test_against_etcd34 in CMake.)
//   CAPSTAN_KEEP_TEST_DIRS  if set to a non-empty value, temp dirs are kept
//                           (their paths are printed) for post-mortems.
//
// Thread safety: a ServerProcess is used by one thread at a time. The free
// functions are thread-safe.

#ifndef CAPSTAN_TESTS_PROCESS_FIXTURE_H_
#define CAPSTAN_TESTS_PROCESS_FIXTURE_H_

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "reference.h"  // CAPSTAN_REQUIRE_REFERENCE: a missing etcd skips, or fails in CI

namespace capstan::testing {

// A TCP port on 127.0.0.1 that was free when this was called and has not
// been returned before by this process, chosen at random above the kernel's
// range for outgoing connections, so that no client connection takes it
// while a server is stopped for a Restart on the same ports. The port stays
// reserved for this process until it exits: an flock on
// /tmp/capstan-test-ports/PORT, which every test process's PickFreePort
// respects, so tests that run side by side (ctest -j) never pick the same
// port, even while one of them has stopped its server for a restart.
// (A process that does not use PickFreePort may still take it; ServerProcess::Start
// retries on that.)
int PickFreePort();

// Whether a server's log (or a start-up error that quotes it) says that it
// could not bind a port because another process had taken it.
bool IsPortInUseFailure(const std::string& log);

// A fresh directory under $TMPDIR (or /tmp), removed recursively on
// destruction unless CAPSTAN_KEEP_TEST_DIRS is set.
class TempDir {
 public:
  // Dies (CHECK-style abort with a message) if the directory can't be made.
  explicit TempDir(const std::string& prefix = "capstan-test");
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // Gives up ownership: the directory is no longer removed on destruction.
  std::string Release() { return std::exchange(path_, std::string()); }

 private:
  std::string path_;
};

// Removes `path` and everything below it. Returns false on the first error.
bool RemoveTree(const std::string& path);

enum class ServerFlavor { kEtcd, kCapstan };

const char* FlavorName(ServerFlavor f);

// The name of a test's run for each flavor, "Etcd" or "Capstan":
//   INSTANTIATE_TEST_SUITE_P(Servers, T, ::testing::Values(ServerFlavor::kEtcd,
//                            ServerFlavor::kCapstan), FlavorTestName());
struct FlavorTestName {
  template <typename ParamInfo>
  std::string operator()(const ParamInfo& info) const {
    return info.param == ServerFlavor::kEtcd ? "Etcd" : "Capstan";
  }
};

// Path of the reference etcd 3.5 binary (CAPSTAN_ETCD_BINARY or the one
// scripts/deps.sh extracted).
std::string EtcdBinary();
// Path of Debian 12's etcd 3.4 (CAPSTAN_ETCD34_BINARY or /usr/bin/etcd).
std::string Etcd34Binary();
// Path of the reference etcdctl 3.5 (CAPSTAN_ETCDCTL_BINARY or beside
// EtcdBinary()'s default).
std::string EtcdctlBinary();
// Path of the capstan binary: $CAPSTAN_BINARY if set, else the path compiled
// in from the CMake target, else "".
std::string CapstanBinary();
// True if `path` names an executable file.
bool IsExecutable(const std::string& path);

struct ServerOptions {
  ServerFlavor flavor = ServerFlavor::kEtcd;
  // Empty: EtcdBinary() or CapstanBinary() by flavor.
  std::string binary;
  // --name, and the member name in --initial-cluster.
  std::string name = "default";
  // Appended after the standard flags.
  std::vector<std::string> extra_args;
  // Start()/Restart() give up (and kill the child) after this long.
  std::chrono::milliseconds start_timeout{20000};
  // Stop() sends SIGKILL after this long.
  std::chrono::milliseconds stop_timeout{10000};

  static ServerOptions Etcd() { return ServerOptions{}; }
  static ServerOptions Capstan() {
    ServerOptions o;
    o.flavor = ServerFlavor::kCapstan;
    return o;
  }
};

// How a finished process ended.
struct ExitInfo {
  bool exited = false;  // true: exit_code is valid; false: killed by term_signal
  int exit_code = 0;
  int term_signal = 0;
  std::string ToString() const;
};

class ServerProcess {
 public:
  // Makes a temp dir `<dir>` holding the data dir `<dir>/data` and the log
  // `<dir>/server.log` (beside the data dir, not in it, so that neither etcd
  // nor capstan sees a foreign file there), picks ports, starts the server
  // (stdout and stderr appended to the log) and waits until
  // Maintenance.Status answers. On failure the child is killed and the error
  // carries the tail of the log.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(ServerOptions options);

  // Kills the child (SIGKILL) if it still runs; removes the temp dir unless
  // CAPSTAN_KEEP_TEST_DIRS is set.
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // SIGTERM, then SIGKILL after options.stop_timeout. Returns how it ended.
  // REQUIRES: running().
  ExitInfo Stop();
  // SIGKILL (a crash). REQUIRES: running().
  ExitInfo Kill();
  // Starts the server again on the same data dir and ports and waits until it
  // answers. REQUIRES: !running().
  absl::Status Restart();
  // Waits until Maintenance.Status succeeds (for etcd: and names a leader,
  // so that linearizable requests are served), the child exits, or `timeout`.
  absl::Status WaitReady(std::chrono::milliseconds timeout);

  // True while the child has not been reaped.
  bool running();
  pid_t pid() const { return pid_; }

  ServerFlavor flavor() const { return options_.flavor; }
  const ServerOptions& options() const { return options_; }
  int client_port() const { return client_port_; }
  int peer_port() const { return peer_port_; }
  int metrics_port() const { return metrics_port_; }
  // "127.0.0.1:<client port>", for gRPC channels and etcdctl --endpoints.
  std::string endpoint() const;
  std::string client_url() const;
  std::string peer_url() const;
  const std::string& dir() const { return dir_; }
  std::string data_dir() const { return dir_ + "/data"; }
  std::string log_path() const { return dir_ + "/server.log"; }
  // The whole log, or its last `max_bytes`.
  std::string ReadLog(size_t max_bytes = 0) const;
  // The command line of the last start.
  const std::vector<std::string>& argv() const { return argv_; }

  // A new insecure channel to endpoint().
  std::shared_ptr<grpc::Channel> NewChannel() const;

 private:
  explicit ServerProcess(ServerOptions options);
  std::vector<std::string> BuildArgv() const;
  absl::Status Spawn();
  // waitpid with WNOHANG; fills exit_ when the child has ended.
  bool Reap(bool block);
  ExitInfo SignalAndWait(int sig, std::chrono::milliseconds timeout);

  ServerOptions options_;
  std::string dir_;
  int client_port_ = 0;
  int peer_port_ = 0;
  int metrics_port_ = 0;
  std::vector<std::string> argv_;
  pid_t pid_ = -1;
  ExitInfo exit_;
};

// Starts `argv` (argv[0] a path; no shell) as a server child the way a
// ServerProcess starts its own: stdin from /dev/null, stdout and stderr
// appended to `log_path` after a banner line with the command, ETCD_* and
// ETCDCTL_* removed from its environment, killed with the test process
// (PR_SET_PDEATHSIG, and the atexit handler until ReapChild sees it end).
// For fixtures that run several servers with flags of their own
// (tests/cluster). Returns the pid.
absl::StatusOr<pid_t> SpawnChild(const std::vector<std::string>& argv,
                                 const std::string& log_path);
// The same with `env` ("NAME=value" entries, such as the ETCD_* block that
// `etcdctl member add` prints) added to the child's environment after the
// ETCD_* and ETCDCTL_* variables are removed; the banner names them too.
absl::StatusOr<pid_t> SpawnChild(const std::vector<std::string>& argv,
                                 const std::string& log_path,
                                 const std::vector<std::string>& env);
// waitpid for a child of SpawnChild: true when it has ended (then *exit, if
// not null, says how and the pid is forgotten), false while it runs.
// Blocks until it ends when `block`.
bool ReapChild(pid_t pid, bool block, ExitInfo* exit);

// Result of running a short-lived command.
struct CommandResult {
  ExitInfo exit;
  std::string out;  // stdout
  std::string err;  // stderr
  bool timed_out = false;
};

// Runs argv[0] with `argv` (no shell), feeding `stdin_data`, and collects its
// output. ETCD_* and ETCDCTL_* variables are removed from its environment.
// Kills it after `timeout`.
CommandResult RunCommand(const std::vector<std::string>& argv, const std::string& stdin_data = "",
                         std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace capstan::testing

#endif  // CAPSTAN_TESTS_PROCESS_FIXTURE_H_
