#include "bench/loadgen/load_driver.h"

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <mutex>

#include "absl/strings/str_format.h"

namespace capstan::bench {

namespace {

using Clock = std::chrono::steady_clock;

std::atomic<bool> g_progress{false};

// How deep completions nest inside Issue() on this thread (gRPC may run a
// callback on the thread that started the call, e.g. when it fails at once).
thread_local int tl_depth = 0;
constexpr int kMaxInlineDepth = 8;

class ClosedLoop {
 public:
  ClosedLoop(const LoopOptions& options, const IssueFn& issue) : opts_(options), issue_(issue) {}

  PhaseResult Run() {
    const int clients = std::max(1, opts_.clients);
    active_ = clients;
    start_ = Clock::now();
    if (opts_.duration > absl::ZeroDuration()) {
      deadline_ = start_ + absl::ToChronoNanoseconds(opts_.duration);
      has_deadline_ = true;
    }
    ProgressMonitor progress(
        opts_.name, opts_.total, [this] { return completed_.load(std::memory_order_relaxed); },
        [this] { return errors_.Total(); });
    std::thread dispatcher([this] { Dispatch(); });
    if (opts_.rate > 0) {
      std::lock_guard<std::mutex> l(mu_);
      for (int c = 0; c < clients; ++c) ready_.push_back(c);
      cv_.notify_all();
    } else {
      for (int c = 0; c < clients; ++c) Issue(c);
    }
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [this] { return active_ == 0; });
    }
    const auto end = Clock::now();
    dispatcher.join();
    progress.Stop();

    PhaseResult r;
    r.name = opts_.name;
    r.latency = hist_;
    r.error_counts = errors_.Snapshot();
    r.errors = errors_.Total();
    r.seconds = std::chrono::duration<double>(end - start_).count();
    r.per_second = progress.PerSecond();
    return r;
  }

 private:
  bool Exhausted(uint64_t seq) const {
    if (opts_.total > 0 && seq >= opts_.total) return true;
    if (opts_.stop != nullptr && opts_.stop->load(std::memory_order_relaxed)) return true;
    return has_deadline_ && Clock::now() >= deadline_;
  }

  void Issue(size_t client) {
    const uint64_t seq = next_seq_.fetch_add(1, std::memory_order_relaxed);
    if (Exhausted(seq)) {
      ClientFinished();
      return;
    }
    const auto start = Clock::now();
    ++tl_depth;
    issue_(seq, client,
           [this, client, start](const grpc::Status& s) { Complete(client, start, s); });
    --tl_depth;
  }

  void Complete(size_t client, Clock::time_point start, const grpc::Status& s) {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start);
    if (s.ok()) {
      hist_.Record(static_cast<uint64_t>(ns.count()));
    } else {
      errors_.Add(s);
    }
    completed_.fetch_add(1, std::memory_order_relaxed);
    if (opts_.rate > 0 || tl_depth > kMaxInlineDepth) {
      std::lock_guard<std::mutex> l(mu_);
      ready_.push_back(client);
      cv_.notify_all();
    } else {
      Issue(client);
    }
  }

  void ClientFinished() {
    std::lock_guard<std::mutex> l(mu_);
    --active_;
    cv_.notify_all();
  }

  // Issues for clients handed over by completions: paced when --rate is set,
  // at once otherwise (only deep inline completions come here then).
  void Dispatch() {
    const auto interval = opts_.rate > 0 ? std::chrono::nanoseconds(static_cast<int64_t>(1e9 / opts_.rate))
                                         : std::chrono::nanoseconds(0);
    // The schedule may fall behind the clock by this much and catch up: a
    // sleep overshoots by tens of microseconds, which at 20,000 requests/s
    // (50 us apart) would otherwise cap the rate near 5,000/s. An idle
    // spell still buys no burst beyond it.
    const auto max_lag = std::max<Clock::duration>(interval, std::chrono::milliseconds(1));
    // Waits shorter than this are not slept: the request goes out early and
    // the schedule, not the clock, keeps the rate.
    constexpr auto kMinSleep = std::chrono::microseconds(100);
    auto next = Clock::now();
    std::unique_lock<std::mutex> l(mu_);
    for (;;) {
      cv_.wait(l, [this] { return !ready_.empty() || active_ == 0; });
      if (active_ == 0) return;
      const size_t client = ready_.front();
      ready_.pop_front();
      l.unlock();
      if (opts_.rate > 0) {
        const auto now = Clock::now();
        next = std::max(next, now - max_lag);
        if (next > now + kMinSleep) std::this_thread::sleep_until(next);
        next += interval;
      }
      Issue(client);
      l.lock();
    }
  }

  const LoopOptions opts_;
  const IssueFn& issue_;
  Clock::time_point start_;
  Clock::time_point deadline_;
  bool has_deadline_ = false;
  std::atomic<uint64_t> next_seq_{0};
  std::atomic<uint64_t> completed_{0};
  Histogram hist_;
  ErrorCounter errors_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<size_t> ready_;  // guarded by mu_
  int active_ = 0;            // guarded by mu_: clients that have not finished
};

}  // namespace

void SetProgressEnabled(bool enabled) { g_progress = enabled; }
bool ProgressEnabled() { return g_progress; }

ProgressMonitor::ProgressMonitor(std::string label, uint64_t total, std::function<uint64_t()> done,
                                 std::function<uint64_t()> errors)
    : label_(std::move(label)), total_(total), done_(std::move(done)), errors_(std::move(errors)) {
  thread_ = std::thread([this] { Loop(); });
}

ProgressMonitor::~ProgressMonitor() { Stop(); }

void ProgressMonitor::Stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void ProgressMonitor::Loop() {
  const auto start = Clock::now();
  auto last_draw = start;
  uint64_t last_second_done = 0;
  int next_second = 1;
  bool drew = false;
  while (!stop_.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto now = Clock::now();
    if (now - start >= std::chrono::seconds(next_second)) {
      const uint64_t d = done_();
      per_second_.push_back(static_cast<double>(d - last_second_done));
      last_second_done = d;
      ++next_second;
    }
    if (g_progress && now - last_draw >= std::chrono::milliseconds(250)) {
      last_draw = now;
      const double secs = std::chrono::duration<double>(now - start).count();
      const uint64_t d = done_();
      std::string line = absl::StrFormat("%s: %d", label_, d);
      if (total_ > 0) absl::StrAppendFormat(&line, "/%d (%.0f%%)", total_, 100.0 * d / total_);
      absl::StrAppendFormat(&line, "  %.0f/s  errors %d  %.1fs", secs > 0 ? d / secs : 0.0,
                            errors_(), secs);
      std::fprintf(stderr, "\r\033[K%s", line.c_str());
      std::fflush(stderr);
      drew = true;
    }
  }
  if (drew) {
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }
}

PhaseResult RunClosedLoop(const LoopOptions& options, const IssueFn& issue) {
  ClosedLoop loop(options, issue);
  return loop.Run();
}

}  // namespace capstan::bench
