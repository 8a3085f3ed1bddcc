// A recording lease client for fault campaigns: one lease at a time, as a
// kubelet's node lease or a controller's leader lease is used. It grants a
// lease (TTL 2 or 3 s), puts a key attached to it, keeps it alive every
// 500 ms (one LeaseKeepAlive stream per renewal) for 0-4 s while reading the
// key every 250 ms, then either revokes it (one lease in five) or lets it
// expire, reading the key every 100 ms until it is gone. Every answered call
// and read goes into a LeaseRecord (lease_checker.h). On an error the client
// moves to the next member, as clientv3 does.
//
//   LeaseClient c(0, cluster->endpoints(), 0, "/campaign-leases/", seed);
//   std::thread t([&] { c.Run(&stop); });
//   ...
//   CheckLeases(c.Records(), allowance);
//
// Thread safety: Run runs on one thread; Records may be called from any.

#ifndef CAPSTAN_TESTS_CLUSTER_LEASE_CLIENT_H_
#define CAPSTAN_TESTS_CLUSTER_LEASE_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "cluster/lease_checker.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "util/mutex.h"

namespace capstan::testing::cluster {

class LeaseClient {
 public:
  LeaseClient(int id, std::vector<std::string> endpoints, int first, std::string prefix,
              uint32_t seed);

  // Leases one after another until `stop`; the lease in hand when it is
  // set is followed to its end (revoked or seen to expire) first, for at
  // most its TTL and 20 s more.
  void Run(const std::atomic<bool>* stop);
  std::vector<LeaseRecord> Records() const;

 private:
  struct Stubs {
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
  };
  void Next() { current_ = (current_ + 1) % static_cast<int>(stubs_.size()); }
  // One lease, start to end; false when it could not even be granted.
  bool OneLease(const std::atomic<bool>* stop);
  bool Grant(int64_t ttl, LeaseRecord* r);
  bool KeepAlive(int64_t lease, LeaseRecord::Call* call);
  bool Read(const std::string& key, LeaseRecord::Read* read);
  void Save(const LeaseRecord& r);

  const int id_;
  const std::string prefix_;
  const std::vector<std::string> endpoints_;
  std::vector<Stubs> stubs_;
  int current_ = 0;
  int64_t seq_ = 0;
  std::mt19937 rng_;
  mutable util::Mutex mu_;
  std::vector<LeaseRecord> records_ ABSL_GUARDED_BY(mu_);
};

}  // namespace capstan::testing::cluster

#endif  // CAPSTAN_TESTS_CLUSTER_LEASE_CLIENT_H_
