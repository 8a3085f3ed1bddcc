// defrag: write latency while Maintenance.Defragment runs, against the same
// writes with the server idle. etcd rewrites its whole bbolt file under the
// backend's write lock, so its writes stall for the length of the defrag;
// Capstan's defrag must let them through.
//
// Phases:
//   load                 --keys puts of --value-size bytes (the data set)
//   (not timed)          every --delete-every-th key deleted and the history
//                        compacted, so that the defrag has space to reclaim
//   put (idle)           --put-rate small puts/s for --idle-duration
//   put (during defrag)  the same puts from 200 ms before Defragment is sent
//                        until it has returned
// Extras: the defrag's duration and the database size (Status.dbSize)
// before and after it.

#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/load_driver.h"
#include "bench/loadgen/workload.h"

namespace capstan::bench {

namespace {

class DefragWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.Int64("keys", &keys_, "Keys in the data set");
    f.Int("value-size", &value_size_, "Value size of the data set's keys, bytes");
    f.Int("delete-every", &delete_every_,
          "Delete every N-th key before the defrag (0: none), then compact");
    f.String("prefix", &prefix_, "Key prefix of the data set");
    f.Double("put-rate", &put_rate_, "Small puts per second in the put phases");
    f.Int("put-clients", &put_clients_, "Clients issuing the small puts");
    f.Duration("idle-duration", &idle_, "Length of the put phase with no defrag running");
    f.Duration("defrag-timeout", &defrag_timeout_, "Deadline of the Defragment call");
  }

