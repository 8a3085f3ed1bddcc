// watch and watch-latency: etcd's benchmark commands of those names, same
// flags. Unlike etcd 3.4's tool, which times only the client-side call for
// watch creation and nothing for events, both measure the round trip: watch
// creation from the create request to its `created` response, and event
// delivery from the start of the put to the arrival of its event.
// watch-latency also reports etcd's own measure, from the put's response to
// the event. watch-prefix (capstan-bench only): one watcher with prev_kv on
// a prefix taking puts as fast as --put-rate allows.

#include <atomic>
#include <map>
#include <memory>
#include <thread>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/keys.h"
#include "bench/loadgen/load_driver.h"
#include "bench/loadgen/streams.h"
#include "bench/loadgen/workload.h"

namespace capstan::bench {

namespace {

using etcdserverpb::PutRequest;
using etcdserverpb::WatchRequest;

uint64_t Nanos(SteadyClock::duration d) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count());
}

// Streams whose `created` responses are timed against their create requests
// (the server answers creates on a stream in order).
class TimedWatchStreams {
 public:
  // on_event (optional) sees every event, on a gRPC thread.
  TimedWatchStreams(Histogram* create_latency, DeliveryTracker* tracker, ErrorCounter* errors,
                    std::function<void(const EventSummary&)> on_event = nullptr)
      : create_latency_(create_latency), tracker_(tracker), errors_(errors),
        on_event_(std::move(on_event)) {}

  ~TimedWatchStreams() { FinishAll(); }

  void Open(ConnectionPool& pool, int n) {
    for (int i = 0; i < n; ++i) {
      auto state = std::make_unique<StreamState>();
      StreamState* st = state.get();
      st->stream = std::make_unique<WatchSummaryStream>(
          pool.Channel(i), [this, st](const WatchResponseSummary& r) { OnResponse(st, r); });
      streams_.push_back(std::move(state));
    }
  }

  size_t size() const { return streams_.size(); }

  void Create(size_t stream, const std::string& key, const std::string& end, bool prev_kv) {
    StreamState* st = streams_[stream].get();
    WatchRequest req;
    auto* c = req.mutable_create_request();
    c->set_key(key);
    c->set_range_end(end);
    c->set_prev_kv(prev_kv);
    {
      std::lock_guard<std::mutex> l(st->mu);
      st->create_sent.push_back(SteadyClock::now());
    }
    requested_.fetch_add(1);
    st->stream->Send(std::move(req));
  }

