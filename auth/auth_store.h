// AuthStore: etcd v3's users, roles, key-range permissions and simple tokens,
// layered on the KV store's durability.
//
// Every mutation (user/role changes, enable/disable) is a typed request, the
// auth field of an etcdserverpb::InternalRaftRequest as etcd 3.5 puts it in
// its Raft log (auth_enable, auth_user_add, ...). Write() turns one into a
// WriteRequest whose CustomOp applies it, and the mutation methods submit
// that through a mvcc::WriteLog: the KV store itself on a single member,
// the Raft log in a cluster, where every member applies the entry with its
// own AuthStore::Write. The committer applies it in order with every other
// write, stages the changed records into its group batch (column family
// kAuth, in the layout `capstan migrate` produces from etcd's buckets:
// "auth/authEnabled", "auth/authRevision", "authUsers/<name>" ->
// authpb.User, "authRoles/<name>" -> authpb.Role) and the mutation becomes
// visible to permission checks only once it is durable. Each successful
// mutation but AuthEnable bumps the auth revision, as etcd's commitRevision
// does.
//
// A request's effect depends only on the request and the applied auth
// state, so members fed the same entries store the same records: passwords
// are hashed before the request is made (etcd 3.5 logs
// base64(bcrypt hash) in hashedPassword and the applier decodes it).
//
// Permission checks read an immutable published state (users, roles and each
// user's merged read/write key ranges, like etcd's range_perm_cache) and take
// only a short lock to fetch it. A mutation's state is published before its
// done callback runs, so that every request that arrives after the change
// was acknowledged is checked against it; states are published in the
// order the committer applied them, whatever order their done callbacks
// run in (a later one, or a Reload, is never replaced by an earlier one).
// The auth store is also its KV store's mvcc::WriteGuard: as etcd's
// authApplierV3, every client write made by a user (WriteRequest::caller,
// logged in the entry's header in a cluster) is checked again when it is
// applied, against the auth state applied by then, on every member: a
// permission revoked between the request's check and its apply refuses it
// ("permission denied", or "revision of auth store is old" for a caller
// checked at an older auth revision), and so does an auth change made by a
// user who lost the root role meanwhile.
//
// Simple tokens ("<random>.<index>") live in memory only (as in etcd), expire
// after the configured TTL unless used, and are dropped when their user is
// deleted or changes password, and when auth is disabled. They are issued
// through the write log, as etcd 3.5 issues them: the member that checked
// the password proposes etcd's InternalAuthenticateRequest (the name and the
// token's random prefix), and every member that applies it registers the
// token "<prefix>.<entry index>", so that a client may present it to any
// member. A member that does not know a token whose index it has not applied
// yet waits for it, as etcd's isValidSimpleToken does, but only if it knows
// that index to be committed (SetCommittedIndex), and for at most
// AuthStoreOptions::token_wait: a token naming an index past the committed
// one (forged, or from an entry this member does not know is committed yet)
// is refused at once, so that it never holds the caller's thread.
//
// Password hashing and checking (bcrypt) is CPU-heavy: HashPassword and
// Authenticate run it on the calling thread, so call them off gRPC reactor
// threads. Mutations never hash on the committer thread.
//
// Thread safety: every public method may be called from any thread. Two
// leaf locks (the published state's and the tokens'), never held together
// and never held while calling out of the auth store.

#ifndef CAPSTAN_AUTH_AUTH_STORE_H_
#define CAPSTAN_AUTH_AUTH_STORE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "auth/jwt_token.h"
#include "authpb/auth.pb.h"
#include "etcdserverpb/raft_internal.pb.h"
#include "etcdserverpb/rpc.pb.h"
#include "mvcc/kv_store.h"
#include "mvcc/write_request.h"
#include "util/mutex.h"

namespace capstan::auth {

// Who a request comes from: etcd's AuthInfo. revision 0 means "no user"
// (no token and no client certificate).
struct AuthInfo {
  std::string user;
  uint64_t revision = 0;
};

enum class PermType { kRead, kWrite };

// Key ranges a user may read or write: disjoint, sorted, merged intervals
// [begin, end) (an empty end means unbounded), built from the permissions of
// all the user's roles. Contains() answers whether the union covers a
// range, like etcd's interval-tree Contains; Intersects() whether one key
// is covered.
class RangeSet {
 public:
  // Adds etcd's permission range: range_end empty: the single key; "\0":
  // every key from key on; else [key, range_end).
  void Add(std::string_view key, std::string_view range_end);
  // Merges overlapping and adjacent intervals. REQUIRES: called after the
  // last Add and before any query.
  void Seal();
  // True if the union covers the request range [key, range_end) (range_end
  // "\0": unbounded; empty: the single key; at or below key: as key alone).
  bool Covers(std::string_view key, std::string_view range_end) const;

