#include "bench/loadgen/k8s_kubelets.h"

#include <chrono>
#include <condition_variable>

#include "absl/strings/str_cat.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/k8s_cluster.h"
#include "bench/loadgen/k8s_objects.h"
#include "bench/loadgen/list_util.h"
#include "bench/loadgen/load_driver.h"

namespace capstan::bench {

std::string NodeSelector(const std::string& node) { return absl::StrCat("spec.nodeName=", node); }

absl::StatusOr<bool> HasPodWatchCache(ConnectionPool& pool) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  capstan::v1::ListRequest req;
  req.set_prefix(kPodsPrefix);
  req.set_limit(1);
  capstan::v1::ListResponse resp;
  const grpc::Status s = pool.Cache(0).List(&ctx, req, &resp);
  if (s.ok()) return true;
  if (s.error_code() == grpc::UNIMPLEMENTED || s.error_code() == grpc::NOT_FOUND) return false;
  return absl::UnavailableError(absl::StrCat("probing capstan.v1.Cache: ", s.error_message()));
}

grpc::Status ListNodePods(capstan::v1::Cache::Stub& cache, const std::string& node,
                          uint64_t* count) {
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  capstan::v1::ListRequest req;
  req.set_prefix(kPodsPrefix);
  req.set_field_selector(NodeSelector(node));
  capstan::v1::ListResponse resp;
  grpc::Status s = cache.List(&ctx, req, &resp);
  *count = resp.kvs_size();
  return s;
}

grpc::Status ListNodePodsFromEtcd(etcdserverpb::KV::Stub& kv, const std::string& node,
                                  int64_t limit, uint64_t* count) {
  *count = 0;
  k8s::PodFields pod;
  const ListResult r = ListPrefix(kv, kPodsPrefix, limit, nullptr, [&](const mvccpb::KeyValue& o) {
    if (k8s::DecodePod(o.value(), &pod) && pod.node == node) ++*count;
  });
  return r.status;
}

// One node's watch: a server-streaming Cache Watch. Deletes nothing itself;
// Kubelets owns it and calls Finish() before destroying it.
class Kubelets::NodeWatch final : public grpc::ClientReadReactor<capstan::v1::WatchResponse> {
 public:
  NodeWatch(capstan::v1::Cache::Stub& stub, capstan::v1::WatchRequest request,
            std::function<void(const capstan::v1::WatchResponse&)> on_response)
      : request_(std::move(request)), on_response_(std::move(on_response)) {
    stub.async()->Watch(&ctx_, &request_, this);
    StartRead(&response_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream is ending; OnDone follows
    on_response_(response_);
    StartRead(&response_);
  }

  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
    status_ = status;
    cv_.notify_all();
  }

  // Cancels the stream and waits until gRPC is done with it. Returns false
  // with the status if it had ended before.
  bool Finish(grpc::Status* broken) {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (done_) {
        *broken = status_;
        return false;
      }
    }
    ctx_.TryCancel();
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return done_; });
    return true;
  }

 private:
  grpc::ClientContext ctx_;
  const capstan::v1::WatchRequest request_;
  const std::function<void(const capstan::v1::WatchResponse&)> on_response_;
  capstan::v1::WatchResponse response_;  // owned by the read in flight

  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;     // guarded by mu_
  grpc::Status status_;   // guarded by mu_
};

Kubelets::Kubelets(ConnectionPool* pool, DeliveryTracker* delivery, ErrorCounter* errors)
    : pool_(pool), delivery_(delivery), errors_(errors) {}

Kubelets::~Kubelets() { Finish(); }

size_t Kubelets::watches() const {
  std::lock_guard<std::mutex> l(mu_);
  return watches_.size();
}

PhaseResult Kubelets::Start(const std::vector<std::string>& nodes, int clients,
                            const std::function<uint64_t(size_t)>& expected_pods) {
  auto on_response = [this](const capstan::v1::WatchResponse& w) {
    const auto now = SteadyClock::now();
    for (const auto& ev : w.events()) {
      if (ev.type() == capstan::v1::Event::BOOKMARK) continue;
      delivery_->EventReceived(ev.revision(), now);
      events_.fetch_add(1);
    }
  };
  return RunClosedLoop(
      {"list by node (kubelet start)", nodes.size(), absl::ZeroDuration(), clients, 0},
      [&](uint64_t seq, size_t client, DoneFn done) {
        capstan::v1::ListRequest req;
        req.set_prefix(kPodsPrefix);
        req.set_field_selector(NodeSelector(nodes[seq]));
        CallAsync<capstan::v1::ListResponse>(
            [this, client](auto* c, auto* q, auto* r, auto cb) {
              pool_->Cache(client).async()->List(c, q, r, std::move(cb));
            },
            std::move(req),
            [this, seq, client, &nodes, &expected_pods, on_response, done = std::move(done)](
                const grpc::Status& s, capstan::v1::ListResponse& resp) {
              if (!s.ok()) return done(s);
              const uint64_t want = expected_pods(seq);
              if (static_cast<uint64_t>(resp.kvs_size()) != want) {
                return done(grpc::Status(
                    grpc::DATA_LOSS, absl::StrCat("list by node returned ", resp.kvs_size(),
                                                  " pods, want ", want)));
              }
              capstan::v1::WatchRequest w;
              w.set_prefix(kPodsPrefix);
              w.set_field_selector(NodeSelector(nodes[seq]));
              w.set_resource_version(absl::StrCat(resp.resource_version()));
              auto watch = std::make_unique<NodeWatch>(pool_->Cache(client), std::move(w),
                                                       on_response);
              {
                std::lock_guard<std::mutex> l(mu_);
                watches_.push_back(std::move(watch));
              }
              done(s);
            });
      });
}

void Kubelets::Finish() {
  std::vector<std::unique_ptr<NodeWatch>> watches;
  {
    std::lock_guard<std::mutex> l(mu_);
    watches.swap(watches_);
  }
  for (auto& w : watches) {
    grpc::Status broken;
    if (!w->Finish(&broken)) {
      errors_->Add(absl::StrCat("node watch ended: ", broken.error_message()));
    }
  }
}

}  // namespace capstan::bench