  // Waits until every create was answered; false on timeout.
  bool WaitCreated(std::chrono::milliseconds timeout) {
    const auto deadline = SteadyClock::now() + timeout;
    while (created_.load() + failed_.load() < requested_.load()) {
      if (SteadyClock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  uint64_t events() const { return events_.load(); }
  SteadyClock::time_point last_event() const {
    return SteadyClock::time_point(SteadyClock::duration(last_event_ns_.load()));
  }

  void FinishAll() {
    for (auto& st : streams_) {
      grpc::Status s;
      if (st->stream->Broken(&s)) errors_->Add(s);
      st->stream->Finish();
    }
    streams_.clear();
  }

 private:
  struct StreamState {
    std::unique_ptr<WatchSummaryStream> stream;
    std::mutex mu;
    std::deque<SteadyClock::time_point> create_sent;  // guarded by mu
  };

  void OnResponse(StreamState* st, const WatchResponseSummary& r) {
    const auto now = SteadyClock::now();
    if (r.created) {
      SteadyClock::time_point sent;
      {
        std::lock_guard<std::mutex> l(st->mu);
        if (st->create_sent.empty()) return;
        sent = st->create_sent.front();
        st->create_sent.pop_front();
      }
      if (r.watch_id < 0 || r.canceled) {
        errors_->Add(absl::StrCat("watch create refused: ", r.cancel_reason));
        failed_.fetch_add(1);
      } else {
        create_latency_->Record(Nanos(now - sent));
        created_.fetch_add(1);
      }
    }
    if (r.canceled && !r.created) {
      errors_->Add(absl::StrCat("watch canceled by the server: ", r.cancel_reason));
    }
    absl::InlinedVector<int64_t, 64> revisions;
    revisions.reserve(r.events.size());
    for (const auto& ev : r.events) revisions.push_back(ev.mod_revision);
    tracker_->EventsReceived(revisions, now);
    if (on_event_) {
      for (const auto& ev : r.events) on_event_(ev);
    }
    events_.fetch_add(r.events.size());
    if (!r.events.empty()) last_event_ns_.store(now.time_since_epoch().count());
  }

  Histogram* const create_latency_;
  DeliveryTracker* const tracker_;
  ErrorCounter* const errors_;
  const std::function<void(const EventSummary&)> on_event_;
  std::vector<std::unique_ptr<StreamState>> streams_;
  std::atomic<uint64_t> requested_{0}, created_{0}, failed_{0}, events_{0};
  std::atomic<int64_t> last_event_ns_{0};
};

class WatchWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.Int("streams", &streams_, "Total watch streams");
    f.Int("watch-per-stream", &per_stream_, "Total watchers per stream");
    f.Int("watched-key-total", &watched_key_total_, "Total number of keys to be watched");
    f.Double("put-rate", &put_rate_, "Number of keys to put per second (0 is no limit)");
    f.Int64("put-total", &put_total_, "Number of put requests");
    f.Int("key-size", &key_size_, "Key size of watch request");
    f.Int64("key-space-size", &key_space_size_, "Maximum possible keys");
    f.Bool("sequential-keys", &seq_keys_, "Use sequential keys");
  }
  absl::Status Prepare(const std::vector<std::string>&) override {
    if (key_space_size_ <= 0) return absl::InvalidArgumentError("expected positive --key-space-size");
    if (watched_key_total_ < 1 || streams_ < 1 || per_stream_ < 1) {
      return absl::InvalidArgumentError("--streams, --watch-per-stream, --watched-key-total must be >= 1");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    std::vector<std::string> watched(watched_key_total_);
    for (int i = 0; i < watched_key_total_; ++i) {
      watched[i] = EtcdBenchKey(seq_keys_ ? i % key_space_size_ : RandomIndex(key_space_size_),
                                key_size_);
    }
    std::map<std::string, int> watchers;  // key -> number of watchers on it
    Histogram create_latency, event_latency;
    ErrorCounter errors;
    DeliveryTracker tracker(&event_latency);
    TimedWatchStreams streams(&create_latency, &tracker, &errors);
    streams.Open(*ctx.pool, streams_);

    // Phase 1: watch creation.
    const auto create_start = SteadyClock::now();
    for (int i = 0; i < streams_ * per_stream_; ++i) {
      const std::string& key = watched[i % watched.size()];
      ++watchers[key];
      streams.Create(i % streams_, key, "", false);
    }
    const bool all_created = streams.WaitCreated(std::chrono::seconds(60));
    PhaseResult create;
    create.name = "watch create";
    create.seconds = std::chrono::duration<double>(SteadyClock::now() - create_start).count();
    if (!all_created) errors.Add("watch creation timed out after 60s");

    // Phase 2: puts to the watched keys; every watcher of a key gets an event.
    LoopOptions o{"watch put", static_cast<uint64_t>(put_total_), absl::ZeroDuration(),
                  ctx.global->clients, put_rate_};
    IssueFn issue = [&](uint64_t seq, size_t client, DoneFn done) {
      const std::string& key = watched[seq % watched.size()];
      const int expected = watchers.at(key);
      PutRequest req;
      req.set_key(key);
      req.set_value("data");
      const auto start = SteadyClock::now();
      AsyncPut(ctx.pool->Kv(client), std::move(req),
               [&tracker, start, expected, done = std::move(done)](const grpc::Status& s,
                                                                   auto& resp) {
                 if (s.ok()) tracker.WriteCommitted(resp.header().revision(), start, expected);
                 done(s);
               });
    };
    const auto put_start = SteadyClock::now();
    PhaseResult put = RunClosedLoop(o, issue);
    ProgressMonitor progress("watch events", 0, [&] { return tracker.Matched(); },
                             [&] { return errors.Total(); });
    const uint64_t missing = tracker.WaitForAll(std::chrono::seconds(60));
    progress.Stop();
    if (missing > 0) errors.Add(absl::StrCat(missing, " watch events never arrived (waited 60s)"));
    PhaseResult events;
    events.name = "watch event";
    events.latency = event_latency;
    events.seconds = std::chrono::duration<double>(streams.last_event() - put_start).count();
    streams.FinishAll();

    create.latency = create_latency;
    create.error_counts = errors.Snapshot();
    create.errors = errors.Total();
    RunReport r;
    r.workload = "watch";
    r.target = ctx.target;
    r.phases.push_back(std::move(create));
    r.phases.push_back(std::move(put));
    r.phases.push_back(std::move(events));
    return r;
  }

 private:
  int streams_ = 10;
  int per_stream_ = 100;
  int watched_key_total_ = 1;
  double put_rate_ = 0;
  int64_t put_total_ = 1000;
  int key_size_ = 32;
  int64_t key_space_size_ = 1;
  bool seq_keys_ = false;
};

class WatchLatencyWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.Int64("total", &total_, "Total number of put requests");
    f.Double("put-rate", &put_rate_, "Number of keys to put per second");
    f.Int("key-size", &key_size_, "Key size of watch response");
    f.Int("val-size", &val_size_, "Value size of watch response");
    f.Bool("prevkv", &prev_kv_, "Watch with prev_kv (capstan-bench only)");
  }

  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    const std::string key = RandomBytes(key_size_, SteadyClock::now().time_since_epoch().count());
    const std::string value = RandomBytes(val_size_, 3);
    const int watchers = std::max(1, ctx.global->clients);
    Histogram create_latency, event_latency, after_response;
    ErrorCounter errors;
    DeliveryTracker tracker(&event_latency, &after_response);
    TimedWatchStreams streams(&create_latency, &tracker, &errors);
    streams.Open(*ctx.pool, watchers);  // one watcher per client, like etcd's tool
    for (int i = 0; i < watchers; ++i) streams.Create(i, key, "", prev_kv_);
    if (!streams.WaitCreated(std::chrono::seconds(60))) {
      return absl::DeadlineExceededError("watch creation timed out after 60s");
    }
    LoopOptions o{"put", static_cast<uint64_t>(total_), absl::ZeroDuration(), 1, put_rate_};
    IssueFn issue = [&](uint64_t, size_t client, DoneFn done) {
      PutRequest req;
      req.set_key(key);
      req.set_value(value);
      const auto start = SteadyClock::now();
      AsyncPut(ctx.pool->Kv(client), std::move(req),
               [&tracker, start, watchers, done = std::move(done)](const grpc::Status& s,
                                                                   auto& resp) {
                 if (s.ok()) tracker.WriteCommitted(resp.header().revision(), start, watchers);
                 done(s);
               });
    };
    PhaseResult put = RunClosedLoop(o, issue);
    const uint64_t missing = tracker.WaitForAll(std::chrono::seconds(30));
    if (missing > 0) errors.Add(absl::StrCat(missing, " watch events never arrived (waited 30s)"));
    streams.FinishAll();
    PhaseResult events;
    events.name = "watch event";
    events.latency = event_latency;
    events.has_throughput = false;
    events.error_counts = errors.Snapshot();
    events.errors = errors.Total();
    PhaseResult etcd_measure;
    etcd_measure.name = "watch event after put response";
    etcd_measure.latency = after_response;
    etcd_measure.has_throughput = false;
    RunReport r;
    r.workload = "watch-latency";
    r.target = ctx.target;
    r.phases.push_back(std::move(put));
    r.phases.push_back(std::move(events));
    r.phases.push_back(std::move(etcd_measure));
    return r;
  }

 private:
  int64_t total_ = 10000;
  double put_rate_ = 100;
  int key_size_ = 32;
  int val_size_ = 32;
  bool prev_kv_ = false;
};