  struct Interval {
    std::string begin;
    std::string end;  // empty: unbounded
  };
  const std::vector<Interval>& intervals() const { return intervals_; }

 private:
  bool ContainsInterval(std::string_view begin, std::string_view end) const;
  bool ContainsKey(std::string_view key) const;
  std::vector<Interval> intervals_;
};

struct AuthStoreOptions {
  // bcrypt cost of new password hashes (--bcrypt-cost).
  int bcrypt_cost = 10;
  // Simple tokens expire after this long without use (--auth-token-ttl).
  absl::Duration token_ttl = absl::Seconds(300);
  // Set: issue and accept JWT tokens (--auth-token jwt,...) instead of
  // simple tokens.
  std::shared_ptr<const JwtTokens> jwt;
  // The wall clock tokens are issued and checked by (a simple token's
  // expiry, a JWT's exp claim); tests substitute their own. Called from any
  // thread that authenticates or presents a token, never under a lock: it
  // must be thread-safe.
  std::function<absl::Time()> now = absl::Now;
  // The longest InfoFromToken waits for this member to apply the entry that
  // issued a simple token it does not know yet (see SetCommittedIndex).
  absl::Duration token_wait = absl::Seconds(1);
};

class AuthStore final : private mvcc::WriteGuard {
 public:
  // Loads the auth records from store's backend; a store without an auth
  // revision starts at revision 1, as etcd does. The mutation methods submit
  // their requests to log (the store itself on a single member, the Raft
  // log in a cluster). store and log must outlive the auth store.
  static absl::StatusOr<std::unique_ptr<AuthStore>> Open(mvcc::KvStore* store,
                                                         mvcc::WriteLog* log,
                                                         const AuthStoreOptions& options);
  // Reloads every auth record from the store's backend, after its data was
  // replaced (KvStore::Restore). Runs on the store's committer (Restore's
  // `after` step), so that no auth write is being applied meanwhile.
  absl::Status Reload() { return Load(); }

  // The single-member form: store is the log.
  static absl::StatusOr<std::unique_ptr<AuthStore>> Open(mvcc::KvStore* store,
                                                         const AuthStoreOptions& options);

  // Detaches itself from the store (SetWriteGuard).
  ~AuthStore() override;

  AuthStore(const AuthStore&) = delete;
  AuthStore& operator=(const AuthStore&) = delete;

  // Log entries at or below index are a replay of what this member applied
  // before it restarted: the simple tokens they issued are not registered
  // again. Before the replay starts.
  void SetReplayedThrough(uint64_t index) {
    replayed_through_.store(index, std::memory_order_release);
  }
  // Where this member's committed log index comes from (a cluster's Raft
  // log): InfoFromToken waits for the entry of a simple token it does not
  // know only if the token's index is at or below it. Unset: the store's
  // applied index (a single member commits what it applies, so it never
  // waits). committed_index is called from the threads that present tokens
  // (gRPC threads), never under a lock of the auth store; it must be
  // thread-safe and must not block. REQUIRES: before any InfoFromToken
  // (before clients are served).
  void SetCommittedIndex(std::function<uint64_t()> committed_index) {
    committed_index_ = std::move(committed_index);
  }

  bool Enabled() const;
  uint64_t Revision() const;
  mvcc::KvStore* kv() const { return kv_; }

  // --- Mutations. Each builds its InternalRaftRequest and submits it to
  // the log; done runs on the committer thread (must not block) once the
  // change is durable and visible, or with the error that refused it
  // (etcd's texts via Error).
  using Done = absl::AnyInvocable<void(absl::Status)>;

