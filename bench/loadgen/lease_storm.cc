// lease-storm: many leases held with keep-alives, then a burst of them
// expiring within the same second, while puts run at a steady rate.
//
//  1. Grants --leases leases: all but --expiring of them with --ttl, then
//     the --expiring ones with --expiring-ttl, each holding one key under
//     /storm/e/.
//  2. Keeps every lease alive over --keepalive-streams long-lived
//     LeaseKeepAlive streams, each lease renewed every third of its TTL as
//     clientv3's KeepAlive loop does (after one sweep of all of them as fast
//     as the streams go).
//  3. Puts at --put-rate (open loop); after --settle, for --idle: the idle
//     put latency. Keep-alive latency is timed from then on.
//  4. Renews the expiring leases once more as fast as it can, then never
//     again: they all expire within that sweep's duration (the expiry
//     spread). A watch on /storm/e/ sees each revocation as a delete.
//  5. Waits until every expiring key is deleted: the revoke time runs from
//     the first lease's deadline to the last delete, and is compared with
//     what the server's revoke rate allows (--revoke-rate, leases/s). The
//     put latency from the first deadline to the last delete is the storm's.
//
// A lease kept alive that the server answers with TTL 0 was lost: an error.

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/keys.h"
#include "bench/loadgen/load_driver.h"
#include "bench/loadgen/streams.h"
#include "bench/loadgen/workload.h"

