#include "auth/auth_store.h"

#include <crypt.h>

#include <algorithm>
#include <charconv>
#include <future>
#include <random>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "auth/errors.h"
#include "storage/backend.h"
#include "util/go_sort.h"

namespace capstan::auth {

using etcdserverpb::InternalRaftRequest;
using mvcc::KvStore;
using mvcc::WriteRequest;
namespace {

using storage::Cf;

// Keys of the kAuth family: etcd's buckets as `capstan migrate` writes them.
constexpr char kEnabledKey[] = "auth/authEnabled";
constexpr char kRevisionKey[] = "auth/authRevision";
constexpr char kUserPrefix[] = "authUsers/";
constexpr char kRolePrefix[] = "authRoles/";
constexpr char kRoot[] = "root";

std::string EncodeRevision(uint64_t rev) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<char>(rev & 0xff);
    rev >>= 8;
  }
  return out;
}

uint64_t DecodeRevision(std::string_view b) {
  uint64_t rev = 0;
  for (unsigned char c : b) rev = (rev << 8) | c;
  return rev;
}

bool HasRole(const authpb::User& u, const std::string& role) {
  return std::find(u.roles().begin(), u.roles().end(), role) != u.roles().end();
}

// etcd's isValidPermissionRange.
bool IsValidPermissionRange(const std::string& key, const std::string& range_end) {
  if (key.empty()) return false;
  if (range_end.empty()) return true;
  if (key < range_end) return true;
  return range_end == std::string(1, '\0');
}

bool CheckHash(const std::string& hash, const std::string& password) {
  auto data = std::make_unique<crypt_data>();
  const char* got = crypt_r(password.c_str(), hash.c_str(), data.get());
  if (got == nullptr || got[0] == '*') return false;
  // Compare without an early exit.
  std::string_view g(got);
  if (g.size() != hash.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < g.size(); ++i) diff |= static_cast<unsigned char>(g[i] ^ hash[i]);
  return diff == 0;
}

// etcd's ErrNoPasswordUser, which its gRPC layer does not map: code
// Unknown with the error's own text. etcd 3.5 answers it for a
// hashedPassword that is not base64.
absl::Status NoPasswordUserError() {
  return absl::UnknownError("auth: authentication failed, password was given for no password user");
}

std::string RandomTokenPrefix() {
  static constexpr char kLetters[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  std::random_device rd;  // /dev/urandom
  std::string out(16, 'a');
  for (char& c : out) c = kLetters[rd() % 52];
  return out;
}

}  // namespace

// ---------------------------------------------------------------- RangeSet

void RangeSet::Add(std::string_view key, std::string_view range_end) {
  if (range_end.empty()) {
    std::string end(key);
    end.push_back('\0');
    intervals_.push_back({std::string(key), std::move(end)});
  } else if (range_end == std::string_view("\0", 1)) {
    intervals_.push_back({std::string(key), std::string()});
  } else {
    intervals_.push_back({std::string(key), std::string(range_end)});
  }
}

