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
#include "server/cache_proxy.h"
#include "server/config.h"
#include "server/logging.h"
#include "server/migrate.h"
#include "server/server.h"
#include "server/snapshot.h"
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

constexpr char kSnapshotUsage[] =
    "Usage:\n"
    "  capstan snapshot restore FILE --data-dir DIR          create DIR from a snapshot\n"
    "  capstan snapshot status FILE [-w simple|table|json]   describe it, as etcdctl\n"
    "A snapshot is the file `etcdctl snapshot save` writes, from Capstan or from etcd.\n";

// `capstan snapshot ...`: offline tools for snapshot files.
int SnapshotCommand(const std::vector<std::string>& args) {
  using namespace capstan::server;
  if (args.size() < 2 || (args[0] != "restore" && args[0] != "status")) {
    std::fputs(kSnapshotUsage, stderr);
    return 2;
  }
  const std::string file = args[1];
  std::string data_dir, format = "simple";
  for (size_t i = 2; i < args.size(); ++i) {
    auto value = [&](const std::string& flag) -> std::string {
      if (args[i].rfind(flag + "=", 0) == 0) return args[i].substr(flag.size() + 1);
      if (args[i] == flag && i + 1 < args.size()) return args[++i];
      return "";
    };
    if (args[i].rfind("--data-dir", 0) == 0) {
      data_dir = value("--data-dir");
    } else if (args[i].rfind("-w", 0) == 0 || args[i].rfind("--write-out", 0) == 0) {
      format = args[i].rfind("-w", 0) == 0 ? value("-w") : value("--write-out");
    } else {
      std::fprintf(stderr, "unknown flag %s\n%s", args[i].c_str(), kSnapshotUsage);
      return 2;
    }
  }
  if (args[0] == "restore") {
    if (data_dir.empty()) {
      std::fprintf(stderr, "--data-dir is required\n%s", kSnapshotUsage);
      return 2;
    }
    if (auto s = RestoreSnapshot(file, data_dir); !s.ok()) {
      std::fprintf(stderr, "Error: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    std::printf("restored snapshot %s into %s\n", file.c_str(), data_dir.c_str());
    return 0;
  }
  auto st = ReadSnapshotStatus(file);
  if (!st.ok()) {
    std::fprintf(stderr, "Error: %s\n", std::string(st.status().message()).c_str());
    return 1;
  }
  auto text = FormatSnapshotStatus(*st, format);
  if (!text.ok()) {
    std::fprintf(stderr, "Error: %s\n", std::string(text.status().message()).c_str());
    return 1;
  }
  std::fputs(text->c_str(), stdout);
  return 0;
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
  // `capstan migrate --from-etcd SRC --data-dir NEW [--verify]` (server/migrate.h).
  if (!args.empty() && args[0] == "migrate") {
    return MigrateCommand(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  // `capstan cache-proxy --upstream URL ...` (server/cache_proxy.h).
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
    SPDLOG_INFO("flag --{} accepted; it has no effect in a single-member Capstan", f);
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
  auto server = Server::Start(*config);
  if (!server.ok()) {
    SPDLOG_CRITICAL("failed to start: {}", std::string(server.status().message()));
    return 1;
  }
  stop.Wait();
  (*server)->Shutdown();
  return 0;
}
