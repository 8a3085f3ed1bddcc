#include "auth/auth_store.h"

#include <crypt.h>
#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <regex>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "auth/errors.h"
#include "gtest/gtest.h"
#include "storage/backend.h"

namespace capstan::auth {

using mvcc::KvStore;
using mvcc::KvStoreOptions;
namespace {

using Perm = authpb::Permission;

Perm MakePerm(Perm::Type type, const std::string& key, const std::string& range_end) {
  Perm p;
  p.set_permtype(type);
  p.set_key(key);
  p.set_range_end(range_end);
  return p;
}

const std::string kNul(1, '\0');

TEST(RangeSetTest, MergesAdjacentAndOverlapping) {
  RangeSet s;
  s.Add("a", "c");
  s.Add("c", "e");   // adjacent
  s.Add("d", "f");   // overlapping
  s.Add("x", "");    // single key
  s.Seal();
  ASSERT_EQ(s.intervals().size(), 2u);
  EXPECT_TRUE(s.Covers("a", "f"));
  EXPECT_TRUE(s.Covers("b", "e"));
  EXPECT_FALSE(s.Covers("a", "g"));
  EXPECT_TRUE(s.Covers("e", ""));
  EXPECT_FALSE(s.Covers("f", ""));
  EXPECT_TRUE(s.Covers("x", ""));
  EXPECT_TRUE(s.Covers("x", std::string("x") + kNul));  // [x, x\0) is the key x
  EXPECT_FALSE(s.Covers("x", "y"));
  EXPECT_FALSE(s.Covers("a", kNul));  // from-key: unbounded
}

TEST(RangeSetTest, ReversedRangeIsCoveredWhereItsKeyIs) {
  // A reversed range ([c, a0): no keys) is allowed where its key is
  // readable, and only there.
  RangeSet s;
  s.Add("a", "b");
  s.Add("c", "");
  s.Seal();
  EXPECT_TRUE(s.Covers("c", "a0"));
  EXPECT_TRUE(s.Covers("a/1", "a"));
  EXPECT_FALSE(s.Covers("d", "a0"));
  EXPECT_FALSE(s.Covers("b", "b"));  // empty, and b is not readable
  EXPECT_TRUE(s.Covers("a", "a"));
}

TEST(RangeSetTest, FromKeyPermission) {
  RangeSet s;
  s.Add("m", kNul);
  s.Seal();
  EXPECT_TRUE(s.Covers("m", kNul));
  EXPECT_TRUE(s.Covers("zzz", ""));
  EXPECT_TRUE(s.Covers("n", "q"));
  EXPECT_FALSE(s.Covers("l", "n"));
  RangeSet all;
  all.Add(kNul, kNul);  // every key
  all.Seal();
  EXPECT_TRUE(all.Covers(kNul, kNul));
}

// A user's key ranges are merged from all its roles' permissions, in
// whatever order they come (a user's roles, each role's permissions,
// std::sort's order among equal begins). Every order of the same
// overlapping, nested, adjacent and unbounded intervals must give the same
// merged set and the same answers, and those answers must be the union's:
// with every interval's ends drawn from a set of points, the union covers
// [a, b) exactly when every point p with a <= p < b lies in some interval
// (between two neighbouring points nothing changes).
TEST(RangeSetTest, AnyOrderOfOverlappingIntervalsFromSeveralRolesGivesTheUnion) {
  struct Perm {
    std::string key, range_end;  // as a role stores them
  };
  // Three roles' permissions (the role a permission came from does not
  // matter to the union; several hold the same interval).
  const std::vector<Perm> perms = {
      {"a", "c"},      // role 1
      {"b", ""},       // role 1: the key b alone
      {"b", "d"},      // role 2: overlaps [a, c), covers b
      {"a/1", "a/3"},  // role 2: nested in [a, c)
      {"d", "e"},      // role 3: adjacent to [b, d)
      {"f", kNul},     // role 3: from f on
      {"a", "c"},      // role 3: the same as role 1's
      {"e\xff", "f"},  // role 3: inside the gap before f
  };
  // Every end above, and keys between and around them.
  std::vector<std::string> points = {"",   "0",  "a",  "a/1", "a/2", "a/3", "ab", "b",
                                     "b0", "c",  "c/1", "d",  "d0",  "e",   "e0", "e\xff",
                                     "f",  "f0", "z",  std::string("b") + kNul};
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());

  // The intervals as [begin, end) with end empty for unbounded.
  auto interval = [](const Perm& p) -> std::pair<std::string, std::string> {
    if (p.range_end.empty()) return {p.key, p.key + kNul};
    if (p.range_end == kNul) return {p.key, ""};
    return {p.key, p.range_end};
  };
  auto in_union = [&](const std::string& k) {
    for (const auto& p : perms) {
      auto [b, e] = interval(p);
      if (b <= k && (e.empty() || k < e)) return true;
    }
    return false;
  };
  // Whether the union covers [key, end) (end empty: unbounded), point by
  // point.
  auto covered = [&](const std::string& key, const std::string& end) {
    for (const auto& p : points) {
      if (p < key || (!end.empty() && p >= end)) continue;
      if (!in_union(p)) return false;
    }
    // An unbounded range also needs what lies past the last point: an
    // unbounded interval that starts at or before it.
    if (end.empty()) {
      return std::any_of(perms.begin(), perms.end(), [&](const Perm& p) {
        return p.range_end == kNul && p.key <= points.back();
      });
    }
    return true;
  };

