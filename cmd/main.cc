// capstan: an etcd v3 compatible server. Accepts etcd's flags and ETCD_*
// environment variables; see `capstan --help`.

#include <sys/resource.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "cmd/cache_proxy.h"
#include "cmd/disk_fault_switch.h"
#include "cmd/migrate/migrate.h"
#include "cmd/snapshot_command.h"
#include "replication/goraft/go_raft_engine.h"
#include "server/config/config.h"
#include "server/observability/logging.h"
#include "server/server.h"
#include "server/stop_signals.h"
#include "spdlog/spdlog.h"

extern char** environ;

namespace {

std::map<std::string, std::string> Environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string::npos) env[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return env;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace capstan::server;
  // Debian builds Abseil without NDEBUG, which leaves absl::Mutex's deadlock
  // detection on: every lock gRPC takes then updates a process-wide lock
  // graph behind a global lock. It costs a few percent of CPU on the write
  // path and catches nothing in a release server.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "snapshot") {
    return SnapshotCommand(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  // `capstan migrate --from-etcd SRC --data-dir NEW [--verify]` (cmd/migrate/migrate.h).
  if (!args.empty() && args[0] == "migrate") {
    return MigrateCommand(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  // `capstan cache-proxy --upstream URL ...` (cmd/cache_proxy.h).
  if (!args.empty() && args[0] == "cache-proxy") {
    return CacheProxyCommand(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  auto config = ParseServerConfig(args, Environment());
  if (!config.ok()) {
    ConfigFailure failure = GetConfigFailure(config.status());
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    if (failure.print_usage) std::fprintf(stderr, "%s", ShortUsageText().c_str());
    return failure.exit_code;
  }
  if (config->help_requested) {
    std::fputs(UsageText().c_str(), stdout);
    return 0;
  }
  if (config->version_requested) {
    std::printf("capstan Version: %s\netcd API Version: %s\n", kCapstanVersion, kEtcdApiVersion);
    return 0;
  }

  if (auto s = InitLogging(config->log_level, config->log_outputs); !s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    return 1;
  }
  for (const auto& env : config->used_env_vars) {
    SPDLOG_INFO("recognized and used environment variable {}", env);
  }
  for (const auto& w : config->warnings) SPDLOG_WARN("{}", w);
  for (const auto& f : config->ignored_flags) {
    SPDLOG_INFO("flag --{} accepted; it has no effect in Capstan", f);
  }
  for (const auto& g : config->ignored_feature_gates) {
    SPDLOG_INFO("feature gate {} accepted; it has no effect in Capstan", g);
  }

  // Every client connection, gRPC or HTTP, holds a descriptor, as do
  // RocksDB's files: lift the soft limit (often 1024) to the hard one, as
  // Go (1.19+) does for etcd.
  if (rlimit nofile{}; getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) {
      SPDLOG_WARN("cannot raise the open file limit: {}", std::strerror(errno));
    }
  }

  StopSignals stop;
  // etcd's Raft (Go), for a member of a multi-member cluster.
  capstan::replication::GoRaftEngineFactory raft;
  // A test hook: a fault campaign fails this member's disk through it.
  std::unique_ptr<capstan::cmd::DiskFaultSwitch> disk_faults =
      capstan::cmd::DiskFaultSwitch::FromEnvironment();
  auto server =
      Server::Start(*config, &raft, disk_faults ? disk_faults->file_system() : nullptr);
  if (!server.ok()) {
    SPDLOG_CRITICAL("failed to start: {}", std::string(server.status().message()));
    return 1;
  }
  stop.Wait();
  (*server)->Shutdown();
  return 0;
}
