// A recording etcd KV client over several members: each operation is sent to
// the current member with a deadline, recorded in a History (history.h) with
// its outcome, and on an error the client moves to the next member (as etcd's
// clientv3 moves between endpoints).
//
//   KvClient client(/*id=*/3, cluster->endpoints(), /*first=*/0, &history);
//   client.Put("k1", client.NextValue());
//   client.Get("k1");
//   client.Cas("k1", "c3-1", false, client.NextValue());
//
// Outcomes: an answered request is ok; any error of a write is unknown (a
// timeout, a lost connection, "leader changed", "request timed out": etcd
// may still apply a proposal it reported as failed); any error of a read is
// failed (a read changes nothing).
//
// Thread safety: a KvClient is used by one thread; many KvClients may share a
// History.

#ifndef CAPSTAN_TESTS_CLUSTER_KV_CLIENT_H_
#define CAPSTAN_TESTS_CLUSTER_KV_CLIENT_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cluster/checker.h"
#include "cluster/cluster_fixture.h"
#include "cluster/history.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/channel.h"

namespace capstan::testing::cluster {

class KvClient {
 public:
  // `endpoints`: "127.0.0.1:<port>" of the members; the first request goes to
  // endpoints[first % size].
  KvClient(int id, std::vector<std::string> endpoints, int first, History* history,
           std::chrono::milliseconds timeout = std::chrono::milliseconds(2000));

  int id() const { return id_; }
  // A value unique across clients: "c<id>-<n>".
  std::string NextValue();
  // Pins the client to member `index` (no moving on errors) or, with -1,
  // lets it move again.
  void Pin(int index) { pinned_ = index; if (index >= 0) current_ = index; }
  int current() const { return current_; }

  // Each returns the recorded operation (its outcome and answer filled in).
  Operation Put(const std::string& key, const std::string& value, bool prev_kv = false);
  Operation Get(const std::string& key, bool serializable = false);
  Operation Delete(const std::string& key, bool prev_kv = false);
  // Txn: if value(key) == expected (create_revision(key) == 0 when
  // expect_absent) then put key=value else range key.
  Operation Cas(const std::string& key, const std::string& expected, bool expect_absent,
                const std::string& value);
  // Txn as the Kubernetes apiserver writes: if mod_revision(key) ==
  // `mod_revision` (0: the key is absent) then put key=value else range key.
  Operation CasModRevision(const std::string& key, int64_t mod_revision,
                           const std::string& value);
  // One page: Range [key, range_end) with `limit` at `revision` (0: the
  // current revision).
  Operation List(const std::string& key, const std::string& range_end, int64_t limit,
                 int64_t revision);

 private:
  etcdserverpb::KV::Stub* Stub();
  void Failed(const grpc::Status& st);
  // Records `op` as invoked at the current member, runs `call(stub, ctx,
  // &response)` (which fills the response and returns the RPC's status)
  // under the client's deadline, and completes the operation: an error of a
  // `write` is unknown, of a read failed.
  template <typename Call>
  Operation Record(Operation op, bool write, Call call);
  // Sends a Txn recorded as `op` (a CAS: its else-branch is a Range of the key).
  Operation Txn(Operation op, const etcdserverpb::TxnRequest& req);
  void Finish(int64_t id, const grpc::Status& st, const Response& r, bool write);

  const int id_;
  const std::vector<std::string> endpoints_;
  History* const history_;
  const std::chrono::milliseconds timeout_;
  std::vector<std::unique_ptr<etcdserverpb::KV::Stub>> stubs_;
  int current_ = 0;
  int pinned_ = -1;
  int64_t seq_ = 0;
};

// etcd-style traffic: until `stop`, random gets (35%), puts (35%, half with
// prev_kv), CASes on the last value this client saw (20%) and deletes (10%)
// on the keys prefix+"k0" .. prefix+"k<keys-1>".
void RunEtcdTraffic(KvClient* c, const std::string& prefix, int keys, uint32_t seed,
                    const std::atomic<bool>* stop);

// Traffic shaped like the Kubernetes apiserver's: until `stop`, objects
// created only when absent (mod_revision == 0), updated by a read of the
// current state followed by a compare-and-swap on its mod_revision (a
// conflict takes the failed compare's read as the new state and retries, as
// GuaranteedUpdate does), read, deleted, and listed in pages of `page`
// keys, every page after the first at the first page's revision (a page
// refused as compacted ends that list, as the apiserver answers 410 and its
// client lists again), on prefix+"k0" .. prefix+"k<keys-1>".
void RunKubernetesTraffic(KvClient* c, const std::string& prefix, int keys, uint32_t seed,
                          const std::atomic<bool>* stop, int page = 3);

// The Kubernetes apiserver's compactor (its storage/etcd3 compact loop):
// every `interval`, a Txn "if version(compact_rev_key) == t then put
// compact_rev_key else get it" (t: the version this compactor last saw),
// and when it won the round, a Compact at the revision the previous round
// read. `safe` bounds the revision compacted (the lowest revision that the
// campaign's watchers and event log have reached), so that nothing the
// checkers still need is compacted away. Runs until `stop`; counts the
// compactions made in *compactions.
void RunCompactor(const std::vector<std::string>& endpoints,
                  std::chrono::milliseconds interval,
                  const std::function<int64_t()>& safe, const std::atomic<bool>* stop,
                  std::atomic<int64_t>* compactions);

// Every event under `prefix` from revision 1 up to `last_revision`, by a
// Watch at the member `endpoint` (its own channel). Fails if the watch ends,
// is compacted, or does not reach `last_revision` before `timeout`.
absl::StatusOr<std::vector<Event>> ReadEventLog(const std::string& endpoint,
                                                const std::string& prefix,
                                                int64_t last_revision,
                                                std::chrono::milliseconds timeout);

}  // namespace capstan::testing::cluster

#endif  // CAPSTAN_TESTS_CLUSTER_KV_CLIENT_H_
