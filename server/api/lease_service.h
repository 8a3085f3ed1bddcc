// etcdserverpb.Lease over the gRPC callback API. Grants and revokes are
// writes through the KV store's committer; keep-alives and time-to-live
// reads are answered from the in-memory lessor.

#ifndef CAPSTAN_SERVER_API_LEASE_SERVICE_H_
#define CAPSTAN_SERVER_API_LEASE_SERVICE_H_

#include "etcdserverpb/rpc.grpc.pb.h"
#include "membership/member.h"
#include "mvcc/kv_store.h"
#include "server/api/decoded.h"

namespace capstan::server {
class AuthGate;
}  // namespace capstan::server

namespace capstan::server {

// Thread-safe. store and member must outlive the service.
class LeaseService final : public DecodingService<etcdserverpb::Lease> {
 public:
  // auth: permission checks (null: none); must outlive the service.
  LeaseService(mvcc::KvStore* store, const membership::MemberInfo* member, const AuthGate* auth = nullptr);

  grpc::ServerUnaryReactor* LeaseGrant(grpc::CallbackServerContext* ctx,
                                       const etcdserverpb::LeaseGrantRequest* request,
                                       etcdserverpb::LeaseGrantResponse* response) override;
  grpc::ServerUnaryReactor* LeaseRevoke(grpc::CallbackServerContext* ctx,
                                        const etcdserverpb::LeaseRevokeRequest* request,
                                        etcdserverpb::LeaseRevokeResponse* response) override;
  grpc::ServerUnaryReactor* LeaseTimeToLive(grpc::CallbackServerContext* ctx,
                                            const etcdserverpb::LeaseTimeToLiveRequest* request,
                                            etcdserverpb::LeaseTimeToLiveResponse* response) override;
  grpc::ServerUnaryReactor* LeaseLeases(grpc::CallbackServerContext* ctx,
                                        const etcdserverpb::LeaseLeasesRequest* request,
                                        etcdserverpb::LeaseLeasesResponse* response) override;

 private:
  mvcc::KvStore* const store_;
  const membership::MemberInfo* const member_;
  const AuthGate* const auth_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_LEASE_SERVICE_H_
