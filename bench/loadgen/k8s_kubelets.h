// The kubelets' side of the k8s scenario, served by Capstan's watch cache
// (capstan.v1.Cache, proto/capstan/v1/cache.proto): as a kubelet does at
// start, each node lists its pods (List of /registry/pods/ with the field
// selector spec.nodeName=<node>) and then watches them from the list's
// resource version (Watch with the same selector). Every pod write then
// produces exactly one event, on the watch of the pod's node.
//
// etcd has no such service; the closest it offers is a Range of the whole
// pod prefix filtered on the client (ListNodePodsFromEtcd), which is what
// kube-apiserver does for a selector list when its watch cache is off.
//
// Thread-safety: Kubelets' methods are called from one thread; the watches'
// events arrive on gRPC threads and go to the DeliveryTracker.

#ifndef CAPSTAN_BENCH_LOADGEN_K8S_KUBELETS_H_
#define CAPSTAN_BENCH_LOADGEN_K8S_KUBELETS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bench/loadgen/connection_pool.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/streams.h"

namespace capstan::bench {

// "spec.nodeName=<node>".
std::string NodeSelector(const std::string& node);

// Whether the server answers capstan.v1.Cache List for the pod prefix
// (false: UNIMPLEMENTED or NOT_FOUND, as etcd or a Capstan without a pod
// cache answers). Other failures are returned as errors.
absl::StatusOr<bool> HasPodWatchCache(ConnectionPool& pool);

// One consistent Cache List of the pods on `node` (resource_version ""), the
// count of pods returned in *count.
grpc::Status ListNodePods(capstan::v1::Cache::Stub& cache, const std::string& node,
                          uint64_t* count);

// etcd's equivalent: a paginated Range of /registry/pods/ (pages of limit),
// each pod decoded and kept when its spec.nodeName is node.
grpc::Status ListNodePodsFromEtcd(etcdserverpb::KV::Stub& kv, const std::string& node,
                                  int64_t limit, uint64_t* count);

class Kubelets {
 public:
  // pool and delivery must outlive the Kubelets; failures of the watches go
  // to errors.
  Kubelets(ConnectionPool* pool, DeliveryTracker* delivery, ErrorCounter* errors);
  ~Kubelets();

  // Lists the pods of every node in `nodes` (--clients lists in flight),
  // checks that node i has expected_pods(i) of them, and starts node i's
  // watch from its list's resource version. Returns the lists' phase.
  PhaseResult Start(const std::vector<std::string>& nodes, int clients,
                    const std::function<uint64_t(size_t)>& expected_pods);

  uint64_t events() const { return events_.load(); }
  size_t watches() const;

  // Ends the watches; a watch that ended before counts as an error.
  void Finish();

 private:
  class NodeWatch;

  ConnectionPool* const pool_;
  DeliveryTracker* const delivery_;
  ErrorCounter* const errors_;
  std::atomic<uint64_t> events_{0};
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<NodeWatch>> watches_;  // guarded by mu_
};

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_K8S_KUBELETS_H_
