// The objects of a simulated Kubernetes cluster in etcd and the writes
// kube-apiserver's etcd3 store sends for them. Objects live in the apiserver's
// layout and encoding (k8s_objects.h):
//   /registry/minions/<node>                   v1.Node
//   /registry/leases/kube-node-lease/<node>    coordination.k8s.io/v1 Lease
//   /registry/pods/<namespace>/<name>          v1.Pod
//   /registry/events/<namespace>/<name>        v1.Event, attached to a lease
// and every write is the apiserver's conditional transaction:
//   create:  If(mod_revision(key) == 0)   Then(Put)         Else(Get)
//   update:  If(mod_revision(key) == rev) Then(Put)         Else(Get)   (GuaranteedUpdate,
//                                                                        retried on conflict)
//   delete:  If(mod_revision(key) == rev) Then(DeleteRange) Else(Get)
//
// Threading: the operation methods (IssueLoad aside) are called from one
// scheduler thread; their completions run on gRPC threads. At most one write
// per object is in flight (an object busy with a write is skipped and
// counted). IssueLoad may be called from any thread.

#ifndef CAPSTAN_BENCH_LOADGEN_K8S_CLUSTER_H_
#define CAPSTAN_BENCH_LOADGEN_K8S_CLUSTER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bench/loadgen/connection_pool.h"
#include "bench/loadgen/histogram.h"
#include "bench/loadgen/load_driver.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/streams.h"

namespace capstan::bench {

inline constexpr const char* kPodsPrefix = "/registry/pods/";
inline constexpr const char* kNodesPrefix = "/registry/minions/";
inline constexpr const char* kNodeLeasesPrefix = "/registry/leases/kube-node-lease/";
inline constexpr const char* kEventsPrefix = "/registry/events/";

// One kind of operation: its latencies and failures. Thread-safe.
struct OpStats {
  explicit OpStats(std::string n) : name(std::move(n)) {}
  std::string name;
  Histogram latency;
  ErrorCounter errors;

  PhaseResult ToPhase(double seconds, bool has_throughput = true) const;
};

class K8sCluster {
 public:
  struct Options {
    int nodes = 1000;
    int pods = 20000;
    int namespaces = 100;
    int pod_min_size = 2048;
    int pod_max_size = 8192;
    int events_per_lease = 1000;
    int64_t event_ttl = 3600;
  };

  // Every steady-state write updates these; delivery (if set) learns each
  // committed write's revision and start time, for watch delivery latency.
  struct Stats {
    OpStats lease_renew{"lease renew"};
    OpStats node_status{"node status"};
    OpStats pod_create{"pod create"};
    OpStats pod_update{"pod update"};
    OpStats pod_delete{"pod delete"};
    OpStats event_create{"event create"};
    OpStats lease_grant{"event lease grant"};

    std::vector<OpStats*> All() {
      return {&lease_renew, &node_status, &pod_create, &pod_update, &pod_delete, &event_create,
              &lease_grant};
    }
  };

  // pool must outlive the cluster; requests go round-robin over `clients`.
  K8sCluster(const Options& options, ConnectionPool* pool, int clients, DeliveryTracker* delivery);

  // Loading: request seq (0 <= seq < LoadTotal()) creates one node, node
  // lease or pod. For RunClosedLoop.
  uint64_t LoadTotal() const { return 2 * static_cast<uint64_t>(options_.nodes) + options_.pods; }
  void IssueLoad(uint64_t seq, size_t client, DoneFn done);
  // The highest revision a load write returned.
  int64_t LoadedRevision() const { return max_rev_.load(); }
  // The nodes' names ("node-000042"), and how many pods loading put on node i.
  std::vector<std::string> NodeNames() const;
  uint64_t LoadedPodsOn(size_t node) const;

  // From now on every committed pod write is also reported to delivery
  // (which expects one event per write: the pod's node watch). Call before
  // the steady state, from the scheduler thread.
  void SetPodDelivery(DeliveryTracker* delivery) { pod_delivery_ = delivery; }
  // Every write acknowledged from now on is also recorded in timeline (at
  // its completion), which must outlive the writes. Before the writes.
  void SetWriteTimeline(Timeline* timeline) { write_timeline_ = timeline; }

  // Steady-state operations.
  void RenewNodeLease();     // the next node, round-robin (a kubelet every 10 s)
  void UpdateNodeStatus();   // the next node, round-robin
  void ChurnPod();           // create : update : delete = 1 : 2 : 1
  void CreateEvent();        // with the current event lease; grants a new one when due

  Stats& stats() { return stats_; }
  int Inflight() const { return inflight_.load(); }
  uint64_t Issued() const { return issued_.load(); }
  uint64_t Skipped() const { return skipped_.load(); }
  uint64_t Conflicts() const { return conflicts_.load(); }

 private:
  class Busy {
   public:
    bool TryAcquire() {
      bool expected = false;
      return flag_.compare_exchange_strong(expected, true, std::memory_order_acquire);
    }
    void Release() { flag_.store(false, std::memory_order_release); }

   private:
    std::atomic<bool> flag_{false};
  };
  struct Node {
    std::string name;
    int64_t node_rev = 0;   // guarded by node_busy
    int64_t lease_rev = 0;  // guarded by lease_busy
    Busy node_busy;
    Busy lease_busy;
  };
  struct PodSlot {
    std::string ns;  // immutable
    // Guarded by busy.
    bool exists = false;
    int64_t rev = 0;
    int incarnation = 0;
    int generation = 1;
    int node = 0;
    Busy busy;
  };
  using WriteDone = std::function<void(const grpc::Status&, int64_t revision)>;

  std::string PodName(const PodSlot& s, size_t i) const;
  std::string PodKey(const PodSlot& s, size_t i) const;
  std::string EncodePod(const PodSlot& s, size_t i, const std::string& phase) const;
  size_t NextClient() { return static_cast<size_t>(client_rr_.fetch_add(1) % clients_); }
  // Takes a pod slot in the wanted state; pods_.size() if none was found.
  size_t GrabSlot(bool want_exists);
  // Counts a steady-state write in flight; the returned callback records its
  // outcome in op and reports the revision to the delivery tracker (and to
  // the pod delivery tracker for a pod write).
  WriteDone Track(OpStats& op, bool pod_write = false);
  // The apiserver's conditional write; value is called per attempt (null for
  // a delete). A conflict retries with the revision the Else branch returned,
  // up to attempts times (a create fails at once).
  void ConditionalWrite(std::string key, int64_t expected_rev, std::function<std::string()> value,
                        int64_t lease, bool is_delete, int attempts, WriteDone done);

  const Options options_;
  ConnectionPool* const pool_;
  const int clients_;
  DeliveryTracker* const delivery_;
  Timeline* write_timeline_ = nullptr;
  DeliveryTracker* pod_delivery_ = nullptr;
  Stats stats_;
  std::vector<Node> nodes_;
  std::vector<PodSlot> pods_;
  std::mt19937_64 rng_{12345};  // scheduler thread only
  uint64_t lease_cursor_ = 0;   // scheduler thread only
  uint64_t node_cursor_ = 0;    // scheduler thread only
  uint64_t events_ = 0;         // scheduler thread only
  int64_t event_lease_ = 0;     // scheduler thread only
  int events_on_lease_ = 0;     // scheduler thread only
  std::atomic<int64_t> max_rev_{0};
  std::atomic<uint64_t> client_rr_{0};
  std::atomic<int> inflight_{0};
  std::atomic<uint64_t> issued_{0}, skipped_{0}, conflicts_{0};
};

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_K8S_CLUSTER_H_
