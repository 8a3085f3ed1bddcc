// capstan: an etcd v3 compatible server. Accepts etcd's flags and ETCD_*
// environment variables; see `capstan --help`.

#include <csignal>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "server/config.h"
#include "server/logging.h"
#include "server/server.h"
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
  std::vector<std::string> args(argv + 1, argv + argc);
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
    spdlog::info("recognized and used environment variable {}", env);
  }
  for (const auto& w : config->warnings) spdlog::warn("{}", w);
  for (const auto& f : config->ignored_flags) {
    spdlog::info("flag --{} accepted; it has no effect in a single-member Capstan", f);
  }

  // Block the stop signals in every thread; main waits for them below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  auto server = Server::Start(*config);
  if (!server.ok()) {
    spdlog::critical("failed to start: {}", std::string(server.status().message()));
    return 1;
  }
  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("received {} signal, shutting down", sig == SIGINT ? "interrupt" : "terminated");
  (*server)->Shutdown();
  return 0;
}
