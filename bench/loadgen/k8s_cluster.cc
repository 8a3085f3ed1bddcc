#include "bench/loadgen/k8s_cluster.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/k8s_objects.h"

namespace capstan::bench {

namespace {

using etcdserverpb::Compare;
using etcdserverpb::TxnRequest;
using etcdserverpb::TxnResponse;
using Clock = std::chrono::steady_clock;

uint64_t Since(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
}

int64_t NowUnix() { return absl::ToUnixSeconds(absl::Now()); }

}  // namespace

PhaseResult OpStats::ToPhase(double seconds, bool has_throughput) const {
  PhaseResult p;
  p.name = name;
  p.latency = latency;
  p.errors = errors.Total();
  p.error_counts = errors.Snapshot();
  p.seconds = seconds;
  p.has_throughput = has_throughput;
  return p;
}

K8sCluster::K8sCluster(const Options& options, ConnectionPool* pool, int clients,
                       DeliveryTracker* delivery)
    : options_(options),
      pool_(pool),
      clients_(std::max(1, clients)),
      delivery_(delivery),
      nodes_(options.nodes),
      // Room for the pod count to wander under churn.
      pods_(static_cast<size_t>(options.pods) + options.pods / 4 + 16) {
  for (int i = 0; i < options_.nodes; ++i) nodes_[i].name = absl::StrFormat("node-%06d", i);
  for (size_t i = 0; i < pods_.size(); ++i) {
    pods_[i].ns = absl::StrFormat("ns-%04d", i % options_.namespaces);
    pods_[i].node = static_cast<int>(i % options_.nodes);
  }
}

std::string K8sCluster::PodName(const PodSlot& s, size_t i) const {
  return absl::StrFormat("app-%d-%06x-%d", i % 40, i, s.incarnation);
}

std::string K8sCluster::PodKey(const PodSlot& s, size_t i) const {
  return absl::StrCat(kPodsPrefix, s.ns, "/", PodName(s, i));
}

std::string K8sCluster::EncodePod(const PodSlot& s, size_t i, const std::string& phase) const {
  std::mt19937_64 rng(i * 131 + s.incarnation);
  k8s::PodSpec p;
  p.ns = s.ns;
  p.name = PodName(s, i);
  p.node = absl::StrFormat("node-%06d", s.node);
  p.phase = phase;
  p.app = absl::StrCat("app-", i % 40);
  p.generation = s.generation;
  p.created_unix = NowUnix();
  p.target_size = std::uniform_int_distribution<int>(options_.pod_min_size, options_.pod_max_size)(rng);
  p.seed = i * 1000003 + s.incarnation;
  return k8s::EncodePod(p);
}

void K8sCluster::ConditionalWrite(std::string key, int64_t expected_rev,
                                  std::function<std::string()> value, int64_t lease,
                                  bool is_delete, int attempts, WriteDone done) {
  TxnRequest req;
  auto* cmp = req.add_compare();
  cmp->set_key(key);
  cmp->set_target(Compare::MOD);
  cmp->set_result(Compare::EQUAL);
  cmp->set_mod_revision(expected_rev);
  if (is_delete) {
    req.add_success()->mutable_request_delete_range()->set_key(key);
  } else {
    auto* put = req.add_success()->mutable_request_put();
    put->set_key(key);
    put->set_value(value());
    put->set_lease(lease);
  }
  req.add_failure()->mutable_request_range()->set_key(key);
  AsyncTxn(pool_->Kv(NextClient()), std::move(req),
           [this, key = std::move(key), value = std::move(value), lease, is_delete, expected_rev,
            attempts, done = std::move(done)](const grpc::Status& s, TxnResponse& resp) mutable {
             if (!s.ok()) return done(s, 0);
             if (resp.succeeded()) return done(s, resp.header().revision());
             conflicts_.fetch_add(1);
             if (attempts <= 1 || expected_rev == 0) {
               return done(grpc::Status(grpc::ABORTED, expected_rev == 0
                                                           ? "create: the object already exists"
                                                           : "update: conflicts on every attempt"),
                           0);
             }
             int64_t current = 0;
             if (resp.responses_size() > 0 && resp.responses(0).response_range().kvs_size() > 0) {
               current = resp.responses(0).response_range().kvs(0).mod_revision();
             }
             ConditionalWrite(std::move(key), current, std::move(value), lease, is_delete,
                              attempts - 1, std::move(done));
           });
}

void K8sCluster::IssueLoad(uint64_t seq, size_t, DoneFn done) {
  std::string key;
  std::function<std::string()> value;
  std::function<void(int64_t)> on_rev;
  const uint64_t nodes = options_.nodes;
  if (seq < nodes) {
    Node& n = nodes_[seq];
    key = kNodesPrefix + n.name;
    value = [&n, seq] { return k8s::EncodeNode({n.name, NowUnix(), 12, seq}); };
    on_rev = [&n](int64_t rev) { n.node_rev = rev; };
  } else if (seq < 2 * nodes) {
    Node& n = nodes_[seq - nodes];
    key = kNodeLeasesPrefix + n.name;
    value = [&n, seq] { return k8s::EncodeNodeLease(n.name, NowUnix(), 0, seq); };
    on_rev = [&n](int64_t rev) { n.lease_rev = rev; };
  } else {
    const size_t i = seq - 2 * nodes;
    PodSlot& p = pods_[i];
    key = PodKey(p, i);
    value = [this, &p, i] { return EncodePod(p, i, "Running"); };
    on_rev = [&p](int64_t rev) {
      p.rev = rev;
      p.exists = true;
    };
  }
  ConditionalWrite(std::move(key), 0, std::move(value), 0, false, 1,
                   [this, on_rev = std::move(on_rev), done = std::move(done)](const grpc::Status& s,
                                                                              int64_t rev) {
                     if (s.ok()) {
                       on_rev(rev);
                       int64_t cur = max_rev_.load();
                       while (rev > cur && !max_rev_.compare_exchange_weak(cur, rev)) {
                       }
                     }
                     done(s);
                   });
}

std::vector<std::string> K8sCluster::NodeNames() const {
  std::vector<std::string> names;
  for (const Node& n : nodes_) names.push_back(n.name);
  return names;
}

uint64_t K8sCluster::LoadedPodsOn(size_t node) const {
  const uint64_t pods = options_.pods, nodes = options_.nodes;
  return pods / nodes + (node < pods % nodes ? 1 : 0);
}

K8sCluster::WriteDone K8sCluster::Track(OpStats& op, bool pod_write) {
  inflight_.fetch_add(1);
  issued_.fetch_add(1);
  const auto start = Clock::now();
  DeliveryTracker* pod_delivery = pod_write ? pod_delivery_ : nullptr;
  Timeline* const timeline = write_timeline_;
  return [this, &op, start, pod_delivery, timeline](const grpc::Status& s, int64_t rev) {
    if (s.ok()) {
      const auto now = Clock::now();
      const auto ns = static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(now - start).count());
      op.latency.Record(ns);
      if (timeline != nullptr) timeline->Record(now, ns);
      if (delivery_ != nullptr) delivery_->WriteCommitted(rev, start, 1);
      if (pod_delivery != nullptr) pod_delivery->WriteCommitted(rev, start, 1);
    } else {
      op.errors.Add(s);
    }
    inflight_.fetch_sub(1);
  };
}