  std::vector<size_t> order(perms.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::optional<std::vector<RangeSet::Interval>> first;
  int orders = 0;
  do {
    ++orders;
    RangeSet s;
    for (size_t i : order) s.Add(perms[i].key, perms[i].range_end);
    s.Seal();
    if (!first) {
      first = s.intervals();
      // [a, e) merged from five intervals, [e\xff, f) and [f, ...) merged.
      ASSERT_EQ(first->size(), 2u);
      EXPECT_EQ((*first)[0].begin, "a");
      EXPECT_EQ((*first)[0].end, "e");
      EXPECT_EQ((*first)[1].begin, "e\xff");
      EXPECT_EQ((*first)[1].end, "");
    } else {
      ASSERT_EQ(s.intervals().size(), first->size());
      for (size_t i = 0; i < first->size(); ++i) {
        ASSERT_EQ(s.intervals()[i].begin, (*first)[i].begin) << "order " << orders;
        ASSERT_EQ(s.intervals()[i].end, (*first)[i].end) << "order " << orders;
      }
    }
    // Only the first order is checked point by point against the union:
    // the others merged to the same intervals.
    if (orders > 1) continue;
    for (const auto& key : points) {
      if (key.empty()) continue;  // no key
      EXPECT_EQ(s.Covers(key, ""), in_union(key)) << "key " << key;
      EXPECT_EQ(s.Covers(key, kNul), covered(key, "")) << "from " << key;
      for (const auto& end : points) {
        if (end <= key) continue;
        EXPECT_EQ(s.Covers(key, end), covered(key, end)) << "[" << key << ", " << end << ")";
      }
    }
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(orders, 40320);
}

class AuthStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/capstan-auth-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    Reopen();
  }
  void TearDown() override {
    auth_.reset();
    kv_.reset();
    std::filesystem::remove_all(dir_);
  }
  void Reopen() {
    auth_.reset();
    kv_.reset();
    storage::BackendOptions bo;
    bo.dir = dir_;
    auto backend = storage::Backend::Open(bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto kv = KvStore::Open(KvStoreOptions{}, std::move(*backend));
    ASSERT_TRUE(kv.ok()) << kv.status();
    kv_ = std::move(*kv);
    AuthStoreOptions options;
    options.bcrypt_cost = 4;
    options.token_ttl = absl::Milliseconds(300);
    options.now = [this] { return absl::FromUnixNanos(now_ns_.load()); };
    auto as = AuthStore::Open(kv_.get(), options);
    ASSERT_TRUE(as.ok()) << as.status();
    auth_ = std::move(*as);
  }

  absl::Status AddUser(const std::string& name, const std::string& password) {
    auto hash = auth_->HashPassword(password);
    if (!hash.ok()) return hash.status();
    return auth_->Wait([&](auto done) { auth_->UserAdd(name, *hash, false, std::move(done)); });
  }
  absl::Status Do(const std::function<void(AuthStore::Done)>& m) { return auth_->Wait(m); }

  // Moves the auth store's clock forward.
  void Advance(absl::Duration d) { now_ns_ += absl::ToInt64Nanoseconds(d); }

  // root user with the root role, role "r" READWRITE on prefix "foo", user
  // "u" with "r"; auth enabled.
  void SetUpUsers() {
    ASSERT_TRUE(AddUser("root", "rootpw").ok());
    ASSERT_TRUE(Do([&](auto d) { auth_->UserGrantRole("root", "root", std::move(d)); }).ok());
    ASSERT_TRUE(Do([&](auto d) { auth_->RoleAdd("r", std::move(d)); }).ok());
    ASSERT_TRUE(Do([&](auto d) {
                  auth_->RoleGrantPermission("r", MakePerm(Perm::READWRITE, "foo", "fop"),
                                             std::move(d));
                }).ok());
    ASSERT_TRUE(AddUser("u", "upw").ok());
    ASSERT_TRUE(Do([&](auto d) { auth_->UserGrantRole("u", "r", std::move(d)); }).ok());
    ASSERT_TRUE(Do([&](auto d) { auth_->AuthEnable(std::move(d)); }).ok());
  }

  std::string dir_;
  // The tokens' wall clock: moves only when a test advances it.
  std::atomic<int64_t> now_ns_{absl::ToUnixNanos(absl::FromCivil(absl::CivilSecond(2024, 1, 1),
                                                                 absl::UTCTimeZone()))};
  std::unique_ptr<KvStore> kv_;
  std::unique_ptr<AuthStore> auth_;
};

TEST_F(AuthStoreTest, EnableNeedsRootUserWithRootRole) {
  EXPECT_EQ(auth_->Revision(), 1u);
  EXPECT_TRUE(Is(Do([&](auto d) { auth_->AuthEnable(std::move(d)); }), Error::kRootUserNotExist));
  ASSERT_TRUE(AddUser("root", "pw").ok());
  EXPECT_TRUE(Is(Do([&](auto d) { auth_->AuthEnable(std::move(d)); }), Error::kRootRoleNotExist));
  ASSERT_TRUE(Do([&](auto d) { auth_->UserGrantRole("root", "root", std::move(d)); }).ok());
  ASSERT_TRUE(Do([&](auto d) { auth_->AuthEnable(std::move(d)); }).ok());
  EXPECT_TRUE(auth_->Enabled());
  // etcd's AuthEnable keeps the revision (AuthDisable bumps it).
  EXPECT_EQ(auth_->Revision(), 3u);
  // Enabling again is ignored and keeps the revision.
  ASSERT_TRUE(Do([&](auto d) { auth_->AuthEnable(std::move(d)); }).ok());
  EXPECT_EQ(auth_->Revision(), 3u);
  // root can't be deleted nor lose root while auth is on.
  EXPECT_TRUE(Is(Do([&](auto d) { auth_->UserDelete("root", std::move(d)); }),
                 Error::kInvalidAuthMgmt));
  EXPECT_TRUE(Is(Do([&](auto d) { auth_->UserRevokeRole("root", "root", std::move(d)); }),
                 Error::kInvalidAuthMgmt));
}

TEST_F(AuthStoreTest, UserAndRoleErrors) {
  EXPECT_TRUE(Is(AddUser("", "x"), Error::kUserEmpty));
  ASSERT_TRUE(AddUser("a", "x").ok());
  EXPECT_TRUE(Is(AddUser("a", "x"), Error::kUserAlreadyExist));
  EXPECT_TRUE(Is(Do([&](auto d) { auth_->UserDelete("zz", std::move(d)); }), Error::kUserNotFound));
  EXPECT_TRUE(Is(Do([&](auto d) { auth_->UserGrantRole("a", "nope", std::move(d)); }),
                 Error::kRoleNotFound));
  EXPECT_TRUE(Is(Do([&](auto d) { auth_->RoleAdd("", std::move(d)); }), Error::kRoleEmpty));
  ASSERT_TRUE(Do([&](auto d) { auth_->RoleAdd("r", std::move(d)); }).ok());
  EXPECT_TRUE(Is(Do([&](auto d) { auth_->RoleAdd("r", std::move(d)); }), Error::kRoleAlreadyExist));
  EXPECT_TRUE(Is(Do([&](auto d) { auth_->UserRevokeRole("a", "r", std::move(d)); }),
                 Error::kRoleNotGranted));
  EXPECT_TRUE(Is(Do([&](auto d) { auth_->RoleRevokePermission("r", "k", "", std::move(d)); }),
                 Error::kPermissionNotGranted));
  EXPECT_TRUE(Is(Do([&](auto d) {
                   auth_->RoleGrantPermission("r", MakePerm(Perm::READ, "", ""), std::move(d));
                 }),
                 Error::kInvalidAuthMgmt));
  // Granting twice updates the type in place.
  ASSERT_TRUE(Do([&](auto d) {
                auth_->RoleGrantPermission("r", MakePerm(Perm::READ, "k", ""), std::move(d));
              }).ok());
  ASSERT_TRUE(Do([&](auto d) {
                auth_->RoleGrantPermission("r", MakePerm(Perm::WRITE, "k", ""), std::move(d));
              }).ok());
  ASSERT_TRUE(Do([&](auto d) {
                auth_->RoleGrantPermission("r", MakePerm(Perm::READ, "a", "b"), std::move(d));
              }).ok());
  auto perms = auth_->RolePermissions("r");
  ASSERT_TRUE(perms.ok());
  ASSERT_EQ(perms->size(), 2u);
  EXPECT_EQ((*perms)[0].key(), "a");
  EXPECT_EQ((*perms)[1].key(), "k");
  EXPECT_EQ((*perms)[1].permtype(), Perm::WRITE);
  // Deleting a role takes it from its users.
  ASSERT_TRUE(Do([&](auto d) { auth_->UserGrantRole("a", "r", std::move(d)); }).ok());
  ASSERT_TRUE(Do([&](auto d) { auth_->RoleDelete("r", std::move(d)); }).ok());
  auto user = auth_->GetUser("a");
  ASSERT_TRUE(user.ok());
  EXPECT_EQ(user->roles_size(), 0);
}

TEST_F(AuthStoreTest, PermissionChecks) {
  SetUpUsers();
  auto token = auth_->Authenticate("u", "upw");
  ASSERT_TRUE(token.ok()) << token.status();
  auto info = auth_->InfoFromToken(*token);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->user, "u");
  EXPECT_TRUE(auth_->CheckRange(*info, "foo", "", PermType::kRead).ok());
  EXPECT_TRUE(auth_->CheckRange(*info, "foo1", "", PermType::kWrite).ok());
  EXPECT_TRUE(auth_->CheckRange(*info, "foo", "fop", PermType::kRead).ok());
  EXPECT_TRUE(Is(auth_->CheckRange(*info, "fop", "", PermType::kRead), Error::kPermissionDenied));
  EXPECT_TRUE(Is(auth_->CheckRange(*info, "fo", "fop", PermType::kRead), Error::kPermissionDenied));
  EXPECT_TRUE(Is(auth_->CheckRange(*info, "foo", kNul, PermType::kRead), Error::kPermissionDenied));
  EXPECT_TRUE(Is(auth_->CheckRange(AuthInfo{}, "foo", "", PermType::kRead), Error::kUserEmpty));
  EXPECT_TRUE(Is(auth_->CheckAdmin(*info), Error::kPermissionDenied));
  EXPECT_TRUE(Is(auth_->CheckAdmin(AuthInfo{}), Error::kUserEmpty));
  auto root = auth_->InfoFromCommonName("root");
  EXPECT_TRUE(auth_->CheckAdmin(root).ok());
  EXPECT_TRUE(auth_->CheckRange(root, kNul, kNul, PermType::kWrite).ok());

