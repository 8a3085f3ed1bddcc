// compaction: what a large compaction costs the requests running beside it.
//
// Writes --keys keys twice (in txns of --load-batch puts, so loading a
// million keys takes seconds, not minutes), which leaves one stale revision
// per key; then runs single-key puts and linearizable single-key ranges at
// --rate each, first alone and then while a physical Compact at the current
// revision removes every stale revision. The latency of those requests
// during the compaction, above all its max, is the measure: the index
// compaction must not stop the world (etcd#9511).

#include <atomic>
#include <chrono>
#include <thread>

#include "absl/strings/str_format.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/fill.h"
#include "bench/loadgen/keys.h"
#include "bench/loadgen/load_driver.h"
#include "bench/loadgen/workload.h"

namespace capstan::bench {

namespace {

class CompactionWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.Int64("keys", &keys_, "Keys written (each twice) before the compaction");
    f.Int("val-size", &val_size_, "Value size of every write, bytes");
    f.Int("load-batch", &load_batch_, "Puts per txn while loading (etcd's --max-txn-ops is 128)");
    f.Double("rate", &rate_, "Puts per second, and as many ranges, beside the compaction");
    f.Duration("idle-duration", &idle_, "Length of the phase with no compaction running");
  }
  absl::Status Prepare(const std::vector<std::string>&) override {
    if (keys_ < 1 || val_size_ < 0 || load_batch_ < 1 || load_batch_ > 128 || rate_ <= 0) {
      return absl::InvalidArgumentError("compaction: bad --keys, --val-size, --load-batch or --rate");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    RunReport r;
    r.workload = "compaction";
    r.target = ctx.target;
    auto key_of = [](int64_t i) -> std::string {
      return absl::StrFormat("/compaction/key-%09d", i);
    };
    const std::string value(static_cast<size_t>(val_size_), 'v');

    // Two generations of every key.
    for (int generation = 1; generation <= 2; ++generation) {
      r.phases.push_back(FillKeys(
          ctx, absl::StrFormat("load, generation %d (txns of %d puts)", generation, load_batch_),
          keys_, load_batch_, key_of, value));
    }

    IssueFn put = [&](uint64_t, size_t client, DoneFn done) {
      etcdserverpb::PutRequest req;
      req.set_key(key_of(RandomIndex(keys_)));
      req.set_value(value);
      AsyncPut(ctx.pool->Kv(client), std::move(req),
               [done = std::move(done)](const grpc::Status& s, auto&) { done(s); });
    };
    IssueFn range = [&](uint64_t, size_t client, DoneFn done) {
      etcdserverpb::RangeRequest req;
      req.set_key(key_of(RandomIndex(keys_)));
      AsyncRange(ctx.pool->Kv(client), std::move(req),
                 [done = std::move(done)](const grpc::Status& s, auto&) { done(s); });
    };
    const int clients = std::max(1, std::min(ctx.global->clients, 16));
    // Puts and ranges side by side until `stop` (or for `duration`).
    auto run_beside = [&](const std::string& when, absl::Duration duration,
                          const std::atomic<bool>* stop) {
      PhaseResult puts, ranges;
      std::thread t([&] {
        ranges = RunClosedLoop({"range " + when, 0, duration, clients, rate_, stop}, range);
      });
      puts = RunClosedLoop({"put " + when, 0, duration, clients, rate_, stop}, put);
      t.join();
      r.phases.push_back(std::move(puts));
      r.phases.push_back(std::move(ranges));
    };
    run_beside("(no compaction)", idle_, nullptr);

    // The compaction, with the same load beside it from just before it starts
    // until just after it returns.
    std::atomic<bool> stop{false};
    double compact_seconds = 0;
    grpc::Status compact_status;
    std::thread compactor([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      etcdserverpb::RangeRequest probe;
      probe.set_key(key_of(0));
      etcdserverpb::RangeResponse head;
      grpc::ClientContext probe_ctx;
      compact_status = ctx.pool->Kv(0).Range(&probe_ctx, probe, &head);
      if (compact_status.ok()) {
        etcdserverpb::CompactionRequest req;
        req.set_revision(head.header().revision());
        req.set_physical(true);
        etcdserverpb::CompactionResponse resp;
        grpc::ClientContext compact_ctx;
        const auto start = std::chrono::steady_clock::now();
        compact_status = ctx.pool->Kv(0).Compact(&compact_ctx, req, &resp);
        compact_seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      stop = true;
    });
    run_beside("(during compaction)", absl::ZeroDuration(), &stop);
    compactor.join();
    if (!compact_status.ok()) {
      return absl::InternalError(
          absl::StrCat("compaction failed: ", compact_status.error_message()));
    }
    r.extras.push_back({"compaction time (physical)", compact_seconds, "s", false});
    r.extras.push_back({"stale revisions compacted", static_cast<double>(keys_), "revisions", false});
    return r;
  }

 private:
  int64_t keys_ = 1000000;
  int val_size_ = 64;
  int load_batch_ = 100;
  double rate_ = 200;
  absl::Duration idle_ = absl::Seconds(3);
};

}  // namespace

std::unique_ptr<Workload> NewCompactionWorkload() { return std::make_unique<CompactionWorkload>(); }

}  // namespace capstan::bench
