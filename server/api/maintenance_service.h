// etcdserverpb.Maintenance and etcdserverpb.Cluster of one member, alone or in a cluster.
// RPCs not overridden here answer UNIMPLEMENTED (the generated default).

#ifndef CAPSTAN_SERVER_API_MAINTENANCE_SERVICE_H_
#define CAPSTAN_SERVER_API_MAINTENANCE_SERVICE_H_

#include <string>

#include "etcdserverpb/rpc.grpc.pb.h"
#include "membership/member.h"
#include "mvcc/kv_store.h"
#include "server/api/decoded.h"
#include "util/work_queue.h"

namespace capstan::server {

class AuthGate;

// Thread-safe. store and member must outlive the service.
//
// Defragment (a full backend compaction, seconds to minutes) runs on the
// service's one defragment thread, never on a gRPC reactor thread: calls
// made while one runs wait their turn in its queue, as etcd's do for its
// backend lock. A queued call whose client is gone, or that the gRPC server
// cancelled as it stops, is answered "etcdserver: server stopped" without
// defragmenting. Destroying the service drains the queue first: a
// defragmentation running finishes, each call still queued is answered
// "etcdserver: server stopped" without touching the store.
//
// MoveLeader never blocks a gRPC thread either: the member's Raft answers it
// (RaftView::TransferLeadership) once the transferee leads, or the call ends
// when its client gives up.
class MaintenanceService final : public DecodingService<etcdserverpb::Maintenance> {
 public:
  // auth: root checks (null: none); must outlive the service.
  MaintenanceService(mvcc::KvStore* store, const membership::MemberInfo* member, std::string version,
                     const AuthGate* auth = nullptr);

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const etcdserverpb::StatusRequest* request,
                                   etcdserverpb::StatusResponse* response) override;
  grpc::ServerUnaryReactor* Alarm(grpc::CallbackServerContext* ctx,
                                  const etcdserverpb::AlarmRequest* request,
                                  etcdserverpb::AlarmResponse* response) override;
  grpc::ServerUnaryReactor* Defragment(grpc::CallbackServerContext* ctx,
                                       const etcdserverpb::DefragmentRequest* request,
                                       etcdserverpb::DefragmentResponse* response) override;
  grpc::ServerUnaryReactor* Hash(grpc::CallbackServerContext* ctx,
                                 const etcdserverpb::HashRequest* request,
                                 etcdserverpb::HashResponse* response) override;
  grpc::ServerUnaryReactor* HashKV(grpc::CallbackServerContext* ctx,
                                   const etcdserverpb::HashKVRequest* request,
                                   etcdserverpb::HashKVResponse* response) override;
  grpc::ServerUnaryReactor* MoveLeader(grpc::CallbackServerContext* ctx,
                                       const etcdserverpb::MoveLeaderRequest* request,
                                       etcdserverpb::MoveLeaderResponse* response) override;
  grpc::ServerUnaryReactor* Downgrade(grpc::CallbackServerContext* ctx,
                                      const etcdserverpb::DowngradeRequest* request,
                                      etcdserverpb::DowngradeResponse* response) override;

 private:
  grpc::ServerWriteReactor<etcdserverpb::SnapshotResponse>* Snapshot(
      grpc::CallbackServerContext* ctx, const Decoded<etcdserverpb::SnapshotRequest>* request);

  mvcc::KvStore* const store_;
  const membership::MemberInfo* const member_;
  const std::string version_;
  const AuthGate* const auth_;
  // Last: destroyed, and drained, before anything its work uses.
  util::WorkQueue defrag_;
};

// etcd's Cluster service. Changes go through the member's Raft log
// (membership::RaftView::ChangeMembership) and are answered once this
// member applied them, with the members after the change; with auth on,
// they need the root role (etcd's checkMembershipOperationPermission).
// MemberList with linearizable waits for a ReadIndex round first.
class ClusterService final : public DecodingService<etcdserverpb::Cluster> {
 public:
  ClusterService(mvcc::KvStore* store, const membership::MemberInfo* member,
                 const AuthGate* auth = nullptr)
      : store_(store), member_(member), auth_(auth) {
    learner_check_ = member;
    DecodeUnary("MemberAdd", &ClusterService::MemberAdd);
    DecodeUnary("MemberRemove", &ClusterService::MemberRemove);
    DecodeUnary("MemberUpdate", &ClusterService::MemberUpdate);
    DecodeUnary("MemberList", &ClusterService::MemberList);
    DecodeUnary("MemberPromote", &ClusterService::MemberPromote);
  }

  grpc::ServerUnaryReactor* MemberAdd(grpc::CallbackServerContext* ctx,
                                      const etcdserverpb::MemberAddRequest* request,
                                      etcdserverpb::MemberAddResponse* response) override;
  grpc::ServerUnaryReactor* MemberRemove(grpc::CallbackServerContext* ctx,
                                         const etcdserverpb::MemberRemoveRequest* request,
                                         etcdserverpb::MemberRemoveResponse* response) override;
  grpc::ServerUnaryReactor* MemberUpdate(grpc::CallbackServerContext* ctx,
                                         const etcdserverpb::MemberUpdateRequest* request,
                                         etcdserverpb::MemberUpdateResponse* response) override;
  grpc::ServerUnaryReactor* MemberList(grpc::CallbackServerContext* ctx,
                                       const etcdserverpb::MemberListRequest* request,
                                       etcdserverpb::MemberListResponse* response) override;
  grpc::ServerUnaryReactor* MemberPromote(grpc::CallbackServerContext* ctx,
                                          const etcdserverpb::MemberPromoteRequest* request,
                                          etcdserverpb::MemberPromoteResponse* response) override;

 private:
  // Proposes change and finishes the call with fill(members) once applied.
  using Fill = absl::AnyInvocable<void(const std::vector<membership::ClusterMember>&)>;
  grpc::ServerUnaryReactor* Change(grpc::CallbackServerContext* ctx,
                                   const membership::MemberChange& change, Fill fill);
  // Fills a response's header and its members (by ID).
  template <typename Response>
  Fill ListMembersInto(Response* response) const;

  mvcc::KvStore* const store_;
  const membership::MemberInfo* const member_;
  const AuthGate* const auth_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_MAINTENANCE_SERVICE_H_