  etcdserverpb::TxnRequest txn;
  txn.add_compare()->set_key("foo");
  txn.add_success()->mutable_request_put()->set_key("foo2");
  EXPECT_TRUE(auth_->CheckTxn(*info, txn).ok());
  txn.add_failure()->mutable_request_txn()->add_success()->mutable_request_range()->set_key("bar");
  EXPECT_TRUE(Is(auth_->CheckTxn(*info, txn), Error::kPermissionDenied));

  // A write-only grant beside the read-write one.
  ASSERT_TRUE(Do([&](auto d) {
                auth_->RoleGrantPermission("r", MakePerm(Perm::WRITE, "fop", "foz"), std::move(d));
              }).ok());
  // An identity from before the change is stale (etcd's ErrAuthOldRevision);
  // looking the token up again gives the current revision.
  EXPECT_TRUE(Is(auth_->CheckRange(*info, "foo", "", PermType::kRead), Error::kAuthOldRevision));
  info = auth_->InfoFromToken(*token);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(auth_->CheckRange(*info, "foo", "foz", PermType::kWrite).ok());
  EXPECT_TRUE(Is(auth_->CheckRange(*info, "foo", "foz", PermType::kRead), Error::kPermissionDenied));

  // Wrong passwords and unknown users.
  EXPECT_TRUE(Is(auth_->Authenticate("u", "bad").status(), Error::kAuthFailed));
  EXPECT_TRUE(Is(auth_->Authenticate("nobody", "x").status(), Error::kAuthFailed));
  EXPECT_TRUE(Is(auth_->InfoFromToken("bogus.1").status(), Error::kInvalidAuthToken));

  // Changing the password drops the user's tokens.
  auto hash = auth_->HashPassword("new");
  ASSERT_TRUE(hash.ok());
  ASSERT_TRUE(Do([&](auto d) { auth_->UserChangePassword("u", *hash, std::move(d)); }).ok());
  EXPECT_TRUE(Is(auth_->InfoFromToken(*token).status(), Error::kInvalidAuthToken));
  EXPECT_TRUE(auth_->Authenticate("u", "new").ok());

