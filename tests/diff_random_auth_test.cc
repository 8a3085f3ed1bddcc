// Seeded random differential test of auth (diff_random_test.cc describes
// the seeded tests; the fixture is in diff_random.h).

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "diff_random.h"
#include "gtest/gtest.h"

namespace capstan::testing::diff_random {
namespace {

// ===========================================================================
// Auth

// Users, roles and permissions changed at random among the KV and lease
// steps, each step sent as a random identity: root, one of the seed's two
// users (whatever roles they hold by then), no token, or a token neither
// server issued. Auth is enabled after the seed's users and roles are made,
// disabled and enabled again now and then, and disabled at the end, so that
// the suite's other checks (DiffTest::TearDown) run without tokens. A token
// stays in use after its user was deleted, its password changed, auth was
// disabled or the servers restarted, until an Authenticate step replaces it:
// both servers must then refuse it alike.
//
// etcd 3.5 may check a request against a stale copy of a user it changed
// since its backend last committed (see CommitEtcdBackend): after every
// admin step etcd is made to commit, so that it answers from the user and
// role records it stores.
constexpr double kAuthAdminWeight = 30, kAuthenticateWeight = 6, kAuthWatchWeight = 6;
const Mix kAuthMix = [] {
  Mix m = kKvMix;
  m.push_back({StepKind::kAuthAdmin, kAuthAdminWeight});
  m.push_back({StepKind::kAuthenticate, kAuthenticateWeight});
  m.push_back({StepKind::kWatch, kAuthWatchWeight});
  return m;
}();

class DiffRandomAuthTest : public DiffRandomTest {
 protected:
  void TearDown() override {
    DisableAuth();
    DiffRandomTest::TearDown();
  }

  // The seed's users (with their passwords) and roles, made before auth is
  // enabled; root (password kRootPassword, role root) is made by the first
  // seed and kept.
  bool BeginAuthSeed() {
    if (!BeginSeed()) return false;
    users_ = {Name("u1"), Name("u2")};
    // The seed's roles, then the special role root.
    roles_ = {Name("r1"), Name("r2"), Name("r3"), "root"};
    AuthUserAddRequest root;
    root.set_name("root");
    root.set_password(kRootPassword);
    // The root role too: a seed may have deleted it while auth was off.
    AuthRoleAddRequest root_role;
    root_role.set_name("root");
    AuthUserGrantRoleRequest grant_root;
    grant_root.set_user("root");
    grant_root.set_role("root");
    if (!Step(root) || !Step(root_role) || !Step(grant_root)) return false;
    passwords_["root"] = kRootPassword;
    for (const auto& u : users_) {
      AuthUserAddRequest add;
      add.set_name(u);
      add.set_password(kPasswords[0]);
      if (!Step(add)) return false;
      passwords_[u] = kPasswords[0];
    }
    for (size_t i = 0; i + 1 < roles_.size(); ++i) {
      AuthRoleAddRequest add;
      add.set_name(roles_[i]);
      if (!Step(add)) return false;
    }
    if (!EnableAuth()) return false;
    CommitEtcdBackend();
    if (!auth_enabled_) {
      ADD_FAILURE() << At() << ": both servers refused to enable auth; the seed would test none";
      return false;
    }
    for (const auto& u : {"root"s, users_[0], users_[1]}) {
      if (!Authenticate(u, passwords_[u])) return false;
    }
    return true;
  }

  bool AuthStep(StepKind kind) {
    switch (kind) {
      case StepKind::kAuthAdmin: {
        const bool ok = AdminStep();
        CommitEtcdBackend();
        return ok;
      }
      case StepKind::kAuthenticate: {
        const std::string user = gen_->Pick(AllUsers());
        return Authenticate(user, gen_->OneIn(6) ? "wrong" : passwords_[user]);
      }
      case StepKind::kWatch:
        return WatchOnce();
      case StepKind::kRestart:
        // Root, with a fresh token, makes the writes and reads a restart
        // needs (a refused write would leave etcd entries to apply again:
        // LeaveEtcdNothingToReapply).
        if (auth_enabled_ && !Authenticate("root", kRootPassword)) return false;
        ActAs(auth_enabled_ ? "root" : "");
        return KvStep(kind);
      default:
        ActAs(Identity());
        return KvStep(kind);
    }
  }