void RangeSet::Seal() {
  std::sort(intervals_.begin(), intervals_.end(),
            [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  std::vector<Interval> merged;
  for (auto& iv : intervals_) {
    if (!merged.empty()) {
      Interval& cur = merged.back();
      if (cur.end.empty()) continue;  // unbounded: absorbs the rest
      if (iv.begin <= cur.end) {      // overlapping or adjacent
        if (iv.end.empty() || iv.end > cur.end) cur.end = iv.end;
        continue;
      }
    }
    merged.push_back(std::move(iv));
  }
  intervals_ = std::move(merged);
}

bool RangeSet::ContainsInterval(std::string_view begin, std::string_view end) const {
  auto it = std::upper_bound(intervals_.begin(), intervals_.end(), begin,
                             [](std::string_view b, const Interval& iv) { return b < iv.begin; });
  if (it == intervals_.begin()) return false;
  const Interval& iv = *std::prev(it);
  if (iv.end.empty()) return true;
  if (end.empty()) return false;
  return end <= iv.end;
}

bool RangeSet::ContainsKey(std::string_view key) const {
  auto it = std::upper_bound(intervals_.begin(), intervals_.end(), key,
                             [](std::string_view k, const Interval& iv) { return k < iv.begin; });
  if (it == intervals_.begin()) return false;
  const Interval& iv = *std::prev(it);
  return iv.end.empty() || key < iv.end;
}

bool RangeSet::Covers(std::string_view key, std::string_view range_end) const {
  if (range_end.empty()) return ContainsKey(key);
  if (range_end == std::string_view("\0", 1)) return ContainsInterval(key, {});
  // A reversed range holds no keys; etcd's interval tree has no defined
  // answer for it (docs/COMPATIBILITY.md): allowed where key itself is.
  if (range_end <= key) return ContainsKey(key);
  return ContainsInterval(key, range_end);
}

// ---------------------------------------------------------------- State

void AuthStore::State::RebuildPerms() {
  perms.clear();
  for (const auto& [name, user] : users) {
    auto p = std::make_shared<UserPerms>();
    p->root = HasRole(user, kRoot);
    for (const auto& role_name : user.roles()) {
      auto r = roles.find(role_name);
      if (r == roles.end()) continue;
      for (const auto& perm : r->second.keypermission()) {
        if (perm.permtype() == authpb::Permission::READ ||
            perm.permtype() == authpb::Permission::READWRITE) {
          p->read.Add(perm.key(), perm.range_end());
        }
        if (perm.permtype() == authpb::Permission::WRITE ||
            perm.permtype() == authpb::Permission::READWRITE) {
          p->write.Add(perm.key(), perm.range_end());
        }
      }
    }
    p->read.Seal();
    p->write.Seal();
    perms[name] = std::move(p);
  }
}

// ---------------------------------------------------------------- AuthStore

AuthStore::AuthStore(KvStore* kv, mvcc::WriteLog* log, const AuthStoreOptions& options)
    : kv_(kv), log_(log), options_(options) {}

absl::StatusOr<std::unique_ptr<AuthStore>> AuthStore::Open(KvStore* store, mvcc::WriteLog* log,
                                                           const AuthStoreOptions& options) {
  std::unique_ptr<AuthStore> as(new AuthStore(store, log, options));
  if (auto s = as->Load(); !s.ok()) return s;
  store->SetWriteGuard(as.get());
  return as;
}

AuthStore::~AuthStore() { kv_->SetWriteGuard(nullptr); }

absl::StatusOr<std::unique_ptr<AuthStore>> AuthStore::Open(KvStore* store,
                                                           const AuthStoreOptions& options) {
  return Open(store, store, options);
}

absl::Status AuthStore::Load() {
  auto state = std::make_shared<State>();
  auto it = kv_->backend()->NewIterator(Cf::kAuth);
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    std::string_view k = it->key();
    std::string_view v = it->value();
    if (k == kEnabledKey) {
      state->enabled = v.size() == 1 && v[0] == 1;
    } else if (k == kRevisionKey) {
      state->revision = DecodeRevision(v);
    } else if (k.substr(0, sizeof(kUserPrefix) - 1) == kUserPrefix) {
      authpb::User u;
      if (!u.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
        return absl::DataLossError("corrupt auth user record " + std::string(k));
      }
      state->users[std::string(k.substr(sizeof(kUserPrefix) - 1))] = std::move(u);
    } else if (k.substr(0, sizeof(kRolePrefix) - 1) == kRolePrefix) {
      authpb::Role r;
      if (!r.ParseFromArray(v.data(), static_cast<int>(v.size()))) {
        return absl::DataLossError("corrupt auth role record " + std::string(k));
      }
      state->roles[std::string(k.substr(sizeof(kRolePrefix) - 1))] = std::move(r);
    }
  }
  if (auto s = it->status(); !s.ok()) return s;
  // etcd commits revision 1 when it finds none; the first mutation stores it.
  if (state->revision == 0) state->revision = 1;
  state->RebuildPerms();
  // Newer than every state made so far: a mutation applied before a Reload
  // whose done callback runs after it publishes nothing.
  state->seq = applied_ ? applied_->seq + 1 : 1;
  applied_ = state;
  Publish(std::move(state));
  return absl::OkStatus();
}

std::shared_ptr<const AuthStore::State> AuthStore::Current() const {
  util::ReaderMutexLock lock(&state_mu_);
  return state_;
}

void AuthStore::Publish(std::shared_ptr<const State> next) {
  util::MutexLock lock(&state_mu_);
  if (state_ == nullptr || next->seq > state_->seq) state_ = std::move(next);
}

uint64_t AuthStore::CommittedIndex() const {
  return committed_index_ ? committed_index_() : kv_->AppliedIndex();
}

bool AuthStore::Enabled() const { return Current()->enabled; }
uint64_t AuthStore::Revision() const { return Current()->revision; }

mvcc::WriteRequest AuthStore::WriteOf(Mutation m, Done done) {
  struct Pending {
    std::shared_ptr<const State> next;  // null: nothing to publish
    Changes changes;
  };
  auto pending = std::make_shared<Pending>();
  WriteRequest w;
  // Committer thread: applies m to the newest applied state and stages the
  // changed records. Nothing is staged when m fails.
  w.op = mvcc::CustomOp{[this, m = std::move(m), pending](storage::WriteBatch* batch) -> absl::Status {
    auto next = std::make_shared<State>(*applied_);
    if (auto s = m(next.get(), &pending->changes); !s.ok()) return s;
    if (!pending->changes.changed) return absl::OkStatus();
    if (pending->changes.bump_revision) next->revision++;
    next->seq = applied_->seq + 1;
    next->RebuildPerms();
    for (const auto& name : pending->changes.users) {
      const std::string key = absl::StrCat(kUserPrefix, name);
      auto u = next->users.find(name);
      if (u == next->users.end()) {
        batch->Delete(Cf::kAuth, key);
      } else {
        batch->Put(Cf::kAuth, key, u->second.SerializeAsString());
      }
    }
    for (const auto& name : pending->changes.roles) {
      const std::string key = absl::StrCat(kRolePrefix, name);
      auto r = next->roles.find(name);
      if (r == next->roles.end()) {
        batch->Delete(Cf::kAuth, key);
      } else {
        batch->Put(Cf::kAuth, key, r->second.SerializeAsString());
      }
    }
    if (pending->changes.enabled) {
      batch->Put(Cf::kAuth, kEnabledKey, std::string(1, next->enabled ? '\1' : '\0'));
    }
    batch->Put(Cf::kAuth, kRevisionKey, EncodeRevision(next->revision));
    applied_ = next;
    pending->next = std::move(next);
    return absl::OkStatus();
  }};
  // Once durable (on the committer, or on the store's answer thread): publish,
  // then drop stale tokens, then acknowledge.
  w.done = [this, pending, done = std::move(done)](absl::Status s) mutable {
    if (s.ok() && pending->next) {
      Publish(pending->next);
      const Changes& c = pending->changes;
      if (c.drop_all_tokens || !c.invalidate_users.empty()) {
        util::MutexLock lock(&tokens_mu_);
        if (c.drop_all_tokens) {
          tokens_.clear();
        } else {
          absl::erase_if(tokens_, [&](const auto& kv) {
            return std::find(c.invalidate_users.begin(), c.invalidate_users.end(),
                             kv.second.user) != c.invalidate_users.end();
          });
        }
      }
    }
    done(s);
  };
  return w;
}

bool AuthStore::IsAuthRequest(const InternalRaftRequest& r) {
  return r.has_auth_enable() || r.has_auth_disable() || r.has_auth_user_add() ||
         r.has_auth_user_delete() || r.has_auth_user_change_password() ||
         r.has_auth_user_grant_role() || r.has_auth_user_revoke_role() || r.has_auth_role_add() ||
         r.has_auth_role_delete() || r.has_auth_role_grant_permission() ||
         r.has_auth_role_revoke_permission();
}

bool AuthStore::IsAuthenticate(const InternalRaftRequest& r) {
  return !r.authenticate().empty();
}

std::optional<WriteRequest> AuthStore::Decode(std::shared_ptr<const InternalRaftRequest> request,
                                              absl::AnyInvocable<void(absl::Status)>* done) {
  if (IsAuthRequest(*request)) return Write(std::move(request), std::move(*done));
  if (IsAuthenticate(*request)) return AuthenticateWrite(std::move(request), std::move(*done));
  return std::nullopt;
}

WriteRequest AuthStore::AuthenticateWrite(std::shared_ptr<const InternalRaftRequest> request,
                                          Done done) {
  etcdserverpb::LoggedAuthenticate a;
  const bool parsed = a.ParseFromString(request->authenticate());
  WriteRequest w;
  // Committer thread: etcd's applied Authenticate. The password was checked
  // by the member that proposed it; here only the user is looked at, in the
  // applied state, so every member decides alike.
  w.op = mvcc::CustomOp{[this, parsed, a = std::move(a)](storage::WriteBatch*) -> absl::Status {
    if (!parsed) return absl::InvalidArgumentError("auth: bad authenticate entry");
    const State& s = *applied_;
    if (!s.enabled) return MakeError(Error::kAuthNotEnabled);
    auto u = s.users.find(a.name());
    if (u == s.users.end()) return MakeError(Error::kAuthFailed);
    if (u->second.options().no_password()) return MakeError(Error::kAuthFailed);
    // A member issuing JWTs signs them where the password is checked.
    if (options_.jwt || a.simple_token().empty()) return absl::OkStatus();
    // etcd: "<prefix>.<consistent index>". A single member's writes carry
    // no Raft index: its applied index stands in (the prefix is unique).
    uint64_t index = kv_->ApplyingIndex();
    if (index == 0) index = kv_->AppliedIndex() + 1;
    // Replayed after a restart: tokens live in memory, and a restarted
    // member knows none (as etcd's).
    if (index <= replayed_through_.load(std::memory_order_acquire)) return absl::OkStatus();
    AddToken(a.simple_token(), a.name(), index);
    return absl::OkStatus();
  }};
  w.raft_request = std::move(request);
  w.done = std::move(done);
  return w;
}

void AuthStore::AddToken(const std::string& prefix, const std::string& user, uint64_t index) {
  const absl::Time now = options_.now();
  util::MutexLock lock(&tokens_mu_);
  absl::erase_if(tokens_, [now](const auto& kv) { return kv.second.expires <= now; });
  tokens_[prefix] = Token{absl::StrCat(prefix, ".", index), user, now + options_.token_ttl};
  token_added_.SignalAll();
}

WriteRequest AuthStore::Write(std::shared_ptr<const InternalRaftRequest> request, Done done) {
  absl::StatusOr<Mutation> m =
      request ? MutationOf(*request) : absl::InvalidArgumentError("auth: no request");
  if (!m.ok()) {
    // Refused in order with every other write, changing nothing.
    m = [s = m.status()](State*, Changes*) { return s; };
  }
  WriteRequest w = WriteOf(*std::move(m), std::move(done));
  w.raft_request = std::move(request);
  return w;
}

void AuthStore::Submit(std::shared_ptr<const InternalRaftRequest> request, Done done,
                       std::optional<mvcc::Caller> by) {
  WriteRequest w = Write(std::move(request), std::move(done));
  w.caller = std::move(by);
  log_->Submit(std::move(w));
}

void AuthStore::ReadThroughLog(std::shared_ptr<const InternalRaftRequest> request, Done done) {
  WriteRequest w;
  w.op = mvcc::CustomOp{[](storage::WriteBatch*) { return absl::OkStatus(); }};
  w.raft_request = std::move(request);
  w.done = std::move(done);
  log_->Submit(std::move(w));
}

absl::StatusOr<std::string> AuthStore::SelectPassword(const std::string& password,
                                                      const std::string& hashed) const {
  // etcd's selectPassword. Before 3.5 etcd logged the password itself and
  // each member hashed it when applying the entry (each with its own salt).
  if (!password.empty() && hashed.empty()) return HashPassword(password);
  std::string hash;
  if (!absl::Base64Unescape(hashed, &hash)) return NoPasswordUserError();
  return hash;
}

absl::StatusOr<AuthStore::Mutation> AuthStore::MutationOf(const InternalRaftRequest& r) const {
  // etcd's applierV3backend.Apply: the first request set, in its order. The
  // client writes and reads before and among the auth mutations are not
  // this store's to apply.
  if (!r.range().empty() || r.has_put() || r.has_delete_range() || r.has_txn() ||
      r.has_compaction() || r.has_lease_grant() || r.has_lease_revoke() ||
      !r.lease_checkpoint().empty() || r.has_alarm() || !r.authenticate().empty()) {
    return absl::InvalidArgumentError("auth: not an auth mutation");
  }

  if (r.has_auth_enable()) {
    return [](State* s, Changes* c) -> absl::Status {
      if (s->enabled) {
        c->changed = false;  // etcd ignores it
        return absl::OkStatus();
      }
      auto root = s->users.find(kRoot);
      if (root == s->users.end()) return MakeError(Error::kRootUserNotExist);
      if (!HasRole(root->second, kRoot)) return MakeError(Error::kRootRoleNotExist);
      s->enabled = true;
      c->enabled = true;
      c->bump_revision = false;  // etcd's AuthEnable keeps the revision
      return absl::OkStatus();
    };
  }

  if (r.has_auth_disable()) {
    return [](State* s, Changes* c) -> absl::Status {
      if (!s->enabled) {
        c->changed = false;
        return absl::OkStatus();
      }
      s->enabled = false;
      c->enabled = true;
      c->drop_all_tokens = true;
      return absl::OkStatus();
    };
  }

  if (r.has_auth_user_add()) {
    const auto& a = r.auth_user_add();
    // etcd stores the request's options, or fresh ones without them.
    const authpb::UserAddOptions options = a.options();
    absl::StatusOr<std::string> password = std::string();
    if (!options.no_password()) password = SelectPassword(a.password(), a.hashedpassword());
    return [name = a.name(), options, password](State* s, Changes* c) -> absl::Status {
      if (name.empty()) return MakeError(Error::kUserEmpty);
      if (s->users.count(name)) return MakeError(Error::kUserAlreadyExist);
      if (!password.ok()) return password.status();
      authpb::User u;
      u.set_name(name);
      if (!password->empty()) u.set_password(*password);
      *u.mutable_options() = options;
      s->users[name] = std::move(u);
      c->users.push_back(name);
      return absl::OkStatus();
    };
  }

  if (r.has_auth_user_delete()) {
    return [name = r.auth_user_delete().name()](State* s, Changes* c) -> absl::Status {
      if (s->enabled && name == kRoot) return MakeError(Error::kInvalidAuthMgmt);
      if (!s->users.erase(name)) return MakeError(Error::kUserNotFound);
      c->users.push_back(name);
      c->invalidate_users.push_back(name);
      return absl::OkStatus();
    };
  }

  if (r.has_auth_user_change_password()) {
    const auto& p = r.auth_user_change_password();
    // Selected whether or not the user needs it (a pre-3.5 entry's password
    // is hashed ahead of the apply); used only for a user with a password.
    absl::StatusOr<std::string> password = SelectPassword(p.password(), p.hashedpassword());
    return [name = p.name(), password](State* s, Changes* c) -> absl::Status {
      auto u = s->users.find(name);
      if (u == s->users.end()) return MakeError(Error::kUserNotFound);
      // etcd 3.5: a user added with no_password keeps no password.
      if (u->second.options().no_password()) {
        u->second.clear_password();
      } else {
        if (!password.ok()) return password.status();
        u->second.set_password(*password);
      }
      c->users.push_back(name);
      c->invalidate_users.push_back(name);
      return absl::OkStatus();
    };
  }

  if (r.has_auth_user_grant_role()) {
    const auto& g = r.auth_user_grant_role();
    return [user = g.user(), role = g.role()](State* s, Changes* c) -> absl::Status {
      auto u = s->users.find(user);
      if (u == s->users.end()) return MakeError(Error::kUserNotFound);
      if (role != kRoot && !s->roles.count(role)) return MakeError(Error::kRoleNotFound);
      auto* roles = u->second.mutable_roles();
      auto pos = std::lower_bound(roles->begin(), roles->end(), role);
      if (pos != roles->end() && *pos == role) {
        c->changed = false;  // already granted: etcd ignores it
        return absl::OkStatus();
      }
      const int idx = static_cast<int>(pos - roles->begin());
      roles->Add(std::string(role));
      for (int i = roles->size() - 1; i > idx; --i) roles->SwapElements(i, i - 1);
      c->users.push_back(user);
      return absl::OkStatus();
    };
  }

  if (r.has_auth_user_get()) return absl::InvalidArgumentError("auth: not an auth mutation");

  if (r.has_auth_user_revoke_role()) {
    const auto& v = r.auth_user_revoke_role();
    return [user = v.name(), role = v.role()](State* s, Changes* c) -> absl::Status {
      if (s->enabled && user == kRoot && role == kRoot) return MakeError(Error::kInvalidAuthMgmt);
      auto u = s->users.find(user);
      if (u == s->users.end()) return MakeError(Error::kUserNotFound);
      auto* roles = u->second.mutable_roles();
      auto pos = std::find(roles->begin(), roles->end(), role);
      if (pos == roles->end()) return MakeError(Error::kRoleNotGranted);
      roles->erase(pos);
      c->users.push_back(user);
      return absl::OkStatus();
    };
  }

  if (r.has_auth_role_add()) {
    return [name = r.auth_role_add().name()](State* s, Changes* c) -> absl::Status {
      if (name.empty()) return MakeError(Error::kRoleEmpty);
      if (s->roles.count(name)) return MakeError(Error::kRoleAlreadyExist);
      authpb::Role role;
      role.set_name(name);
      s->roles[name] = std::move(role);
      c->roles.push_back(name);
      return absl::OkStatus();
    };
  }

  if (r.has_auth_role_grant_permission()) {
    const auto& g = r.auth_role_grant_permission();
    const bool has_perm = g.has_perm();
    return [role = g.name(), perm = g.perm(), has_perm](State* s, Changes* c) -> absl::Status {
      // etcd checks the permission before it looks the role up.
      if (!has_perm) return MakeError(Error::kPermissionNotGiven);
      if (!IsValidPermissionRange(perm.key(), perm.range_end())) {
        return MakeError(Error::kInvalidAuthMgmt);
      }
      auto r = s->roles.find(role);
      if (r == s->roles.end()) return MakeError(Error::kRoleNotFound);
      auto* perms = r->second.mutable_keypermission();
      // As etcd: look at the first permission whose key is not less.
      auto pos = std::find_if(perms->begin(), perms->end(),
                              [&](const authpb::Permission& p) { return p.key() >= perm.key(); });
      if (pos != perms->end() && pos->key() == perm.key() &&
          pos->range_end() == perm.range_end()) {
        pos->set_permtype(perm.permtype());
      } else {
        // Appended, then sorted by key with Go's sort.Sort as etcd does:
        // not stable, so permissions on one key (a point and a range from
        // it) keep the order that algorithm leaves (GoSort).
        *perms->Add() = perm;
        util::GoSort(
            perms->size(), [&](int i, int j) { return perms->Get(i).key() < perms->Get(j).key(); },
            [&](int i, int j) { perms->SwapElements(i, j); });
      }
      c->roles.push_back(role);
      return absl::OkStatus();
    };
  }

  if (r.has_auth_role_get()) return absl::InvalidArgumentError("auth: not an auth mutation");

  if (r.has_auth_role_revoke_permission()) {
    const auto& v = r.auth_role_revoke_permission();
    return [role = v.role(), key = v.key(), range_end = v.range_end()](
               State* s, Changes* c) -> absl::Status {
      auto r = s->roles.find(role);
      if (r == s->roles.end()) return MakeError(Error::kRoleNotFound);
      auto* perms = r->second.mutable_keypermission();
      const int before = perms->size();
      perms->erase(std::remove_if(perms->begin(), perms->end(),
                                  [&](const authpb::Permission& p) {
                                    return p.key() == key && p.range_end() == range_end;
                                  }),
                   perms->end());
      if (perms->size() == before) return MakeError(Error::kPermissionNotGranted);
      c->roles.push_back(role);
      return absl::OkStatus();
    };
  }

  if (r.has_auth_role_delete()) {
    return [name = r.auth_role_delete().role()](State* s, Changes* c) -> absl::Status {
      if (s->enabled && name == kRoot) return MakeError(Error::kInvalidAuthMgmt);
      if (!s->roles.erase(name)) return MakeError(Error::kRoleNotFound);
      c->roles.push_back(name);
      // Users holding the role lose it.
      for (auto& [uname, u] : s->users) {
        auto* roles = u.mutable_roles();
        auto pos = std::find(roles->begin(), roles->end(), name);
        if (pos == roles->end()) continue;
        roles->erase(pos);
        c->users.push_back(uname);
      }
      return absl::OkStatus();
    };
  }

  return absl::InvalidArgumentError("auth: not an auth mutation");
}

absl::Status AuthStore::Wait(const std::function<void(Done)>& mutation) {
  std::promise<absl::Status> p;
  auto f = p.get_future();
  mutation([&p](absl::Status s) { p.set_value(s); });
  return f.get();
}

// The mutation methods: the InternalRaftRequest etcd 3.5's server proposes
// for each (its header is the log's to fill).

void AuthStore::AuthEnable(Done done, std::optional<mvcc::Caller> by) {
  auto r = std::make_shared<InternalRaftRequest>();
  r->mutable_auth_enable();
  Submit(std::move(r), std::move(done), std::move(by));
}

void AuthStore::AuthDisable(Done done, std::optional<mvcc::Caller> by) {
  auto r = std::make_shared<InternalRaftRequest>();
  r->mutable_auth_disable();
  Submit(std::move(r), std::move(done), std::move(by));
}

void AuthStore::UserAdd(const std::string& name, const std::string& hashed_password,
                        bool no_password, Done done, std::optional<mvcc::Caller> by) {
  auto r = std::make_shared<InternalRaftRequest>();
  auto* a = r->mutable_auth_user_add();
  a->set_name(name);
  a->mutable_options()->set_no_password(no_password);
  if (!no_password) a->set_hashedpassword(absl::Base64Escape(hashed_password));
  Submit(std::move(r), std::move(done), std::move(by));
}

void AuthStore::UserDelete(const std::string& name, Done done, std::optional<mvcc::Caller> by) {
  auto r = std::make_shared<InternalRaftRequest>();
  r->mutable_auth_user_delete()->set_name(name);
  Submit(std::move(r), std::move(done), std::move(by));
}

void AuthStore::UserChangePassword(const std::string& name, const std::string& hashed_password,
                                   Done done, std::optional<mvcc::Caller> by) {
  auto r = std::make_shared<InternalRaftRequest>();
  auto* p = r->mutable_auth_user_change_password();
  p->set_name(name);
  p->set_hashedpassword(absl::Base64Escape(hashed_password));
  Submit(std::move(r), std::move(done), std::move(by));
}

void AuthStore::UserGrantRole(const std::string& user, const std::string& role, Done done,
                              std::optional<mvcc::Caller> by) {
  auto r = std::make_shared<InternalRaftRequest>();
  auto* g = r->mutable_auth_user_grant_role();
  g->set_user(user);
  g->set_role(role);
  Submit(std::move(r), std::move(done), std::move(by));
}

void AuthStore::UserRevokeRole(const std::string& user, const std::string& role, Done done,
                               std::optional<mvcc::Caller> by) {
  auto r = std::make_shared<InternalRaftRequest>();
  auto* v = r->mutable_auth_user_revoke_role();
  v->set_name(user);
  v->set_role(role);
  Submit(std::move(r), std::move(done), std::move(by));
}

void AuthStore::RoleAdd(const std::string& name, Done done, std::optional<mvcc::Caller> by) {
  auto r = std::make_shared<InternalRaftRequest>();
  r->mutable_auth_role_add()->set_name(name);
  Submit(std::move(r), std::move(done), std::move(by));
}

void AuthStore::RoleDelete(const std::string& name, Done done, std::optional<mvcc::Caller> by) {
  auto r = std::make_shared<InternalRaftRequest>();
  r->mutable_auth_role_delete()->set_role(name);
  Submit(std::move(r), std::move(done), std::move(by));
}

void AuthStore::RoleGrantPermission(const std::string& role, const authpb::Permission& perm,
                                    Done done, std::optional<mvcc::Caller> by) {
  auto r = std::make_shared<InternalRaftRequest>();
  auto* g = r->mutable_auth_role_grant_permission();
  g->set_name(role);
  *g->mutable_perm() = perm;
  Submit(std::move(r), std::move(done), std::move(by));
}

void AuthStore::RoleRevokePermission(const std::string& role, const std::string& key,
                                     const std::string& range_end, Done done,
                                     std::optional<mvcc::Caller> by) {
  auto r = std::make_shared<InternalRaftRequest>();
  auto* v = r->mutable_auth_role_revoke_permission();
  v->set_role(role);
  v->set_key(key);
  v->set_range_end(range_end);
  Submit(std::move(r), std::move(done), std::move(by));
}

// ---------------------------------------------------------------- reads

absl::StatusOr<authpb::User> AuthStore::GetUser(const std::string& name) const {
  auto s = Current();
  auto u = s->users.find(name);
  if (u == s->users.end()) return MakeError(Error::kUserNotFound);
  return u->second;
}

absl::StatusOr<authpb::Role> AuthStore::GetRole(const std::string& name) const {
  auto s = Current();
  auto r = s->roles.find(name);
  if (r == s->roles.end()) return MakeError(Error::kRoleNotFound);
  return r->second;
}

absl::StatusOr<std::vector<authpb::Permission>> AuthStore::RolePermissions(
    const std::string& name) const {
  auto role = GetRole(name);
  if (!role.ok()) return role.status();
  std::vector<authpb::Permission> out;
  if (name == kRoot) {
    authpb::Permission all;
    all.set_permtype(authpb::Permission::READWRITE);
    all.set_range_end(std::string(1, '\0'));
    out.push_back(std::move(all));
    return out;
  }
  out.assign(role->keypermission().begin(), role->keypermission().end());
  return out;
}

std::vector<std::string> AuthStore::UserNames() const {
  auto s = Current();
  std::vector<std::string> out;
  for (const auto& [name, u] : s->users) out.push_back(name);
  return out;
}

std::vector<std::string> AuthStore::RoleNames() const {
  auto s = Current();
  std::vector<std::string> out;
  for (const auto& [name, r] : s->roles) out.push_back(name);
  return out;
}

bool AuthStore::UserHasRole(const std::string& user, const std::string& role) const {
  auto s = Current();
  auto u = s->users.find(user);
  return u != s->users.end() && HasRole(u->second, role);
}

// ---------------------------------------------------------------- tokens

absl::StatusOr<std::string> AuthStore::HashPassword(const std::string& password) const {
  char salt[CRYPT_GENSALT_OUTPUT_SIZE];
  if (crypt_gensalt_rn("$2b$", static_cast<unsigned long>(options_.bcrypt_cost), nullptr, 0, salt,
                       sizeof(salt)) == nullptr) {
    return absl::InternalError("bcrypt: cannot make a salt");
  }
  auto data = std::make_unique<crypt_data>();
  const char* hash = crypt_r(password.c_str(), salt, data.get());
  if (hash == nullptr || hash[0] == '*') return absl::InternalError("bcrypt: hashing failed");
  return std::string(hash);
}

absl::StatusOr<uint64_t> AuthStore::CheckPassword(const std::string& name,
                                                  const std::string& password) const {
  auto s = Current();
  if (!s->enabled) return MakeError(Error::kAuthNotEnabled);
  auto u = s->users.find(name);
  if (u == s->users.end()) return MakeError(Error::kAuthFailed);
  if (u->second.options().no_password()) return MakeError(Error::kAuthFailed);
  if (!CheckHash(u->second.password(), password)) return MakeError(Error::kAuthFailed);
  return s->revision;
}

void AuthStore::IssueToken(const std::string& name, TokenDone done) {
  if (options_.jwt) {
    done(options_.jwt->Sign(name, Revision(), options_.now()));
    return;
  }
  // etcd's InternalAuthenticateRequest: the name and the token's prefix,
  // never the password. Read before any lock: the prefix comes from
  // /dev/urandom.
  std::string prefix = RandomTokenPrefix();
  etcdserverpb::LoggedAuthenticate a;
  a.set_name(name);
  a.set_simple_token(prefix);
  auto request = std::make_shared<InternalRaftRequest>();
  request->set_authenticate(a.SerializeAsString());
  log_->Submit(AuthenticateWrite(
      std::move(request), [this, prefix = std::move(prefix), done = std::move(done)](
                              absl::Status s) mutable {
        if (!s.ok()) {
          done(s);
          return;
        }
        std::optional<std::string> token;
        {
          util::MutexLock lock(&tokens_mu_);
          auto it = tokens_.find(prefix);
          if (it != tokens_.end()) token = it->second.token;
        }
        // Gone already (its user deleted in the same group): no token.
        if (!token) {
          done(MakeError(Error::kAuthFailed));
          return;
        }
        done(*std::move(token));
      }));
}

absl::StatusOr<std::string> AuthStore::Authenticate(const std::string& name,
                                                    const std::string& password) {
  for (;;) {
    absl::StatusOr<uint64_t> checked = CheckPassword(name, password);
    if (!checked.ok()) return checked.status();
    std::promise<absl::StatusOr<std::string>> p;
    auto f = p.get_future();
    IssueToken(name, [&p](absl::StatusOr<std::string> t) { p.set_value(std::move(t)); });
    absl::StatusOr<std::string> token = f.get();
    // etcd retries while the password was checked at a stale revision.
    if (!token.ok() || *checked == Revision()) return token;
  }
}

absl::StatusOr<AuthInfo> AuthStore::InfoFromToken(const std::string& token) {
  const absl::Time now = options_.now();
  if (options_.jwt) {
    auto claims = options_.jwt->Verify(token, now);
    if (!claims.ok()) return claims.status();
    return AuthInfo{std::move(claims->username), claims->revision};
  }
  // etcd's isValidSimpleToken: "<prefix>.<index>", the index a number.
  const size_t dot = token.find('.');
  if (dot == std::string::npos || token.find('.', dot + 1) != std::string::npos) {
    return MakeError(Error::kInvalidAuthToken);
  }
  uint64_t index = 0;
  const std::string_view digits = std::string_view(token).substr(dot + 1);
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size()) {
    return MakeError(Error::kInvalidAuthToken);
  }
  const std::string prefix = token.substr(0, dot);
  // Before any lock: the hook calls out of the auth store.
  const uint64_t committed = CommittedIndex();
  std::string user;
  {
    util::MutexLock lock(&tokens_mu_);
    auto it = tokens_.find(prefix);
    // A token issued through an entry this member has not applied yet (the
    // client got it from a member ahead of this one): waited for, as etcd
    // waits for the index to be applied, if this member knows the entry is
    // committed, and for at most token_wait. One naming an index past that
    // is refused at once: a forged index holds no thread.
    if (it == tokens_.end() && kv_->AppliedIndex() < index && index <= committed) {
      token_waits_.fetch_add(1, std::memory_order_relaxed);
      const absl::Time deadline = absl::Now() + options_.token_wait;
      while (it == tokens_.end() && kv_->AppliedIndex() < index && absl::Now() < deadline) {
        // Woken when a token is registered; the applied index is looked at
        // again at least every few milliseconds.
        token_added_.WaitWithTimeout(&tokens_mu_, absl::Milliseconds(5));
        it = tokens_.find(prefix);
      }
    }
    if (it == tokens_.end() || it->second.token != token) {
      return MakeError(Error::kInvalidAuthToken);
    }
    if (it->second.expires <= now) {
      tokens_.erase(it);
      return MakeError(Error::kInvalidAuthToken);
    }
    it->second.expires = now + options_.token_ttl;  // refreshed on use
    user = it->second.user;
  }
  return AuthInfo{std::move(user), Revision()};
}