  // Disabling drops every token and lets everything through.
  ASSERT_TRUE(Do([&](auto d) { auth_->AuthDisable(std::move(d)); }).ok());
  EXPECT_EQ(auth_->TEST_NumTokens(), 0u);
  EXPECT_TRUE(auth_->CheckRange(AuthInfo{}, "bar", "", PermType::kWrite).ok());
  EXPECT_TRUE(Is(auth_->Authenticate("u", "new").status(), Error::kAuthNotEnabled));
}

// Submits w to the store and waits for its answer.
absl::Status SubmitAndWait(KvStore* kv, mvcc::WriteRequest w) {
  std::promise<absl::Status> p;
  auto f = p.get_future();
  w.done = [&p](absl::Status s) { p.set_value(s); };
  kv->Submit(std::move(w));
  return f.get();
}

TEST_F(AuthStoreTest, AUsersWriteIsCheckedAgainWhenItIsApplied) {
  SetUpUsers();
  auto token = auth_->Authenticate("u", "upw");
  ASSERT_TRUE(token.ok()) << token.status();
  auto info = auth_->InfoFromToken(*token);
  ASSERT_TRUE(info.ok());
  const mvcc::Caller u{info->user, info->revision};

  etcdserverpb::PutRequest put;
  put.set_key("foo1");
  put.set_value("v");
  etcdserverpb::PutResponse put_resp;
  auto put_write = [&](std::optional<mvcc::Caller> caller) {
    mvcc::WriteRequest w;
    w.op = mvcc::PutOp{&put, &put_resp};
    w.caller = std::move(caller);
    return w;
  };
  EXPECT_TRUE(SubmitAndWait(kv_.get(), put_write(u)).ok());
  const int64_t rev = kv_->Rev();

  // The permission is revoked after u's writes were checked (and queued, or
  // logged): they reach the committer after the revocation.
  ASSERT_TRUE(Do([&](auto d) { auth_->RoleRevokePermission("r", "foo", "fop", std::move(d)); }).ok());
  // Checked at the older auth revision: etcd's ErrAuthOldRevision.
  EXPECT_TRUE(Is(SubmitAndWait(kv_.get(), put_write(u)), Error::kAuthOldRevision));
  // At the current one: permission denied, for every kind of write.
  const mvcc::Caller now{"u", auth_->Revision()};
  EXPECT_TRUE(Is(SubmitAndWait(kv_.get(), put_write(now)), Error::kPermissionDenied));
  etcdserverpb::DeleteRangeRequest del;
  del.set_key("foo1");
  etcdserverpb::DeleteRangeResponse del_resp;
  mvcc::WriteRequest dw;
  dw.op = mvcc::DeleteRangeOp{&del, &del_resp};
  dw.caller = now;
  EXPECT_TRUE(Is(SubmitAndWait(kv_.get(), std::move(dw)), Error::kPermissionDenied));
  etcdserverpb::TxnRequest txn;
  txn.add_success()->mutable_request_put()->set_key("foo2");
  etcdserverpb::TxnResponse txn_resp;
  mvcc::WriteRequest tw;
  tw.op = mvcc::TxnOp{&txn, &txn_resp};
  tw.caller = now;
  EXPECT_TRUE(Is(SubmitAndWait(kv_.get(), std::move(tw)), Error::kPermissionDenied));
  EXPECT_EQ(kv_->Rev(), rev) << "a refused write changed the store";
  // A caller with no user at all (etcd's empty AuthInfo): user name is empty.
  EXPECT_TRUE(Is(SubmitAndWait(kv_.get(), put_write(mvcc::Caller{"", 0})), Error::kUserEmpty));
  // A write of the server's own (no caller) is not a user's.
  EXPECT_TRUE(SubmitAndWait(kv_.get(), put_write(std::nullopt)).ok());

  // An auth change by a user without the root role (it lost it between
  // the check and the apply): refused at apply, as etcd's
  // needAdminPermission.
  EXPECT_TRUE(Is(Do([&](auto d) { auth_->RoleAdd("r2", std::move(d), now); }),
                 Error::kPermissionDenied));
  EXPECT_TRUE(Is(auth_->GetRole("r2").status(), Error::kRoleNotFound));
  EXPECT_TRUE(
      Do([&](auto d) { auth_->RoleAdd("r2", std::move(d), mvcc::Caller{"root", 0}); }).ok());
}

// A change is published before its done callback (the RPC's answer) runs:
// whatever arrives after the acknowledgement is checked against it.
TEST_F(AuthStoreTest, AChangeIsVisibleWhenItIsAcknowledged) {
  SetUpUsers();
  const uint64_t before = auth_->Revision();
  ASSERT_TRUE(auth_->CheckRange(AuthInfo{"u", before}, "foo", "", PermType::kRead).ok());
  struct Seen {
    uint64_t revision = 0;
    absl::Status read, write;
  };
  std::promise<Seen> seen;
  auth_->RoleRevokePermission("r", "foo", "fop", [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    Seen now;
    now.revision = auth_->Revision();
    now.read = auth_->CheckRange(AuthInfo{"u", now.revision}, "foo", "", PermType::kRead);
    etcdserverpb::PutRequest put;
    put.set_key("foo");
    now.write = auth_->CheckPut(AuthInfo{"u", now.revision}, put);
    seen.set_value(now);
  });
  const Seen at_ack = seen.get_future().get();
  EXPECT_EQ(at_ack.revision, before + 1);
  EXPECT_TRUE(Is(at_ack.read, Error::kPermissionDenied)) << at_ack.read;
  EXPECT_TRUE(Is(at_ack.write, Error::kPermissionDenied)) << at_ack.write;
}

TEST_F(AuthStoreTest, SimpleTokensNameTheirIndexAndASingleMemberNeverWaitsForOne) {
  SetUpUsers();
  auto token = auth_->Authenticate("u", "upw");
  ASSERT_TRUE(token.ok()) << token.status();
  const size_t dot = token->find('.');
  ASSERT_NE(dot, std::string::npos);
  EXPECT_EQ(dot, 16u);
  const uint64_t index = std::stoull(token->substr(dot + 1));
  EXPECT_GT(index, 0u);
  EXPECT_LE(index, kv_->AppliedIndex());
  // Malformed tokens are refused at once.
  for (const std::string bad : {"nodot", "a.b", "a.1.2", "a.", "a.-1"}) {
    EXPECT_TRUE(Is(auth_->InfoFromToken(bad).status(), Error::kInvalidAuthToken)) << bad;
  }
  // A token naming an index this member has not applied: a single member
  // commits what it applies, so no member is ahead of it and the token is
  // refused without waiting, a forged huge index too.
  for (const uint64_t ahead : {kv_->AppliedIndex() + 1, kv_->AppliedIndex() + 100,
                               std::numeric_limits<uint64_t>::max()}) {
    EXPECT_TRUE(Is(auth_->InfoFromToken(absl::StrCat("unknownprefixxxx.", ahead)).status(),
                   Error::kInvalidAuthToken))
        << ahead;
  }
  EXPECT_EQ(auth_->TEST_TokenWaits(), 0u);
  // The right prefix with another index is not the token.
  EXPECT_TRUE(Is(auth_->InfoFromToken(absl::StrCat(token->substr(0, dot), ".", index - 1)).status(),
                 Error::kInvalidAuthToken));
  EXPECT_TRUE(auth_->InfoFromToken(*token).ok());
}

TEST_F(AuthStoreTest, TokensExpireUnlessUsed) {
  SetUpUsers();
  auto token = auth_->Authenticate("root", "rootpw");
  ASSERT_TRUE(token.ok());
  EXPECT_NE(token->find('.'), std::string::npos);
  auto unused = auth_->Authenticate("u", "upw");
  ASSERT_TRUE(unused.ok());
  EXPECT_EQ(auth_->TEST_NumTokens(), 2u);
  // Used within the TTL (300 ms), a token lives on: each use refreshes it,
  // long past its first TTL.
  for (int i = 0; i < 4; ++i) {
    Advance(absl::Milliseconds(299));
    EXPECT_TRUE(auth_->InfoFromToken(*token).ok()) << "use " << i;
  }
  // A token not used for its TTL has expired, exactly at the TTL.
  EXPECT_TRUE(Is(auth_->InfoFromToken(*unused).status(), Error::kInvalidAuthToken));
  EXPECT_EQ(auth_->TEST_NumTokens(), 1u) << "the expired token was kept";
  // One nanosecond before its TTL since the last use the token is still
  // valid: a new login, which drops expired tokens, keeps it.
  Advance(absl::Milliseconds(300) - absl::Nanoseconds(1));
  auto last = auth_->Authenticate("u", "upw");
  ASSERT_TRUE(last.ok());
  EXPECT_EQ(auth_->TEST_NumTokens(), 2u) << "a live token was dropped";
  Advance(absl::Nanoseconds(1));
  EXPECT_TRUE(Is(auth_->InfoFromToken(*token).status(), Error::kInvalidAuthToken));
  EXPECT_TRUE(auth_->InfoFromToken(*last).ok());
}

TEST_F(AuthStoreTest, PersistsAcrossReopen) {
  SetUpUsers();
  const uint64_t rev = auth_->Revision();
  EXPECT_EQ(rev, 7u);
  Reopen();
  EXPECT_TRUE(auth_->Enabled());
  EXPECT_EQ(auth_->Revision(), rev);
  EXPECT_EQ(auth_->UserNames(), (std::vector<std::string>{"root", "u"}));
  EXPECT_EQ(auth_->RoleNames(), (std::vector<std::string>{"r"}));
  auto token = auth_->Authenticate("u", "upw");
  ASSERT_TRUE(token.ok()) << token.status();
  auto info = auth_->InfoFromToken(*token);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(auth_->CheckRange(*info, "foo", "", PermType::kWrite).ok());
  EXPECT_TRUE(Is(auth_->CheckRange(*info, "bar", "", PermType::kWrite), Error::kPermissionDenied));
  // Deletions persist too.
  ASSERT_TRUE(Do([&](auto d) { auth_->UserDelete("u", std::move(d)); }).ok());
  ASSERT_TRUE(Do([&](auto d) { auth_->AuthDisable(std::move(d)); }).ok());
  Reopen();
  EXPECT_FALSE(auth_->Enabled());
  EXPECT_EQ(auth_->Revision(), rev + 2);
  EXPECT_EQ(auth_->UserNames(), (std::vector<std::string>{"root"}));
}

// What crypt(3) makes of password with hash's algorithm, cost and salt.
std::string Crypt(const std::string& password, const std::string& hash) {
  auto data = std::make_unique<crypt_data>();
  const char* got = crypt_r(password.c_str(), hash.c_str(), data.get());
  return got == nullptr ? "" : got;
}

TEST_F(AuthStoreTest, StoresABcryptHashAtTheConfiguredCost) {
  SetUpUsers();
  // The record as persisted (etcd's authUsers bucket layout).
  std::string bytes;
  ASSERT_TRUE(kv_->backend()->Get(storage::Cf::kAuth, "authUsers/u", &bytes).ok());
  authpb::User user;
  ASSERT_TRUE(user.ParseFromString(bytes));
  EXPECT_EQ(user.name(), "u");
  const std::string hash = user.password();
  // Modular crypt format: $2b$, two-digit cost (4 here), 22 characters of
  // salt and 31 of hash in bcrypt's base64.
  EXPECT_TRUE(std::regex_match(hash, std::regex(R"(\$2b\$04\$[./A-Za-z0-9]{53})"))) << hash;
  EXPECT_EQ(hash.find("upw"), std::string::npos);
  EXPECT_EQ(Crypt("upw", hash), hash);
  EXPECT_NE(Crypt("upx", hash), hash);
  // A new salt for every hash.
  ASSERT_TRUE(kv_->backend()->Get(storage::Cf::kAuth, "authUsers/root", &bytes).ok());
  ASSERT_TRUE(user.ParseFromString(bytes));
  EXPECT_EQ(Crypt("rootpw", user.password()), user.password());
  auto again = auth_->HashPassword("upw");
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, hash);
  EXPECT_EQ(Crypt("upw", *again), *again);
}

