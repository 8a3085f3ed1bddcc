// put, range, txn-put and txn-mixed: etcd's benchmark commands of those names
// (tools/benchmark/cmd in etcd 3.4; txn-mixed from 3.5), same flags, same
// requests, same keys.

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/keys.h"
#include "bench/loadgen/load_driver.h"
#include "bench/loadgen/workload.h"

namespace capstan::bench {

namespace {

using etcdserverpb::PutRequest;
using etcdserverpb::RangeRequest;
using etcdserverpb::TxnRequest;

absl::Status CheckKeySpace(int key_space_size) {
  if (key_space_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected positive --key-space-size, got (", key_space_size, ")"));
  }
  return absl::OkStatus();
}

RunReport NewReport(const std::string& workload, const BenchContext& ctx) {
  RunReport r;
  r.workload = workload;
  r.target = ctx.target;
  return r;
}

// Compacts every `interval` (none when it is zero) at the revision of a Get
// of "foo" minus `delta` (at least 0), on client 0's connection, as etcd's
// benchmark does for put --compact-interval, until Stop.
class PeriodicCompactor {
 public:
  PeriodicCompactor(BenchContext& ctx, absl::Duration interval, int64_t delta) {
    if (interval <= absl::ZeroDuration()) return;
    thread_ = std::thread([this, &ctx, interval, delta] {
      for (;;) {
        {
          absl::MutexLock l(&mu_);
          if (mu_.AwaitWithTimeout(absl::Condition(&stop_), interval)) return;
        }
        absl::Status s = CompactOnce(ctx, delta);
        if (!s.ok()) {
          absl::MutexLock l(&mu_);
          error_ = s;
          return;
        }
      }
    });
  }
  ~PeriodicCompactor() { Stop().IgnoreError(); }
  // Ends the compactions; the error of the first that failed, or OK.
  absl::Status Stop() {
    {
      absl::MutexLock l(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock l(&mu_);
    return error_;
  }

 private:
  static absl::Status CompactOnce(BenchContext& ctx, int64_t delta) {
    RangeRequest get;
    get.set_key("foo");
    etcdserverpb::RangeResponse got;
    grpc::ClientContext get_ctx;
    get_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::Status s = ctx.pool->Kv(0).Range(&get_ctx, get, &got);
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("compaction's Get: ", s.error_message()));
    etcdserverpb::CompactionRequest req;
    req.set_revision(std::max<int64_t>(0, got.header().revision() - delta));
    etcdserverpb::CompactionResponse resp;
    grpc::ClientContext compact_ctx;
    compact_ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    s = ctx.pool->Kv(0).Compact(&compact_ctx, req, &resp);
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("Compact: ", s.error_message()));
    return absl::OkStatus();
  }

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

// humanize.Bytes, as etcd's tool prints sizes: SI units, one decimal
// below 10.
std::string HumanizeBytes(uint64_t n) {
  if (n < 10) return absl::StrCat(n, " B");
  static const char* const kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
  int e = 0;
  double v = static_cast<double>(n);
  while (v >= 1000 && e < 6) {
    v /= 1000;
    ++e;
  }
  v = std::floor(v * 10 + 0.5) / 10;
  return v < 10 ? absl::StrFormat("%.1f %s", v, kUnits[e]) : absl::StrFormat("%.0f %s", v, kUnits[e]);
}

// put --check-hashkv: etcd's tool's "HashKV Summary:" of the first endpoint
// (HashKV at the current revision, asked twice as etcd's tool asks it, and
// the member's database size from Status).
absl::StatusOr<std::string> HashKvSummary(BenchContext& ctx) {
  const std::string host = ctx.global->endpoints.front();
  const absl::Time start = absl::Now();
  etcdserverpb::HashKVResponse hash;
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext c;
    SetDeadline(&c);
    grpc::Status s = ctx.pool->Maintenance(0).HashKV(&c, etcdserverpb::HashKVRequest(), &hash);
    if (!s.ok()) {
      return absl::UnavailableError(absl::StrCat("Failed to get the hashkv of endpoint ", host,
                                                 " (", s.error_message(), ")"));
    }
  }
  etcdserverpb::StatusResponse status;
  grpc::ClientContext c;
  SetDeadline(&c);
  grpc::Status s = ctx.pool->Maintenance(0).Status(&c, etcdserverpb::StatusRequest(), &status);
  if (!s.ok()) {
    return absl::UnavailableError(absl::StrCat("Failed to get the status of endpoint ", host, " (",
                                               s.error_message(), ")"));
  }
  return absl::StrCat("HashKV Summary:\n\tHashKV: ", hash.hash(), "\n\tEndpoint: ", host,
                      "\n\tTime taken to get hashkv: ", absl::FormatDuration(absl::Now() - start),
                      "\n\tDB size: ", HumanizeBytes(static_cast<uint64_t>(status.dbsize())));
}

class PutWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.Int("key-size", &key_size_, "Key size of put request");
    f.Int("val-size", &val_size_, "Value size of put request");
    f.Double("rate", &rate_, "Maximum puts per second (0 is no limit)");
    f.Int64("total", &total_, "Total number of put requests");
    f.Int64("key-space-size", &key_space_size_, "Maximum possible keys");
    f.Bool("sequential-keys", &seq_keys_, "Use sequential keys");
    f.Duration("duration", &duration_, "Stop after this long instead of after --total (0: off)");
    f.Duration("compact-interval", &compact_interval_,
               "Interval to compact database (do not duplicate this with etcd's "
               "'auto-compaction-retention' flag) (e.g. --compact-interval=5m compacts every "
               "5-minute)");
    f.Int64("compact-index-delta", &compact_index_delta_,
            "Delta between current revision and compact revision (e.g. current revision 10000, "
            "compact at 9000)");
    f.Bool("check-hashkv", &check_hashkv_, "'true' to check hashkv");
  }
  absl::Status Prepare(const std::vector<std::string>&) override {
    return CheckKeySpace(static_cast<int>(std::min<int64_t>(key_space_size_, INT32_MAX)));
  }
  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    const std::string value = RandomBytes(val_size_, 1);
    LoopOptions o{"put", duration_ > absl::ZeroDuration() ? 0 : static_cast<uint64_t>(total_),
                  duration_, ctx.global->clients, rate_};
    IssueFn issue = [&](uint64_t seq, size_t client, DoneFn done) {
      PutRequest req;
      const int64_t index = seq_keys_ ? static_cast<int64_t>(seq % key_space_size_)
                                      : RandomIndex(key_space_size_);
      req.set_key(EtcdBenchKey(index, key_size_));
      req.set_value(value);
      AsyncPut(ctx.pool->Kv(client), std::move(req),
               [done = std::move(done)](const grpc::Status& s, auto&) { done(s); });
    };
    RunReport r = NewReport("put", ctx);
    {
      // etcd's tool compacts on the first client's connection every
      // --compact-interval while the puts run, and stops with the error of
      // a compaction that fails.
      PeriodicCompactor compactor(ctx, compact_interval_, compact_index_delta_);
      r.phases.push_back(RunClosedLoop(o, issue));
      if (absl::Status s = compactor.Stop(); !s.ok()) return s;
    }
    if (check_hashkv_) {
      auto summary = HashKvSummary(ctx);
      if (!summary.ok()) return summary.status();
      r.text.push_back(*std::move(summary));
    }
    return r;
  }

 private:
  int key_size_ = 8;
  int val_size_ = 8;
  double rate_ = 0;
  int64_t total_ = 10000;
  int64_t key_space_size_ = 1;
  bool seq_keys_ = false;
  absl::Duration duration_ = absl::ZeroDuration();
  absl::Duration compact_interval_ = absl::ZeroDuration();
  int64_t compact_index_delta_ = 1000;
  bool check_hashkv_ = false;
};