// One watcher with prev_kv on a prefix; puts to --key-space-size keys under
// it, --clients in flight, paced to --put-rate. Reports the write rate
// achieved, the events received per second, their delivery latency, and
// whether the watcher kept up: every event arrived, each overwrite with its
// previous value, and how long the last event trailed the last put.
class WatchPrefixWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.String("prefix", &prefix_, "Prefix watched and written");
    f.Int64("total", &total_, "Total number of puts");
    f.Double("put-rate", &put_rate_, "Puts per second (0 is no limit)");
    f.Int64("key-space-size", &key_space_size_, "Keys under the prefix (overwritten in turn)");
    f.Int("val-size", &val_size_, "Value size of each put");
  }
  absl::Status Prepare(const std::vector<std::string>&) override {
    if (key_space_size_ < 1 || total_ < 1) {
      return absl::InvalidArgumentError("--key-space-size and --total must be >= 1");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    const std::string value = RandomBytes(val_size_, 5);
    Histogram create_latency, event_latency;
    ErrorCounter errors;
    DeliveryTracker tracker(&event_latency);
    std::atomic<uint64_t> with_prev{0}, overwrites{0};
    TimedWatchStreams streams(&create_latency, &tracker, &errors,
                              [&](const EventSummary& ev) {
                                if (ev.version > 1) {
                                  overwrites.fetch_add(1, std::memory_order_relaxed);
                                  if (ev.has_prev_kv) with_prev.fetch_add(1, std::memory_order_relaxed);
                                }
                              });
    streams.Open(*ctx.pool, 1);
    streams.Create(0, prefix_, PrefixEnd(prefix_), /*prev_kv=*/true);
    if (!streams.WaitCreated(std::chrono::seconds(60))) {
      return absl::DeadlineExceededError("watch creation timed out after 60s");
    }
    LoopOptions o{"put", static_cast<uint64_t>(total_), absl::ZeroDuration(),
                  std::max(1, ctx.global->clients), put_rate_};
    IssueFn issue = [&](uint64_t seq, size_t client, DoneFn done) {
      PutRequest req;
      req.set_key(absl::StrCat(prefix_, static_cast<int64_t>(seq) % key_space_size_));
      req.set_value(value);
      const auto start = SteadyClock::now();
      AsyncPut(ctx.pool->Kv(client), std::move(req),
               [&tracker, start, done = std::move(done)](const grpc::Status& s, auto& resp) {
                 if (s.ok()) tracker.WriteCommitted(resp.header().revision(), start, 1);
                 done(s);
               });
    };
    const auto put_start = SteadyClock::now();
    PhaseResult put = RunClosedLoop(o, issue);
    const auto put_end = SteadyClock::now();
    const uint64_t missing = tracker.WaitForAll(std::chrono::seconds(60));
    if (missing > 0) errors.Add(absl::StrCat(missing, " watch events never arrived (waited 60s)"));
    if (with_prev.load() != overwrites.load()) {
      errors.Add(absl::StrCat(overwrites.load() - with_prev.load(),
                              " overwrite events without prev_kv"));
    }
    const auto last_event = streams.last_event();
    streams.FinishAll();
    PhaseResult events;
    events.name = "watch event";
    events.latency = event_latency;
    events.seconds = std::chrono::duration<double>(last_event - put_start).count();
    events.error_counts = errors.Snapshot();
    events.errors = errors.Total();
    RunReport r;
    r.workload = "watch-prefix";
    r.target = ctx.target;
    const double lag_ms = std::chrono::duration<double, std::milli>(last_event - put_end).count();
    r.extras.push_back({"last event after last put", std::max(0.0, lag_ms), "ms", false});
    r.extras.push_back({"overwrite events with prev_kv", static_cast<double>(with_prev.load()),
                        "events", true});
    r.phases.push_back(std::move(put));
    r.phases.push_back(std::move(events));
    return r;
  }

 private:
  std::string prefix_ = "/bench/watch-prefix/";
  int64_t total_ = 100000;
  double put_rate_ = 20000;
  int64_t key_space_size_ = 10000;
  int val_size_ = 256;
};

}  // namespace

std::unique_ptr<Workload> NewWatchPrefixWorkload() {
  return std::make_unique<WatchPrefixWorkload>();
}

std::unique_ptr<Workload> NewWatchWorkload() { return std::make_unique<WatchWorkload>(); }
std::unique_ptr<Workload> NewWatchLatencyWorkload() {
  return std::make_unique<WatchLatencyWorkload>();
}

}  // namespace capstan::bench
