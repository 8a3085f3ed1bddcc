// Transport: how a member's Raft messages reach its peers and theirs reach
// it. The replication layer knows only this interface; the peer service
// (server/peer/, gRPC over the peer URLs with etcd's peer TLS flags)
// implements it.
//
// Thread safety: every method may be called from any thread. Send never
// blocks: each peer has its own bounded queue, and a message that does not
// fit is dropped and its peer reported unreachable (Raft resends).

#ifndef CAPSTAN_REPLICATION_TRANSPORT_H_
#define CAPSTAN_REPLICATION_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "absl/status/statusor.h"
#include "etcdserverpb/rpc.pb.h"
#include "membership/member.h"
#include "replication/raft_engine.h"

namespace capstan::replication {

// What a member does with what its peers send it. Set before Start; each
// callback may be called from any transport thread, concurrently, and
// must not block for long (enqueue and return).
struct TransportHandler {
  // A raftpb.Message from peer `from`, addressed to this member.
  std::function<void(uint64_t from, std::string message)> on_message;
  // A message to `to` could not be delivered (peer down, queue full):
  // raft's ReportUnreachable.
  std::function<void(uint64_t to)> on_unreachable;
  // Where the transport writes the files of an incoming snapshot (it clears
  // the directory first); empty: snapshots are refused.
  std::string snapshot_dir;
  // A snapshot from peer `from`, complete and verified in snapshot_dir;
  // message is its MsgSnap. The callee takes the files out of snapshot_dir
  // (renames the directory) before it returns. Snapshots are received one
  // at a time.
  std::function<absl::Status(uint64_t from, std::string message)> on_snapshot;
  // A lease keep-alive forwarded by a follower to this member, the leader:
  // renews the lease and answers its new TTL (etcd's leader-side
  // LeaseRenew). Errors are etcd's lease errors. Must not block: it may
  // answer later, from another thread.
  // It answers through `done` (once it has confirmed that it leads), filling
  // `response` first; `response` lives until then.
  std::function<void(const etcdserverpb::LeaseKeepAliveRequest& request,
                     etcdserverpb::LeaseKeepAliveResponse* response,
                     absl::AnyInvocable<void(absl::Status)> done)>
      on_lease_renew;
  // A LeaseTimeToLive forwarded to the leader, which alone knows the
  // remaining TTL.
  std::function<absl::Status(const etcdserverpb::LeaseTimeToLiveRequest& request,
                             etcdserverpb::LeaseTimeToLiveResponse* response)>
      on_lease_time_to_live;
  // The members this member's table holds (a joining member asks).
  std::function<std::vector<membership::ClusterMember>()> on_members;
  // A learner's promotion asked of a follower and forwarded to this
  // member, the leader (etcd's POST /members/promote/<id>): done gets the
  // members after it, or the leader's error.
  std::function<void(uint64_t id, membership::RaftView::MembersDone done)> on_member_promote;
  // A peer's corruption check asks for the hash of this member's keys at a
  // revision (etcd's GET /members/hashkv). Hashing reads every revision, so
  // the callee answers through `done` from a thread of its own, filling
  // `response` first; `response` lives until then. Must not block.
  std::function<void(const etcdserverpb::HashKVRequest& request,
                     etcdserverpb::HashKVResponse* response,
                     absl::AnyInvocable<void(absl::Status)> done)>
      on_hash_kv;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Starts serving the peer URLs. Messages from a peer whose cluster ID
  // differs, or from a member this one has removed, are refused with
  // etcd's errors before they reach the handler.
  virtual absl::Status Start(TransportHandler handler) = 0;
  // Stops serving and sending; no handler runs after Stop returns.
  virtual void Stop() = 0;
  // Adds (or updates the URLs of) a peer that messages may be sent to.
  virtual void AddPeer(uint64_t id, const std::vector<std::string>& peer_urls) = 0;
  // Forgets a peer; it is refused from now on (etcd's removed-member check).
  virtual void RemovePeer(uint64_t id) = 0;
  // Queues each message for its peer (RaftMessage::to), in order per peer,
  // or writes it at once where that cannot wait (an idle connection).
  virtual void Send(std::vector<RaftMessage> messages) = 0;
  // Streams a snapshot to peer `to`: every file of the directory dir (a
  // checkpoint of the data), then message (its MsgSnap), at most
  // rate_bytes_per_sec (0: unlimited). Blocks until the peer has accepted
  // it, or fails.
  virtual absl::Status SendSnapshot(uint64_t to, const std::string& dir, const std::string& message,
                                    int64_t rate_bytes_per_sec) = 0;
  // Calls the leader's on_lease_renew over the peer connection (a
  // follower's LeaseKeepAlive) and returns at once: `done` gets the leader's
  // answer, or Unavailable when the leader cannot be reached before
  // deadline_ms, on whichever thread has it (this one, when it fails at
  // once). No thread waits for the leader meanwhile, so a follower forwards
  // any number of keep-alives at a time, as etcd's does.
  using LeaseRenewDone =
      absl::AnyInvocable<void(absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse>)>;
  virtual void LeaseRenew(uint64_t leader, const etcdserverpb::LeaseKeepAliveRequest& request,
                          int64_t deadline_ms, LeaseRenewDone done) = 0;
  // Asks the leader to promote learner `id` (its on_member_promote) and
  // waits for its answer: the members after the promotion, or the leader's
  // error (membership errors keep their identity).
  virtual absl::StatusOr<std::vector<membership::ClusterMember>> PromoteMember(
      uint64_t leader, uint64_t id, int64_t deadline_ms) {
    return absl::UnimplementedError("this transport does not forward promotions");
  }
  // Calls peer `id`'s on_hash_kv and waits for the answer (waiting for the
  // peer to be reachable until deadline_ms): its hash at `revision`, or
  // its error; Unavailable when it cannot be reached in time.
  virtual absl::StatusOr<etcdserverpb::HashKVResponse> PeerHashKV(uint64_t id, int64_t revision,
                                                                  int64_t deadline_ms) {
    return absl::UnimplementedError("this transport does not ask peers for hashes");
  }
  // Since when the connection to peer `id` has been up (etcd's
  // Transport.ActiveSince); absl::InfiniteFuture() when it is down or the
  // peer is unknown.
  virtual absl::Time ActiveSince(uint64_t id) const = 0;
  // What this member exchanged with each peer it sends to or heard from.
  virtual std::vector<membership::PeerTraffic> Traffic() const { return {}; }
  // Calls the leader's on_lease_time_to_live and waits for the answer.
  virtual absl::Status LeaseTimeToLive(uint64_t leader,
                                       const etcdserverpb::LeaseTimeToLiveRequest& request,
                                       etcdserverpb::LeaseTimeToLiveResponse* response,
                                       int64_t deadline_ms) = 0;
};

}  // namespace capstan::replication

#endif  // CAPSTAN_REPLICATION_TRANSPORT_H_
