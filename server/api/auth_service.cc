#include "server/api/auth_service.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "auth/errors.h"
#include "grpcpp/security/auth_context.h"
#include "mvcc/errors.h"
#include "server/api/errors.h"

namespace capstan::server {
namespace {

using auth::AuthInfo;
using auth::PermType;

// bcrypt is CPU-bound: one check per core at most, at least two so that a
// slow UserAdd does not hold every Authenticate back.
int BcryptThreads() {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 2, 8);
}

}  // namespace

// ---------------------------------------------------------------- AuthGate

absl::StatusOr<AuthInfo> AuthGate::Identify(const grpc::ServerContextBase& ctx) const {
  // etcd's AuthInfoFromCtx: nobody, and no token is looked at, while auth is
  // off.
  if (!store_->Enabled()) return AuthInfo{};
  const auto& md = ctx.client_metadata();
  auto it = md.find("token");
  if (it == md.end()) it = md.find("authorization");
  if (it != md.end()) {
    return store_->InfoFromToken(std::string(it->second.data(), it->second.size()));
  }
  if (client_cert_auth_) {
    auto ac = ctx.auth_context();
    if (ac && ac->IsPeerAuthenticated()) {
      auto cn = ac->FindPropertyValues("x509_common_name");
      if (!cn.empty()) return store_->InfoFromCommonName(std::string(cn[0].data(), cn[0].size()));
    }
  }
  return AuthInfo{};
}

absl::Status AuthGate::CheckRange(const grpc::ServerContextBase& ctx,
                                  const etcdserverpb::RangeRequest& req) const {
  auto info = Identify(ctx);
  if (!info.ok()) return info.status();
  if (auto s = store_->CheckRange(*info, req.key(), req.range_end(), PermType::kRead); !s.ok()) {
    return s;
  }
  // etcd's doSerialize: a read is answered only for the current auth
  // revision (a JWT from another revision, even a later one, is stale).
  if (info->revision != 0 && info->revision != store_->Revision() && store_->Enabled()) {
    return auth::MakeError(auth::Error::kAuthOldRevision);
  }
  return absl::OkStatus();
}

absl::Status AuthGate::CheckPut(const grpc::ServerContextBase& ctx,
                                const etcdserverpb::PutRequest& req) const {
  auto info = Identify(ctx);
  if (!info.ok()) return info.status();
  return store_->CheckPut(*info, req);
}

absl::Status AuthGate::CheckDeleteRange(const grpc::ServerContextBase& ctx,
                                        const etcdserverpb::DeleteRangeRequest& req) const {
  auto info = Identify(ctx);
  if (!info.ok()) return info.status();
  return store_->CheckDeleteRange(*info, req);
}

absl::Status AuthGate::CheckTxn(const grpc::ServerContextBase& ctx,
                                const etcdserverpb::TxnRequest& req) const {
  auto info = Identify(ctx);
  if (!info.ok()) return info.status();
  return store_->CheckTxn(*info, req);
}

absl::Status AuthGate::CheckWatch(const grpc::ServerContextBase& ctx, std::string_view key,
                                  std::string_view range_end) const {
  auto info = Identify(ctx);
  if (!info.ok()) return info.status();
  // etcd turns an empty watch key into "\0".
  if (key.empty()) key = std::string_view("\0", 1);
  return store_->CheckRange(*info, key, range_end, PermType::kRead);
}

absl::Status AuthGate::CheckLeaseRevoke(const grpc::ServerContextBase& ctx,
                                        int64_t lease_id) const {
  auto info = Identify(ctx);
  if (!info.ok()) return info.status();
  return store_->CheckLeaseKeys(*info, lease_id, PermType::kWrite);
}

absl::Status AuthGate::CheckLeaseTimeToLive(const grpc::ServerContextBase& ctx,
                                            int64_t lease_id) const {
  if (!store_->Enabled()) return absl::OkStatus();
  auto info = Identify(ctx);
  if (!info.ok()) return info.status();
  // Even for a lease without keys, or none at all.
  if (info->revision == 0) return auth::MakeError(auth::Error::kUserEmpty);
  return store_->CheckLeaseKeys(*info, lease_id, PermType::kRead);
}