AuthInfo AuthStore::InfoFromCommonName(const std::string& cn) const {
  return AuthInfo{cn, Revision()};
}

size_t AuthStore::TEST_NumTokens() {
  util::MutexLock lock(&tokens_mu_);
  return tokens_.size();
}

// ---------------------------------------------------------------- checks

absl::Status AuthStore::CheckRangeIn(const State& s, const AuthInfo& info, std::string_view key,
                                     std::string_view range_end, PermType type) const {
  if (!s.enabled) return absl::OkStatus();
  if (info.revision == 0) return MakeError(Error::kUserEmpty);
  if (info.revision < s.revision) return MakeError(Error::kAuthOldRevision);
  auto p = s.perms.find(info.user);
  if (p == s.perms.end()) return MakeError(Error::kPermissionDenied);
  if (p->second->root) return absl::OkStatus();
  const RangeSet& set = type == PermType::kRead ? p->second->read : p->second->write;
  if (set.Covers(key, range_end)) return absl::OkStatus();
  return MakeError(Error::kPermissionDenied);
}

absl::Status AuthStore::CheckRange(const AuthInfo& info, std::string_view key,
                                   std::string_view range_end, PermType type) const {
  auto s = Current();
  return CheckRangeIn(*s, info, key, range_end, type);
}

