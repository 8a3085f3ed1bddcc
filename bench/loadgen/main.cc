// capstan-bench: etcd's benchmark tool's commands and flags, plus large-list,
// the Kubernetes scenario (k8s), and `compare`, which runs any of them
// against Capstan and a real etcd side by side. See docs/BENCHMARKS.md.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/compare.h"
#include "bench/loadgen/k8s_scenario.h"
#include "bench/loadgen/load_driver.h"
#include "bench/loadgen/plot.h"
#include "bench/loadgen/workload.h"

namespace capstan::bench {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;  // requests failed or the run could not complete
constexpr int kExitUsage = 2;

void PrintUsage(std::ostream& out) {
  out << "capstan-bench: a load generator for etcd v3 servers (Capstan or etcd)\n\n"
         "Usage:\n"
         "  capstan-bench [global flags] <command> [flags] [args]\n"
         "  capstan-bench [global flags] compare [compare flags] <command> [flags] [args]\n\n"
         "Commands (etcd benchmark's, with its flags):\n";
  for (const auto& w : Workloads()) out << "  " << w.usage << "\n      " << w.help << "\n";
  out << "  compare <command> ...\n      Run <command> against Capstan and etcd started here, "
         "alternately, --rounds times;\n      print medians side by side with the ratio\n\n"
         "`capstan-bench <command> --help` lists a command's flags.\n\nGlobal flags:\n";
  FlagSet f;
  GlobalOptions g;
  g.Register(f);
  out << f.Usage();
}

bool WantsHelp(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    if (a == "--help" || a == "-h" || a == "-help") return true;
  }
  return false;
}

void WriteText(const std::string& path, const std::string& text) {
  if (path.empty()) return;
  std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream(path) << text;
}

// The command as reports show it: without the output flags (--json, --markdown,
// --plot), which do not change what is measured.
std::string DisplayedCommand(const std::vector<std::string>& args) {
  std::vector<std::string> shown;
  for (size_t i = 0; i < args.size(); ++i) {
    bool output = false;
    for (const char* flag : {"--json", "--markdown", "--plot"}) {
      if (args[i] == flag) {
        output = true;
        ++i;  // and its value
      } else if (absl::StartsWith(args[i], absl::StrCat(flag, "="))) {
        output = true;
      }
      if (output) break;
    }
    if (!output) shown.push_back(args[i]);
  }
  return absl::StrCat("capstan-bench ", absl::StrJoin(shown, " "));
}

void ApplyGlobals(const GlobalOptions& g) {
  SetProgressEnabled(isatty(STDERR_FILENO) && !g.no_progress);
  RequestTimeout() = absl::ToChronoMilliseconds(g.request_timeout);
}

int RunSingle(const GlobalOptions& given, Workload& workload, const std::string& name,
              const std::string& command_line) {
  GlobalOptions global = given;
  if (global.target_leader) {
    auto leader = ConnectionPool::LeaderEndpoints(global.endpoints, global.dial_timeout,
                                                  global.security);
    if (!leader.ok()) {
      std::cerr << "capstan-bench: " << leader.status().message() << "\n";
      return kExitFailed;
    }
    global.endpoints = *std::move(leader);
  }
  auto pool =
      ConnectionPool::Dial(global.endpoints, global.conns, global.dial_timeout, global.security);
  if (!pool.ok()) {
    std::cerr << "capstan-bench: " << pool.status().message() << "\n";
    return kExitFailed;
  }
  BenchContext ctx;
  ctx.global = &global;
  ctx.pool = pool->get();
  ctx.server_pid = global.server_pid;
  ctx.target = absl::StrJoin(global.endpoints, ",");
  auto report = workload.Run(ctx);
  if (!report.ok()) {
    std::cerr << "capstan-bench " << name << ": " << report.status().message() << "\n";
    return kExitFailed;
  }
  report->params = command_line;
  PrintReport(*report, std::cout);
  std::string md = MarkdownTable(*report);
  if (name == "k8s") {
    std::map<std::string, double> m;
    for (const auto& metric : report->Metrics()) m[metric.name] = metric.value;
    absl::StrAppend(&md, "\n", K8sSloTable({report->target}, {m}));
  }
  std::cout << md << std::flush;
  WriteText(global.markdown_path, md);
  if (!global.json_path.empty()) {
    JsonWriter w;
    WriteJson(*report, w);
    WriteText(global.json_path, w.str() + "\n");
  }
  if (!global.plot_dir.empty()) {
    for (const auto& p : report->phases) {
      if (p.latency.Count() == 0) continue;
      std::cerr << PlotPercentiles(global.plot_dir, Slug(name + "-" + p.name),
                                   absl::StrCat(name, ": ", p.name, " latency"),
                                   {{p.name, &p.latency}})
                << "\n";
      if (p.per_second.size() >= 2) {
        std::cerr << PlotThroughput(global.plot_dir, Slug(name + "-" + p.name + "-throughput"),
                                    absl::StrCat(name, ": ", p.name, " throughput"),
                                    {{p.name, p.per_second}})
                  << "\n";
      }
      if (p.p99_ms_per_second.size() >= 2) {
        std::cerr << PlotOverTime(global.plot_dir, Slug(name + "-" + p.name + "-p99-over-time"),
                                  absl::StrCat(name, ": ", p.name, " p99 per second"), "p99 (ms)",
                                  {{p.name, p.p99_ms_per_second}}, /*sparse=*/true)
                  << "\n";
      }
    }
  }
  const uint64_t errors = report->TotalErrors();
  if (errors > 0) {
    std::cerr << "capstan-bench " << name << ": " << errors << " failed requests: verdict FAIL\n";
    return kExitFailed;
  }
  return kExitOk;
}