absl::Status AuthGate::CheckAdmin(const grpc::ServerContextBase& ctx) const {
  auto info = Identify(ctx);
  if (!info.ok()) return info.status();
  return store_->CheckAdmin(*info);
}

absl::Status AuthGate::CheckIdentity(const grpc::ServerContextBase& ctx) const {
  return Identify(ctx).status();
}

mvcc::Caller AuthGate::CallerOf(const grpc::ServerContextBase& ctx) const {
  if (!store_->Enabled()) return {};
  auto info = Identify(ctx);
  if (!info.ok()) return {};
  return mvcc::Caller{std::move(info->user), info->revision};
}

// ---------------------------------------------------------------- AuthService

AuthService::AuthService(std::unique_ptr<auth::AuthStore> store, bool client_cert_auth,
                         const membership::MemberInfo* member)
    : store_(std::move(store)),
      owned_gate_(store_.get(), client_cert_auth),
      member_(member),
      bcrypt_(BcryptThreads(), "bcrypt") {
  learner_check_ = member;
  DecodeUnary("AuthEnable", &AuthService::AuthEnable);
  DecodeUnary("AuthDisable", &AuthService::AuthDisable);
  DecodeUnary("AuthStatus", &AuthService::AuthStatus);
  DecodeUnary("Authenticate", &AuthService::Authenticate);
  DecodeUnary("UserAdd", &AuthService::UserAdd);
  DecodeUnary("UserGet", &AuthService::UserGet);
  DecodeUnary("UserList", &AuthService::UserList);
  DecodeUnary("UserDelete", &AuthService::UserDelete);
  DecodeUnary("UserChangePassword", &AuthService::UserChangePassword);
  DecodeUnary("UserGrantRole", &AuthService::UserGrantRole);
  DecodeUnary("UserRevokeRole", &AuthService::UserRevokeRole);
  DecodeUnary("RoleAdd", &AuthService::RoleAdd);
  DecodeUnary("RoleGet", &AuthService::RoleGet);
  DecodeUnary("RoleList", &AuthService::RoleList);
  DecodeUnary("RoleDelete", &AuthService::RoleDelete);
  DecodeUnary("RoleGrantPermission", &AuthService::RoleGrantPermission);
  DecodeUnary("RoleRevokePermission", &AuthService::RoleRevokePermission);
}

template <typename Response>
void AuthService::Finish(grpc::ServerUnaryReactor* reactor, Response* resp,
                         const absl::Status& s) const {
  if (s.ok()) {
    membership::FillHeader(*member_, resp->mutable_header());
    resp->mutable_header()->set_revision(gate_->store()->kv()->Rev());
  }
  reactor->Finish(ToGrpcStatus(s));
}

void AuthService::RunBcrypt(const grpc::ServerContextBase* ctx, grpc::ServerUnaryReactor* reactor,
                            std::function<void()> work) {
  bcrypt_.RunOrCancel([ctx, reactor, work = std::move(work)](bool run) {
    if (!run || ctx->IsCancelled()) {
      // Touches nothing of the service: it may be on its way out.
      reactor->Finish(ToGrpcStatus(mvcc::MakeError(mvcc::Error::kStopped)));
      return;
    }
    work();
  });
}

template <typename Response>
auth::AuthStore::Done AuthService::FinishWhenDone(grpc::ServerUnaryReactor* reactor,
                                                  Response* resp) const {
  return [this, reactor, resp](absl::Status s) { Finish(reactor, resp, s); };
}

template <typename Response, typename Start>
grpc::ServerUnaryReactor* AuthService::Admin(grpc::CallbackServerContext* ctx, Response* resp,
                                             Start start, AllowedFn also_allowed) const {
  auto* reactor = ctx->DefaultReactor();
  auto info = gate_->Identify(*ctx);
  absl::Status s = info.ok() ? gate_->store()->CheckAdmin(*info) : info.status();
  if (!s.ok() && !(info.ok() && also_allowed && also_allowed(*info))) {
    Finish(reactor, resp, s);
    return reactor;
  }
  start(reactor);
  return reactor;
}