  absl::Status Prepare(const std::vector<std::string>&) override {
    if (keys_ < 1 || value_size_ < 1 || delete_every_ < 0 || put_clients_ < 1 || put_rate_ <= 0) {
      return absl::InvalidArgumentError("defrag: bad sizes, counts or rate");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    RunReport r;
    r.workload = "defrag";
    r.target = ctx.target;
    r.params = absl::StrFormat("keys=%d value-size=%d delete-every=%d put-rate=%g put-clients=%d",
                               keys_, value_size_, delete_every_, put_rate_, put_clients_);
    auto key_of = [&](int64_t i) { return absl::StrFormat("%s%010d", prefix_, i); };

    // The data set: values cut from random bytes, so that storage
    // compression does not shrink it.
    std::string random(std::max<size_t>(1 << 20, 2 * value_size_), '\0');
    std::mt19937_64 rng(42);
    for (char& c : random) c = static_cast<char>(rng());
    auto value_of = [&](int64_t i) {
      const size_t span = random.size() - value_size_;
      return random.substr(static_cast<size_t>(i * 7919) % span, value_size_);
    };
    LoopOptions load{"load", static_cast<uint64_t>(keys_), absl::ZeroDuration(),
                     std::max(1, ctx.global->clients), 0};
    r.phases.push_back(RunClosedLoop(load, [&](uint64_t seq, size_t client, DoneFn done) {
      etcdserverpb::PutRequest req;
      req.set_key(key_of(static_cast<int64_t>(seq)));
      req.set_value(value_of(static_cast<int64_t>(seq)));
      AsyncPut(ctx.pool->Kv(client), std::move(req),
               [done = std::move(done)](const grpc::Status& s, auto&) { done(s); });
    }));
    if (r.phases.back().errors > 0) return r;

    // Free space for the defrag to reclaim: deletes, then a compaction.
    if (delete_every_ > 0) {
      LoopOptions del{"delete", static_cast<uint64_t>(keys_ / delete_every_),
                      absl::ZeroDuration(), std::max(1, ctx.global->clients), 0};
      PhaseResult deletes = RunClosedLoop(del, [&](uint64_t seq, size_t client, DoneFn done) {
        etcdserverpb::DeleteRangeRequest req;
        req.set_key(key_of(static_cast<int64_t>(seq) * delete_every_));
        auto& kv = ctx.pool->Kv(client);
        CallAsync<etcdserverpb::DeleteRangeResponse>(
            [&kv](auto* c, auto* q, auto* p, auto cb) {
              kv.async()->DeleteRange(c, q, p, std::move(cb));
            },
            std::move(req), [done = std::move(done)](const grpc::Status& s, auto&) { done(s); });
      });
      if (deletes.errors > 0) return absl::UnavailableError("defrag: deletes failed");
    }
    auto status = DbStatus(ctx);
    if (!status.ok()) return status.status();
    {
      grpc::ClientContext c;
      c.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
      etcdserverpb::CompactionRequest req;
      req.set_revision(status->header().revision());
      req.set_physical(true);
      etcdserverpb::CompactionResponse resp;
      grpc::Status s = ctx.pool->Kv(0).Compact(&c, req, &resp);
      if (!s.ok()) return absl::UnavailableError(absl::StrCat("Compact: ", s.error_message()));
    }

    // Small writes, idle and then during the defrag.
    std::atomic<uint64_t> generation{0};
    IssueFn put = [&](uint64_t, size_t client, DoneFn done) {
      etcdserverpb::PutRequest req;
      req.set_key(absl::StrCat(prefix_, "writer/", client));
      req.set_value(absl::StrCat("generation-", generation.fetch_add(1)));
      AsyncPut(ctx.pool->Kv(client), std::move(req),
               [done = std::move(done)](const grpc::Status& s, auto&) { done(s); });
    };
    r.phases.push_back(RunClosedLoop({"put (idle)", 0, idle_, put_clients_, put_rate_}, put));

    status = DbStatus(ctx);
    if (!status.ok()) return status.status();
    const double size_before = static_cast<double>(status->dbsize());
    std::atomic<bool> stop{false};
    PhaseResult during;
    std::thread writer([&] {
      during = RunClosedLoop(
          {"put (during defrag)", 0, absl::ZeroDuration(), put_clients_, put_rate_, &stop}, put);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto start = std::chrono::steady_clock::now();
    grpc::Status defrag;
    {
      grpc::ClientContext c;
      c.set_deadline(std::chrono::system_clock::now() + absl::ToChronoSeconds(defrag_timeout_));
      etcdserverpb::DefragmentResponse resp;
      defrag = ctx.pool->Maintenance(0).Defragment(&c, {}, &resp);
    }
    const double defrag_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stop = true;
    writer.join();
    during.name = "put (during defrag)";
    if (!defrag.ok()) {
      during.errors += 1;
      during.error_counts[absl::StrCat("Defragment: ", defrag.error_message())] += 1;
    }
    r.phases.push_back(std::move(during));

    status = DbStatus(ctx);
    if (!status.ok()) return status.status();
    r.extras.push_back({"defrag seconds", defrag_seconds, "s", false});
    r.extras.push_back({"db MiB before defrag", size_before / 1048576.0, "MiB", false});
    r.extras.push_back(
        {"db MiB after defrag", static_cast<double>(status->dbsize()) / 1048576.0, "MiB", false});
    return r;
  }

 private:
  static absl::StatusOr<etcdserverpb::StatusResponse> DbStatus(BenchContext& ctx) {
    grpc::ClientContext c;
    c.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    etcdserverpb::StatusResponse resp;
    grpc::Status s = ctx.pool->Maintenance(0).Status(&c, {}, &resp);
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("Status: ", s.error_message()));
    return resp;
  }

  int64_t keys_ = 100000;
  int value_size_ = 4096;
  int delete_every_ = 2;
  std::string prefix_ = "/defrag-bench/";
  double put_rate_ = 200;
  int put_clients_ = 16;
  absl::Duration idle_ = absl::Seconds(5);
  absl::Duration defrag_timeout_ = absl::Minutes(30);
};

}  // namespace

std::unique_ptr<Workload> NewDefragWorkload() { return std::make_unique<DefragWorkload>(); }

}  // namespace capstan::bench
