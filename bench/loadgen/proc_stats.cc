#include "bench/loadgen/proc_stats.h"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace capstan::bench {

bool ReadProcSample(pid_t pid, ProcSample* out) {
  const std::string base = "/proc/" + std::to_string(pid);
  std::ifstream stat(base + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  // Fields after the command name (which may hold spaces) start at state (3).
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  unsigned long long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stoull(field);
    if (i == 15) stime = std::stoull(field);
  }
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  out->cpu_seconds = (utime + stime) / ticks;
  std::ifstream status(base + "/status");
  while (std::getline(status, line)) {
    auto kb = [&](const char* key, uint64_t* v) {
      if (line.rfind(key, 0) == 0) *v = std::stoull(line.substr(std::string(key).size())) * 1024;
    };
    kb("VmRSS:", &out->rss_bytes);
    kb("VmHWM:", &out->hwm_bytes);
  }
  return true;
}

QuietWait WaitUntilQuiet(const std::vector<pid_t>& pids, double cores,
                         std::chrono::milliseconds window, std::chrono::milliseconds limit) {
  using Clock = std::chrono::steady_clock;
  auto cpu_of_all = [&] {
    double sum = 0;
    for (pid_t pid : pids) {
      ProcSample s;
      if (ReadProcSample(pid, &s)) sum += s.cpu_seconds;
    }
    return sum;
  };
  const auto start = Clock::now();
  QuietWait out;
  for (;;) {
    const auto window_start = Clock::now();
    const double before = cpu_of_all();
    std::this_thread::sleep_for(window);
    const double used = cpu_of_all() - before;
    const double wall = std::chrono::duration<double>(Clock::now() - window_start).count();
    out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (used < cores * wall) {
      out.quiet = true;
      return out;
    }
    if (Clock::now() - start >= limit) return out;
  }
}

ProcessSampler::ProcessSampler(pid_t pid, std::chrono::milliseconds interval)
    : pid_(pid), interval_(interval) {
  if (pid_ > 0) thread_ = std::thread([this] { Loop(); });
}

ProcessSampler::~ProcessSampler() { Stop(); }

void ProcessSampler::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void ProcessSampler::Loop() {
  const auto t0 = std::chrono::steady_clock::now();
  auto sample = [&] {
    ProcSample s;
    if (!ReadProcSample(pid_, &s)) return;
    if (samples_++ == 0) start_ = s;
    end_ = s;
    peak_rss_ = std::max(peak_rss_, s.rss_bytes);
    wall_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  sample();
  while (!stop_.load()) {
    const auto until = std::chrono::steady_clock::now() + interval_;
    while (!stop_.load() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    sample();
  }
}

}  // namespace capstan::bench
