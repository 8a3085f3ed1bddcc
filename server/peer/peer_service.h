// PeerService: the receiving half of the peer transport, the
// capstan.v1.Peer service (proto/capstan/v1/peer.proto) on the peer URLs.
//
// Every call is admitted first, as etcd's peer listener and rafthttp admit
// a request: a client certificate must name the caller's address (unless
// --peer-skip-client-san-verification), then the sender's
// cluster ID must be this member's ("cluster ID mismatch"), the sender must
// not be a removed member ("the member has been permanently removed from
// the cluster"), and the call must be addressed to this member ("to field
// mismatch"). A refused call never reaches the handler. On an accepted Raft
// stream each message's own `to` and `from` are checked too, and the
// removal check is repeated for every batch, so a member removed while its
// stream is open is cut off at its next batch.
//
// Threads: the service is on gRPC's callback API, like the client
// services, so that its server keeps no polling threads of its own (a
// synchronous server's pollers share the process's epoll set and wake up
// for client traffic too). A Raft stream reads its next batch once the
// previous one was handed to the handler; the lease calls answer when the
// handler calls back (a renewal once the leader has confirmed it leads).
// Both run on gRPC's callback threads, which call on_message,
// on_lease_renew and on_lease_time_to_live, under no lock: those must not
// block (replication/transport.h). A snapshot is received on the service's
// own thread, "peer-snapshot", which writes the files and calls
// on_snapshot: one snapshot at a time, the next stream waiting its turn
// unread, so file I/O never runs on a callback thread.
//
// Thread safety: gRPC calls the methods concurrently. The service must
// outlive its server, and the server must be shut down (which waits for
// every call to end) before the service is destroyed.

#ifndef CAPSTAN_SERVER_PEER_PEER_SERVICE_H_
#define CAPSTAN_SERVER_PEER_PEER_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "capstan/v1/peer.grpc.pb.h"
#include "replication/transport.h"
#include "util/mutex.h"
#include "util/work_queue.h"

namespace capstan::server::peer {

class PeerService final : public capstan::v1::Peer::CallbackService {
 public:
  // is_removed answers whether a member ID was removed from the cluster; it
  // is called for every call and every batch, on gRPC's callback threads,
  // and must be cheap. handler and is_removed must outlive the service's
  // server.
  // check_client_san: a caller's client certificate must name the address
  // it calls from (etcd's checkSAN; PeerAddressMismatch), else
  // UNAUTHENTICATED with the reason.
  PeerService(uint64_t local_id, uint64_t cluster_id, const replication::TransportHandler* handler,
              std::function<bool(uint64_t)> is_removed, bool check_client_san);

  grpc::ServerReadReactor<capstan::v1::RaftBatch>* Raft(
      grpc::CallbackServerContext* context, capstan::v1::RaftStreamEnd* response) override;
  grpc::ServerUnaryReactor* LeaseRenew(grpc::CallbackServerContext* context,
                                       const etcdserverpb::LeaseKeepAliveRequest* request,
                                       etcdserverpb::LeaseKeepAliveResponse* response) override;
  grpc::ServerUnaryReactor* LeaseTimeToLive(
      grpc::CallbackServerContext* context, const etcdserverpb::LeaseTimeToLiveRequest* request,
      etcdserverpb::LeaseTimeToLiveResponse* response) override;
  grpc::ServerUnaryReactor* MemberPromote(grpc::CallbackServerContext* context,
                                          const etcdserverpb::MemberPromoteRequest* request,
                                          etcdserverpb::MemberPromoteResponse* response) override;
  grpc::ServerUnaryReactor* Members(grpc::CallbackServerContext* context,
                                    const capstan::v1::MembersRequest* request,
                                    etcdserverpb::MemberListResponse* response) override;
  grpc::ServerUnaryReactor* Probe(grpc::CallbackServerContext* context,
                                  const capstan::v1::ProbeRequest* request,
                                  capstan::v1::ProbeResponse* response) override;
  grpc::ServerUnaryReactor* HashKV(grpc::CallbackServerContext* context,
                                   const etcdserverpb::HashKVRequest* request,
                                   etcdserverpb::HashKVResponse* response) override;
  // Receives into handler->snapshot_dir (one snapshot at a time, on the
  // snapshot thread), then calls handler->on_snapshot there.
  grpc::ServerReadReactor<capstan::v1::SnapshotChunk>* Snapshot(
      grpc::CallbackServerContext* context, capstan::v1::SnapshotEnd* response) override;

  // The bytes of the Raft messages received from each peer so far.
  std::vector<std::pair<uint64_t, uint64_t>> ReceivedBytes() const ABSL_LOCKS_EXCLUDED(received_mu_);

  // What a Raft stream outside gRPC (raft_stream.h) needs of the service.
  // AdmitIdentity: the identity checks of Admit, on the stream's header
  // values (cluster ID, sender, receiver, as etcd's ID text), with the same
  // logs: OK and *from, or the refusal.
  grpc::Status AdmitIdentity(std::string_view cluster, std::string_view sender,
                             std::string_view to, uint64_t* from) const;
  bool IsRemoved(uint64_t id) const { return is_removed_(id); }
  // One message of an admitted sender `from`: its own addresses checked,
  // counted in *received, handed to the handler. Not OK (and not handed
  // on) for a message that cannot be read or is not from `from` to this
  // member.
  grpc::Status HandleMessage(uint64_t from, std::string message,
                             std::atomic<uint64_t>* received) const;
  // The counter of the bytes received from peer `from`, which a Raft
  // stream takes once when it is admitted and adds each message to. Stable
  // for the service's life.
  std::atomic<uint64_t>* ReceivedCounter(uint64_t from) const ABSL_LOCKS_EXCLUDED(received_mu_);

 private:
  class RaftReactor;
  class SnapshotReactor;

  // Admits a call: OK and the sender's ID in *from, or the refusal.
  grpc::Status Admit(const grpc::ServerContextBase& context, uint64_t* from) const;
  // The status of a Raft batch from `from`, whose messages went to the
  // handler unless it is not OK (a removed sender, a bad message: the
  // messages before the bad one were handed over).
  grpc::Status HandleBatch(uint64_t from, capstan::v1::RaftBatch* batch,
                           std::atomic<uint64_t>* received) const;

  const uint64_t local_id_;
  const uint64_t cluster_id_;
  const replication::TransportHandler* const handler_;
  const std::function<bool(uint64_t)> is_removed_;
  const bool check_client_san_;
  // A leaf: taken when a Raft stream is admitted and at each scrape, never
  // per message.
  mutable util::Mutex received_mu_;
  mutable std::map<uint64_t, std::unique_ptr<std::atomic<uint64_t>>> received_
      ABSL_GUARDED_BY(received_mu_);
  // One thread: receives the snapshots, one at a time, in the order their
  // streams were admitted. Last member: destroyed (and joined) first.
  util::WorkQueue snapshots_;
};

}  // namespace capstan::server::peer

#endif  // CAPSTAN_SERVER_PEER_PEER_SERVICE_H_
