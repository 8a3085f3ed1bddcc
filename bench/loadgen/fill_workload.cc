// fill: loads N keys under a prefix in batched txns and nothing else; the
// loader of scripts that measure what happens to a full server (restart
// time, defragmentation).

#include "absl/strings/str_format.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/fill.h"
#include "bench/loadgen/load_driver.h"

namespace capstan::bench {

PhaseResult FillKeys(BenchContext& ctx, const std::string& phase_name, int64_t keys, int batch,
                     const std::function<std::string(int64_t)>& key_of, const std::string& value) {
  const uint64_t txns = static_cast<uint64_t>((keys + batch - 1) / batch);
  IssueFn issue = [&](uint64_t seq, size_t client, DoneFn done) {
    etcdserverpb::TxnRequest txn;
    const int64_t first = static_cast<int64_t>(seq) * batch;
    for (int64_t i = first; i < std::min(keys, first + batch); ++i) {
      auto* put = txn.add_success()->mutable_request_put();
      put->set_key(key_of(i));
      put->set_value(value);
    }
    AsyncTxn(ctx.pool->Kv(client), std::move(txn),
             [done = std::move(done)](const grpc::Status& s, auto&) { done(s); });
  };
  return RunClosedLoop({phase_name, txns, absl::ZeroDuration(), ctx.global->clients, 0}, issue);
}

namespace {

class FillWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.Int64("keys", &keys_, "Keys to write");
    f.Int("val-size", &val_size_, "Value size, bytes");
    f.String("prefix", &prefix_, "Key prefix (keys are <prefix><9-digit index>)");
    f.Int("load-batch", &batch_, "Puts per txn (etcd's --max-txn-ops is 128)");
  }
  absl::Status Prepare(const std::vector<std::string>&) override {
    if (keys_ < 1 || val_size_ < 0 || batch_ < 1 || batch_ > 128) {
      return absl::InvalidArgumentError("fill: bad --keys, --val-size or --load-batch");
    }
    return absl::OkStatus();
  }
  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    RunReport r;
    r.workload = "fill";
    r.target = ctx.target;
    const std::string value(static_cast<size_t>(val_size_), 'v');
    r.phases.push_back(FillKeys(
        ctx, absl::StrFormat("fill (txns of %d puts)", batch_), keys_, batch_,
        [this](int64_t i) { return absl::StrFormat("%s%09d", prefix_, i); }, value));
    return r;
  }

 private:
  int64_t keys_ = 100000;
  int val_size_ = 256;
  std::string prefix_ = "/fill/";
  int batch_ = 100;
};

}  // namespace

std::unique_ptr<Workload> NewFillWorkload() { return std::make_unique<FillWorkload>(); }

}  // namespace capstan::bench