absl::Status AuthStore::CheckAdminIn(const State& s, const AuthInfo& info) const {
  if (!s.enabled) return absl::OkStatus();
  if (info.user.empty()) return MakeError(Error::kUserEmpty);
  auto p = s.perms.find(info.user);
  if (p == s.perms.end()) return MakeError(Error::kUserNotFound);
  if (!p->second->root) return MakeError(Error::kPermissionDenied);
  return absl::OkStatus();
}

absl::Status AuthStore::CheckAdmin(const AuthInfo& info) const {
  auto s = Current();
  return CheckAdminIn(*s, info);
}

absl::Status AuthStore::CheckApply(const WriteRequest& w) {
  // Committer thread: applied_ holds every auth change applied before w.
  const State& s = *applied_;
  if (!s.enabled || !w.caller) return absl::OkStatus();
  const AuthInfo info{w.caller->user, w.caller->auth_revision};
  return std::visit(
      [&](const auto& op) -> absl::Status {
        using T = std::decay_t<decltype(op)>;
        if constexpr (std::is_same_v<T, mvcc::PutOp>) {
          return CheckPutIn(s, info, *op.request);
        } else if constexpr (std::is_same_v<T, mvcc::DeleteRangeOp>) {
          const auto& d = *op.request;
          if (auto st = CheckRangeIn(s, info, d.key(), d.range_end(), PermType::kWrite); !st.ok()) {
            return st;
          }
          if (d.prev_kv()) return CheckRangeIn(s, info, d.key(), d.range_end(), PermType::kRead);
          return absl::OkStatus();
        } else if constexpr (std::is_same_v<T, mvcc::TxnOp>) {
          return CheckTxnIn(s, info, *op.request, TxnRules::kCurrent);
        } else if constexpr (std::is_same_v<T, mvcc::LeaseRevokeOp>) {
          // etcd's checkLeasePutsKeys: an admin at once, else write
          // permission on every attached key.
          if (CheckAdminIn(s, info).ok()) return absl::OkStatus();
          return CheckLeaseKeysIn(s, info, op.request->id(), PermType::kWrite);
        } else if constexpr (std::is_same_v<T, mvcc::CustomOp>) {
          // etcd's needAdminPermission: an auth change by a user who lost
          // the root role meanwhile is refused.
          if (w.raft_request && IsAuthRequest(*w.raft_request)) return CheckAdminIn(s, info);
          return absl::OkStatus();
        } else {
          // Compactions, lease grants and alarms: etcd checks none at apply.
          return absl::OkStatus();
        }
      },
      w.op);
}

