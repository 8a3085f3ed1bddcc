#include "server/api/maintenance_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <utility>

#include "absl/strings/str_join.h"
#include "membership/member_table.h"
#include "mvcc/errors.h"
#include "server/api/auth_service.h"
#include "server/api/errors.h"
#include "server/api/snapshot_stream.h"
#include "server/api/write_rpc.h"
#include "server/config/config.h"
#include "server/config/version.h"

namespace capstan::server {
namespace {

// A Snapshot stream refused before it starts.
class RefusedSnapshot final : public grpc::ServerWriteReactor<etcdserverpb::SnapshotResponse> {
 public:
  explicit RefusedSnapshot(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// A MoveLeader call waiting for its transfer, which the member's Raft answers
// (Completion), or, as soon as the client gives up (its deadline passed, it
// cancelled), etcd's answer when MoveLeader's context ends: "leader transfer
// took too long". Finished once, by whichever comes first; deletes itself.
class MoveLeaderCall final : public grpc::ServerUnaryReactor {
 public:
  // The transfer's completion. It may run after the call is gone (the
  // client gave up first): then it touches only the shared flag.
  absl::AnyInvocable<void(absl::Status)> Completion() {
    return [this, finished = finished_](absl::Status s) {
      if (!finished->exchange(true)) Finish(ToGrpcStatus(s));
    };
  }
  void OnCancel() override {
    if (!finished_->exchange(true)) {
      Finish(ToGrpcStatus(mvcc::MakeError(mvcc::Error::kTimeoutLeaderTransfer)));
    }
  }
  void OnDone() override { delete this; }

 private:
  const std::shared_ptr<std::atomic<bool>> finished_ = std::make_shared<std::atomic<bool>>(false);
};

// The call's deadline (none: the infinite future).
absl::Time DeadlineOf(const grpc::CallbackServerContext& ctx) {
  const auto deadline = ctx.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

}  // namespace

MaintenanceService::MaintenanceService(mvcc::KvStore* store, const membership::MemberInfo* member,
                                       std::string version, const AuthGate* auth)
    : store_(store),
      member_(member),
      version_(std::move(version)),
      auth_(auth),
      defrag_(1, "defrag") {
  learner_check_ = member;
  DecodeUnary("Alarm", &MaintenanceService::Alarm);
  DecodeUnary("Status", &MaintenanceService::Status);
  DecodeUnary("Defragment", &MaintenanceService::Defragment);
  DecodeUnary("Hash", &MaintenanceService::Hash);
  DecodeUnary("HashKV", &MaintenanceService::HashKV);
  DecodeUnary("MoveLeader", &MaintenanceService::MoveLeader);
  DecodeUnary("Downgrade", &MaintenanceService::Downgrade);
  DecodeServerStream<etcdserverpb::SnapshotRequest, etcdserverpb::SnapshotResponse>(
      "Snapshot", [this](grpc::CallbackServerContext* ctx,
                         const Decoded<etcdserverpb::SnapshotRequest>* request) {
        return Snapshot(ctx, request);
      });
}

// Defragment, Snapshot, Hash and HashKV need the root role when auth is on
// (etcd's authMaintenanceServer, which returns the auth errors unconverted);
// Status, Alarm and MoveLeader do not.
#define CAPSTAN_REQUIRE_ROOT(ctx)                         \
  if (auth_ != nullptr) {                                 \
    if (auto s = auth_->CheckAdmin(*(ctx)); !s.ok()) {    \
      auto* reactor = (ctx)->DefaultReactor();            \
      reactor->Finish(ToUnconvertedAuthStatus(s));        \
      return reactor;                                     \
    }                                                     \
  }

grpc::ServerUnaryReactor* MaintenanceService::Status(grpc::CallbackServerContext* ctx,
                                                     const etcdserverpb::StatusRequest*,
                                                     etcdserverpb::StatusResponse* response) {
  membership::FillHeader(*member_, response->mutable_header());
  response->mutable_header()->set_revision(store_->Rev());
  response->set_version(version_);
  response->set_dbsize(static_cast<int64_t>(store_->backend()->SizeOnDisk()));
  response->set_dbsizeinuse(static_cast<int64_t>(store_->backend()->LiveDataSize()));
  if (const membership::RaftView* raft = member_->raft) {
    response->set_leader(raft->Leader());
    response->set_raftindex(raft->CommittedIndex());
    response->set_raftappliedindex(raft->AppliedIndex());
    response->set_raftterm(raft->Term());
    response->set_islearner(raft->IsLearner());
  } else {
    response->set_leader(member_->member_id);
    // One member: every applied request is a committed raft entry, plus the
    // entry each term starts with.
    const uint64_t index = store_->AppliedIndex() + member_->raft_term;
    response->set_raftindex(index);
    response->set_raftappliedindex(index);
    response->set_raftterm(member_->raft_term);
    response->set_islearner(false);
  }
  // etcd 3.6's: the schema version of the data (the cluster version once
  // migrated; none before the cluster has a version), the backend quota
  // (2 GiB unless --quota-backend-bytes says otherwise; with a negative
  // quota, no quota: 0) and no downgrade.
  response->set_storageversion(member_->StorageVersion(kEtcdClusterVersion, kEtcdStorageVersion));
  response->set_dbsizequota(store_->options().quota_bytes);
  response->mutable_downgradeinfo()->set_enabled(false);
  // etcd's Status: a member that knows no leader says so first (etcdctl
  // endpoint status shows it in its ERRORS column), then the alarms.
  if (response->leader() == 0) response->add_errors("etcdserver: no leader");
  for (const auto& a : store_->Alarms()) {
    // etcd lists alarms as the AlarmMember's text form.
    response->add_errors("memberID:" + std::to_string(a.memberid()) +
                         " alarm:" + etcdserverpb::AlarmType_Name(a.alarm()) + " ");
  }
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* MaintenanceService::Alarm(grpc::CallbackServerContext* ctx,
                                                    const etcdserverpb::AlarmRequest* request,
                                                    etcdserverpb::AlarmResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  SubmitAndFinish(store_, member_, reactor, mvcc::AlarmOp{request, response});
  return reactor;
}

grpc::ServerUnaryReactor* MaintenanceService::Defragment(
    grpc::CallbackServerContext* ctx, const etcdserverpb::DefragmentRequest*,
    etcdserverpb::DefragmentResponse*) {
  CAPSTAN_REQUIRE_ROOT(ctx)
  auto* reactor = ctx->DefaultReactor();
  // A full backend compaction takes a while: run it off the gRPC threads,
  // one at a time. Reads and writes continue meanwhile.
  // etcd answers with an empty response (no header).
  defrag_.RunOrCancel([this, ctx, reactor](bool run) {
    if (!run || ctx->IsCancelled()) {
      // Touches nothing of the service: it may be on its way out.
      reactor->Finish(ToGrpcStatus(mvcc::MakeError(mvcc::Error::kStopped)));
      return;
    }
    reactor->Finish(ToGrpcStatus(store_->Defragment()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* MaintenanceService::Hash(grpc::CallbackServerContext* ctx,
                                                   const etcdserverpb::HashRequest*,
                                                   etcdserverpb::HashResponse* response) {
  CAPSTAN_REQUIRE_ROOT(ctx)
  auto* reactor = ctx->DefaultReactor();
  const int64_t rev = store_->Rev();
  auto hash = store_->Hash();
  if (!hash.ok()) {
    reactor->Finish(ToGrpcStatus(hash.status()));
    return reactor;
  }
  membership::FillHeader(*member_, response->mutable_header());
  response->mutable_header()->set_revision(rev);
  response->set_hash(*hash);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* MaintenanceService::HashKV(grpc::CallbackServerContext* ctx,
                                                     const etcdserverpb::HashKVRequest* request,
                                                     etcdserverpb::HashKVResponse* response) {
  CAPSTAN_REQUIRE_ROOT(ctx)
  auto* reactor = ctx->DefaultReactor();
  uint32_t hash;
  int64_t compact_rev, hash_rev;
  absl::Status s = store_->HashKV(request->revision(), &hash, &compact_rev, &hash_rev);
  if (s.ok()) {
    membership::FillHeader(*member_, response->mutable_header());
    response->mutable_header()->set_revision(store_->Rev());
    response->set_hash(hash);
    response->set_compact_revision(compact_rev);
    // etcd 3.5.16's HashKVResponse has no hash_revision (3.6 adds it): the
    // field stays unset.
    (void)hash_rev;
  }
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerWriteReactor<etcdserverpb::SnapshotResponse>* MaintenanceService::Snapshot(
    grpc::CallbackServerContext* ctx, const Decoded<etcdserverpb::SnapshotRequest>* request) {
  if (!request->ok()) return new RefusedSnapshot(StreamUnmarshalStatus(request->error));
  if (auth_ != nullptr) {
    if (auto s = auth_->CheckAdmin(*ctx); !s.ok()) {
      return new RefusedSnapshot(ToUnconvertedAuthStatus(s));
    }
  }
  return NewSnapshotReactor(store_, *member_);
}

// etcd's maintenanceServer.MoveLeader and EtcdServer.MoveLeader: only the
// leader takes it; the transferee must be a voting member; the call returns
// once this member sees the transferee lead (at once when it is this
// member), with an empty response (no header).
grpc::ServerUnaryReactor* MaintenanceService::MoveLeader(
    grpc::CallbackServerContext* ctx, const etcdserverpb::MoveLeaderRequest* request,
    etcdserverpb::MoveLeaderResponse*) {
  membership::RaftView* raft = member_->raft;
  const uint64_t target = request->targetid();
  // A single member without Raft leads, and is the only member.
  const uint64_t leader = raft != nullptr ? raft->Leader() : member_->member_id;
  bool voter = false;
  if (raft != nullptr) {
    for (const auto& m : raft->Members()) voter |= m.id == target && !m.is_learner;
  } else {
    voter = target == member_->member_id;
  }
  absl::Status refused;
  if (leader != member_->member_id) {
    refused = mvcc::MakeError(mvcc::Error::kNotLeader);
  } else if (!voter) {
    refused = mvcc::MakeError(mvcc::Error::kBadLeaderTransferee);
  }
  if (!refused.ok() || raft == nullptr) {
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(ToGrpcStatus(refused));
    return reactor;
  }
  auto* call = new MoveLeaderCall();
  raft->TransferLeadership(target, DeadlineOf(*ctx), call->Completion());
  return call;
}

grpc::ServerUnaryReactor* MaintenanceService::Downgrade(grpc::CallbackServerContext* ctx,
                                                        const etcdserverpb::DowngradeRequest*,
                                                        etcdserverpb::DowngradeResponse*) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status(grpc::UNIMPLEMENTED,
                               "capstan: cluster version downgrade is not supported; a Capstan "
                               "member serves one API version"));
  return reactor;
}

#undef CAPSTAN_REQUIRE_ROOT

namespace {

template <typename Members>
void AddMembers(const std::vector<membership::ClusterMember>& members, Members* out) {
  // etcd lists the members by ID; one that has not published its
  // attributes yet has no name and no client URLs.
  std::vector<membership::ClusterMember> sorted = members;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  for (const auto& cm : sorted) membership::ToProto(cm, out->Add());
}

// A membership change waiting for this member to apply it, finished by the
// completion or, first, by the client giving up. Deletes itself.
class MembershipCall final : public grpc::ServerUnaryReactor {
 public:
  using Fill = absl::AnyInvocable<void(const std::vector<membership::ClusterMember>&)>;
  explicit MembershipCall(Fill fill) : fill_(std::move(fill)) {}
  membership::RaftView::MembersDone Completion() {
    return [this, finished = finished_](
               absl::StatusOr<std::vector<membership::ClusterMember>> members) {
      if (finished->exchange(true)) return;
      if (!members.ok()) {
        Finish(ToGrpcStatus(members.status()));
        return;
      }
      fill_(*members);
      Finish(grpc::Status::OK);
    };
  }
  void OnCancel() override {
    if (!finished_->exchange(true)) Finish(grpc::Status(grpc::CANCELLED, "context canceled"));
  }
  void OnDone() override { delete this; }

 private:
  Fill fill_;
  const std::shared_ptr<std::atomic<bool>> finished_ = std::make_shared<std::atomic<bool>>(false);
};

grpc::ServerUnaryReactor* Finished(grpc::CallbackServerContext* ctx, const absl::Status& s) {
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

// etcd's types.NewURLs for a member's peer URLs (sorted, normalized).
absl::StatusOr<std::vector<std::string>> MemberUrls(
    const google::protobuf::RepeatedPtrField<std::string>& urls) {
  if (urls.empty()) return membership::MakeError(membership::Error::kBadUrls);
  std::vector<std::string> texts(urls.begin(), urls.end());
  auto parsed = ParseUrlList(absl::StrJoin(texts, ","));
  if (!parsed.ok()) return membership::MakeError(membership::Error::kBadUrls);
  std::vector<std::string> out;
  for (const auto& u : *parsed) out.push_back(u.String());
  return out;
}

}  // namespace

template <typename Response>
ClusterService::Fill ClusterService::ListMembersInto(Response* response) const {
  return [this, response](const std::vector<membership::ClusterMember>& members) {
    membership::FillHeader(*member_, response->mutable_header());
    AddMembers(members, response->mutable_members());
  };
}

grpc::ServerUnaryReactor* ClusterService::Change(grpc::CallbackServerContext* ctx,
                                                 const membership::MemberChange& change,
                                                 Fill fill) {
  membership::RaftView* raft = member_->raft;
  if (raft == nullptr) {
    return Finished(ctx, absl::UnimplementedError(
                             "membership changes need a member that runs Raft (the capstan binary)"));
  }
  auto* call = new MembershipCall(std::move(fill));
  raft->ChangeMembership(change, DeadlineOf(*ctx), call->Completion());
  return call;
}

#define CAPSTAN_MEMBERSHIP_ADMIN(ctx)                                    \
  if (auth_ != nullptr) {                                                \
    if (auto s = auth_->CheckAdmin(*(ctx)); !s.ok()) return Finished(ctx, s); \
  }

grpc::ServerUnaryReactor* ClusterService::MemberAdd(grpc::CallbackServerContext* ctx,
                                                    const etcdserverpb::MemberAddRequest* request,
                                                    etcdserverpb::MemberAddResponse* response) {
  auto urls = MemberUrls(request->peerurls());
  if (!urls.ok()) return Finished(ctx, urls.status());
  CAPSTAN_MEMBERSHIP_ADMIN(ctx);
  membership::MemberChange change;
  change.type = request->islearner() ? membership::ChangeType::kAddLearnerNode
                                     : membership::ChangeType::kAddNode;
  // etcd's NewMember("", urls, "", now): the URLs and the time in seconds.
  change.id = membership::EtcdMemberId(*urls, absl::StrCat(absl::ToUnixSeconds(absl::Now())));
  change.member.id = change.id;
  change.member.peer_urls = *urls;
  change.member.is_learner = request->islearner();
  return Change(ctx, change, [this, response, added = change.member](const auto& members) {
    membership::FillHeader(*member_, response->mutable_header());
    auto* m = response->mutable_member();
    m->set_id(added.id);
    for (const auto& u : added.peer_urls) m->add_peerurls(u);
    m->set_islearner(added.is_learner);
    AddMembers(members, response->mutable_members());
  });
}

grpc::ServerUnaryReactor* ClusterService::MemberRemove(
    grpc::CallbackServerContext* ctx, const etcdserverpb::MemberRemoveRequest* request,
    etcdserverpb::MemberRemoveResponse* response) {
  CAPSTAN_MEMBERSHIP_ADMIN(ctx);
  membership::MemberChange change;
  change.type = membership::ChangeType::kRemoveNode;
  change.id = request->id();
  change.member.id = request->id();
  return Change(ctx, change, ListMembersInto(response));
}

grpc::ServerUnaryReactor* ClusterService::MemberUpdate(
    grpc::CallbackServerContext* ctx, const etcdserverpb::MemberUpdateRequest* request,
    etcdserverpb::MemberUpdateResponse* response) {
  CAPSTAN_MEMBERSHIP_ADMIN(ctx);
  membership::MemberChange change;
  change.type = membership::ChangeType::kUpdateNode;
  change.id = request->id();
  change.member.id = request->id();
  // etcd takes the URLs as given (its client checked them).
  change.member.peer_urls.assign(request->peerurls().begin(), request->peerurls().end());
  return Change(ctx, change, ListMembersInto(response));
}

grpc::ServerUnaryReactor* ClusterService::MemberPromote(
    grpc::CallbackServerContext* ctx, const etcdserverpb::MemberPromoteRequest* request,
    etcdserverpb::MemberPromoteResponse* response) {
  CAPSTAN_MEMBERSHIP_ADMIN(ctx);
  membership::MemberChange change;
  change.type = membership::ChangeType::kAddNode;
  change.is_promote = true;
  change.id = request->id();
  change.member.id = request->id();
  return Change(ctx, change, ListMembersInto(response));
}

#undef CAPSTAN_MEMBERSHIP_ADMIN

grpc::ServerUnaryReactor* ClusterService::MemberList(grpc::CallbackServerContext* ctx,
                                                     const etcdserverpb::MemberListRequest* request,
                                                     etcdserverpb::MemberListResponse* response) {
  auto list = [this, response] {
    // etcd's MemberList header carries no revision.
    membership::FillHeader(*member_, response->mutable_header());
    AddMembers(membership::MembersOf(*member_), response->mutable_members());
  };
  if (!request->linearizable() || member_->raft == nullptr) {
    list();
    return Finished(ctx, absl::OkStatus());
  }
  // etcd's linearizableReadNotify, then the members this member applied.
  auto* reactor = ctx->DefaultReactor();
  store_->ReadBarrier([reactor, list = std::move(list)](absl::Status s) mutable {
    if (s.ok()) list();
    reactor->Finish(ToGrpcStatus(s));
  });
  return reactor;
}

}  // namespace capstan::server
