#include "bench/loadgen/compare.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/k8s_scenario.h"
#include "bench/loadgen/plot.h"
#include "bench/loadgen/proc_stats.h"
#include "bench/loadgen/server_process.h"

namespace capstan::bench {

namespace {

struct Run {
  int round = 0;
  std::string target;
  bool ok = false;      // the run completed (its requests may still have failed)
  std::string failure;  // why it did not
  RunReport report;
};

double Median(std::vector<double> v) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string Display(const std::string& target) {
  if (target == "capstan") return "Capstan";
  if (target == "floor") return "gRPC floor";
  if (target == "floor-async") return "gRPC floor (async)";
  return target;
}

std::vector<std::string> SplitFlags(const std::string& s) {
  return absl::StrSplit(s, ' ', absl::SkipEmpty());
}

// Runs the workload once against a fresh server.
Run RunOnce(const CompareOptions& o, const GlobalOptions& global, Workload& workload,
            const std::string& target, int round) {
  Run run;
  run.round = round;
  run.target = target;
  ServerOptions so;
  // The floor takes (and ignores) Capstan's flags.
  so.kind = target == "etcd" ? ServerKind::kEtcd : ServerKind::kCapstan;
  if (target == "capstan") {
    so.binary = o.capstan_binary;
    so.extra_flags = SplitFlags(o.capstan_flags);
  } else if (target == "floor" || target == "floor-async") {
    so.binary = o.floor_binary;
    if (target == "floor-async") so.extra_flags = {"--model=async"};
  } else {
    so.binary = o.etcd_binary;
    so.extra_flags = SplitFlags(o.etcd_flags);
  }
  so.keep_data = o.keep_data;
  auto server = ServerProcess::Start(so, o.ready_timeout);
  if (!server.ok()) {
    run.failure = std::string(server.status().message());
    return run;
  }
  auto pool = ConnectionPool::Dial({(*server)->endpoint()}, global.conns, global.dial_timeout);
  if (!pool.ok()) {
    run.failure = std::string(pool.status().message());
    return run;
  }
  // The workload sees the server under test as its endpoints too (a list
  // process dials them).
  GlobalOptions target_global = global;
  target_global.endpoints = {(*server)->endpoint()};
  BenchContext ctx;
  ctx.global = &target_global;
  ctx.pool = pool->get();
  ctx.server_pid = (*server)->pid();
  ctx.target = target;
  ProcessSampler sampler((*server)->pid());
  // Watchdog: bounds the run even if the server stops answering.
  std::mutex mu;
  std::condition_variable cv;
  bool finished = false, killed = false;
  const pid_t pid = (*server)->pid();
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> l(mu);
    if (!cv.wait_for(l, absl::ToChronoMilliseconds(o.run_timeout), [&] { return finished; })) {
      killed = true;
      kill(pid, SIGKILL);
    }
  });
  auto report = workload.Run(ctx);
  {
    std::lock_guard<std::mutex> l(mu);
    finished = true;
    cv.notify_all();
  }
  watchdog.join();
  sampler.Stop();
  if (killed) {
    run.failure = absl::StrCat("the run took longer than --run-timeout (",
                               absl::FormatDuration(o.run_timeout), "); its server was killed (log: ", (*server)->work_dir(), "/server.log)");
    return run;
  }
  pool->reset();
  absl::Status stopped = (*server)->Stop();
  if (!report.ok()) {
    run.failure = std::string(report.status().message());
    return run;
  }
  run.report = std::move(*report);
  if (!stopped.ok()) {
    run.failure = std::string(stopped.message());
    return run;
  }
  if (sampler.valid()) {
    uint64_t ok = 0;
    for (const auto& p : run.report.phases) {
      if (p.has_throughput) ok += p.latency.Count();
    }
    run.report.extras.push_back({"server CPU time", sampler.CpuSeconds(), "s", false});
    if (ok > 0) {
      run.report.extras.push_back(
          {"server CPU per request", sampler.CpuSeconds() * 1e6 / ok, "us", false});
    }
    run.report.extras.push_back({"server RSS peak", sampler.PeakRss() / 1048576.0, "MiB", false});
  }
  run.ok = true;
  return run;
}