void K8sCluster::RenewNodeLease() {
  Node& n = nodes_[lease_cursor_++ % nodes_.size()];
  if (!n.lease_busy.TryAcquire()) {
    skipped_.fetch_add(1);
    return;
  }
  WriteDone record = Track(stats_.lease_renew);
  const absl::Time now = absl::Now();
  const int64_t secs = absl::ToUnixSeconds(now);
  const int32_t nanos =
      static_cast<int32_t>(absl::ToInt64Microseconds(now - absl::FromUnixSeconds(secs)) * 1000);
  ConditionalWrite(kNodeLeasesPrefix + n.name, n.lease_rev,
                   [&n, secs, nanos] { return k8s::EncodeNodeLease(n.name, secs, nanos, 1); }, 0,
                   false, 3, [&n, record](const grpc::Status& s, int64_t rev) {
                     if (s.ok()) n.lease_rev = rev;
                     n.lease_busy.Release();
                     record(s, rev);
                   });
}

void K8sCluster::UpdateNodeStatus() {
  const uint64_t idx = node_cursor_++ % nodes_.size();
  Node& n = nodes_[idx];
  if (!n.node_busy.TryAcquire()) {
    skipped_.fetch_add(1);
    return;
  }
  WriteDone record = Track(stats_.node_status);
  ConditionalWrite(kNodesPrefix + n.name, n.node_rev,
                   [&n, idx] { return k8s::EncodeNode({n.name, NowUnix(), 12, idx}); }, 0, false,
                   3, [&n, record](const grpc::Status& s, int64_t rev) {
                     if (s.ok()) n.node_rev = rev;
                     n.node_busy.Release();
                     record(s, rev);
                   });
}