int Main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  const std::string command_line = DisplayedCommand(args);
  GlobalOptions global;

  // Global flags may come before the command.
  std::vector<std::string> rest;
  {
    FlagSet f;
    global.Register(f);
    if (args.empty() || args[0] == "help" || (WantsHelp(args) && args.size() == 1)) {
      PrintUsage(std::cout);
      return args.empty() ? kExitUsage : kExitOk;
    }
    if (auto s = f.Parse(args, &rest, /*stop_at_positional=*/true); !s.ok()) {
      std::cerr << "Error: " << s.message() << "\n";
      return kExitUsage;
    }
  }
  if (rest.empty()) {
    PrintUsage(std::cerr);
    return kExitUsage;
  }
  const std::string command = rest[0];
  rest.erase(rest.begin());

  CompareOptions compare;
  const bool comparing = command == "compare";
  if (comparing) {
    FlagSet f;
    global.Register(f);
    compare.Register(f);
    std::vector<std::string> tail;
    const bool help_first = !rest.empty() && WantsHelp({rest[0]});
    if (auto s = help_first ? absl::OkStatus() : f.Parse(rest, &tail, /*stop_at_positional=*/true);
        !s.ok()) {
      std::cerr << "Error: " << s.message() << "\n";
      return kExitUsage;
    }
    if (tail.empty()) {
      std::cout << "Usage: capstan-bench compare [flags] <command> [command flags]\n\nFlags:\n"
                << f.Usage();
      return help_first ? kExitOk : kExitUsage;
    }
    rest = tail;
  }
  const std::string name = comparing ? rest[0] : command;
  if (comparing) rest.erase(rest.begin());
  const WorkloadInfo* info = FindWorkload(name);
  if (info == nullptr) {
    std::cerr << "Error: unknown command \"" << name << "\" for \"capstan-bench\"\n";
    PrintUsage(std::cerr);
    return kExitUsage;
  }
  std::unique_ptr<Workload> workload = info->make();
  FlagSet f;
  global.Register(f);
  if (comparing) compare.Register(f);
  workload->RegisterFlags(f);
  if (WantsHelp(rest)) {
    std::cout << info->help << "\n\nUsage:\n  capstan-bench " << info->usage << " [flags]\n\nFlags:\n"
              << f.Usage();
    return kExitOk;
  }
  std::vector<std::string> positional;
  if (auto s = f.Parse(rest, &positional); !s.ok()) {
    std::cerr << "Error: " << s.message() << "\n";
    return kExitUsage;
  }
  if (auto s = workload->Prepare(positional); !s.ok()) {
    std::cerr << "Error: " << s.message() << "\n";
    return kExitUsage;
  }
  ApplyGlobals(global);
  if (comparing) return RunCompare(compare, global, *workload, name, command_line);
  return RunSingle(global, *workload, name, command_line);
}

}  // namespace
}  // namespace capstan::bench

int main(int argc, char** argv) {
  // Debian's Abseil keeps absl::Mutex deadlock detection on (no NDEBUG);
  // gRPC's locks would pay for it on every request.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return capstan::bench::Main(argc, argv);
}