std::string OneLine(const Run& run) {
  if (!run.ok) return absl::StrCat("FAILED: ", run.failure);
  std::string s;
  for (const auto& p : run.report.phases) {
    if (!s.empty()) s += "; ";
    absl::StrAppend(&s, p.name, ": ");
    if (p.has_throughput) absl::StrAppend(&s, FormatNumber(p.Throughput()), " req/s, ");
    absl::StrAppend(&s, "p99 ", Ms(p.latency.Percentile(99)), " ms");
    if (p.errors) absl::StrAppend(&s, ", ", p.errors, " errors");
  }
  return s;
}

void WriteText(const std::string& path, const std::string& text) {
  if (path.empty()) return;
  std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  std::ofstream(path) << text;
}

}  // namespace

void CompareOptions::Register(FlagSet& f) {
  f.Int("rounds", &rounds, "Rounds; each runs the workload once against each target");
  f.String("capstan-binary", &capstan_binary, "capstan server binary (default: next to capstan-bench)");
  f.String("etcd-binary", &etcd_binary, "etcd server binary (default: $CAPSTAN_ETCD_BINARY, else etcd 3.5 from ~/.cache/capstan/etcd-3.5, else /usr/bin/etcd)");
  f.String("capstan-flags", &capstan_flags, "extra flags for capstan, space-separated");
  f.String("etcd-flags", &etcd_flags, "extra flags for etcd, space-separated");
  f.String("floor-binary", &floor_binary,
           "capstan-grpc-floor binary, for the target floor (default: next to capstan-bench)");
  f.String("targets", &targets,
           "comma-separated targets to run, of capstan, etcd, floor (gRPC alone, no storage, on "
           "gRPC's callback API as Capstan) and floor-async (the same on the completion-queue "
           "API, a thread per core); ratios are to the last");
  f.Bool("keep-data", &keep_data, "keep each server's data dir and log under /tmp");
  f.Duration("ready-timeout", &ready_timeout, "how long a server may take to start serving");
  f.Duration("run-timeout", &run_timeout,
             "kill the server of a run still going after this long (the run then fails)");
}

namespace {

// `name` in the directory of capstan-bench, or in its server/ subdirectory.
std::string BesideSelf(const std::string& name) {
  const std::filesystem::path self = SelfPath();
  if (!self.has_parent_path()) return name;
  const auto dir = self.parent_path();
  for (const auto& candidate : {dir / "server" / name, dir / name}) {
    if (access(candidate.c_str(), X_OK) == 0) return candidate.string();
  }
  return (dir / "server" / name).string();
}

}  // namespace

std::string DefaultCapstanBinary() { return BesideSelf("capstan"); }

std::string DefaultFloorBinary() { return BesideSelf("capstan-grpc-floor"); }

std::string DefaultEtcdBinary() {
  if (const char* env = std::getenv("CAPSTAN_ETCD_BINARY"); env != nullptr && *env != '\0') {
    return env;
  }
  if (const char* home = std::getenv("HOME"); home != nullptr) {
    const std::string extracted = std::string(home) + "/.cache/capstan/etcd-3.5/usr/bin/etcd";
    if (access(extracted.c_str(), X_OK) == 0) return extracted;
  }
  return "/usr/bin/etcd";
}