// Writes n keys (`key` itself when n is 1, else key + 8-digit index) with
// val_size-byte values, with the given concurrency. Returns the failures.
uint64_t Populate(BenchContext& ctx, const std::string& key, int64_t n, int val_size) {
  if (n <= 0) return 0;
  const std::string value = RandomBytes(val_size, 2);
  LoopOptions o{"populate", static_cast<uint64_t>(n), absl::ZeroDuration(),
                std::max(ctx.global->clients, 1), 0};
  IssueFn issue = [&](uint64_t seq, size_t client, DoneFn done) {
    PutRequest req;
    req.set_key(n == 1 ? key : absl::StrFormat("%s%08d", key, seq));
    req.set_value(value);
    AsyncPut(ctx.pool->Kv(client), std::move(req),
             [done = std::move(done)](const grpc::Status& s, auto&) { done(s); });
  };
  return RunClosedLoop(o, issue).errors;
}

class RangeWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.Double("rate", &rate_, "Maximum range requests per second (0 is no limit)");
    f.Int64("total", &total_, "Total number of range requests");
    f.String("consistency", &consistency_, "Linearizable(l) or Serializable(s)");
    f.Int64("limit", &limit_, "Range result limit (0: none)");
    f.Int64("populate", &populate_,
            "Before measuring, write this many keys: the key itself when 1, else key + "
            "8-digit index (capstan-bench only)");
    f.Int("val-size", &val_size_, "Value size of the populated keys");
    f.Bool("prefix", &prefix_, "Range over every key with the given key as prefix");
    f.Duration("duration", &duration_, "Stop after this long instead of after --total (0: off)");
  }
  absl::Status Prepare(const std::vector<std::string>& args) override {
    if (args.empty() || args.size() > 2) {
      return absl::InvalidArgumentError("usage: range key [end-range]");
    }
    key_ = args[0];
    end_ = args.size() == 2 ? args[1] : (prefix_ ? PrefixEnd(key_) : "");
    if (consistency_ != "l" && consistency_ != "s") {
      return absl::InvalidArgumentError("--consistency must be l or s");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    RunReport r = NewReport("range", ctx);
    if (uint64_t failed = Populate(ctx, key_, populate_, val_size_); failed > 0) {
      return absl::UnavailableError(absl::StrCat(failed, " puts failed while populating"));
    }
    LoopOptions o{"range", duration_ > absl::ZeroDuration() ? 0 : static_cast<uint64_t>(total_),
                  duration_, ctx.global->clients, rate_};
    IssueFn issue = [&](uint64_t, size_t client, DoneFn done) {
      RangeRequest req;
      req.set_key(key_);
      req.set_range_end(end_);
      req.set_limit(limit_);
      req.set_serializable(consistency_ == "s");
      AsyncRangeSummary(ctx.pool->Channel(client), std::move(req),
                        [done = std::move(done)](const grpc::Status& s, auto&) { done(s); });
    };
    r.phases.push_back(RunClosedLoop(o, issue));
    r.notes.push_back(consistency_ == "l" ? "bench with linearizable range"
                                          : "bench with serializable range");
    return r;
  }

 private:
  double rate_ = 0;
  int64_t total_ = 10000;
  std::string consistency_ = "l";
  int64_t limit_ = 0;
  int64_t populate_ = 0;
  int val_size_ = 8;
  bool prefix_ = false;
  absl::Duration duration_ = absl::ZeroDuration();
  std::string key_, end_;
};

class TxnPutWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.Int("key-size", &key_size_, "Key size of txn put");
    f.Int("val-size", &val_size_, "Value size of txn put");
    f.Int("txn-ops", &ops_, "Number of puts per txn");
    f.Double("rate", &rate_, "Maximum txns per second (0 is no limit)");
    f.Int64("total", &total_, "Total number of txn requests");
    f.Int64("key-space-size", &key_space_size_, "Maximum possible keys");
    f.Duration("duration", &duration_, "Stop after this long instead of after --total (0: off)");
  }
  absl::Status Prepare(const std::vector<std::string>&) override {
    if (ops_ < 1) return absl::InvalidArgumentError("--txn-ops must be at least 1");
    return CheckKeySpace(static_cast<int>(std::min<int64_t>(key_space_size_, INT32_MAX)));
  }
  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    const std::string value = RandomBytes(val_size_, 1);
    LoopOptions o{"txn-put", duration_ > absl::ZeroDuration() ? 0 : static_cast<uint64_t>(total_),
                  duration_, ctx.global->clients, rate_};
    IssueFn issue = [&](uint64_t seq, size_t client, DoneFn done) {
      TxnRequest req;
      for (int j = 0; j < ops_; ++j) {
        auto* put = req.add_success()->mutable_request_put();
        put->set_key(EtcdBenchKey(static_cast<int64_t>((seq * ops_ + j) % key_space_size_),
                                  key_size_));
        put->set_value(value);
      }
      AsyncTxn(ctx.pool->Kv(client), std::move(req),
               [done = std::move(done)](const grpc::Status& s, auto&) { done(s); });
    };
    RunReport r = NewReport("txn-put", ctx);
    r.phases.push_back(RunClosedLoop(o, issue));
    return r;
  }

 private:
  int key_size_ = 8;
  int val_size_ = 8;
  int ops_ = 1;
  double rate_ = 0;
  int64_t total_ = 10000;
  int64_t key_space_size_ = 1;
  absl::Duration duration_ = absl::ZeroDuration();
};

class TxnMixedWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.Int("key-size", &key_size_, "Key size of mixed txn");
    f.Int("val-size", &val_size_, "Value size of mixed txn");
    f.Double("rate", &rate_, "Maximum txns per second (0 is no limit)");
    f.Int64("total", &total_, "Total number of txn requests");
    f.String("end-key", &end_key_,
             "Read operation range end key. By default, we do full range query with the default "
             "limit of 1000.");
    f.Int64("limit", &limit_, "Read operation range result limit");
    f.Int64("key-space-size", &key_space_size_, "Maximum possible keys");
    f.String("consistency", &consistency_, "Linearizable(l) or Serializable(s)");
    f.Double("rw-ratio", &rw_ratio_, "Read/write ops ratio");
  }
  absl::Status Prepare(const std::vector<std::string>&) override {
    if (consistency_ != "l" && consistency_ != "s") {
      return absl::InvalidArgumentError("--consistency must be l or s");
    }
    return CheckKeySpace(static_cast<int>(std::min<int64_t>(key_space_size_, INT32_MAX)));
  }
  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    const std::string value = RandomBytes(val_size_, 1);
    Histogram reads, writes;
    std::atomic<uint64_t> read_ops{0}, write_ops{0};
    const double read_share = rw_ratio_ / (1 + rw_ratio_);
    LoopOptions o{"txn-mixed", static_cast<uint64_t>(total_), absl::ZeroDuration(),
                  ctx.global->clients, rate_};
    IssueFn issue = [&](uint64_t seq, size_t client, DoneFn done) {
      TxnRequest req;
      const bool read = std::uniform_real_distribution<double>(0, 1)(ThreadRng()) < read_share;
      if (read) {
        // clientv3.OpGet("", WithRange(end), WithPrefix(), WithLimit(limit)):
        // WithPrefix on an empty key wins and means every key.
        auto* range = req.add_success()->mutable_request_range();
        range->set_key(std::string(1, '\0'));
        range->set_range_end(std::string(1, '\0'));
        range->set_limit(limit_);
        range->set_serializable(consistency_ == "s");
        read_ops.fetch_add(1);
      } else {
        auto* put = req.add_success()->mutable_request_put();
        put->set_key(EtcdBenchKey(static_cast<int64_t>(seq % key_space_size_), key_size_));
        put->set_value(value);
        write_ops.fetch_add(1);
      }
      const auto start = SteadyClockNow();
      AsyncTxn(ctx.pool->Kv(client), std::move(req),
               [&, read, start, done = std::move(done)](const grpc::Status& s, auto&) {
                 if (s.ok()) (read ? reads : writes).Record(SteadyClockNow() - start);
                 done(s);
               });
    };
    PhaseResult all = RunClosedLoop(o, issue);
    RunReport r = NewReport("txn-mixed", ctx);
    PhaseResult read_phase, write_phase;
    read_phase.name = "txn-mixed read";
    read_phase.latency = reads;
    read_phase.seconds = all.seconds;
    write_phase.name = "txn-mixed write";
    write_phase.latency = writes;
    write_phase.seconds = all.seconds;
    write_phase.errors = all.errors;  // errors are not split by kind
    write_phase.error_counts = all.error_counts;
    r.phases.push_back(std::move(read_phase));
    r.phases.push_back(std::move(write_phase));
    r.notes.push_back(absl::StrCat("Total Read Ops: ", read_ops.load(),
                                   ", Total Write Ops: ", write_ops.load()));
    return r;
  }

 private:
  static uint64_t SteadyClockNow() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }

  int key_size_ = 8;
  int val_size_ = 8;
  double rate_ = 0;
  int64_t total_ = 10000;
  std::string end_key_;
  int64_t limit_ = 1000;
  int64_t key_space_size_ = 1;
  std::string consistency_ = "l";
  double rw_ratio_ = 1;
};

}  // namespace

std::unique_ptr<Workload> NewPutWorkload() { return std::make_unique<PutWorkload>(); }
std::unique_ptr<Workload> NewRangeWorkload() { return std::make_unique<RangeWorkload>(); }
std::unique_ptr<Workload> NewTxnPutWorkload() { return std::make_unique<TxnPutWorkload>(); }
std::unique_ptr<Workload> NewTxnMixedWorkload() { return std::make_unique<TxnMixedWorkload>(); }

}  // namespace capstan::bench