// An admin-only mutation: `mutate` runs with store and done (which finishes
// the RPC) for an admin caller.
#define CAPSTAN_ADMIN_MUTATION(Name, Req, Resp, mutate)                                        \
  grpc::ServerUnaryReactor* AuthService::Name(grpc::CallbackServerContext* ctx,               \
                                              const etcdserverpb::Req* req,                   \
                                              etcdserverpb::Resp* resp) {                      \
    return Admin(ctx, resp, [&](grpc::ServerUnaryReactor* reactor) {                           \
      auth::AuthStore* store = gate_->store();                                                 \
      auth::AuthStore::Done done = FinishWhenDone(reactor, resp);                              \
      std::optional<mvcc::Caller> by = gate_->CallerOf(*ctx);                                  \
      (void)req;                                                                               \
      mutate;                                                                                  \
    });                                                                                        \
  }

CAPSTAN_ADMIN_MUTATION(AuthEnable, AuthEnableRequest, AuthEnableResponse,
                       store->AuthEnable(std::move(done), std::move(by)))
CAPSTAN_ADMIN_MUTATION(AuthDisable, AuthDisableRequest, AuthDisableResponse,
                       store->AuthDisable(std::move(done), std::move(by)))
CAPSTAN_ADMIN_MUTATION(UserDelete, AuthUserDeleteRequest, AuthUserDeleteResponse,
                       store->UserDelete(req->name(), std::move(done), std::move(by)))
CAPSTAN_ADMIN_MUTATION(UserGrantRole, AuthUserGrantRoleRequest, AuthUserGrantRoleResponse,
                       store->UserGrantRole(req->user(), req->role(), std::move(done), std::move(by)))
CAPSTAN_ADMIN_MUTATION(UserRevokeRole, AuthUserRevokeRoleRequest, AuthUserRevokeRoleResponse,
                       store->UserRevokeRole(req->name(), req->role(), std::move(done), std::move(by)))
CAPSTAN_ADMIN_MUTATION(RoleAdd, AuthRoleAddRequest, AuthRoleAddResponse,
                       store->RoleAdd(req->name(), std::move(done), std::move(by)))
CAPSTAN_ADMIN_MUTATION(RoleDelete, AuthRoleDeleteRequest, AuthRoleDeleteResponse,
                       store->RoleDelete(req->role(), std::move(done), std::move(by)))
CAPSTAN_ADMIN_MUTATION(RoleRevokePermission, AuthRoleRevokePermissionRequest,
                       AuthRoleRevokePermissionResponse,
                       store->RoleRevokePermission(req->role(), req->key(), req->range_end(),
                                                   std::move(done), std::move(by)))
#undef CAPSTAN_ADMIN_MUTATION

grpc::ServerUnaryReactor* AuthService::RoleGrantPermission(
    grpc::CallbackServerContext* ctx, const etcdserverpb::AuthRoleGrantPermissionRequest* req,
    etcdserverpb::AuthRoleGrantPermissionResponse* resp) {
  return Admin(ctx, resp, [&](grpc::ServerUnaryReactor* reactor) {
    if (!req->has_perm()) {
      Finish(reactor, resp, auth::MakeError(auth::Error::kPermissionNotGiven));
      return;
    }
    gate_->store()->RoleGrantPermission(req->name(), req->perm(), FinishWhenDone(reactor, resp),
                                        gate_->CallerOf(*ctx));
  });
}

grpc::ServerUnaryReactor* AuthService::UserAdd(grpc::CallbackServerContext* ctx,
                                               const etcdserverpb::AuthUserAddRequest* req,
                                               etcdserverpb::AuthUserAddResponse* resp) {
  return Admin(ctx, resp, [&](grpc::ServerUnaryReactor* reactor) {
    auth::AuthStore* store = gate_->store();
    if (req->options().no_password()) {
      store->UserAdd(req->name(), {}, /*no_password=*/true, FinishWhenDone(reactor, resp),
                     gate_->CallerOf(*ctx));
      return;
    }
    // As etcd 3.5's server: the password (an empty one too) is hashed
    // before the request is logged; a hashedPassword the client sent is
    // not used.
    RunBcrypt(ctx, reactor, [this, store, req, resp, reactor, by = gate_->CallerOf(*ctx)] {
      auto hash = store->HashPassword(req->password());
      if (!hash.ok()) {
        Finish(reactor, resp, hash.status());
        return;
      }
      store->UserAdd(req->name(), *hash, false, FinishWhenDone(reactor, resp), by);
    });
  });
}