  // The write that applies request, one of its auth mutations (auth_enable,
  // auth_disable, auth_user_add, auth_user_delete,
  // auth_user_change_password, auth_user_grant_role, auth_user_revoke_role,
  // auth_role_add, auth_role_delete, auth_role_grant_permission,
  // auth_role_revoke_permission; the first set in etcd's apply order), as
  // etcd 3.5's applier applies it: a CustomOp with raft_request set to
  // request. done gets InvalidArgument for a request holding none of them
  // (or a client write before them). Admin permission is the submitter's
  // to check. An auth_user_add or auth_user_change_password with a password
  // and no hashedPassword (as etcd before 3.5 logs them) is hashed here, on
  // the calling thread, as etcd's applier hashes it; a hashedPassword is
  // base64 of the bcrypt hash, as etcd 3.5 logs it.
  mvcc::WriteRequest Write(std::shared_ptr<const etcdserverpb::InternalRaftRequest> request,
                           Done done);
  // Whether request holds one of the auth mutations Write applies.
  static bool IsAuthRequest(const etcdserverpb::InternalRaftRequest& request);
  // Whether request is etcd's InternalAuthenticateRequest (a simple token).
  static bool IsAuthenticate(const etcdserverpb::InternalRaftRequest& request);
  // The write that applies a logged auth entry on this member: an auth
  // mutation (Write) or an InternalAuthenticateRequest (registers its
  // simple token); nullopt, leaving *done alone, for any other entry. What a
  // cluster member's Raft log decodes its auth entries with.
  std::optional<mvcc::WriteRequest> Decode(
      std::shared_ptr<const etcdserverpb::InternalRaftRequest> request,
      absl::AnyInvocable<void(absl::Status)>* done);
  // log->Submit(Write(request, done)), made by `by` (the caller whose admin
  // permission was checked): it is checked again when it is applied. Each
  // mutation below takes the same `by`.
  void Submit(std::shared_ptr<const etcdserverpb::InternalRaftRequest> request, Done done,
              std::optional<mvcc::Caller> by = std::nullopt);
  // etcd 3.5 proposes its auth reads (AuthStatus, UserGet, UserList,
  // RoleGet, RoleList) as it proposes writes: `request` holds one of them
  // and goes through the log, changing nothing on any member, and done runs
  // once it is applied. The caller then reads the applied state, which is
  // at least as new as the entry: the read is linearizable, and without a
  // quorum it fails as a write does.
  void ReadThroughLog(std::shared_ptr<const etcdserverpb::InternalRaftRequest> request, Done done);

  void AuthEnable(Done done, std::optional<mvcc::Caller> by = std::nullopt);
  void AuthDisable(Done done, std::optional<mvcc::Caller> by = std::nullopt);
  // hashed_password: from HashPassword, the bcrypt hash itself (ignored
  // with no_password); the request carries it base64-encoded.
  void UserAdd(const std::string& name, const std::string& hashed_password, bool no_password,
               Done done, std::optional<mvcc::Caller> by = std::nullopt);
  void UserDelete(const std::string& name, Done done,
                  std::optional<mvcc::Caller> by = std::nullopt);
  // A user added with no_password keeps no password (etcd 3.5).
  void UserChangePassword(const std::string& name, const std::string& hashed_password, Done done,
                          std::optional<mvcc::Caller> by = std::nullopt);
  void UserGrantRole(const std::string& user, const std::string& role, Done done,
                     std::optional<mvcc::Caller> by = std::nullopt);
  void UserRevokeRole(const std::string& user, const std::string& role, Done done,
                      std::optional<mvcc::Caller> by = std::nullopt);
  void RoleAdd(const std::string& name, Done done, std::optional<mvcc::Caller> by = std::nullopt);
  void RoleDelete(const std::string& name, Done done,
                  std::optional<mvcc::Caller> by = std::nullopt);
  void RoleGrantPermission(const std::string& role, const authpb::Permission& perm, Done done,
                           std::optional<mvcc::Caller> by = std::nullopt);
  void RoleRevokePermission(const std::string& role, const std::string& key,
                            const std::string& range_end, Done done,
                            std::optional<mvcc::Caller> by = std::nullopt);

  // Blocking forms of the mutations, for tests and tools.
  absl::Status Wait(const std::function<void(Done)>& mutation);

  // --- Reads of the published state.
  absl::StatusOr<authpb::User> GetUser(const std::string& name) const;
  absl::StatusOr<authpb::Role> GetRole(const std::string& name) const;
  // RoleGet's answer: the root role reports READWRITE on every key.
  absl::StatusOr<std::vector<authpb::Permission>> RolePermissions(const std::string& name) const;
  std::vector<std::string> UserNames() const;
  std::vector<std::string> RoleNames() const;
  bool UserHasRole(const std::string& user, const std::string& role) const;