int RunCompare(const CompareOptions& options, const GlobalOptions& global, Workload& workload,
               const std::string& workload_name, const std::string& command_line) {
  CompareOptions o = options;
  if (o.capstan_binary.empty()) o.capstan_binary = DefaultCapstanBinary();
  if (o.floor_binary.empty()) o.floor_binary = DefaultFloorBinary();
  if (o.etcd_binary.empty()) o.etcd_binary = DefaultEtcdBinary();
  const std::vector<std::string> targets = absl::StrSplit(o.targets, ',', absl::SkipEmpty());
  InstallServerCleanup();
  std::cerr << "compare " << workload_name << ": " << o.rounds << " rounds against "
            << o.targets << "\n  capstan: " << o.capstan_binary << "\n  etcd:    " << o.etcd_binary
            << "\n  floor:   " << o.floor_binary << "\n";

  std::vector<Run> runs;
  for (int round = 1; round <= o.rounds; ++round) {
    std::vector<std::string> order = targets;
    if (round % 2 == 0) std::reverse(order.begin(), order.end());  // alternate who goes first
    for (const auto& target : order) {
      Run run = RunOnce(o, global, workload, target, round);
      run.report.params = command_line;
      std::cerr << absl::StrFormat("[round %d/%d] %-7s %s\n", round, o.rounds, target, OneLine(run));
      runs.push_back(std::move(run));
    }
  }

  // Medians per metric and target, in the order the metrics first appear.
  std::vector<std::string> names;
  std::map<std::string, Metric> meta;
  std::map<std::string, std::map<std::string, std::vector<double>>> values;  // target -> metric -> rounds
  std::map<std::string, uint64_t> errors;
  bool failed = false;
  for (const Run& run : runs) {
    if (!run.ok) {
      failed = true;
      continue;
    }
    errors[run.target] += run.report.TotalErrors();
    for (const Metric& m : run.report.Metrics()) {
      if (!meta.count(m.name)) {
        names.push_back(m.name);
        meta[m.name] = m;
      }
      values[run.target][m.name].push_back(m.value);
    }
  }
  std::vector<std::map<std::string, double>> medians(targets.size());
  for (size_t t = 0; t < targets.size(); ++t) {
    for (const auto& [name, v] : values[targets[t]]) medians[t][name] = Median(v);
  }

  std::string md = absl::StrFormat("## %s: %s, median of %d rounds\n\n`%s`\n\n", workload_name,
                                   absl::StrJoin(targets, " vs ", [](std::string* out, const std::string& t) {
                                     out->append(Display(t));
                                   }),
                                   o.rounds, command_line);
  // Two targets get the first's ratio to the second and which is better;
  // more get each one's ratio to the last.
  const bool pair = targets.size() == 2;
  const size_t ratios = targets.size() < 2 ? 0 : targets.size() - 1;
  md += "| metric |";
  for (const auto& t : targets) absl::StrAppend(&md, " ", Display(t), " |");
  for (size_t t = 0; t < ratios; ++t) {
    absl::StrAppend(&md, " ", Display(targets[t]), "/", Display(targets.back()), " |");
  }
  if (pair) md += " better |";
  md += "\n| --- |";
  for (size_t i = 0; i < targets.size() + ratios + (pair ? 1 : 0); ++i) md += " ---: |";
  md += "\n";
  for (const auto& name : names) {
    const Metric& m = meta[name];
    absl::StrAppend(&md, "| ", name, " (", m.unit, ") |");
    for (size_t t = 0; t < targets.size(); ++t) {
      auto it = medians[t].find(name);
      absl::StrAppend(&md, " ", it == medians[t].end() ? "-" : FormatNumber(it->second), " |");
    }
    const double b = medians.back().count(name) ? medians.back()[name] : NAN;
    for (size_t t = 0; t < ratios; ++t) {
      const double a = medians[t].count(name) ? medians[t][name] : NAN;
      if (std::isnan(a) || std::isnan(b) || b == 0) {
        md += pair ? " - | - |" : " - |";
        continue;
      }
      const double ratio = a / b;
      absl::StrAppend(&md, " ", absl::StrFormat("%.2f", ratio), " |");
      if (pair) {
        std::string better = "=";
        if (std::fabs(ratio - 1) > 0.03) {
          better = (ratio > 1) == m.higher_is_better ? Display(targets[0]) : Display(targets[1]);
        }
        absl::StrAppend(&md, " ", better, " |");
      }
    }
    md += "\n";
  }
  md += "| failed requests (all rounds) |";
  for (const auto& t : targets) absl::StrAppend(&md, " ", errors[t], " |");
  for (size_t i = 0; i < ratios + (pair ? 1 : 0); ++i) md += " |";
  md += "\n";

  if (workload_name == "k8s") {
    std::vector<std::string> shown;
    for (const auto& t : targets) shown.push_back(Display(t));
    absl::StrAppend(&md, "\nKubernetes SLOs (medians):\n\n", K8sSloTable(shown, medians));
  }

  // Every round, for judging the noise.
  md += "\nPer round (req/s and p99 ms of each phase):\n\n| round | target | result |\n| ---: | --- | --- |\n";
  for (const Run& run : runs) {
    absl::StrAppend(&md, "| ", run.round, " | ", Display(run.target), " | ", OneLine(run), " |\n");
  }
  std::cout << "\n" << md << std::flush;
  WriteText(global.markdown_path, md);

  if (!global.json_path.empty()) {
    JsonWriter w;
    w.BeginObject();
    w.Key("workload").Value(workload_name);
    w.Key("command").Value(command_line);
    w.Key("rounds").Value(o.rounds);
    w.Key("runs").BeginArray();
    for (const Run& run : runs) {
      w.BeginObject();
      w.Key("round").Value(run.round);
      w.Key("target").Value(run.target);
      w.Key("ok").Value(run.ok);
      if (!run.ok) w.Key("failure").Value(run.failure);
      if (run.ok) {
        w.Key("report");
        WriteJson(run.report, w);
      }
      w.EndObject();
    }
    w.EndArray();
    w.Key("medians").BeginObject();
    for (size_t t = 0; t < targets.size(); ++t) {
      w.Key(targets[t]).BeginObject();
      for (const auto& name : names) {
        if (medians[t].count(name)) w.Key(name).Value(medians[t][name]);
      }
      w.EndObject();
    }
    w.EndObject();
    if (pair) {
      w.Key("ratios").BeginObject();
      for (const auto& name : names) {
        if (medians[0].count(name) && medians[1].count(name) && medians[1][name] != 0) {
          w.Key(name).Value(medians[0][name] / medians[1][name]);
        }
      }
      w.EndObject();
    }
    w.EndObject();
    WriteText(global.json_path, w.str() + "\n");
  }

  if (!global.plot_dir.empty()) {
    // One latency-by-percentile plot per phase: every round of a target merged.
    std::vector<std::string> phases;
    for (const Run& run : runs) {
      for (const auto& p : run.report.phases) {
        if (std::find(phases.begin(), phases.end(), p.name) == phases.end()) phases.push_back(p.name);
      }
    }
    for (const auto& phase : phases) {
      std::vector<Histogram> merged(targets.size());
      for (const Run& run : runs) {
        const size_t t = std::find(targets.begin(), targets.end(), run.target) - targets.begin();
        for (const auto& p : run.report.phases) {
          if (p.name == phase && t < targets.size()) merged[t].Merge(p.latency);
        }
      }
      std::vector<std::pair<std::string, const Histogram*>> series;
      for (size_t t = 0; t < targets.size(); ++t) {
        if (merged[t].Count() > 0) series.emplace_back(Display(targets[t]), &merged[t]);
      }
      if (series.empty()) continue;
      std::cerr << PlotPercentiles(global.plot_dir, Slug(workload_name + "-" + phase),
                                   absl::StrCat(workload_name, ": ", phase, " latency (all rounds)"),
                                   series)
                << "\n";
    }
  }

  uint64_t total_errors = 0;
  for (const auto& [t, n] : errors) total_errors += n;
  if (failed || total_errors > 0) {
    std::cerr << "compare: " << (failed ? "some runs failed; " : "") << total_errors
              << " failed requests: verdict FAIL\n";
    return 1;
  }
  return 0;
}

}  // namespace capstan::bench