grpc::ServerUnaryReactor* AuthService::UserChangePassword(
    grpc::CallbackServerContext* ctx, const etcdserverpb::AuthUserChangePasswordRequest* req,
    etcdserverpb::AuthUserChangePasswordResponse* resp) {
  return Admin(ctx, resp, [&](grpc::ServerUnaryReactor* reactor) {
    auth::AuthStore* store = gate_->store();
    if (req->password().empty()) {
      // As etcd 3.5's server: without a password the client's
      // hashedPassword (base64 of a bcrypt hash) is logged as it is, and
      // the applier decodes it.
      auto request = std::make_shared<etcdserverpb::InternalRaftRequest>();
      auto* change = request->mutable_auth_user_change_password();
      change->set_name(req->name());
      change->set_hashedpassword(req->hashedpassword());
      store->Submit(std::move(request), FinishWhenDone(reactor, resp), gate_->CallerOf(*ctx));
      return;
    }
    RunBcrypt(ctx, reactor, [this, store, req, resp, reactor, by = gate_->CallerOf(*ctx)] {
      auto hash = store->HashPassword(req->password());
      if (!hash.ok()) {
        Finish(reactor, resp, hash.status());
        return;
      }
      store->UserChangePassword(req->name(), *hash, FinishWhenDone(reactor, resp), by);
    });
  });
}

grpc::ServerUnaryReactor* AuthService::Authenticate(grpc::CallbackServerContext* ctx,
                                                    const etcdserverpb::AuthenticateRequest* req,
                                                    etcdserverpb::AuthenticateResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  auth::AuthStore* store = gate_->store();
  if (!store->Enabled()) {
    Finish(reactor, resp, auth::MakeError(auth::Error::kAuthNotEnabled));
    return reactor;
  }
  // etcd's Authenticate starts with a linearizable read: the password is
  // checked against every auth change committed before the call.
  store->kv()->ReadBarrier([this, ctx, reactor, req, resp](absl::Status s) {
    if (!s.ok()) {
      Finish(reactor, resp, s);
      return;
    }
    RunBcrypt(ctx, reactor, [this, ctx, reactor, req, resp] {
      AuthenticateOnce(ctx, reactor, req, resp);
    });
  });
  return reactor;
}

void AuthService::AuthenticateOnce(grpc::CallbackServerContext* ctx,
                                   grpc::ServerUnaryReactor* reactor,
                                   const etcdserverpb::AuthenticateRequest* req,
                                   etcdserverpb::AuthenticateResponse* resp) {
  auth::AuthStore* store = gate_->store();
  absl::StatusOr<uint64_t> checked = store->CheckPassword(req->name(), req->password());
  if (!checked.ok()) {
    Finish(reactor, resp, checked.status());
    return;
  }
  // A simple token goes through the write log; done runs on the committer.
  store->IssueToken(req->name(), [this, ctx, reactor, req, resp, store,
                                  checked = *checked](absl::StatusOr<std::string> token) {
    if (token.ok() && checked != store->Revision()) {
      // The password was checked at a stale auth revision: again.
      RunBcrypt(ctx, reactor, [this, ctx, reactor, req, resp] {
        AuthenticateOnce(ctx, reactor, req, resp);
      });
      return;
    }
    if (token.ok()) resp->set_token(*token);
    Finish(reactor, resp, token.status());
  });
}

template <typename Response, typename Read>
void AuthService::ReadThroughLog(grpc::ServerUnaryReactor* reactor, Response* resp,
                                 std::shared_ptr<etcdserverpb::InternalRaftRequest> request,
                                 Read read) const {
  gate_->store()->ReadThroughLog(
      std::move(request), [this, reactor, resp, read = std::move(read)](absl::Status s) mutable {
        Finish(reactor, resp, s.ok() ? read() : s);
      });
}

