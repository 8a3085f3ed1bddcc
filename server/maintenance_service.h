// etcdserverpb.Maintenance and etcdserverpb.Cluster for a single member.
// RPCs not overridden here answer UNIMPLEMENTED (the generated default).

#ifndef CAPSTAN_SERVER_MAINTENANCE_SERVICE_H_
#define CAPSTAN_SERVER_MAINTENANCE_SERVICE_H_

#include <string>

#include "etcdserverpb/rpc.grpc.pb.h"
#include "mvcc/kv_store.h"
#include "server/member.h"

namespace capstan::server {

// Thread-safe. store and member must outlive the service.
class MaintenanceService final : public etcdserverpb::Maintenance::CallbackService {
 public:
  MaintenanceService(mvcc::KvStore* store, const MemberInfo* member, std::string version)
      : store_(store), member_(member), version_(std::move(version)) {}

  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const etcdserverpb::StatusRequest* request,
                                   etcdserverpb::StatusResponse* response) override;

 private:
  mvcc::KvStore* const store_;
  const MemberInfo* const member_;
  const std::string version_;
};

class ClusterService final : public etcdserverpb::Cluster::CallbackService {
 public:
  ClusterService(mvcc::KvStore* store, const MemberInfo* member) : store_(store), member_(member) {}

  grpc::ServerUnaryReactor* MemberList(grpc::CallbackServerContext* ctx,
                                       const etcdserverpb::MemberListRequest* request,
                                       etcdserverpb::MemberListResponse* response) override;

 private:
  mvcc::KvStore* const store_;
  const MemberInfo* const member_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_MAINTENANCE_SERVICE_H_
