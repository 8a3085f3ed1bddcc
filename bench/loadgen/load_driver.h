// The closed-loop load engine shared by the etcd-benchmark-style workloads:
// --clients requests in flight at once, each client issuing its next request
// when the previous one completes, optionally paced to --rate requests/s
// across all clients (a token bucket like the golang.org/x/time/rate limiter
// of etcd's benchmark, except that the schedule may lag the clock by up to
// 1 ms, or one request, and then catch up). A request's latency is measured
// from its start to its completion, as etcd's benchmark measures it (so,
// like etcd's, a paced run does not count time spent waiting for the rate
// limiter).

#ifndef CAPSTAN_BENCH_LOADGEN_LOAD_DRIVER_H_
#define CAPSTAN_BENCH_LOADGEN_LOAD_DRIVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/support/status.h>

#include "absl/time/time.h"
#include "bench/loadgen/report.h"

namespace capstan::bench {

// Whether progress lines are drawn (main sets it: stderr is a TTY, no --no-progress).
void SetProgressEnabled(bool enabled);
bool ProgressEnabled();

// Samples a completion counter from its own thread: draws a progress line on
// stderr every 250 ms when enabled, and records completions per second.
class ProgressMonitor {
 public:
  // total 0: unknown. done and errors are called from the monitor thread.
  ProgressMonitor(std::string label, uint64_t total, std::function<uint64_t()> done,
                  std::function<uint64_t()> errors);
  ~ProgressMonitor();
  // Joins the thread and clears the line. Idempotent.
  void Stop();
  // Valid after Stop().
  const std::vector<double>& PerSecond() const { return per_second_; }

 private:
  void Loop();

  const std::string label_;
  const uint64_t total_;
  const std::function<uint64_t()> done_;
  const std::function<uint64_t()> errors_;
  std::atomic<bool> stop_{false};
  std::vector<double> per_second_;  // written by the monitor thread until Stop()
  std::thread thread_;
};

// Completes one request: call exactly once, from any thread, without blocking.
using DoneFn = std::function<void(const grpc::Status&)>;
// Starts request number seq for client (0 <= client < clients) and returns
// without waiting for it.
using IssueFn = std::function<void(uint64_t seq, size_t client, DoneFn done)>;

struct LoopOptions {
  std::string name;
  uint64_t total = 0;                               // requests; 0: until duration
  absl::Duration duration = absl::ZeroDuration();   // 0: until total
  int clients = 1;
  double rate = 0;                                  // requests/s in all; 0: no limit
  const std::atomic<bool>* stop = nullptr;          // set: stop issuing (optional)
};

// Runs the loop until total requests have completed or duration has passed
// (whichever is set and comes first) and every in-flight request is done.
PhaseResult RunClosedLoop(const LoopOptions& options, const IssueFn& issue);

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_LOAD_DRIVER_H_