grpc::ServerUnaryReactor* AuthService::AuthStatus(grpc::CallbackServerContext* ctx,
                                                  const etcdserverpb::AuthStatusRequest*,
                                                  etcdserverpb::AuthStatusResponse* resp) {
  return Admin(ctx, resp, [&](grpc::ServerUnaryReactor* reactor) {
    auto r = std::make_shared<etcdserverpb::InternalRaftRequest>();
    r->mutable_auth_status();
    ReadThroughLog(reactor, resp, std::move(r), [this, resp] {
      resp->set_enabled(gate_->store()->Enabled());
      resp->set_authrevision(gate_->store()->Revision());
      return absl::OkStatus();
    });
  });
}

grpc::ServerUnaryReactor* AuthService::UserGet(grpc::CallbackServerContext* ctx,
                                               const etcdserverpb::AuthUserGetRequest* req,
                                               etcdserverpb::AuthUserGetResponse* resp) {
  // A user may read itself.
  auto self = [req](const auth::AuthInfo& info) { return req->name() == info.user; };
  return Admin(
      ctx, resp,
      [&](grpc::ServerUnaryReactor* reactor) {
        auto r = std::make_shared<etcdserverpb::InternalRaftRequest>();
        r->mutable_auth_user_get()->set_name(req->name());
        ReadThroughLog(reactor, resp, std::move(r), [this, req, resp] {
          auto user = gate_->store()->GetUser(req->name());
          if (user.ok()) {
            for (const auto& role : user->roles()) resp->add_roles(role);
          }
          return user.status();
        });
      },
      self);
}

grpc::ServerUnaryReactor* AuthService::RoleGet(grpc::CallbackServerContext* ctx,
                                               const etcdserverpb::AuthRoleGetRequest* req,
                                               etcdserverpb::AuthRoleGetResponse* resp) {
  auth::AuthStore* store = gate_->store();
  // A user may read its own roles.
  auto own = [store, req](const auth::AuthInfo& info) {
    return store->UserHasRole(info.user, req->role());
  };
  return Admin(
      ctx, resp,
      [&](grpc::ServerUnaryReactor* reactor) {
        auto r = std::make_shared<etcdserverpb::InternalRaftRequest>();
        r->mutable_auth_role_get()->set_role(req->role());
        ReadThroughLog(reactor, resp, std::move(r), [store, req, resp] {
          auto perms = store->RolePermissions(req->role());
          if (perms.ok()) {
            for (auto& p : *perms) *resp->add_perm() = std::move(p);
          }
          return perms.status();
        });
      },
      own);
}

grpc::ServerUnaryReactor* AuthService::UserList(grpc::CallbackServerContext* ctx,
                                                const etcdserverpb::AuthUserListRequest*,
                                                etcdserverpb::AuthUserListResponse* resp) {
  return Admin(ctx, resp, [&](grpc::ServerUnaryReactor* reactor) {
    auto r = std::make_shared<etcdserverpb::InternalRaftRequest>();
    r->mutable_auth_user_list();
    ReadThroughLog(reactor, resp, std::move(r), [this, resp] {
      for (auto& n : gate_->store()->UserNames()) resp->add_users(std::move(n));
      return absl::OkStatus();
    });
  });
}

grpc::ServerUnaryReactor* AuthService::RoleList(grpc::CallbackServerContext* ctx,
                                                const etcdserverpb::AuthRoleListRequest*,
                                                etcdserverpb::AuthRoleListResponse* resp) {
  return Admin(ctx, resp, [&](grpc::ServerUnaryReactor* reactor) {
    auto r = std::make_shared<etcdserverpb::InternalRaftRequest>();
    r->mutable_auth_role_list();
    ReadThroughLog(reactor, resp, std::move(r), [this, resp] {
      for (auto& n : gate_->store()->RoleNames()) resp->add_roles(std::move(n));
      return absl::OkStatus();
    });
  });
}

}  // namespace capstan::server
