// etcdserverpb.Auth over the gRPC callback API, and AuthGate: who a request
// comes from and what it may do, for every other service.
//
// Identity follows etcd 3.5 (EtcdServer.AuthInfoFromCtx): the "token"
// metadata (or "authorization", as the gRPC gateway sends it) names a simple
// token; without one, and with --client-cert-auth, the verified client
// certificate's common name is the user; otherwise there is no user (and
// every check fails with "user name is empty" while auth is enabled).
//
// Checks are made when the request arrives, before it is queued to the
// committer or proposed; a write made by a user carries who made it
// (CallerOf) and the auth store checks it again when every member applies
// it, serialized with auth changes, as etcd does.

#ifndef CAPSTAN_SERVER_API_AUTH_SERVICE_H_
#define CAPSTAN_SERVER_API_AUTH_SERVICE_H_

#include <functional>
#include <optional>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "auth/auth_store.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "membership/member.h"
#include "mvcc/kv_store.h"
#include "server/api/decoded.h"
#include "util/work_queue.h"

namespace capstan::server {

// Thread-safe. store must outlive the gate.
class AuthGate {
 public:
  AuthGate(auth::AuthStore* store, bool client_cert_auth)
      : store_(store), client_cert_auth_(client_cert_auth) {}

  auth::AuthStore* store() const { return store_; }

  // The caller's identity; kInvalidAuthToken for an unknown or expired token.
  absl::StatusOr<auth::AuthInfo> Identify(const grpc::ServerContextBase& ctx) const;

  // Each answers ok or etcd's error for the request (identity errors
  // included).
  absl::Status CheckRange(const grpc::ServerContextBase& ctx,
                          const etcdserverpb::RangeRequest& req) const;
  absl::Status CheckPut(const grpc::ServerContextBase& ctx, const etcdserverpb::PutRequest& req) const;
  absl::Status CheckDeleteRange(const grpc::ServerContextBase& ctx,
                                const etcdserverpb::DeleteRangeRequest& req) const;
  absl::Status CheckTxn(const grpc::ServerContextBase& ctx, const etcdserverpb::TxnRequest& req) const;
  // Read permission on a watched range.
  absl::Status CheckWatch(const grpc::ServerContextBase& ctx, std::string_view key,
                          std::string_view range_end) const;
  // Write permission on every key attached to the lease (etcd's
  // checkLeasePuts), for LeaseRevoke.
  absl::Status CheckLeaseRevoke(const grpc::ServerContextBase& ctx, int64_t lease_id) const;
  // For a LeaseTimeToLive that lists the lease's keys (etcd 3.5.13+'s
  // checkLeaseTimeToLive): a user, and read permission on every attached
  // key. Without keys etcd checks nothing, not even the token.
  absl::Status CheckLeaseTimeToLive(const grpc::ServerContextBase& ctx, int64_t lease_id) const;
  // The root role (etcd's IsAdminPermitted).
  absl::Status CheckAdmin(const grpc::ServerContextBase& ctx) const;
  // Only a valid identity, no permission (Compact and LeaseGrant, as etcd:
  // it refuses a bad token before proposing any request).
  absl::Status CheckIdentity(const grpc::ServerContextBase& ctx) const;
  // Who makes a write, for its WriteRequest::caller (etcd's RequestHeader
  // username and auth_revision), so that its permission is checked again
  // when it is applied: empty while auth is off and for a caller without a
  // user (refused at apply if auth is on by then, as etcd refuses a write
  // checked before auth was enabled). Call after the write's check passed.
  mvcc::Caller CallerOf(const grpc::ServerContextBase& ctx) const;

 private:
  auth::AuthStore* const store_;
  const bool client_cert_auth_;
};

// A client write's checks before it is submitted, in etcd's order: its shape
// (mvcc::ValidateWrite: the errors etcd's gRPC layer gives), then, with auth
// on (gate not null), the caller's permission by check, or only a valid
// identity when check is null. OK: the write may go to the store marked
// validated. The KV service and the Lock and Election recipes both submit
// writes through it.
template <typename Req>
absl::Status CheckWrite(const AuthGate* gate, const grpc::ServerContextBase& ctx, const Req& req,
                        int max_txn_ops,
                        absl::Status (AuthGate::*check)(const grpc::ServerContextBase&,
                                                        const Req&) const) {
  absl::Status s = mvcc::ValidateWrite(req, max_txn_ops);
  if (s.ok() && gate != nullptr) {
    s = check != nullptr ? (gate->*check)(ctx, req) : gate->CheckIdentity(ctx);
  }
  return s;
}

// Owns the auth store and the gate the other services check with. Thread-safe.
// member and the KV store under the auth store must outlive the service;
// the gate lives as long as the service.
//
// bcrypt work (Authenticate, UserAdd of a user with a password, and
// UserChangePassword given a plain password; the hash goes in the logged
// request, as etcd 3.5 logs it) runs on the service's pool of a few threads (one per
// core, 2 to 8), never on a gRPC reactor thread nor on a thread per call.
// While the pool is busy a call waits in its queue, however many there are:
// etcd answers every Authenticate eventually. A queued call whose client is
// gone, or that the gRPC server cancelled as it stops, is answered "etcdserver:
// server stopped" (Unavailable) without its bcrypt check (its client never
// sees that answer). Destroying the service drains the pool first: checks
// running finish, each call still queued is answered "etcdserver: server
// stopped" without touching the service or the store.
class AuthService final : public DecodingService<etcdserverpb::Auth> {
 public:
  AuthService(std::unique_ptr<auth::AuthStore> store, bool client_cert_auth,
              const membership::MemberInfo* member);

