// Starts Capstan or etcd from its binary on free loopback ports with a fresh
// data dir under /tmp, waits until it serves, and stops it. Both run with
// their default durability (every commit fsynced) and the same flags.
//
// A ServerProcess is used from one thread. InstallServerCleanup() makes
// SIGINT/SIGTERM kill every server still running before the harness exits,
// and each server also gets SIGKILL if the harness dies (PR_SET_PDEATHSIG).

#ifndef CAPSTAN_BENCH_LOADGEN_SERVER_PROCESS_H_
#define CAPSTAN_BENCH_LOADGEN_SERVER_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace capstan::bench {

enum class ServerKind { kCapstan, kEtcd };
const char* ServerName(ServerKind kind);

struct ServerOptions {
  ServerKind kind = ServerKind::kCapstan;
  std::string binary;
  std::vector<std::string> extra_flags;
  bool keep_data = false;  // leave the data dir and log behind
};

class ServerProcess {
 public:
  // Starts the server and waits (up to ready_timeout) until a linearizable
  // Range succeeds on it.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(const ServerOptions& options,
                                                              absl::Duration ready_timeout);
  ~ServerProcess();

  // SIGTERM, then SIGKILL after 10 s; removes the work dir unless keep_data.
  // Idempotent. Errors if the server had already died.
  absl::Status Stop();

  pid_t pid() const { return pid_; }
  const std::string& endpoint() const { return endpoint_; }  // "127.0.0.1:port"
  const std::string& work_dir() const { return work_dir_; }
  const std::string& command() const { return command_; }

 private:
  ServerProcess() = default;

  ServerOptions options_;
  pid_t pid_ = -1;
  std::string endpoint_;
  std::string work_dir_;
  std::string command_;
};

// A TCP port on 127.0.0.1 that was free a moment ago.
int FreeLoopbackPort();
void InstallServerCleanup();
// The last lines of a file, for error messages.
std::string Tail(const std::string& path, int lines);

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_SERVER_PROCESS_H_