absl::Status AuthStore::CheckLeaseKeysIn(const State& s, const AuthInfo& info, int64_t lease_id,
                                         PermType type) const {
  if (lease_id == 0 || !s.enabled) return absl::OkStatus();
  auto lease = kv_->lessor()->Get(lease_id, /*with_keys=*/true);
  if (!lease) return absl::OkStatus();
  for (const auto& key : lease->keys) {
    if (auto st = CheckRangeIn(s, info, key, {}, type); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status AuthStore::CheckLeaseKeys(const AuthInfo& info, int64_t lease_id,
                                       PermType type) const {
  auto s = Current();
  return CheckLeaseKeysIn(*s, info, lease_id, type);
}

absl::Status AuthStore::CheckTxnIn(const State& s, const AuthInfo& info,
                                   const etcdserverpb::TxnRequest& txn, TxnRules rules) const {
  for (const auto& cmp : txn.compare()) {
    if (auto st = CheckRangeIn(s, info, cmp.key(), cmp.range_end(), PermType::kRead); !st.ok()) {
      return st;
    }
  }
  for (const auto* ops : {&txn.success(), &txn.failure()}) {
    for (const auto& op : *ops) {
      absl::Status st;
      switch (op.request_case()) {
        case etcdserverpb::RequestOp::kRequestRange:
          st = CheckRangeIn(s, info, op.request_range().key(), op.request_range().range_end(),
                            PermType::kRead);
          break;
        case etcdserverpb::RequestOp::kRequestPut:
          if (rules == TxnRules::kEtcd34) {
            st = CheckRangeIn(s, info, op.request_put().key(), {}, PermType::kWrite);
          } else {
            st = CheckPutIn(s, info, op.request_put());  // as a plain Put
          }
          break;
        case etcdserverpb::RequestOp::kRequestDeleteRange: {
          const auto& d = op.request_delete_range();
          if (d.prev_kv()) st = CheckRangeIn(s, info, d.key(), d.range_end(), PermType::kRead);
          if (st.ok()) st = CheckRangeIn(s, info, d.key(), d.range_end(), PermType::kWrite);
          break;
        }
        case etcdserverpb::RequestOp::kRequestTxn:
          if (rules == TxnRules::kCurrent) st = CheckTxnIn(s, info, op.request_txn(), rules);
          break;
        default:
          break;
      }
      if (!st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

absl::Status AuthStore::CheckPutIn(const State& s, const AuthInfo& info,
                                   const etcdserverpb::PutRequest& put) const {
  if (auto st = CheckRangeIn(s, info, put.key(), {}, PermType::kWrite); !st.ok()) return st;
  // A lease already holding keys this user can't write can't be attached to
  // more: the user could not revoke it.
  if (auto st = CheckLeaseKeysIn(s, info, put.lease(), PermType::kWrite); !st.ok()) return st;
  if (put.prev_kv()) return CheckRangeIn(s, info, put.key(), {}, PermType::kRead);
  return absl::OkStatus();
}

absl::Status AuthStore::CheckPut(const AuthInfo& info, const etcdserverpb::PutRequest& put) const {
  auto s = Current();
  if (!s->enabled) return absl::OkStatus();
  return CheckPutIn(*s, info, put);
}

absl::Status AuthStore::CheckDeleteRange(const AuthInfo& info,
                                         const etcdserverpb::DeleteRangeRequest& del) const {
  auto s = Current();
  if (!s->enabled) return absl::OkStatus();
  if (auto st = CheckRangeIn(*s, info, del.key(), del.range_end(), PermType::kWrite); !st.ok()) {
    return st;
  }
  if (del.prev_kv()) return CheckRangeIn(*s, info, del.key(), del.range_end(), PermType::kRead);
  return absl::OkStatus();
}

absl::Status AuthStore::CheckTxn(const AuthInfo& info, const etcdserverpb::TxnRequest& txn,
                                 TxnRules rules) const {
  auto s = Current();
  if (!s->enabled) return absl::OkStatus();
  return CheckTxnIn(*s, info, txn, rules);
}

}  // namespace capstan::auth
