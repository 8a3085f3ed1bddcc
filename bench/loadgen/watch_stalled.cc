// watch-stalled (capstan-bench only): the slow-consumer check of a watch hub.
// --watchers normal streams, each with one prefix watcher that reads
// everything, watch a prefix through two phases of --total puts each:
//
//   baseline: only the normal streams;
//   stalled:  plus --stalled streams that create a prefix watcher and then
//             never read. Each has its own channel with a small HTTP/2 window
//             (no BDP probing), so the client stops taking data after a few
//             KiB and the server has to hold, park or drop what it owes them.
//
// It reports put latency per phase and the ratio of their p99s, the server's
// RSS at the end of each phase (and the stalled phase's peak), and checks
// that every normal watcher received every event of both phases exactly once
// and in order; a watcher that did not fails the run.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/client_security.h"
#include "bench/loadgen/keys.h"
#include "bench/loadgen/load_driver.h"
#include "bench/loadgen/proc_stats.h"
#include "bench/loadgen/streams.h"
#include "bench/loadgen/workload.h"

namespace capstan::bench {

namespace {

using etcdserverpb::PutRequest;
using etcdserverpb::WatchRequest;
using etcdserverpb::WatchResponse;

constexpr double kMiB = 1048576.0;

WatchRequest PrefixWatch(const std::string& prefix) {
  WatchRequest req;
  req.mutable_create_request()->set_key(prefix);
  req.mutable_create_request()->set_range_end(PrefixEnd(prefix));
  return req;
}

// The normal watchers: one prefix watcher per stream, every event read.
// Checks per stream that the events come exactly once and in revision order
// (every put under the prefix is its own revision, so revisions must rise
// strictly), and hands each event to the current phase's DeliveryTracker.
// Thread-safe.
class CheckedWatchers {
 public:
  explicit CheckedWatchers(ErrorCounter* errors) : errors_(errors) {}
  ~CheckedWatchers() { FinishAll(); }

  // REQUIRES: called once, before any other method.
  void Open(ConnectionPool& pool, int n, const std::string& prefix) {
    for (int i = 0; i < n; ++i) {
      auto w = std::make_unique<Watcher>();
      Watcher* raw = w.get();
      watchers_.push_back(std::move(w));
      raw->stream = std::make_unique<WatchStream>(
          pool.Watch(i), [this, raw](const WatchResponse& r) { OnResponse(raw, r); });
      raw->stream->Send(PrefixWatch(prefix));
    }
  }

