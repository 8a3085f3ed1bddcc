#include "server/maintenance_service.h"

namespace capstan::server {

grpc::ServerUnaryReactor* MaintenanceService::Status(grpc::CallbackServerContext* ctx,
                                                     const etcdserverpb::StatusRequest*,
                                                     etcdserverpb::StatusResponse* response) {
  FillHeader(*member_, response->mutable_header());
  response->mutable_header()->set_revision(store_->Rev());
  response->set_version(version_);
  response->set_dbsize(static_cast<int64_t>(store_->backend()->SizeOnDisk()));
  response->set_dbsizeinuse(static_cast<int64_t>(store_->backend()->LiveDataSize()));
  response->set_leader(member_->member_id);
  // One member: every applied request is a committed raft entry, plus the
  // entry each term starts with.
  const uint64_t index = store_->AppliedIndex() + member_->raft_term;
  response->set_raftindex(index);
  response->set_raftappliedindex(index);
  response->set_raftterm(member_->raft_term);
  response->set_islearner(false);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ClusterService::MemberList(grpc::CallbackServerContext* ctx,
                                                     const etcdserverpb::MemberListRequest*,
                                                     etcdserverpb::MemberListResponse* response) {
  FillHeader(*member_, response->mutable_header());
  response->mutable_header()->set_revision(store_->Rev());
  auto* m = response->add_members();
  m->set_id(member_->member_id);
  m->set_name(member_->name);
  for (const auto& u : member_->peer_urls) m->add_peerurls(u);
  for (const auto& u : member_->client_urls) m->add_clienturls(u);
  m->set_islearner(false);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace capstan::server