  const AuthGate* gate() const { return &owned_gate_; }

#define CAPSTAN_AUTH_RPC(Name, Req, Resp)                                                       \
  grpc::ServerUnaryReactor* Name(grpc::CallbackServerContext* ctx, const etcdserverpb::Req* req, \
                                 etcdserverpb::Resp* resp) override;
  CAPSTAN_AUTH_RPC(AuthEnable, AuthEnableRequest, AuthEnableResponse)
  CAPSTAN_AUTH_RPC(AuthDisable, AuthDisableRequest, AuthDisableResponse)
  CAPSTAN_AUTH_RPC(AuthStatus, AuthStatusRequest, AuthStatusResponse)
  CAPSTAN_AUTH_RPC(Authenticate, AuthenticateRequest, AuthenticateResponse)
  CAPSTAN_AUTH_RPC(UserAdd, AuthUserAddRequest, AuthUserAddResponse)
  CAPSTAN_AUTH_RPC(UserGet, AuthUserGetRequest, AuthUserGetResponse)
  CAPSTAN_AUTH_RPC(UserList, AuthUserListRequest, AuthUserListResponse)
  CAPSTAN_AUTH_RPC(UserDelete, AuthUserDeleteRequest, AuthUserDeleteResponse)
  CAPSTAN_AUTH_RPC(UserChangePassword, AuthUserChangePasswordRequest,
                   AuthUserChangePasswordResponse)
  CAPSTAN_AUTH_RPC(UserGrantRole, AuthUserGrantRoleRequest, AuthUserGrantRoleResponse)
  CAPSTAN_AUTH_RPC(UserRevokeRole, AuthUserRevokeRoleRequest, AuthUserRevokeRoleResponse)
  CAPSTAN_AUTH_RPC(RoleAdd, AuthRoleAddRequest, AuthRoleAddResponse)
  CAPSTAN_AUTH_RPC(RoleGet, AuthRoleGetRequest, AuthRoleGetResponse)
  CAPSTAN_AUTH_RPC(RoleList, AuthRoleListRequest, AuthRoleListResponse)
  CAPSTAN_AUTH_RPC(RoleDelete, AuthRoleDeleteRequest, AuthRoleDeleteResponse)
  CAPSTAN_AUTH_RPC(RoleGrantPermission, AuthRoleGrantPermissionRequest,
                   AuthRoleGrantPermissionResponse)
  CAPSTAN_AUTH_RPC(RoleRevokePermission, AuthRoleRevokePermissionRequest,
                   AuthRoleRevokePermissionResponse)
#undef CAPSTAN_AUTH_RPC

 private:
  // One attempt of Authenticate (on the bcrypt pool): the password, then
  // the token; again while the auth revision moved past the one the
  // password was checked at (etcd's Authenticate loop).
  void AuthenticateOnce(grpc::CallbackServerContext* ctx, grpc::ServerUnaryReactor* reactor,
                        const etcdserverpb::AuthenticateRequest* req,
                        etcdserverpb::AuthenticateResponse* resp);
  // Finishes with resp's header filled on success.
  template <typename Response>
  void Finish(grpc::ServerUnaryReactor* reactor, Response* resp, const absl::Status& s) const;
  // Whether a caller without the root role may still make the call.
  using AllowedFn = std::function<bool(const auth::AuthInfo&)>;
  // The preamble of every admin RPC: runs start(reactor), which must finish
  // the reactor, for a caller with the root role or one also_allowed
  // admits; else finishes with the identity or admin error. Returns the
  // reactor.
  template <typename Response, typename Start>
  grpc::ServerUnaryReactor* Admin(grpc::CallbackServerContext* ctx, Response* resp, Start start,
                                  AllowedFn also_allowed = nullptr) const;
  // A done callback for an AuthStore mutation that finishes the RPC.
  template <typename Response>
  auth::AuthStore::Done FinishWhenDone(grpc::ServerUnaryReactor* reactor, Response* resp) const;
  // An auth read as etcd 3.5 makes it, through the log
  // (AuthStore::ReadThroughLog): once `request` is applied, read() fills
  // resp from the applied state and its status finishes the RPC.
  template <typename Response, typename Read>
  void ReadThroughLog(grpc::ServerUnaryReactor* reactor, Response* resp,
                      std::shared_ptr<etcdserverpb::InternalRaftRequest> request, Read read) const;
  // Queues bcrypt work for the call on ctx on the pool. work must finish
  // reactor (or arrange for a done callback to). It does not run if the
  // call is cancelled before its turn or the service is being destroyed:
  // reactor is then finished with "server stopped".
  void RunBcrypt(const grpc::ServerContextBase* ctx, grpc::ServerUnaryReactor* reactor,
                 std::function<void()> work);

  const std::unique_ptr<auth::AuthStore> store_;
  const AuthGate owned_gate_;
  const AuthGate* const gate_ = &owned_gate_;
  const membership::MemberInfo* const member_;
  // Last: destroyed, and drained, before the store its work uses.
  util::WorkQueue bcrypt_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_AUTH_SERVICE_H_