 private:
  static constexpr char kRootPassword[] = "rootpw";
  static constexpr std::array<const char*, 2> kPasswords = {"pw1", "pw2"};

  // name.<seed>: the seed's own, and OwnName's.
  std::string Name(const char* base) const { return absl::StrCat(base, ".", seed()); }
  std::vector<std::string> AllUsers() const { return {"root", users_[0], users_[1]}; }
  // A password the user may have (a seed user's is one of kPasswords).
  std::string Password() { return gen_->Pick(kPasswords); }

  // Who a KV or lease step runs as: root, a user of the seed, no one, or a
  // token neither server issued.
  std::string Identity() {
    switch (gen_->Weighted({30, 25, 25, 8, 4})) {
      case 0:
        return "root";
      case 1:
        return users_[0];
      case 2:
        return users_[1];
      case 3:
        return "";
      default:
        return kBogus;
    }
  }
  // Later steps carry who's last token on each server (none for "").
  void ActAs(const std::string& who) {
    // Root with a valid token is let through whatever the range; anyone else
    // (root with a dropped token too) is checked (see set_restricted).
    auto it = user_tokens_.find(who);
    gen_->set_restricted(!(who == "root" && it != user_tokens_.end() && it->second.valid));
    acting_as_ = absl::StrCat(" as ", who.empty() ? "(no token)" : who);
    // While auth is off etcd looks at no token: none is sent then.
    if (!auth_enabled_) {
      acting_as_ += " (auth off: no token)";
      SetTokens("", "");
      return;
    }
    if (who == kBogus) {
      SetTokens("bogus.7", "bogus.7");
    } else if (it == user_tokens_.end()) {
      SetTokens("", "");
    } else {
      SetTokens(it->second.token[0], it->second.token[1]);
    }
  }

  // A watcher made as a random identity, on a stream of its own on each
  // server: its first answer is compared (Created; created and canceled,
  // "permission denied", for an identity that may not read the range or
  // a bad token), then both streams close.
  bool WatchOnce() {
    ActAs(Identity());
    ++step_;
    WatchRequest req;
    *req.mutable_create_request() = gen_->Watch();
    // etcd checks a watch from a key on ("\0") as a watch of that key alone,
    // which Capstan does not copy (docs/COMPATIBILITY.md): for anyone whose
    // checks matter, such a watcher ends at the seed's last key instead.
    if (gen_->restricted() && req.create_request().range_end() == "\0"s) {
      req.mutable_create_request()->set_range_end(PrefixEnd(Root()));
    }
    WatchClient e(etcd_stubs().watch.get(), token(false));
    WatchClient c(capstan_stubs().watch.get(), token(true));
    EXPECT_TRUE(e.Send(req) && c.Send(req)) << At() << ": a watch stream broke";
    const std::optional<WatchResponse> first[2] = {e.Next(kEventWait), c.Next(kEventWait)};
    if (!first[0] || !first[1]) {
      ADD_FAILURE() << At() << ": watch" << acting_as_ << ": no answer from "
                    << (!first[0] ? "etcd" : "capstan") << "\n"
                    << Describe(req);
      return false;
    }
    if (auto same = SameResponse(*first[0], *first[1], etcd(), capstan()); !same) {
      ADD_FAILURE() << At() << ": watch" << acting_as_ << "\n" << Describe(req) << same.message();
      return false;
    }
    return true;
  }

  // Authenticate as user; on success the steps' tokens for user are the new
  // ones.
  bool Authenticate(const std::string& user, const std::string& password) {
    ActAs("");
    AuthenticateRequest r;
    r.set_name(user);
    r.set_password(password);
    if (!Step(r)) return false;
    if (last_ok_) user_tokens_[user] = Token{{auth_tokens_[0], auth_tokens_[1]}, true};
    return true;
  }