  bool WaitCreated(std::chrono::milliseconds timeout) {
    const auto deadline = SteadyClock::now() + timeout;
    while (created_.load() < watchers_.size()) {
      if (SteadyClock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  // Events from now on are matched by this tracker (null: none).
  void SetTracker(DeliveryTracker* tracker) { tracker_.store(tracker); }

  // Adds an error for every watcher that did not receive exactly `expected`
  // events, in order, ending with revision last_revision.
  void Check(uint64_t expected, int64_t last_revision) {
    for (size_t i = 0; i < watchers_.size(); ++i) {
      Watcher& w = *watchers_[i];
      std::lock_guard<std::mutex> l(w.mu);
      if (w.out_of_order > 0) {
        errors_->Add(absl::StrCat("watcher ", i, ": ", w.out_of_order,
                                  " events repeated or out of revision order"));
      }
      if (w.events != expected || w.last_revision != last_revision) {
        errors_->Add(absl::StrCat("watcher ", i, ": ", w.events, " events up to revision ",
                                  w.last_revision, ", expected ", expected, " up to ",
                                  last_revision));
      }
    }
  }

  // Fewest events any watcher received.
  uint64_t MinEvents() const {
    uint64_t min = UINT64_MAX;
    for (const auto& w : watchers_) {
      std::lock_guard<std::mutex> l(w->mu);
      min = std::min(min, w->events);
    }
    return watchers_.empty() ? 0 : min;
  }

  void FinishAll() {
    for (auto& w : watchers_) {
      grpc::Status s;
      if (w->stream->Broken(&s)) errors_->Add(s);
      w->stream->Finish();
    }
    watchers_.clear();
  }

 private:
  struct Watcher {
    std::unique_ptr<WatchStream> stream;
    mutable std::mutex mu;
    uint64_t events = 0;        // guarded by mu
    int64_t last_revision = 0;  // guarded by mu
    uint64_t out_of_order = 0;  // guarded by mu
  };

  void OnResponse(Watcher* w, const WatchResponse& r) {
    const auto now = SteadyClock::now();
    if (r.created()) {
      if (r.canceled() || r.watch_id() < 0) {
        errors_->Add(absl::StrCat("watch create refused: ", r.cancel_reason()));
      } else {
        created_.fetch_add(1);
      }
    } else if (r.canceled()) {
      errors_->Add(absl::StrCat("watch canceled by the server: ", r.cancel_reason()));
    }
    if (r.events_size() == 0) return;
    DeliveryTracker* tracker = tracker_.load();
    std::lock_guard<std::mutex> l(w->mu);
    for (const auto& ev : r.events()) {
      const int64_t rev = ev.kv().mod_revision();
      if (rev <= w->last_revision) ++w->out_of_order;
      w->last_revision = std::max(w->last_revision, rev);
      ++w->events;
      if (tracker != nullptr) tracker->EventReceived(rev, now);
    }
  }

  ErrorCounter* const errors_;
  std::vector<std::unique_ptr<Watcher>> watchers_;
  std::atomic<size_t> created_{0};
  std::atomic<DeliveryTracker*> tracker_{nullptr};
};

// A Watch stream on a channel of its own that sends one create request and
// never reads: gRPC takes at most about `window` bytes of responses off the
// connection for it, then the server's writes to it stop completing. With
// read set it reads and discards everything instead (the control run).
class StalledWatchStream final : public grpc::ClientBidiReactor<WatchRequest, WatchResponse> {
 public:
  StalledWatchStream(std::shared_ptr<grpc::Channel> channel, const std::string& prefix, bool read)
      : channel_(std::move(channel)), stub_(etcdserverpb::Watch::NewStub(channel_)),
        request_(PrefixWatch(prefix)) {
    stub_->async()->Watch(&ctx_, this);
    StartWrite(&request_);
    if (read) StartRead(&response_);
    StartCall();
  }

  // Whether the create request went out; waits up to timeout.
  bool WaitSent(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, timeout, [this] { return write_done_ || done_; });
    return write_ok_;
  }

  // Cancels the stream and waits until gRPC is done with it.
  void Finish() {
    ctx_.TryCancel();
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return done_; });
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> l(mu_);
    write_done_ = true;
    write_ok_ = ok;
    cv_.notify_all();
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&response_);
  }
  void OnDone(const grpc::Status&) override {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
    cv_.notify_all();
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<etcdserverpb::Watch::Stub> stub_;
  grpc::ClientContext ctx_;
  WatchRequest request_;    // owned by the write in flight
  WatchResponse response_;  // owned by the read in flight
  std::mutex mu_;
  std::condition_variable cv_;
  bool write_done_ = false;  // guarded by mu_
  bool write_ok_ = false;    // guarded by mu_
  bool done_ = false;        // guarded by mu_
};

// The endpoint of the server under test. compare's BenchContext carries no
// endpoint (its pool is dialed to the server it started), so there it is read
// from the server's --listen-client-urls.
std::string ServerEndpoint(const BenchContext& ctx) {
  if (ctx.server_pid > 0 && (ctx.target == "capstan" || ctx.target == "etcd")) {
    std::ifstream in(absl::StrCat("/proc/", ctx.server_pid, "/cmdline"), std::ios::binary);
    const std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (absl::string_view arg : absl::StrSplit(cmdline, '\0')) {
      if (absl::ConsumePrefix(&arg, "--listen-client-urls=")) {
        return std::string(*absl::StrSplit(arg, ',').begin());
      }
    }
  }
  return ctx.global->endpoints.front();
}

double RssMiB(pid_t pid) {
  ProcSample s;
  return pid > 0 && ReadProcSample(pid, &s) ? s.rss_bytes / kMiB : 0;
}

class WatchStalledWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.String("prefix", &prefix_, "Prefix watched and written");
    f.Int64("total", &total_, "Puts in each phase");
    f.Double("rate", &rate_, "Puts per second in all (0 is no limit)");
    f.Int("val-size", &val_size_, "Value size of each put");
    f.Int("watchers", &watchers_, "Normal streams, one prefix watcher each, reading everything");
    f.Int("stalled", &stalled_, "Streams in the stalled phase that watch the prefix and never read");
    f.Int("stalled-window", &stalled_window_,
          "HTTP/2 stream window (bytes) of the stalled streams' channels");
    f.Bool("stalled-read", &stalled_read_,
           "Control: the --stalled streams read (and discard) everything instead");
  }
  absl::Status Prepare(const std::vector<std::string>&) override {
    if (total_ < 1 || watchers_ < 1 || stalled_ < 0 || stalled_window_ < 1) {
      return absl::InvalidArgumentError(
          "--total and --watchers must be >= 1, --stalled >= 0, --stalled-window >= 1");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    if (!ctx.global->security.user.empty()) {
      return absl::UnimplementedError("watch-stalled does not support --user");
    }
    const std::string value = RandomBytes(val_size_, 7);
    const pid_t pid = ctx.server_pid;
    ErrorCounter errors;
    CheckedWatchers watchers(&errors);
    watchers.Open(*ctx.pool, watchers_, prefix_);
    if (!watchers.WaitCreated(std::chrono::seconds(60))) {
      return absl::DeadlineExceededError("watch creation timed out after 60s");
    }
    RunReport r;
    r.workload = "watch-stalled";
    r.target = ctx.target;
    r.extras.push_back({"server RSS before the puts", RssMiB(pid), "MiB", false});

    int64_t last_revision = 0;
    std::mutex rev_mu;
    // Runs one phase of puts; every normal watcher must see every put.
    auto run_phase = [&](const std::string& name) {
      Histogram event_latency;
      DeliveryTracker tracker(&event_latency);
      watchers.SetTracker(&tracker);
      LoopOptions o{name, static_cast<uint64_t>(total_), absl::ZeroDuration(),
                    std::max(1, ctx.global->clients), rate_};
      IssueFn issue = [&](uint64_t seq, size_t client, DoneFn done) {
        PutRequest req;
        req.set_key(absl::StrCat(prefix_, name, "/", seq));
        req.set_value(value);
        const auto start = SteadyClock::now();
        AsyncPut(ctx.pool->Kv(client), std::move(req),
                 [&, start, done = std::move(done)](const grpc::Status& s, auto& resp) {
                   if (s.ok()) {
                     tracker.WriteCommitted(resp.header().revision(), start, watchers_);
                     std::lock_guard<std::mutex> l(rev_mu);
                     last_revision = std::max(last_revision, resp.header().revision());
                   }
                   done(s);
                 });
      };
      ProcessSampler sampler(pid, std::chrono::milliseconds(100));
      PhaseResult put = RunClosedLoop(o, issue);
      const uint64_t missing = tracker.WaitForAll(std::chrono::seconds(60));
      sampler.Stop();
      watchers.SetTracker(nullptr);
      if (missing > 0) {
        errors.Add(absl::StrCat(name, ": ", missing, " watch events never arrived (waited 60s)"));
      }
      r.phases.push_back(std::move(put));
      PhaseResult events;
      events.name = absl::StrCat(name, ", watch event");
      events.latency = event_latency;
      events.has_throughput = false;
      r.phases.push_back(std::move(events));
      if (sampler.valid()) {
        r.extras.push_back({absl::StrCat("server RSS peak, ", name), sampler.PeakRss() / kMiB,
                            "MiB", false});
      }
      r.extras.push_back({absl::StrCat("server RSS at end, ", name), RssMiB(pid), "MiB", false});
    };

    run_phase("put baseline");

    // The stalled streams: each on its own connection with a small window.
    std::vector<std::unique_ptr<StalledWatchStream>> stalled;
    const std::string endpoint = ServerEndpoint(ctx);
    auto credentials = MakeChannelCredentials(ctx.global->security, endpoint);
    if (!credentials.ok()) return credentials.status();
    for (int i = 0; i < stalled_; ++i) {
      grpc::ChannelArguments args;
      args.SetInt("capstan.bench.stalled_index", i);  // a connection of its own
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, stalled_window_);
      args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
      args.SetMaxReceiveMessageSize(-1);
      auto channel = grpc::CreateCustomChannel(ConnectionPool::TargetOf(endpoint), *credentials, args);
      stalled.push_back(std::make_unique<StalledWatchStream>(channel, prefix_, stalled_read_));
    }
    for (auto& s : stalled) {
      if (!s->WaitSent(std::chrono::seconds(10))) errors.Add("a stalled stream's create failed");
    }
    // The create requests are sent; give the server a moment to act on them.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));

    run_phase("put stalled");

    // Every successful put of both phases is one event for each normal watcher.
    const uint64_t puts_ok =
        r.Phase("put baseline")->latency.Count() + r.Phase("put stalled")->latency.Count();
    watchers.Check(puts_ok, last_revision);
    const uint64_t min_events = watchers.MinEvents();
    watchers.FinishAll();
    for (auto& s : stalled) s->Finish();
    stalled.clear();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    r.extras.push_back({"server RSS 1 s after closing the stalled streams", RssMiB(pid), "MiB",
                        false});

    const PhaseResult* base = r.Phase("put baseline");
    const PhaseResult* slow = r.Phase("put stalled");
    const uint64_t base_p99 = base->latency.Percentile(99);
    if (base_p99 > 0) {
      r.extras.push_back({"put p99 stalled / baseline",
                          static_cast<double>(slow->latency.Percentile(99)) / base_p99, "x",
                          false});
    }
    r.extras.push_back({"events received by each normal watcher (fewest)",
                        static_cast<double>(min_events), "events", true});
    // Watch failures fail the verdict through the last phase's errors.
    PhaseResult& last = r.phases.back();
    last.error_counts = errors.Snapshot();
    last.errors = errors.Total();
    return r;
  }

 private:
  std::string prefix_ = "/bench/watch-stalled/";
  int64_t total_ = 10000;
  double rate_ = 0;
  int val_size_ = 1024;
  int watchers_ = 10;
  int stalled_ = 4;
  int stalled_window_ = 16384;
  bool stalled_read_ = false;
};

}  // namespace

std::unique_ptr<Workload> NewWatchStalledWorkload() {
  return std::make_unique<WatchStalledWorkload>();
}

}  // namespace capstan::bench