// etcd hashes with Go's bcrypt, which writes $2a$ hashes; a data dir
// migrated from etcd keeps them.
TEST_F(AuthStoreTest, VerifiesEtcdBcryptHashes) {
  SetUpUsers();
  // Written by etcd 3.4 (`etcdctl user add alice --new-user-password=s3cret-Pw`,
  // read from its bbolt file): cost 10.
  const std::string etcd_hash = "$2a$10$9QO4aKqavE4a679ve3dk4u5KmcT98tI7sIC6s7rqYoVUguaW6KiuW";
  ASSERT_TRUE(Do([&](auto d) { auth_->UserAdd("alice", etcd_hash, false, std::move(d)); }).ok());
  EXPECT_TRUE(auth_->Authenticate("alice", "s3cret-Pw").ok());
  EXPECT_TRUE(Is(auth_->Authenticate("alice", "s3cret-pw").status(), Error::kAuthFailed));
  EXPECT_TRUE(Is(auth_->Authenticate("alice", "").status(), Error::kAuthFailed));

  // $2a$ and $2b$ are the same algorithm for such passwords: a hash made
  // here and relabelled $2a$ verifies too.
  auto hash = auth_->HashPassword("pw-for-bob");
  ASSERT_TRUE(hash.ok());
  ASSERT_EQ(hash->substr(0, 4), "$2b$");
  std::string relabelled = "$2a$" + hash->substr(4);
  ASSERT_TRUE(Do([&](auto d) { auth_->UserAdd("bob", relabelled, false, std::move(d)); }).ok());
  EXPECT_TRUE(auth_->Authenticate("bob", "pw-for-bob").ok());
  EXPECT_TRUE(Is(auth_->Authenticate("bob", "pw-for-bo").status(), Error::kAuthFailed));
}

// ---------------------------------------------------------------- typed requests

using Request = etcdserverpb::InternalRaftRequest;
using RequestPtr = std::shared_ptr<const Request>;

// One member: a KV store on its own data dir and an auth store on it, whose
// mutations go through log (the KV store when null).
class Member {
 public:
  // configure, if set, changes the auth store's options.
  explicit Member(mvcc::WriteLog* log = nullptr,
                  const std::function<void(AuthStoreOptions*)>& configure = nullptr) {
    char tmpl[] = "/tmp/capstan-auth-member-XXXXXX";
    dir_ = mkdtemp(tmpl);
    storage::BackendOptions bo;
    bo.dir = dir_;
    auto backend = storage::Backend::Open(bo);
    EXPECT_TRUE(backend.ok()) << backend.status();
    auto kv = KvStore::Open(KvStoreOptions{}, std::move(*backend));
    EXPECT_TRUE(kv.ok()) << kv.status();
    kv_ = std::move(*kv);
    AuthStoreOptions options;
    options.bcrypt_cost = 4;
    if (configure) configure(&options);
    auto as = log ? AuthStore::Open(kv_.get(), log, options) : AuthStore::Open(kv_.get(), options);
    EXPECT_TRUE(as.ok()) << as.status();
    auth_ = std::move(*as);
  }
  ~Member() {
    auth_.reset();
    kv_.reset();
    std::filesystem::remove_all(dir_);
  }

  KvStore* kv() const { return kv_.get(); }
  AuthStore* auth() const { return auth_.get(); }

  // Applies request through Write, submitted straight to the KV store.
  absl::Status Apply(RequestPtr request) {
    std::promise<absl::Status> p;
    auto f = p.get_future();
    kv_->Submit(auth_->Write(std::move(request), [&p](absl::Status s) { p.set_value(s); }));
    return f.get();
  }
  absl::Status Do(const std::function<void(AuthStore::Done)>& m) { return auth_->Wait(m); }

  // Every record of the auth column family, as stored.
  std::map<std::string, std::string> Records() const {
    std::map<std::string, std::string> out;
    auto it = kv_->backend()->NewIterator(storage::Cf::kAuth);
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      out[std::string(it->key())] = std::string(it->value());
    }
    EXPECT_TRUE(it->status().ok()) << it->status();
    return out;
  }

 private:
  std::string dir_;
  std::unique_ptr<KvStore> kv_;
  std::unique_ptr<AuthStore> auth_;
};

RequestPtr Req(const std::function<void(Request*)>& fill) {
  auto r = std::make_shared<Request>();
  fill(r.get());
  return r;
}

RequestPtr UserAddReq(const std::string& name, const std::string& hash, bool no_password = false) {
  return Req([&](Request* r) {
    auto* a = r->mutable_auth_user_add();
    a->set_name(name);
    a->mutable_options()->set_no_password(no_password);
    if (!no_password) a->set_hashedpassword(absl::Base64Escape(hash));
  });
}
RequestPtr GrantRoleReq(const std::string& user, const std::string& role) {
  return Req([&](Request* r) {
    r->mutable_auth_user_grant_role()->set_user(user);
    r->mutable_auth_user_grant_role()->set_role(role);
  });
}
RequestPtr RoleAddReq(const std::string& name) {
  return Req([&](Request* r) { r->mutable_auth_role_add()->set_name(name); });
}
RequestPtr GrantPermReq(const std::string& role, const Perm& perm) {
  return Req([&](Request* r) {
    r->mutable_auth_role_grant_permission()->set_name(role);
    *r->mutable_auth_role_grant_permission()->mutable_perm() = perm;
  });
}
RequestPtr EnableReq() { return Req([](Request* r) { r->mutable_auth_enable(); }); }
RequestPtr DisableReq() { return Req([](Request* r) { r->mutable_auth_disable(); }); }

