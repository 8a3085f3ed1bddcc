// WriteRequest: one write for the KV store's committer, typed.
//
// The writes a client makes are the requests etcd puts in its Raft log, the
// fields of etcdserverpb::InternalRaftRequest: put, delete_range, txn,
// compaction, lease_grant, lease_revoke and alarm. A WriteRequest holds one
// of them as a typed pair (the request and the response the committer
// fills), so the committer dispatches on the type instead of casting a
// protobuf::Message back. Two more kinds are Capstan's own and never leave
// the member: an InternalOp (a step of the store itself, run between
// writes) and a CustomOp (a store layered on the KV store's durability,
// such as auth, staging its own records).
//
// ToInternalRaftRequest gives a client write the shape etcd's Raft log
// carries, the entry a replicated member proposes.
//
// Thread safety: plain values; a WriteRequest is handed to KvStore::Submit
// and from then on touched by the committer only.

#ifndef CAPSTAN_MVCC_WRITE_REQUEST_H_
#define CAPSTAN_MVCC_WRITE_REQUEST_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <variant>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "etcdserverpb/raft_internal.pb.h"
#include "etcdserverpb/rpc.pb.h"
#include "storage/backend.h"

namespace capstan::mvcc {

// A client write: the request, and the response the committer fills (its
// header carries only the revision). Both are owned by the submitter and
// must stay alive until the write's `done` runs.
template <typename Request, typename Response>
struct ClientOp {
  const Request* request = nullptr;
  Response* response = nullptr;
};

using PutOp = ClientOp<etcdserverpb::PutRequest, etcdserverpb::PutResponse>;
using DeleteRangeOp = ClientOp<etcdserverpb::DeleteRangeRequest, etcdserverpb::DeleteRangeResponse>;
using TxnOp = ClientOp<etcdserverpb::TxnRequest, etcdserverpb::TxnResponse>;
using CompactOp = ClientOp<etcdserverpb::CompactionRequest, etcdserverpb::CompactionResponse>;
using LeaseGrantOp = ClientOp<etcdserverpb::LeaseGrantRequest, etcdserverpb::LeaseGrantResponse>;
using LeaseRevokeOp =
    ClientOp<etcdserverpb::LeaseRevokeRequest, etcdserverpb::LeaseRevokeResponse>;
using AlarmOp = ClientOp<etcdserverpb::AlarmRequest, etcdserverpb::AlarmResponse>;

// The store's own step: `apply` runs on the committer (the thread holding
// its part: KvStore's committer thread, or one committing inline) inside a
// group, between writes (compacting the key index in batches). It takes no
// revision and is not counted in the applied index.
struct InternalOp {
  absl::AnyInvocable<void()> apply;
};

// A store layered on the KV store's durability (auth): `apply_batch` runs on
// the committer in order with every other write and may stage
// records into the group's batch; the write's `done` runs once they are
// durable, with apply_batch's error if it failed. Nothing staged by a failed
// apply_batch may remain: check before staging.
struct CustomOp {
  absl::AnyInvocable<absl::Status(storage::WriteBatch* batch)> apply_batch;
};

using WriteOp = std::variant<PutOp, DeleteRangeOp, TxnOp, CompactOp, LeaseGrantOp, LeaseRevokeOp,
                             AlarmOp, InternalOp, CustomOp>;

// Who made a client write, as etcd's RequestHeader logs it: the user of the
// caller's token or certificate and the auth revision it was checked at
// (etcd's AuthInfo). Empty (no user, revision 0) for a client that showed
// no identity, as every client does while auth is off: a write of such a
// caller that applies once auth is on is refused, "user name is empty", as
// etcd's authApplierV3 refuses it.
struct Caller {
  std::string user;
  uint64_t auth_revision = 0;
};

// The caller of the server's own lease revocations (an expired lease),
// which etcd checks when they apply: etcd revokes as root
// (AuthStore.WithRoot), which passes whatever the lease's keys. A
// revocation's caller is checked for the root role only, never for its auth
// revision, so none is given.
inline Caller RootCaller() { return Caller{"root", 0}; }

// A write applied by the committer, which calls `done` exactly once: after
// the write is durable and visible, or with the error that refused it. done
// runs on the store's answer thread (or, for a small group with nothing
// queued before it, on the committer; with KvStoreOptions::inline_commit,
// on the thread that committed the group), in commit order: it must not
// block.
struct WriteRequest {
  WriteOp op;
  absl::AnyInvocable<void(absl::Status)> done;
  // The submitter already checked the request with ValidateWrite (the KV
  // service does, before its auth checks): the committer skips the txn
  // checks that cost (the duplicate-key walk), off its serial path.
  bool validated = false;
  // A CustomOp that a cluster replicates (an auth change) carries the
  // request as etcd's Raft log holds it: the member that proposed it
  // applies op, every other member the WriteRequest that the owner of the
  // request builds from this entry (replication/). Null for a client write
  // (ToInternalRaftRequest gives its entry) and for what never leaves the
  // member.
  std::shared_ptr<const etcdserverpb::InternalRaftRequest> raft_request;
  // The index of the Raft log entry this write applies (0: a write that is
  // not in a log). The committer stores the greatest applied index with
  // each group, atomically with its data (etcd's consistent index), so that
  // replay after a crash skips what was applied.
  uint64_t raft_index = 0;
  // The term of that entry, stored with the applied index (etcd 3.5's
  // consistent term): a log restarted behind the store resumes from it.
  uint64_t raft_term = 0;
  // Set for every client write: who made it (an empty Caller while auth is
  // off). A cluster logs it in the entry's header (username,
  // auth_revision), every member applies the entry with the caller its
  // header names (the proposer too), and the store's WriteGuard re-checks
  // the permission against it when the write is applied, as etcd's
  // authApplierV3 does. Unset: a write of the server's own that etcd does
  // not check (compactions, lease grants and checkpoints, alarms) or one
  // that never leaves the member.
  std::optional<Caller> caller;
  // Nonzero: a write of this member's own that only the leader of this term
  // may make (the revocation of a lease its clock saw expire, decided once a
  // ReadIndex round confirmed the leadership in this term). A write log
  // that no longer leads in that term refuses it (kNotLeader) instead of
  // forwarding it: forwarded to a new leader, which has kept the lease
  // alive, it would revoke a lease a client was told it holds.
  uint64_t leader_term = 0;
  // Nobody waits for its answer (a cluster's entry that another member
  // proposed): done only releases what op points into, and the committer
  // drops it rather than handing it to the answering thread.
  bool unawaited = false;
};

// Re-checks a client write as the committer applies it (etcd's
// authApplierV3): a permission revoked after the write was checked and
// queued (or logged) refuses it. The auth store is the store's guard.
class WriteGuard {
 public:
  virtual ~WriteGuard() = default;
  // Runs on the committer thread, in order with every other write, just
  // before w applies (after the writes before it in its group): ok, or the
  // error that refuses w, which then changes nothing. Must not block.
  virtual absl::Status CheckApply(const WriteRequest& w) = 0;
};

// Where writes go to be ordered, made durable and applied: on a single
// member (and in libcapstan) the KV store's committer itself; in a cluster
// the Raft log (replication/), whose committed entries reach the committer
// of every member in log order. The services and the stores layered on the
// KV store (auth) submit through a WriteLog, never knowing which.
//
// Thread safety: Submit may be called from any thread.
class WriteLog {
 public:
  virtual ~WriteLog() = default;
  // Orders w with every other write and calls w.done exactly once, as
  // KvStore::Submit does: after the write is durable (in a cluster, on a
  // quorum) and applied here, or with the error that refused it.
  virtual void Submit(WriteRequest w) = 0;
  // Whether this member does the work that only one member may do (expiring
  // leases, automatic compaction): always on a single member, on the leader
  // in a cluster.
  virtual bool Leads() const { return true; }
  // The term in which Leads() holds (WriteRequest::leader_term); 0 on a
  // single member, which has no terms to lose.
  virtual uint64_t LeaderTerm() const { return 0; }
  // Calls ready (on any thread; it must not block) once every write
  // committed before the call is applied on this member, so that a read
  // served then is linearizable (etcd's ReadIndex), or with the error that
  // prevents it (no leader, a timeout). At once on a single member.
  virtual void ReadBarrier(absl::AnyInvocable<void(absl::Status)> ready) {
    ready(absl::OkStatus());
  }
  // Called by the KV store's committer after each group is durable and
  // published, with the store's applied index. Must not block or call into
  // the store.
  virtual void Applied(uint64_t applied_index) {}
  // Renews a lease where its cluster keeps leases alive (the leader) and
  // calls done with its TTL, or kLeaseNotFound, or why it could not reach
  // the leader. done may run on any thread, before RenewLease returns.
  // Only a cluster's write log overrides it; the KV store renews locally.
  virtual void RenewLease(int64_t id, absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) {
    done(absl::UnimplementedError("this write log does not renew leases"));
  }
  // A lease's TTLs (and keys, when asked) as the member that keeps leases
  // alive knows them (a cluster's leader: a follower never sees the
  // keep-alives), or kLeaseNotFound. done may run on any thread, before the
  // call returns. Only a cluster's write log overrides it.
  using LeaseTimeToLiveDone =
      absl::AnyInvocable<void(absl::StatusOr<etcdserverpb::LeaseTimeToLiveResponse>)>;
  virtual void LeaseTimeToLive(const etcdserverpb::LeaseTimeToLiveRequest& request,
                               LeaseTimeToLiveDone done) {
    done(absl::UnimplementedError("this write log does not keep leases"));
  }
};

// A client write's request as etcd's Raft log carries it: `out` gets a copy
// of the request in the matching field of InternalRaftRequest (the header
// and ID are the caller's). Returns false, leaving `out` alone, for an
// InternalOp or a CustomOp, which never leave the member.
bool ToInternalRaftRequest(const WriteOp& op, etcdserverpb::InternalRaftRequest* out);

// The encoded size of a client write's request (what --max-request-bytes
// limits); 0 for an InternalOp or a CustomOp.
size_t RequestBytes(const WriteOp& op);

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_WRITE_REQUEST_H_