  // A change to users, roles or permissions, or a read of them; mostly as
  // root, sometimes as someone else, who may not. Root's roles change (etcd
  // refuses while auth is on), never root itself, so that it can always
  // sign in again.
  bool AdminStep() {
    ActAs(gen_->OneIn(6) ? Identity() : "root");
    // Auth is mostly on: once off, it comes back soon.
    if (!auth_enabled_ && gen_->OneIn(3)) return EnableAuth();
    const std::string seed_user = gen_->Pick(users_);
    const std::string user = gen_->OneIn(10) ? "root" : seed_user;
    const std::string role = gen_->Pick(roles_);
    switch (gen_->Weighted({30, 14, 12, 6, 3, 3, 3, 2, 3, 4, 4, 2, 2, 1, 1})) {
      case 0: {
        AuthRoleGrantPermissionRequest r;
        r.set_name(role);
        const auto span = PermissionSpan();
        r.mutable_perm()->set_key(span.key);
        r.mutable_perm()->set_range_end(span.end);
        r.mutable_perm()->set_permtype(static_cast<authpb::Permission::Type>(gen_->Uniform(0, 2)));
        if (!Step(r)) return false;
        if (last_ok_) granted_.push_back({role, span.key, span.end});
        return true;
      }
      case 1: {
        AuthRoleRevokePermissionRequest r;
        if (!granted_.empty() && !gen_->OneIn(4)) {
          const Grant g = gen_->Pick(granted_);
          r.set_role(g.role);
          r.set_key(g.key);
          r.set_range_end(g.end);
        } else {
          const auto span = gen_->Span();
          r.set_role(role);
          r.set_key(span.key);
          r.set_range_end(span.end);
        }
        return Step(r);
      }
      case 2: {
        AuthUserGrantRoleRequest r;
        r.set_user(user);
        r.set_role(role);
        return Step(r);
      }
      case 3: {
        AuthUserRevokeRoleRequest r;
        r.set_name(user);
        r.set_role(role);
        return Step(r);
      }
      case 4: {
        AuthRoleAddRequest r;
        r.set_name(role);
        return Step(r);
      }
      case 5: {
        AuthRoleDeleteRequest r;
        r.set_role(role);
        return Step(r);
      }
      case 6: {
        AuthUserAddRequest r;
        r.set_name(seed_user);
        r.set_password(Password());
        if (!Step(r)) return false;
        if (last_ok_) passwords_[seed_user] = r.password();
        return true;
      }
      case 7: {
        AuthUserDeleteRequest r;
        r.set_name(seed_user);
        if (!Step(r)) return false;
        if (last_ok_) DropTokens(seed_user);
        return true;
      }
      case 8: {
        AuthUserChangePasswordRequest r;
        r.set_name(seed_user);
        r.set_password(Password());
        if (!Step(r)) return false;
        if (last_ok_) {
          passwords_[seed_user] = r.password();
          DropTokens(seed_user);
        }
        return true;
      }
      case 9: {
        AuthUserGetRequest r;
        r.set_name(user);
        return Step(r);
      }
      case 10: {
        // Not of root: Capstan lists one permission on every key, as etcd
        // 3.6 does; the reference 3.5.16 lists none (docs/SECURITY.md).
        AuthRoleGetRequest r;
        r.set_role(role == "root" ? roles_[0] : role);
        return Step(r);
      }
      case 11:
        return Step(AuthUserListRequest());
      case 12:
        return Step(AuthRoleListRequest());
      case 13: {
        if (!Step(AuthDisableRequest())) return false;
        if (last_ok_) {
          auth_enabled_ = false;
          DropTokens();
        }
        return true;
      }
      default:
        return EnableAuth();
    }
  }

