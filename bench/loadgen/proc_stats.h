// CPU and memory of a process on this machine, from /proc/<pid>.

#ifndef CAPSTAN_BENCH_LOADGEN_PROC_STATS_H_
#define CAPSTAN_BENCH_LOADGEN_PROC_STATS_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace capstan::bench {

struct ProcSample {
  double cpu_seconds = 0;  // user + system, all threads
  uint64_t rss_bytes = 0;  // VmRSS
  uint64_t hwm_bytes = 0;  // VmHWM: peak RSS over the process's life
};

// False if the process is gone or /proc is unreadable.
bool ReadProcSample(pid_t pid, ProcSample* out);

// Waits until the processes `pids` together use less than `cores` of CPU
// over a whole `window` (a cluster's members once a load's flushes and
// compactions are done), or until `limit` has passed. A process that is gone
// counts as quiet.
struct QuietWait {
  double seconds = 0;  // how long it waited
  bool quiet = false;  // false: `limit` passed first
};
QuietWait WaitUntilQuiet(const std::vector<pid_t>& pids, double cores,
                         std::chrono::milliseconds window, std::chrono::milliseconds limit);

// Samples a process every interval from its own thread, between construction
// and Stop(). Accessors are valid after Stop().
class ProcessSampler {
 public:
  explicit ProcessSampler(pid_t pid,
                          std::chrono::milliseconds interval = std::chrono::milliseconds(250));
  ~ProcessSampler();
  void Stop();

  bool valid() const { return samples_ > 0; }
  double CpuSeconds() const { return end_.cpu_seconds - start_.cpu_seconds; }
  // Average cores busy over the sampled interval.
  double CpuCores() const { return wall_seconds_ > 0 ? CpuSeconds() / wall_seconds_ : 0; }
  uint64_t PeakRss() const { return peak_rss_; }
  uint64_t EndRss() const { return end_.rss_bytes; }
  uint64_t LifetimePeakRss() const { return end_.hwm_bytes; }

 private:
  void Loop();

  const pid_t pid_;
  const std::chrono::milliseconds interval_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  // Written by the sampler thread until Stop().
  ProcSample start_, end_;
  uint64_t peak_rss_ = 0;
  int samples_ = 0;
  double wall_seconds_ = 0;
};

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_PROC_STATS_H_