std::optional<Error> ErrorIn(const absl::Status& s) { return ErrorOf(s); }

TEST(AuthWriteTest, WriteGivesTheStateTheMethodsGive) {
  Member by_method;
  Member by_write;
  auto hash = by_method.auth()->HashPassword("pw");
  ASSERT_TRUE(hash.ok());
  AuthStore* m = by_method.auth();
  // Each step as a method call and as the request it stands for.
  struct Step {
    std::function<void(AuthStore::Done)> method;
    RequestPtr request;
  };
  const Perm rw = MakePerm(Perm::READWRITE, "foo", "fop");
  const Perm w_from = MakePerm(Perm::WRITE, "b", kNul);
  const std::vector<Step> steps = {
      {[&](auto d) { m->AuthEnable(std::move(d)); }, EnableReq()},  // no root user
      {[&](auto d) { m->UserAdd("root", *hash, false, std::move(d)); }, UserAddReq("root", *hash)},
      {[&](auto d) { m->AuthEnable(std::move(d)); }, EnableReq()},  // no root role
      {[&](auto d) { m->UserGrantRole("root", "root", std::move(d)); },
       GrantRoleReq("root", "root")},
      {[&](auto d) { m->RoleAdd("r", std::move(d)); }, RoleAddReq("r")},
      {[&](auto d) { m->RoleGrantPermission("r", rw, std::move(d)); }, GrantPermReq("r", rw)},
      {[&](auto d) { m->RoleGrantPermission("r", w_from, std::move(d)); },
       GrantPermReq("r", w_from)},
      {[&](auto d) { m->UserAdd("u", "", true, std::move(d)); }, UserAddReq("u", "", true)},
      {[&](auto d) { m->UserGrantRole("u", "r", std::move(d)); }, GrantRoleReq("u", "r")},
      {[&](auto d) { m->UserGrantRole("u", "nope", std::move(d)); }, GrantRoleReq("u", "nope")},
      {[&](auto d) { m->UserChangePassword("root", *hash, std::move(d)); },
       Req([&](Request* r) {
         r->mutable_auth_user_change_password()->set_name("root");
         r->mutable_auth_user_change_password()->set_hashedpassword(absl::Base64Escape(*hash));
       })},
      {[&](auto d) { m->AuthEnable(std::move(d)); }, EnableReq()},
      {[&](auto d) { m->UserRevokeRole("u", "r", std::move(d)); }, Req([](Request* r) {
         r->mutable_auth_user_revoke_role()->set_name("u");
         r->mutable_auth_user_revoke_role()->set_role("r");
       })},
      {[&](auto d) { m->RoleRevokePermission("r", "foo", "fop", std::move(d)); },
       Req([](Request* r) {
         r->mutable_auth_role_revoke_permission()->set_role("r");
         r->mutable_auth_role_revoke_permission()->set_key("foo");
         r->mutable_auth_role_revoke_permission()->set_range_end("fop");
       })},
      {[&](auto d) { m->RoleDelete("root", std::move(d)); },
       Req([](Request* r) { r->mutable_auth_role_delete()->set_role("root"); })},
      {[&](auto d) { m->AuthDisable(std::move(d)); }, DisableReq()},
      {[&](auto d) { m->RoleDelete("r", std::move(d)); },
       Req([](Request* r) { r->mutable_auth_role_delete()->set_role("r"); })},
      {[&](auto d) { m->UserDelete("u", std::move(d)); },
       Req([](Request* r) { r->mutable_auth_user_delete()->set_name("u"); })},
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const absl::Status a = by_method.Do(steps[i].method);
    const absl::Status b = by_write.Apply(steps[i].request);
    EXPECT_EQ(a, b) << "step " << i;
    EXPECT_EQ(by_method.auth()->Revision(), by_write.auth()->Revision()) << "step " << i;
    EXPECT_EQ(by_method.auth()->Enabled(), by_write.auth()->Enabled()) << "step " << i;
    EXPECT_EQ(by_method.Records(), by_write.Records()) << "step " << i;
  }
  EXPECT_EQ(by_write.auth()->Revision(), 14u);
  EXPECT_FALSE(by_write.auth()->Enabled());
  EXPECT_EQ(by_write.auth()->UserNames(), (std::vector<std::string>{"root"}));
  EXPECT_TRUE(by_write.auth()->RoleNames().empty());
}

// Members applying the same requests in the same order store the same
// records, whatever each request's outcome: a cluster's members stay equal.
TEST(AuthWriteTest, TwoMembersFedTheSameRequestsStoreTheSameRecords) {
  Member a;
  Member b;
  auto hash = a.auth()->HashPassword("rootpw");
  ASSERT_TRUE(hash.ok());
  struct Step {
    RequestPtr request;
    std::optional<Error> want;  // nullopt: ok
  };
  const std::vector<Step> steps = {
      {EnableReq(), Error::kRootUserNotExist},
      {UserAddReq("root", *hash), std::nullopt},
      {UserAddReq("root", *hash), Error::kUserAlreadyExist},
      {UserAddReq("", *hash), Error::kUserEmpty},
      {EnableReq(), Error::kRootRoleNotExist},
      {GrantRoleReq("root", "missing"), Error::kRoleNotFound},
      {GrantRoleReq("ghost", "root"), Error::kUserNotFound},
      {GrantRoleReq("root", "root"), std::nullopt},
      {GrantRoleReq("root", "root"), std::nullopt},  // ignored: no revision
      {RoleAddReq("r"), std::nullopt},
      {RoleAddReq("r"), Error::kRoleAlreadyExist},
      {RoleAddReq(""), Error::kRoleEmpty},
      {GrantPermReq("missing", MakePerm(Perm::READ, "k", "")), Error::kRoleNotFound},
      // etcd checks the range before it looks the role up.
      {GrantPermReq("missing", MakePerm(Perm::READ, "", "")), Error::kInvalidAuthMgmt},
      {Req([](Request* r) { r->mutable_auth_role_grant_permission()->set_name("r"); }),
       Error::kPermissionNotGiven},
      {GrantPermReq("r", MakePerm(Perm::READ, "b", "a")), Error::kInvalidAuthMgmt},
      {GrantPermReq("r", MakePerm(Perm::READ, "k", "l")), std::nullopt},
      {GrantPermReq("r", MakePerm(Perm::WRITE, "k", "")), std::nullopt},
      {GrantPermReq("r", MakePerm(Perm::WRITE, "k", "l")), std::nullopt},  // updated in place
      {UserAddReq("u", "", true), std::nullopt},
      {GrantRoleReq("u", "r"), std::nullopt},
      {EnableReq(), std::nullopt},
      {EnableReq(), std::nullopt},  // ignored
      {Req([](Request* r) { r->mutable_auth_user_delete()->set_name("root"); }),
       Error::kInvalidAuthMgmt},
      {Req([](Request* r) { r->mutable_auth_role_delete()->set_role("root"); }),
       Error::kInvalidAuthMgmt},
      {Req([](Request* r) {
         r->mutable_auth_user_revoke_role()->set_name("u");
         r->mutable_auth_user_revoke_role()->set_role("root");
       }),
       Error::kRoleNotGranted},
      {Req([](Request* r) {
         r->mutable_auth_role_revoke_permission()->set_role("r");
         r->mutable_auth_role_revoke_permission()->set_key("zz");
       }),
       Error::kPermissionNotGranted},
      {Req([](Request* r) { r->mutable_auth_role_delete()->set_role("r"); }), std::nullopt},
      {DisableReq(), std::nullopt},
      {DisableReq(), std::nullopt},  // ignored
  };
  for (size_t i = 0; i < steps.size(); ++i) {
    const absl::Status sa = a.Apply(steps[i].request);
    const absl::Status sb = b.Apply(steps[i].request);
    if (steps[i].want) {
      EXPECT_EQ(ErrorIn(sa), steps[i].want) << "step " << i << ": " << sa;
    } else {
      EXPECT_TRUE(sa.ok()) << "step " << i << ": " << sa;
    }
    EXPECT_EQ(sa, sb) << "step " << i;
    EXPECT_EQ(a.Records(), b.Records()) << "step " << i;
  }
  // Revision: 1, then one per change but AuthEnable.
  EXPECT_EQ(a.auth()->Revision(), 11u);
  EXPECT_EQ(b.auth()->Revision(), 11u);
  const auto records = a.Records();
  EXPECT_EQ(records.count("authRoles/r"), 0u);
  authpb::User u;
  ASSERT_TRUE(u.ParseFromString(records.at("authUsers/u")));
  EXPECT_EQ(u.roles_size(), 0);  // the deleted role was taken from its user
  EXPECT_TRUE(u.options().no_password());
}