  // --- Passwords and tokens.
  // A bcrypt hash of password at the configured cost (CPU-heavy).
  absl::StatusOr<std::string> HashPassword(const std::string& password) const;
  // Checks name's password (CPU-heavy, on the calling thread): the auth
  // revision it was checked at (etcd's CheckPassword), or kAuthNotEnabled,
  // kAuthFailed.
  absl::StatusOr<uint64_t> CheckPassword(const std::string& name,
                                         const std::string& password) const;
  // Issues a token to name, whose password was checked: a JWT carrying the
  // current auth revision (at once) with options.jwt; else a simple token,
  // through the write log (etcd's InternalAuthenticateRequest), once this
  // member applied it. done runs on the committer (must not block) or on
  // the calling thread, with the token or the error that refused it
  // (kAuthNotEnabled, kAuthFailed for a user gone meanwhile).
  using TokenDone = absl::AnyInvocable<void(absl::StatusOr<std::string>)>;
  void IssueToken(const std::string& name, TokenDone done);
  // etcd's Authenticate, blocking: CheckPassword, then IssueToken, again
  // while the auth revision moved past the one the password was checked at.
  // Not on the committer thread.
  absl::StatusOr<std::string> Authenticate(const std::string& name, const std::string& password);
  // The identity a token stands for (a simple token's TTL is refreshed; a
  // JWT carries the auth revision it was issued at); kInvalidAuthToken if it
  // is unknown, expired, or a JWT with a bad signature.
  absl::StatusOr<AuthInfo> InfoFromToken(const std::string& token);
  // The identity of a verified client certificate's common name.
  AuthInfo InfoFromCommonName(const std::string& cn) const;

  // --- Permission checks (etcd's isOpPermitted and IsAdminPermitted): ok
  // when auth is disabled; kUserEmpty without a user; kAuthOldRevision
  // (range checks) when info predates the current auth revision (a JWT
  // issued before an auth change); kPermissionDenied (or kUserNotFound for
  // admin) otherwise.
  absl::Status CheckRange(const AuthInfo& info, std::string_view key, std::string_view range_end,
                          PermType type) const;
  absl::Status CheckAdmin(const AuthInfo& info) const;
  // type permission on every key attached to the lease (etcd's
  // checkLeasePuts for kWrite); ok for lease 0 or a lease that does not
  // exist.
  absl::Status CheckLeaseKeys(const AuthInfo& info, int64_t lease_id, PermType type) const;
  // Every compare and every operation of a txn, recursively, each as its own
  // request would be checked (a put's prev_kv and lease included), as etcd
  // releases from 2026 on do; etcd 3.4.23 checks neither nested txns nor a
  // put's prev_kv and lease inside a txn.
  //
  // kEtcd34 checks as etcd 3.4.23 (and every release before its 2026 fixes)
  // checks a txn when it applies one: compares and ranges read, puts write
  // only, deletes read for prev_kv then write, nested txns not at all. A
  // replay of such an etcd's log (capstan migrate) applies what it applied.
  enum class TxnRules { kCurrent, kEtcd34 };
  absl::Status CheckTxn(const AuthInfo& info, const etcdserverpb::TxnRequest& txn,
                        TxnRules rules = TxnRules::kCurrent) const;
  // A Put (write on the key, write on the lease's other keys, read for
  // prev_kv) and a DeleteRange (write, then read for prev_kv), as etcd's
  // authApplierV3 checks them.
  absl::Status CheckPut(const AuthInfo& info, const etcdserverpb::PutRequest& put) const;
  absl::Status CheckDeleteRange(const AuthInfo& info,
                                const etcdserverpb::DeleteRangeRequest& del) const;

  // Test hook: the tokens currently valid.
  size_t TEST_NumTokens();
  // Test hook: how many InfoFromToken calls waited for a token's entry.
  uint64_t TEST_TokenWaits() const { return token_waits_.load(std::memory_order_relaxed); }