  // etcd 3.5 (3.5.16 to 3.5.29, and 3.4) reads a user's record for its
  // permission checks (the root role), its admin checks and its password
  // checks through its backend's read buffer, whose single-key lookup reads
  // the slot past the buffer's end when every buffered key sorts before the
  // one it looks for (bucketBuffer.Range; fixed in 3.6 by etcd-io/etcd#12587).
  // That slot keeps a record from before an earlier backend commit: e.g.
  // after root was granted to u2, a change to u1 alone, and commits
  // between, u2 is read without the root role and a request of u2's that
  // needs root is "permission denied" (this suite's seed 1 once, at step
  // 86). Where etcd's commits fall (every 100 ms, and at once after each
  // delete) depends on timing, so the answer did too. A Hash makes etcd
  // commit its backend first; after a commit the buffer is empty and a
  // lookup looks at its first slot only, which holds what that commit
  // wrote. So after every change to users and roles etcd is made to commit,
  // and its next checks read the records it stores. Not compared, and
  // changes nothing; the "capstan" side is committed too when it is an etcd
  // (CAPSTAN_DIFF_BOTH_ETCD).
  void CommitEtcdBackend() {
    for (int i = 0; i < 2; ++i) {
      if (i == 1 && !BothEtcd()) break;
      ServerStubs& server = i == 0 ? etcd_stubs() : capstan_stubs();
      // Root's token there, made again when refused (tokens are dropped by
      // a restart and when auth is disabled).
      grpc::Status st = HashAsRoot(server, &commit_tokens_[i]);
      if (!st.ok()) {
        commit_tokens_[i].clear();
        st = HashAsRoot(server, &commit_tokens_[i]);
      }
      EXPECT_TRUE(st.ok()) << At() << ": a Hash to make etcd commit its backend: " << Describe(st);
    }
  }
  // A Hash as root (etcd checks admin permission for it while auth is on),
  // with *token, or a token made first into *token if it is empty.
  grpc::Status HashAsRoot(ServerStubs& server, std::string* token) {
    if (auth_enabled_ && token->empty()) {
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
      AuthenticateRequest a;
      a.set_name("root");
      a.set_password(kRootPassword);
      AuthenticateResponse resp;
      if (grpc::Status st = server.auth->Authenticate(&ctx, a, &resp); !st.ok()) return st;
      *token = resp.token();
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
    if (auth_enabled_) ctx.AddMetadata("token", *token);
    HashResponse resp;
    return server.maintenance->Hash(&ctx, HashRequest(), &resp);
  }

  bool EnableAuth() {
    if (!Step(AuthEnableRequest())) return false;
    if (last_ok_) auth_enabled_ = true;
    return true;
  }

  // A range etcd grants a permission on (it refuses empty and reversed ones
  // as "invalid auth management": docs/COMPATIBILITY.md).
  RequestGenerator::KeyRange PermissionSpan() {
    for (;;) {
      auto span = gen_->Span();
      if (!span.key.empty() &&
          (span.end.empty() || span.key < span.end || span.end == "\0"s)) {
        return span;
      }
    }
  }

  // After a restart every token is gone on both servers: root signs in
  // again for the reads that check what survived.
  bool Restarted() override {
    DropTokens();
    if (!auth_enabled_) return true;
    if (!Authenticate("root", kRootPassword)) return false;
    ActAs("root");
    return true;
  }

  // Turns auth off on both servers, as root, whatever the seed left; not
  // compared (a seed that failed may have left the servers apart).
  void DisableAuth() {
    for (ServerStubs* s : {&etcd_stubs(), &capstan_stubs()}) {
      grpc::ClientContext actx;
      actx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
      AuthenticateRequest a;
      a.set_name("root");
      a.set_password(kRootPassword);
      AuthenticateResponse token;
      if (!s->auth->Authenticate(&actx, a, &token).ok()) continue;  // auth is off
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
      ctx.AddMetadata("token", token.token());
      AuthDisableResponse resp;
      grpc::Status st = s->auth->AuthDisable(&ctx, AuthDisableRequest(), &resp);
      EXPECT_TRUE(st.ok()) << "AuthDisable: " << Describe(st);
    }
    SetTokens("", "");
  }

  // A user's last token on each server; no longer valid once the servers
  // dropped it (the steps go on sending it).
  struct Token {
    std::array<std::string, 2> token;  // etcd's, capstan's
    bool valid = false;
  };
  // Marks user's tokens (everyone's for "") as dropped by the servers.
  void DropTokens(const std::string& user = "") {
    for (auto& [name, t] : user_tokens_) {
      if (user.empty() || name == user) t.valid = false;
    }
  }

  struct Grant {
    std::string role, key, end;
  };
  static constexpr char kBogus[] = "(bogus)";

  std::vector<std::string> users_, roles_;
  std::map<std::string, std::string> passwords_;
  std::map<std::string, Token> user_tokens_;  // by user
  std::vector<Grant> granted_;  // permissions granted (some revoked since)
  // Root's tokens for CommitEtcdBackend: etcd's, and the other etcd's with
  // CAPSTAN_DIFF_BOTH_ETCD.
  std::string commit_tokens_[2];
  bool auth_enabled_ = false;
};

TEST_P(DiffRandomAuthTest, Run) {
  if (!BeginAuthSeed()) return;
  for (int i = 0; i < Steps(); ++i) {
    if (!AuthStep(gen_->Kind(kAuthMix))) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, DiffRandomAuthTest, ::testing::ValuesIn(Seeds()), SeedName);

}  // namespace
}  // namespace capstan::testing::diff_random