namespace capstan::bench {

namespace {

using etcdserverpb::LeaseKeepAliveRequest;
using etcdserverpb::LeaseKeepAliveResponse;

uint64_t NanosBetween(SteadyClock::time_point from, SteadyClock::time_point to) {
  return static_cast<uint64_t>(
      std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count()));
}

double SecondsBetween(SteadyClock::time_point from, SteadyClock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Keep-alive streams with their requests' send times (a stream answers in
// order), the latency of every renewal, and the leases found gone.
class KeepAlives {
 public:
  KeepAlives(ConnectionPool& pool, int streams, ErrorCounter* errors) : errors_(errors) {
    for (int i = 0; i < streams; ++i) {
      auto s = std::make_unique<Stream>();
      Stream* raw = s.get();
      s->stream = std::make_unique<KeepAliveStream>(
          pool.Lease(i), [this, raw](const LeaseKeepAliveResponse& r) { OnResponse(raw, r); });
      streams_.push_back(std::move(s));
    }
  }
  ~KeepAlives() { FinishAll(); }

  void Renew(int64_t id) {
    Stream& s = *streams_[next_.fetch_add(1, std::memory_order_relaxed) % streams_.size()];
    {
      std::lock_guard<std::mutex> l(s.mu);
      s.sent.push_back(SteadyClock::now());
    }
    sent_.fetch_add(1, std::memory_order_relaxed);
    LeaseKeepAliveRequest req;
    req.set_id(id);
    s.stream->Send(std::move(req));
  }

  // Renewals answered from now on are timed.
  void StartMeasuring() { measuring_ = true; }
  uint64_t sent() const { return sent_.load(); }
  uint64_t answered() const { return answered_.load(); }
  Histogram& latency() { return latency_; }

  // Waits until every renewal sent so far is answered; false on timeout.
  bool WaitAnswered(std::chrono::milliseconds timeout) {
    const auto deadline = SteadyClock::now() + timeout;
    const uint64_t want = sent();
    while (answered() < want) {
      if (SteadyClock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }

  void FinishAll() {
    for (auto& s : streams_) {
      grpc::Status st;
      if (s->stream->Broken(&st)) errors_->Add(st);
      s->stream->Finish();
    }
    streams_.clear();
  }

 private:
  struct Stream {
    std::unique_ptr<KeepAliveStream> stream;
    std::mutex mu;
    std::deque<SteadyClock::time_point> sent;  // guarded by mu
  };

  void OnResponse(Stream* s, const LeaseKeepAliveResponse& r) {
    const auto now = SteadyClock::now();
    SteadyClock::time_point sent;
    {
      std::lock_guard<std::mutex> l(s->mu);
      if (s->sent.empty()) return;
      sent = s->sent.front();
      s->sent.pop_front();
    }
    if (measuring_.load(std::memory_order_relaxed)) latency_.Record(NanosBetween(sent, now));
    if (r.ttl() <= 0) errors_->Add(absl::StrCat("kept-alive lease ", r.id(), " was gone"));
    answered_.fetch_add(1, std::memory_order_relaxed);
  }

  ErrorCounter* const errors_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::atomic<size_t> next_{0};
  std::atomic<uint64_t> sent_{0}, answered_{0};
  std::atomic<bool> measuring_{false};
  Histogram latency_;
};

class LeaseStormWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.Int64("leases", &leases_, "Leases held with keep-alives, the expiring ones included");
    f.Int64("expiring", &expiring_, "Leases that stop being kept alive at once");
    f.Int64("ttl", &ttl_, "TTL of the leases kept alive (s)");
    f.Int64("expiring-ttl", &expiring_ttl_, "TTL of the expiring leases (s)");
    f.Int("keepalive-streams", &streams_, "LeaseKeepAlive streams");
    f.Double("put-rate", &put_rate_, "Puts per second during the run (open loop)");
    f.Duration("settle", &settle_, "Puts and keep-alives run this long before anything is measured");
    f.Duration("idle", &idle_, "How long puts are measured before the storm");
    f.Double("revoke-rate", &revoke_rate_,
             "The server's lease revoke rate (leases/s), for the time revocation should take");
    f.Duration("timeout", &timeout_, "How long to wait for every expiring lease to be revoked");
  }

  absl::Status Prepare(const std::vector<std::string>&) override {
    if (expiring_ < 1 || leases_ < expiring_ || ttl_ < 3 || expiring_ttl_ < 3 || streams_ < 1 ||
        put_rate_ <= 0 || revoke_rate_ <= 0) {
      return absl::InvalidArgumentError(
          "need 1 <= --expiring <= --leases, TTLs >= 3, --keepalive-streams >= 1, "
          "positive --put-rate and --revoke-rate");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    ErrorCounter errors;
    const int clients = std::max(1, ctx.global->clients);
    RunReport r;
    r.workload = "lease-storm";
    r.target = ctx.target;

    // 1. Grants, and the expiring leases' keys. ids[0, expiring) are the
    // expiring leases; they are granted last, so that their short TTL is
    // not spent while the others are granted.
    std::vector<int64_t> ids(leases_);
    LoopOptions go{"lease grant", static_cast<uint64_t>(leases_), absl::ZeroDuration(), clients, 0};
    r.phases.push_back(RunClosedLoop(go, [&](uint64_t seq, size_t client, DoneFn done) {
      const int64_t index = (static_cast<int64_t>(seq) + expiring_) % leases_;
      etcdserverpb::LeaseGrantRequest req;
      req.set_ttl(index < expiring_ ? expiring_ttl_ : ttl_);
      AsyncLeaseGrant(ctx.pool->Lease(client), std::move(req),
                      [&ids, index, done = std::move(done)](const grpc::Status& s, auto& resp) {
                        if (s.ok()) ids[index] = resp.id();
                        done(s);
                      });
    }));
    LoopOptions ko{"attach key", static_cast<uint64_t>(expiring_), absl::ZeroDuration(), clients, 0};
    r.phases.push_back(RunClosedLoop(ko, [&](uint64_t seq, size_t client, DoneFn done) {
      etcdserverpb::PutRequest req;
      req.set_key(absl::StrCat("/storm/e/", seq));
      req.set_value("v");
      req.set_lease(ids[seq]);
      AsyncPut(ctx.pool->Kv(client), std::move(req),
               [done = std::move(done)](const grpc::Status& s, auto&) { done(s); });
    }));
    if (r.TotalErrors() > 0) return r;

    // The revocations, seen as deletes.
    std::atomic<int64_t> deletes{0};
    std::atomic<int64_t> first_delete_ns{0}, last_delete_ns{0};
    WatchStream watch(ctx.pool->Watch(0), [&](const etcdserverpb::WatchResponse& resp) {
      const int64_t now = SteadyClock::now().time_since_epoch().count();
      int n = 0;
      for (const auto& ev : resp.events()) n += ev.type() == mvccpb::Event::DELETE;
      if (n == 0) return;
      int64_t zero = 0;
      first_delete_ns.compare_exchange_strong(zero, now);
      last_delete_ns.store(now);
      deletes.fetch_add(n);
    });
    {
      etcdserverpb::WatchRequest req;
      req.mutable_create_request()->set_key("/storm/e/");
      req.mutable_create_request()->set_range_end(PrefixEnd("/storm/e/"));
      watch.Send(std::move(req));
    }

    // 2. Keep-alives: one sweep of all (the expiring ones first), then every
    // lease every third of its TTL.
    KeepAlives keepalives(*ctx.pool, streams_, &errors);
    const auto sweep_start = SteadyClock::now();
    for (int64_t id : ids) keepalives.Renew(id);
    if (!keepalives.WaitAnswered(std::chrono::seconds(60))) {
      errors.Add("the first keep-alive sweep took more than 60 s");
    }
    const double first_sweep_s = SecondsBetween(sweep_start, SteadyClock::now());
    std::atomic<bool> keep_expiring{true}, stop_pacer{false};
    std::thread pacer([&] { Pace(ids, keepalives, keep_expiring, stop_pacer); });

    // 3. Puts at a steady rate; each latency goes to the window it started in.
    enum Window { kIdle, kBetween, kStorm, kAfter };
    std::atomic<int> window{kBetween};
    Histogram put_idle, put_storm;
    std::atomic<bool> stop_puts{false};
    std::atomic<int64_t> puts_in_flight{0};
    std::thread putter([&] {
      const auto interval = std::chrono::nanoseconds(static_cast<int64_t>(1e9 / put_rate_));
      auto next = SteadyClock::now();
      for (uint64_t seq = 0; !stop_puts.load(); ++seq) {
        std::this_thread::sleep_until(next);
        next += interval;
        const int w = window.load();
        etcdserverpb::PutRequest req;
        req.set_key(absl::StrCat("/storm/p/", seq % 1000));
        req.set_value("v");
        const auto start = SteadyClock::now();
        puts_in_flight.fetch_add(1);
        AsyncPut(ctx.pool->Kv(seq), std::move(req), [&, w, start](const grpc::Status& s, auto&) {
          if (!s.ok()) {
            errors.Add(s);
          } else if (w == kIdle) {
            put_idle.Record(NanosBetween(start, SteadyClock::now()));
          } else if (w == kStorm) {
            put_storm.Record(NanosBetween(start, SteadyClock::now()));
          }
          puts_in_flight.fetch_sub(1);
        });
      }
    });
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(settle_));
    window = kIdle;
    keepalives.StartMeasuring();
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(idle_));

    // 4. The last renewal of the expiring leases.
    window = kBetween;
    keep_expiring = false;
    const auto final_start = SteadyClock::now();
    for (int64_t i = 0; i < expiring_; ++i) keepalives.Renew(ids[i]);
    if (!keepalives.WaitAnswered(std::chrono::seconds(60))) {
      errors.Add("the last renewal of the expiring leases took more than 60 s");
    }
    const auto final_end = SteadyClock::now();
    const auto first_deadline = final_start + std::chrono::seconds(expiring_ttl_);
    std::this_thread::sleep_until(first_deadline);

    // 5. The storm.
    window = kStorm;
    const auto wait_until = first_deadline + absl::ToChronoNanoseconds(timeout_);
    while (deletes.load() < expiring_ && SteadyClock::now() < wait_until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    window = kAfter;
    stop_puts = true;
    putter.join();
    stop_pacer = true;
    pacer.join();
    const auto drain_until = SteadyClock::now() + std::chrono::seconds(30);
    while (puts_in_flight.load() > 0 && SteadyClock::now() < drain_until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    keepalives.WaitAnswered(std::chrono::seconds(10));
    keepalives.FinishAll();
    watch.Finish();
    if (deletes.load() < expiring_) {
      errors.Add(absl::StrCat(expiring_ - deletes.load(), " expiring leases not revoked within ",
                              absl::FormatDuration(timeout_), " of their deadline"));
    }

    const SteadyClock::time_point last_delete{SteadyClock::duration(last_delete_ns.load())};
    const SteadyClock::time_point first_delete{SteadyClock::duration(first_delete_ns.load())};
    PhaseResult idle;
    idle.name = "put (idle)";
    idle.latency = put_idle;
    idle.seconds = absl::ToDoubleSeconds(idle_);
    PhaseResult storm;
    storm.name = "put (storm)";
    storm.latency = put_storm;
    storm.seconds = last_delete_ns.load() > 0 ? SecondsBetween(first_deadline, last_delete) : 0;
    storm.error_counts = errors.Snapshot();
    storm.errors = errors.Total();
    PhaseResult ka;
    ka.name = "keepalive";
    ka.latency = keepalives.latency();
    ka.has_throughput = false;
    r.phases.push_back(std::move(idle));
    r.phases.push_back(std::move(storm));
    r.phases.push_back(std::move(ka));

    const double revoke_s = last_delete_ns.load() > 0 ? SecondsBetween(first_deadline, last_delete) : 0;
    const double spread_s = SecondsBetween(final_start, final_end);
    const double idle_p99 = put_idle.Percentile(99) / 1e6;
    const double storm_p99 = put_storm.Percentile(99) / 1e6;
    r.extras.push_back({"first keep-alive sweep", first_sweep_s, "s", false});
    r.extras.push_back({"expiry spread (last renewal sweep)", spread_s, "s", false});
    r.extras.push_back({"revoke time (first deadline -> last delete)", revoke_s, "s", false});
    r.extras.push_back({"revoke time the rate allows", expiring_ / revoke_rate_, "s", false});
    if (last_delete_ns.load() > first_delete_ns.load()) {
      r.extras.push_back({"revocations/s (first -> last delete)",
                          deletes.load() / SecondsBetween(first_delete, last_delete), "leases/s",
                          true});
    }
    r.extras.push_back({"expiring keys deleted", static_cast<double>(deletes.load()), "keys", true});
    if (idle_p99 > 0) {
      r.extras.push_back({"put p99 storm/idle", storm_p99 / idle_p99, "x", false});
    }
    r.notes.push_back(absl::StrCat(
        "revoke time ", FormatNumber(revoke_s), " s for ", expiring_, " leases; at ",
        FormatNumber(revoke_rate_), "/s the rate allows ", FormatNumber(expiring_ / revoke_rate_),
        " s (plus the server's check interval); put p99 idle ", FormatNumber(idle_p99),
        " ms, storm ", FormatNumber(storm_p99), " ms"));
    return r;
  }

 private:
  // Renews the kept leases every ttl/3 and, while keep_expiring, the
  // expiring ones every expiring_ttl/3, spread evenly over time.
  void Pace(const std::vector<int64_t>& ids, KeepAlives& keepalives,
            const std::atomic<bool>& keep_expiring, const std::atomic<bool>& stop) {
    struct Group {
      int64_t from, to;  // ids[from, to)
      double per_second;
      double due = 0;
      int64_t next;
    };
    Group groups[2] = {
        {0, expiring_, 3.0 * expiring_ / expiring_ttl_, 0, 0},
        {expiring_, leases_, 3.0 * (leases_ - expiring_) / ttl_, 0, expiring_},
    };
    auto last = SteadyClock::now();
    while (!stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      const auto now = SteadyClock::now();
      const double dt = SecondsBetween(last, now);
      last = now;
      for (int g = 0; g < 2; ++g) {
        Group& gr = groups[g];
        if (gr.to <= gr.from || (g == 0 && !keep_expiring.load())) continue;
        gr.due += dt * gr.per_second;
        for (; gr.due >= 1; gr.due -= 1) {
          keepalives.Renew(ids[gr.next]);
          if (++gr.next == gr.to) gr.next = gr.from;
        }
      }
    }
  }

  int64_t leases_ = 100000;
  int64_t expiring_ = 10000;
  int64_t ttl_ = 60;
  int64_t expiring_ttl_ = 15;
  int streams_ = 10;
  double put_rate_ = 200;
  absl::Duration settle_ = absl::Seconds(3);
  absl::Duration idle_ = absl::Seconds(5);
  double revoke_rate_ = 1000;
  absl::Duration timeout_ = absl::Seconds(120);
};

}  // namespace

std::unique_ptr<Workload> NewLeaseStormWorkload() { return std::make_unique<LeaseStormWorkload>(); }

}  // namespace capstan::bench