 private:
  struct UserPerms {
    RangeSet read, write;
    bool root = false;
  };
  // One immutable version of the auth state.
  struct State {
    // The order in which the committer made the states (Load and each
    // applied mutation): only a state newer than the published one is
    // published.
    uint64_t seq = 0;
    bool enabled = false;
    uint64_t revision = 0;
    std::map<std::string, authpb::User> users;
    std::map<std::string, authpb::Role> roles;
    absl::flat_hash_map<std::string, std::shared_ptr<const UserPerms>> perms;
    void RebuildPerms();
  };
  // What a mutation changed, to stage.
  struct Changes {
    std::vector<std::string> users, roles;  // names whose records changed
    bool enabled = false;
    std::vector<std::string> invalidate_users;  // whose tokens to drop
    bool drop_all_tokens = false;
    bool changed = true;  // false: a no-op that keeps the revision
    bool bump_revision = true;  // false: staged, but the revision stays
  };
  using Mutation = std::function<absl::Status(State* next, Changes* changes)>;

  AuthStore(mvcc::KvStore* kv, mvcc::WriteLog* log, const AuthStoreOptions& options);
  absl::Status Load();
  // mvcc::WriteGuard, on the committer: w re-checked against applied_.
  absl::Status CheckApply(const mvcc::WriteRequest& w) override;
  // The write applying a logged InternalAuthenticateRequest.
  mvcc::WriteRequest AuthenticateWrite(
      std::shared_ptr<const etcdserverpb::InternalRaftRequest> request, Done done);
  // Registers a simple token (committer thread) and wakes InfoFromToken.
  void AddToken(const std::string& prefix, const std::string& user, uint64_t index)
      ABSL_LOCKS_EXCLUDED(tokens_mu_);
  std::atomic<uint64_t> replayed_through_{0};  // SetReplayedThrough
  // The mutation request applies (hashing a pre-3.5 entry's password here).
  absl::StatusOr<Mutation> MutationOf(const etcdserverpb::InternalRaftRequest& request) const;
  // etcd's selectPassword: the bcrypt hash a request's password and
  // hashedPassword give.
  absl::StatusOr<std::string> SelectPassword(const std::string& password,
                                             const std::string& hashed) const;
  // The CustomOp write applying m to the applied state.
  mvcc::WriteRequest WriteOf(Mutation m, Done done);
  std::shared_ptr<const State> Current() const;
  // Publishes next unless a newer state is published already.
  void Publish(std::shared_ptr<const State> next) ABSL_LOCKS_EXCLUDED(state_mu_);
  // The index up to which this member knows the log committed.
  uint64_t CommittedIndex() const;
  absl::Status CheckAdminIn(const State& s, const AuthInfo& info) const;
  absl::Status CheckRangeIn(const State& s, const AuthInfo& info, std::string_view key,
                            std::string_view range_end, PermType type) const;
  absl::Status CheckLeaseKeysIn(const State& s, const AuthInfo& info, int64_t lease_id,
                               PermType type) const;
  absl::Status CheckTxnIn(const State& s, const AuthInfo& info, const etcdserverpb::TxnRequest& txn,
                          TxnRules rules) const;
  absl::Status CheckPutIn(const State& s, const AuthInfo& info,
                          const etcdserverpb::PutRequest& put) const;

  mvcc::KvStore* const kv_;
  mvcc::WriteLog* const log_;
  const AuthStoreOptions options_;

  // The state with every applied mutation, durable or not: read and written
  // by the committer thread only (and by Load before any mutation), so no
  // lock.
  std::shared_ptr<const State> applied_;

  // The published (durable) state: swapped by the committer, read by
  // everyone. Lock order: state_mu_ is a leaf lock, held only to copy or
  // swap the pointer; never held with tokens_mu_.
  mutable util::Mutex state_mu_;
  std::shared_ptr<const State> state_ ABSL_GUARDED_BY(state_mu_);

  struct Token {
    std::string token;  // "<prefix>.<index>"
    std::string user;
    absl::Time expires;
  };
  // Simple tokens, by their random prefix (unique: 16 letters of 52). Lock
  // order: tokens_mu_ is a leaf lock; never held with state_mu_.
  util::Mutex tokens_mu_;
  absl::flat_hash_map<std::string, Token> tokens_ ABSL_GUARDED_BY(tokens_mu_);
  // Signalled when a token is registered.
  util::CondVar token_added_;
  std::atomic<uint64_t> token_waits_{0};  // TEST_TokenWaits

  // Set before clients are served (SetCommittedIndex); read-only after.
  std::function<uint64_t()> committed_index_;
};

}  // namespace capstan::auth

#endif  // CAPSTAN_AUTH_AUTH_STORE_H_