TEST(AuthWriteTest, WriteCarriesItsRequestAndRefusesOthers) {
  Member m;
  auto request = RoleAddReq("r");
  mvcc::WriteRequest w = m.auth()->Write(request, [](absl::Status) {});
  EXPECT_EQ(w.raft_request, request);
  EXPECT_TRUE(std::holds_alternative<mvcc::CustomOp>(w.op));
  const uint64_t rev = m.auth()->Revision();
  // Nothing set, a client write, an auth read, a login: not auth mutations.
  for (const auto& bad : {Req([](Request*) {}), Req([](Request* r) {
                            r->mutable_put()->set_key("k");
                            r->mutable_auth_role_add()->set_name("x");
                          }),
                          Req([](Request* r) { r->mutable_auth_user_get()->set_name("u"); }),
                          Req([](Request* r) { r->set_authenticate("\x0a\x01u"); })}) {
    const absl::Status s = m.Apply(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(m.auth()->Revision(), rev);
  }
  EXPECT_EQ(m.Apply(nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(m.auth()->RoleNames().empty());
  EXPECT_TRUE(m.Records().empty()) << "a refused request stored something";
}

// The mutation methods submit through the log given at Open, with the
// request each stands for.
TEST(AuthWriteTest, MethodsSubmitThroughTheLog) {
  class RecordingLog : public mvcc::WriteLog {
   public:
    void Submit(mvcc::WriteRequest w) override {
      requests.push_back(w.raft_request);
      kv->Submit(std::move(w));
    }
    KvStore* kv = nullptr;
    std::vector<RequestPtr> requests;
  };
  RecordingLog log;
  Member m(&log);
  log.kv = m.kv();
  ASSERT_TRUE(m.Do([&](auto d) { m.auth()->RoleAdd("r", std::move(d)); }).ok());
  ASSERT_TRUE(m.Do([&](auto d) { m.auth()->UserAdd("u", "$2b$hash", false, std::move(d)); }).ok());
  ASSERT_EQ(log.requests.size(), 2u);
  ASSERT_TRUE(log.requests[0]);
  EXPECT_EQ(log.requests[0]->auth_role_add().name(), "r");
  ASSERT_TRUE(log.requests[1]);
  // etcd 3.5 logs the hash in base64, never the password.
  EXPECT_EQ(log.requests[1]->auth_user_add().hashedpassword(), absl::Base64Escape("$2b$hash"));
  EXPECT_TRUE(log.requests[1]->auth_user_add().password().empty());
  auto user = m.auth()->GetUser("u");
  ASSERT_TRUE(user.ok());
  EXPECT_EQ(user->password(), "$2b$hash");
}

// What etcd 3.5's applier does with the password fields (selectPassword).
TEST(AuthWriteTest, PasswordFieldsAsEtcdAppliesThem) {
  Member m;
  auto stored = [&](const std::string& name) {
    auto u = m.auth()->GetUser(name);
    EXPECT_TRUE(u.ok()) << u.status();
    return u.ok() ? *u : authpb::User();
  };
  // no_password: no password kept, whatever the request carries.
  ASSERT_TRUE(m.Apply(Req([](Request* r) {
                 auto* a = r->mutable_auth_user_add();
                 a->set_name("np");
                 a->set_password("pw");
                 a->set_hashedpassword(absl::Base64Escape("$2b$x"));
                 a->mutable_options()->set_no_password(true);
               })).ok());
  EXPECT_TRUE(stored("np").password().empty());
  EXPECT_TRUE(stored("np").options().no_password());
  // Changing a no-password user's password keeps it without one.
  ASSERT_TRUE(m.Apply(Req([](Request* r) {
                 r->mutable_auth_user_change_password()->set_name("np");
                 r->mutable_auth_user_change_password()->set_hashedpassword(
                     absl::Base64Escape("$2b$y"));
               })).ok());
  EXPECT_TRUE(stored("np").password().empty());
  // A request without options is a user with a password; nothing in it
  // gives an empty one.
  ASSERT_TRUE(m.Apply(Req([](Request* r) { r->mutable_auth_user_add()->set_name("empty"); })).ok());
  EXPECT_TRUE(stored("empty").password().empty());
  EXPECT_TRUE(stored("empty").has_options());
  EXPECT_FALSE(stored("empty").options().no_password());
  // A hashedPassword that is not base64: etcd's ErrNoPasswordUser, which
  // its gRPC layer answers as Unknown with the error's text.
  const absl::Status bad = m.Apply(Req([](Request* r) {
    r->mutable_auth_user_add()->set_name("bad");
    r->mutable_auth_user_add()->set_hashedpassword("not base64!");
  }));
  EXPECT_EQ(bad.code(), absl::StatusCode::kUnknown);
  EXPECT_EQ(bad.message(), "auth: authentication failed, password was given for no password user");
  EXPECT_FALSE(m.auth()->GetUser("bad").ok());
  // Name checks come first.
  EXPECT_TRUE(Is(m.Apply(Req([](Request* r) {
                   r->mutable_auth_user_add()->set_name("empty");
                   r->mutable_auth_user_add()->set_hashedpassword("not base64!");
                 })),
                 Error::kUserAlreadyExist));
  // An entry as etcd before 3.5 logs it (the password itself) is hashed
  // when written, as etcd's applier hashes it.
  ASSERT_TRUE(m.Apply(Req([](Request* r) {
                 r->mutable_auth_user_add()->set_name("old");
                 r->mutable_auth_user_add()->set_password("oldpw");
               })).ok());
  EXPECT_EQ(Crypt("oldpw", stored("old").password()), stored("old").password());
  ASSERT_TRUE(m.Apply(Req([](Request* r) {
                 r->mutable_auth_user_change_password()->set_name("old");
                 r->mutable_auth_user_change_password()->set_password("newpw");
               })).ok());
  EXPECT_EQ(Crypt("newpw", stored("old").password()), stored("old").password());
  EXPECT_NE(stored("old").password().find("$2b$04$"), std::string::npos);
}

// ---------------------------------------------------------------- tokens of other members

// Root with the root role, user "u" (password "upw"), auth enabled.
void EnableWithUser(Member& m) {
  auto hash = m.auth()->HashPassword("upw");
  ASSERT_TRUE(hash.ok());
  AuthStore* a = m.auth();
  ASSERT_TRUE(m.Do([&](auto d) { a->UserAdd("root", *hash, false, std::move(d)); }).ok());
  ASSERT_TRUE(m.Do([&](auto d) { a->UserGrantRole("root", "root", std::move(d)); }).ok());
  ASSERT_TRUE(m.Do([&](auto d) { a->UserAdd("u", *hash, false, std::move(d)); }).ok());
  ASSERT_TRUE(m.Do([&](auto d) { a->AuthEnable(std::move(d)); }).ok());
}

// A member that has not applied a token's entry waits for it only if it
// knows the entry committed, and no longer than token_wait (here none): a
// forged index past the committed one holds no thread at all.
TEST(TokenWaitTest, OnlyATokenAtOrBelowTheCommittedIndexIsWaitedFor) {
  Member m(nullptr, [](AuthStoreOptions* o) { o->token_wait = absl::ZeroDuration(); });
  ASSERT_NO_FATAL_FAILURE(EnableWithUser(m));
  // As a member whose log committed five entries it has not applied yet.
  const uint64_t committed = m.kv()->AppliedIndex() + 5;
  m.auth()->SetCommittedIndex([committed] { return committed; });
  for (const uint64_t past : {committed + 1, std::numeric_limits<uint64_t>::max()}) {
    EXPECT_TRUE(Is(m.auth()->InfoFromToken(absl::StrCat("unknownprefixxxx.", past)).status(),
                   Error::kInvalidAuthToken))
        << past;
  }
  EXPECT_EQ(m.auth()->TEST_TokenWaits(), 0u) << "a token past the committed index was waited for";
  // At the committed index: waited for (at most token_wait), then refused.
  EXPECT_TRUE(Is(m.auth()->InfoFromToken(absl::StrCat("unknownprefixxxx.", committed)).status(),
                 Error::kInvalidAuthToken));
  EXPECT_EQ(m.auth()->TEST_TokenWaits(), 1u);
  // A token this member registered is found without waiting.
  auto token = m.auth()->Authenticate("u", "upw");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_TRUE(m.auth()->InfoFromToken(*token).ok());
  EXPECT_EQ(m.auth()->TEST_TokenWaits(), 1u);
}

// A token whose entry is committed but not yet applied here (the client got
// it from a member ahead of this one) is accepted once this member applies
// the entry. The entry is held back until the caller asks for the committed
// index, and token_wait is unbounded: the answer does not depend on timing.
TEST(TokenWaitTest, ACommittedTokenIsAcceptedOnceItsEntryIsApplied) {
  class HoldingLog : public mvcc::WriteLog {
   public:
    void Submit(mvcc::WriteRequest w) override {
      if (hold_next_token && w.raft_request && AuthStore::IsAuthenticate(*w.raft_request)) {
        hold_next_token = false;
        held = std::move(w);
        return;
      }
      kv->Submit(std::move(w));
    }
    KvStore* kv = nullptr;
    bool hold_next_token = false;
    std::optional<mvcc::WriteRequest> held;
  };
  HoldingLog log;
  Member m(&log, [](AuthStoreOptions* o) { o->token_wait = absl::InfiniteDuration(); });
  log.kv = m.kv();
  ASSERT_NO_FATAL_FAILURE(EnableWithUser(m));

  // The token is issued through the log, which holds its entry.
  log.hold_next_token = true;
  std::promise<absl::StatusOr<std::string>> issued;
  m.auth()->IssueToken("u", [&](absl::StatusOr<std::string> t) { issued.set_value(std::move(t)); });
  ASSERT_TRUE(log.held.has_value());
  etcdserverpb::LoggedAuthenticate entry;
  ASSERT_TRUE(entry.ParseFromString(log.held->raft_request->authenticate()));
  // A single member's token names the index it applies its entry at.
  const uint64_t index = m.kv()->AppliedIndex() + 1;
  const std::string token = absl::StrCat(entry.simple_token(), ".", index);

  // The caller learns the entry is committed; only then is it applied.
  m.auth()->SetCommittedIndex([&, released = false]() mutable {
    if (!released) {
      released = true;
      m.kv()->Submit(*std::move(log.held));
    }
    return index;
  });
  absl::StatusOr<AuthInfo> info = m.auth()->InfoFromToken(token);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->user, "u");
  EXPECT_LE(m.auth()->TEST_TokenWaits(), 1u);
  auto got = issued.get_future().get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, token) << "the token names another index than its entry's";
}

// A mutation's state is published when its done callback runs; states are
// published in the order the committer applied them, even if the done
// callbacks run out of order (here a log delays the first one; a Reload on
// the committer before a queued callback runs is the same case).
TEST(AuthPublishTest, AnEarlierStateNeverReplacesALaterOne) {
  class DelayingLog : public mvcc::WriteLog {
   public:
    void Submit(mvcc::WriteRequest w) override {
      if (delay_next) {
        delay_next = false;
        w.done = [this, done = std::move(w.done)](absl::Status s) mutable {
          delayed.set_value([done = std::move(done), s]() mutable { done(s); });
        };
      }
      kv->Submit(std::move(w));
    }
    KvStore* kv = nullptr;
    bool delay_next = false;
    std::promise<absl::AnyInvocable<void()>> delayed;
  };
  DelayingLog log;
  Member m(&log);
  log.kv = m.kv();
  const uint64_t rev = m.auth()->Revision();
  // Role a, whose done callback is delayed, then role b.
  log.delay_next = true;
  std::promise<absl::Status> a_done;
  m.auth()->RoleAdd("a", [&](absl::Status s) { a_done.set_value(s); });
  absl::AnyInvocable<void()> finish_a = log.delayed.get_future().get();
  ASSERT_TRUE(m.Do([&](auto d) { m.auth()->RoleAdd("b", std::move(d)); }).ok());
  EXPECT_EQ(m.auth()->Revision(), rev + 2);
  EXPECT_EQ(m.auth()->RoleNames(), (std::vector<std::string>{"a", "b"}));
  // a's callback runs last: it acknowledges a, and publishes nothing older.
  finish_a();
  EXPECT_TRUE(a_done.get_future().get().ok());
  EXPECT_EQ(m.auth()->Revision(), rev + 2);
  EXPECT_EQ(m.auth()->RoleNames(), (std::vector<std::string>{"a", "b"}));
  // A Reload is newer than what was applied before it.
  ASSERT_TRUE(m.auth()->Reload().ok());
  EXPECT_EQ(m.auth()->Revision(), rev + 2);
  EXPECT_EQ(m.auth()->RoleNames(), (std::vector<std::string>{"a", "b"}));
}

}  // namespace
}  // namespace capstan::auth