size_t K8sCluster::GrabSlot(bool want_exists) {
  for (int probe = 0; probe < 32; ++probe) {
    const size_t i = rng_() % pods_.size();
    if (!pods_[i].busy.TryAcquire()) continue;
    if (pods_[i].exists == want_exists) return i;
    pods_[i].busy.Release();
  }
  return pods_.size();
}

void K8sCluster::ChurnPod() {
  const uint64_t dice = rng_() % 4;
  const bool create = dice == 0, remove = dice == 3;
  const size_t i = GrabSlot(/*want_exists=*/!create);
  if (i == pods_.size()) {
    skipped_.fetch_add(1);
    return;
  }
  PodSlot& p = pods_[i];
  if (create) {
    ++p.incarnation;
    p.generation = 1;
    p.node = static_cast<int>(rng_() % nodes_.size());
    WriteDone record = Track(stats_.pod_create, /*pod_write=*/true);
    ConditionalWrite(PodKey(p, i), 0, [this, &p, i] { return EncodePod(p, i, "Pending"); }, 0,
                     false, 1, [&p, record](const grpc::Status& s, int64_t rev) {
                       if (s.ok()) {
                         p.exists = true;
                         p.rev = rev;
                       }
                       p.busy.Release();
                       record(s, rev);
                     });
  } else if (remove) {
    WriteDone record = Track(stats_.pod_delete, /*pod_write=*/true);
    ConditionalWrite(PodKey(p, i), p.rev, nullptr, 0, true, 3,
                     [&p, record](const grpc::Status& s, int64_t rev) {
                       if (s.ok()) p.exists = false;
                       p.busy.Release();
                       record(s, rev);
                     });
  } else {
    ++p.generation;
    WriteDone record = Track(stats_.pod_update, /*pod_write=*/true);
    ConditionalWrite(PodKey(p, i), p.rev, [this, &p, i] { return EncodePod(p, i, "Running"); }, 0,
                     false, 3, [&p, record](const grpc::Status& s, int64_t rev) {
                       if (s.ok()) p.rev = rev;
                       p.busy.Release();
                       record(s, rev);
                     });
  }
}

void K8sCluster::CreateEvent() {
  if (event_lease_ == 0 || events_on_lease_ >= options_.events_per_lease) {
    // kube-apiserver's lease manager: a new lease every events-per-lease objects.
    grpc::ClientContext c;
    SetDeadline(&c);
    etcdserverpb::LeaseGrantRequest req;
    req.set_ttl(options_.event_ttl);
    etcdserverpb::LeaseGrantResponse resp;
    const auto t = Clock::now();
    const grpc::Status s = pool_->Lease(NextClient()).LeaseGrant(&c, req, &resp);
    if (!s.ok()) {
      stats_.lease_grant.errors.Add(s);
      return;
    }
    stats_.lease_grant.latency.Record(Since(t));
    event_lease_ = resp.id();
    events_on_lease_ = 0;
  }
  ++events_on_lease_;
  const uint64_t n = events_++;
  const size_t i = rng_() % pods_.size();
  k8s::EventSpec e;
  e.ns = pods_[i].ns;
  e.pod = absl::StrFormat("app-%d-%06x", i % 40, i);
  e.name = absl::StrFormat("%s.%016x", e.pod, n * 0x9e3779b97f4a7c15ULL);
  e.node = absl::StrFormat("node-%06d", i % nodes_.size());
  e.reason = n % 3 == 0 ? "Scheduled" : n % 3 == 1 ? "Pulled" : "Started";
  e.unix = NowUnix();
  e.seed = n;
  ConditionalWrite(absl::StrCat(kEventsPrefix, e.ns, "/", e.name), 0,
                   [e] { return k8s::EncodeEvent(e); }, event_lease_, false, 1,
                   Track(stats_.event_create));
}

}  // namespace capstan::bench
