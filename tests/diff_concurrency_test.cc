// Differential tests of etcd's Lock service (v3lockpb.Lock): uncontended
// and contended locks, waiters that give up or lose their lease, compared
// with etcd's answers; seeded random sequences of Lock and Election calls;
// and a server that stops while calls wait. Elections and Observe are in
// diff_concurrency_election_test.cc; both share diff_concurrency.h.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "diff_concurrency.h"

namespace capstan::testing {
namespace {

// ===========================================================================
// Lock

TEST_F(DiffConcurrencyTest, LockUncontended) {
  int64_t lease = GrantBoth(60);
  auto p = Both(LockR(K("lock"), lease));
  EXPECT_SAME(p);
  ASSERT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
  EXPECT_EQ(p.etcd.resp.key(), K("lock/") + GoHex(lease));
  // The lock's key: empty, attached to the lease.
  auto keys = Both(PrefixR(K("lock/")));
  EXPECT_SAME(keys);
  ASSERT_EQ(keys.etcd.resp.kvs_size(), 1);
  EXPECT_EQ(keys.etcd.resp.kvs(0).lease(), lease);
}

TEST_F(DiffConcurrencyTest, LockAgainWithTheSameLeaseReusesTheKey) {
  int64_t lease = GrantBoth(60);
  EXPECT_SAME(Both(LockR(K("lock"), lease)));
  auto again = Both(LockR(K("lock"), lease));
  EXPECT_SAME(again);
  EXPECT_SAME(Both(PrefixR(K("lock/"))));
}

TEST_F(DiffConcurrencyTest, LockWithAnUnknownLease) {
  auto p = Both(LockR(K("lock"), 0x7eadbeef));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
  EXPECT_SAME(Both(PrefixR(K("lock/"))));
}


// Without a lease, the server grants one of 60 s (etcd's session TTL) and
// names the key after it; the IDs differ between the servers.
TEST_F(DiffConcurrencyTest, LockWithoutALeaseGrantsOne) {
  auto p = Both(LockR(K("lock"), 0));
  ASSERT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
  ASSERT_TRUE(p.capstan.status.ok()) << Describe(p.capstan.status);
  EXPECT_EQ(p.etcd.resp.header().revision(), p.capstan.resp.header().revision());
  const std::string prefix = K("lock/");
  for (bool on_capstan : {false, true}) {
    const std::string& key = on_capstan ? p.capstan.resp.key() : p.etcd.resp.key();
    SCOPED_TRACE(on_capstan ? "capstan" : "etcd");
    ASSERT_EQ(key.substr(0, prefix.size()), prefix);
    uint64_t id = 0;
    ASSERT_TRUE(absl::SimpleHexAtoi(key.substr(prefix.size()), &id)) << key;
    ServerStubs& stubs = on_capstan ? capstan_stubs() : etcd_stubs();
    {
      grpc::ClientContext ctx;
      etcdserverpb::LeaseTimeToLiveRequest r;
      r.set_id(static_cast<int64_t>(id));
      r.set_keys(true);
      etcdserverpb::LeaseTimeToLiveResponse out;
      ASSERT_TRUE(stubs.lease->LeaseTimeToLive(&ctx, r, &out).ok());
      EXPECT_EQ(out.grantedttl(), 60);
      EXPECT_GT(out.ttl(), 50);
      ASSERT_EQ(out.keys_size(), 1);
      EXPECT_EQ(out.keys(0), key);
    }
    // Revoke the granted lease so that it does not outlive the test.
    grpc::ClientContext ctx;
    etcdserverpb::LeaseRevokeRequest r;
    r.set_id(static_cast<int64_t>(id));
    etcdserverpb::LeaseRevokeResponse out;
    ASSERT_TRUE(stubs.lease->LeaseRevoke(&ctx, r, &out).ok());
  }
}

TEST_F(DiffConcurrencyTest, Unlock) {
  int64_t lease = GrantBoth(60);
  auto lock = Both(LockR(K("lock"), lease));
  ASSERT_SAME(lock);
  EXPECT_SAME(Both(UnlockR(lock.etcd.resp.key())));
  EXPECT_SAME(Both(PrefixR(K("lock/"))));
  // Unlocking what is not held deletes nothing and still answers a header.
  EXPECT_SAME(Both(UnlockR(lock.etcd.resp.key())));
  EXPECT_SAME(Both(UnlockR(K("never-locked"))));
}

TEST_F(DiffConcurrencyTest, UnlockWithoutAKey) {
  auto p = Both(UnlockR(""));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
}

// The second locker waits until the first unlocks, then holds the lock; the
// answer's header is the revision of the unlock, which a locker that did
// not wait could not know.
TEST_F(DiffConcurrencyTest, ContendedLockWaitsForTheHolder) {
  auto [a, b, first, second] = LockBehindAHolder();
  ASSERT_FALSE(HasFailure());
  ExpectWaitingOnBoth(K("lock/"), K("lock/") + GoHex(b), *second.etcd, *second.capstan);
  auto unlock = Both(UnlockR(first.etcd.resp.key()));
  ASSERT_SAME(unlock);
  auto e = second.etcd->Wait();
  auto c = second.capstan->Wait();
  ExpectSame(e, c);
  EXPECT_EQ(e.resp.key(), K("lock/") + GoHex(b));
  EXPECT_EQ(e.resp.header().revision(), unlock.etcd.resp.header().revision());
  EXPECT_EQ(c.resp.header().revision(), unlock.capstan.resp.header().revision())
      << "Capstan answered before the holder let go";
  EXPECT_SAME(Both(PrefixR(K("lock/"))));
}

// Three waiters queue in the order they asked.
TEST_F(DiffConcurrencyTest, WaitersGetTheLockInTurn) {
  int64_t a = GrantBoth(60);
  int64_t b = GrantBoth(60);
  int64_t c = GrantBoth(60);
  auto first = Both(LockR(K("lock"), a));
  ASSERT_SAME(first);
  auto second = LockInBackground(LockR(K("lock"), b));
  AwaitKeyOnBoth(K("lock/") + GoHex(b));
  auto third = LockInBackground(LockR(K("lock"), c));
  AwaitKeyOnBoth(K("lock/") + GoHex(c));
  EXPECT_SAME(Both(UnlockR(first.etcd.resp.key())));
  auto e2 = second.etcd->Wait();
  auto c2 = second.capstan->Wait();
  ExpectSame(e2, c2);
  EXPECT_EQ(e2.resp.key(), K("lock/") + GoHex(b));
  // The third still waits, now behind the second.
  ExpectWaitingOnBoth(K("lock/"), K("lock/") + GoHex(c), *third.etcd, *third.capstan);
  auto unlock = Both(UnlockR(e2.resp.key()));
  ASSERT_SAME(unlock);
  auto e3 = third.etcd->Wait();
  auto c3 = third.capstan->Wait();
  ExpectSame(e3, c3);
  EXPECT_EQ(e3.resp.key(), K("lock/") + GoHex(c));
  EXPECT_EQ(c3.resp.header().revision(), unlock.capstan.resp.header().revision())
      << "Capstan answered before the second holder let go";
}

// A waiter that gives up (its client cancels the call) takes its key away,
// and the next waiter is not held up by it.
TEST_F(DiffConcurrencyTest, CancelledWaiterRemovesItsKey) {
  auto [a, b, first, second] = LockBehindAHolder();
  ASSERT_FALSE(HasFailure());
  second.etcd->Cancel();
  second.capstan->Cancel();
  EXPECT_EQ(second.etcd->Wait().status.error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(second.capstan->Wait().status.error_code(), grpc::StatusCode::CANCELLED);
  AwaitNoKeyOnBoth(K("lock/") + GoHex(b));
  EXPECT_SAME(Both(PrefixR(K("lock/"))));
}

// A holder whose lease is revoked loses its key, and so the lock.
TEST_F(DiffConcurrencyTest, RevokedHolderReleasesTheLock) {
  auto [a, b, first, second] = LockBehindAHolder();
  ASSERT_FALSE(HasFailure());
  etcdserverpb::LeaseRevokeRequest revoke;
  revoke.set_id(a);
  EXPECT_SAME(Both(revoke));
  ExpectSame(second.etcd->Wait(), second.capstan->Wait());
}

// A waiter whose own lease ends while it waits has lost its place: etcd 3.5
// answers "mutex: session is expired" once the holder lets go (3.4's mutex
// did not look and answered the lock held, with a key that no longer exists).
TEST_F(DiffConcurrencyTest, WaiterWhoseLeaseEndsIsToldSo) {
  auto [a, b, first, second] = LockBehindAHolder();
  ASSERT_FALSE(HasFailure());
  etcdserverpb::LeaseRevokeRequest revoke;
  revoke.set_id(b);
  EXPECT_SAME(Both(revoke));
  EXPECT_SAME(Both(UnlockR(first.etcd.resp.key())));
  auto e = second.etcd->Wait();
  auto c = second.capstan->Wait();
  EXPECT_EQ(e.status.error_code(), grpc::StatusCode::UNKNOWN) << Describe(e.status);
  EXPECT_EQ(e.status.error_message(), "mutex: session is expired");
  ExpectSame(e, c);
  // Nobody holds the lock on either server.
  auto keys = Both(PrefixR(K("lock/")));
  EXPECT_SAME(keys);
  EXPECT_EQ(keys.etcd.resp.kvs_size(), 0);
}

// etcdctl's lock runs the mutex recipe itself, over KV, Lease and Watch:
// both servers run the command under the lock, and release it after.
TEST_F(DiffConcurrencyTest, EtcdctlLockRunsTheCommandHoldingTheLock) {
  auto p = Etcdctl({"lock", K("ctl"), "echo", "held"}, "", /*json=*/false);
  EXPECT_SAME_CTL(p);
  EXPECT_EQ(p.etcd.out, "held\n");
  auto keys = Both(PrefixR(K("ctl/")));
  EXPECT_SAME(keys);
  EXPECT_EQ(keys.etcd.resp.kvs_size(), 0);
}
// ===========================================================================
// Seeded random sequences

// Random Lock, Unlock, Campaign, Proclaim, Resign and Leader calls, cancelled
// waiters, and puts and deletes under the locks' and elections' prefixes,
// on two names and three leases, sent to both servers. A call that waits
// waits on both; after every step each waiting call must have been answered
// on both servers or on neither, and every answer and the keys under the
// prefixes must be etcd's. Kept away from the cases where etcd 3.4 and 3.5
// differ: no waiter's own key is deleted while it waits.
//
// The leases (600 s) outlive runs of up to about 2,000 steps.
//
//   CAPSTAN_RANDOM_SEEDS (default 2), CAPSTAN_RANDOM_STEPS (default 60).
class DiffRandomRecipeTest : public DiffConcurrencyTest,
                             public ::testing::WithParamInterface<int> {
 protected:
  // A call left waiting on both servers.
  struct Pending {
    bool campaign = false;
    std::string name;
    int64_t lease = 0;
    std::string key;  // its key under the name's prefix
    std::unique_ptr<Waiting<LockResponse>> lock[2];
    std::unique_ptr<Waiting<CampaignResponse>> run[2];
    bool waited = false;  // still waiting after the step that sent it
    bool done(int i) const { return campaign ? run[i]->done() : lock[i]->done(); }
    // The call gives up on both servers.
    void Cancel() {
      for (int i = 0; i < 2; ++i) {
        if (campaign) {
          run[i]->Cancel();
        } else {
          lock[i]->Cancel();
        }
      }
    }
  };

  int Pick(int n) { return static_cast<int>(rng_() % static_cast<uint64_t>(n)); }
  std::string Name(int i) const { return K(absl::StrCat("n", i)); }

  // Waits until every waiting call is answered on both servers or on
  // neither, and compares the answers of those that were.
  void Settle() {
    if (pending_.empty()) return;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    auto agreed_since = std::chrono::steady_clock::now();
    for (;;) {
      bool agree = true;
      for (const auto& p : pending_) agree = agree && p->done(0) == p->done(1);
      const auto now = std::chrono::steady_clock::now();
      if (!agree) agreed_since = now;
      // Both sides agree, and have for a while (a call about to be answered
      // on both is given the time to be).
      if (agree && now - agreed_since > std::chrono::milliseconds(400)) break;
      if (now > deadline) {
        ADD_FAILURE() << "a waiting call was answered by one server only";
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (auto it = pending_.begin(); it != pending_.end();) {
      Pending& p = **it;
      if (!p.done(0) || !p.done(1)) {
        p.waited = true;
        ++it;
        continue;
      }
      grpc::Status status;
      if (p.campaign) {
        auto e = p.run[0]->Wait();
        auto c = p.run[1]->Wait();
        ExpectSame(e, c);
        if (e.status.ok()) leaders_.push_back(e.resp.leader());
        status = e.status;
      } else {
        auto e = p.lock[0]->Wait();
        auto c = p.lock[1]->Wait();
        ExpectSame(e, c);
        if (e.status.ok()) held_.push_back(e.resp.key());
        status = e.status;
      }
      ++answered_[status.ok() ? 0 : status.error_code() == grpc::StatusCode::CANCELLED ? 1 : 2];
      if (p.waited && status.ok()) ++answered_after_waiting_;
      // A waiter that gave up takes its key away (a candidate resigns), on
      // both servers, before anything else is sent.
      if (status.error_code() == grpc::StatusCode::CANCELLED) AwaitNoKeyOnBoth(p.key);
      it = pending_.erase(it);
    }
  }

  // Drops what a Lock or Campaign answered for key (it is gone).
  void Forget(const std::string& key) {
    held_.erase(std::remove(held_.begin(), held_.end(), key), held_.end());
    leaders_.erase(std::remove_if(leaders_.begin(), leaders_.end(),
                                  [&](const LeaderKey& l) { return l.key() == key; }),
                   leaders_.end());
  }

  // Every call still waiting gives up; waits until both servers answered
  // it and removed its key.
  void CancelAll() {
    for (auto& p : pending_) p->Cancel();
    Settle();
  }

  // Calls left waiting must not outlive the test (their keys would go
  // during the next seed, on the same servers).
  void TearDown() override {
    CancelAll();
    pending_.clear();
    DiffConcurrencyTest::TearDown();
  }

  bool Awaited(const std::string& key) const {
    for (const auto& p : pending_) {
      if (p->key == key) return true;
    }
    return false;
  }

  void Step() {
    const std::string name = Name(Pick(2));
    const int64_t lease = leases_[Pick(3)];
    const std::string own = name + "/" + GoHex(lease);
    switch (Pick(9)) {
      case 0:
      case 1: {  // Lock or Campaign; at most one waiting per key
        if (Awaited(own)) return;
        auto p = std::make_unique<Pending>();
        p->campaign = Pick(2) == 1;
        p->name = name;
        p->lease = lease;
        p->key = own;
        if (p->campaign) {
          auto r = CampaignR(name, lease, absl::StrCat("v", step_));
          p->run[0] = std::make_unique<Waiting<CampaignResponse>>(
              etcd_stubs().election.get(), &v3electionpb::Election::Stub::Campaign, r, kCallLife);
          p->run[1] = std::make_unique<Waiting<CampaignResponse>>(
              capstan_stubs().election.get(), &v3electionpb::Election::Stub::Campaign, r,
              kCallLife);
        } else {
          auto r = LockR(name, lease);
          p->lock[0] = std::make_unique<Waiting<LockResponse>>(
              etcd_stubs().lock.get(), &v3lockpb::Lock::Stub::Lock, r, kCallLife);
          p->lock[1] = std::make_unique<Waiting<LockResponse>>(
              capstan_stubs().lock.get(), &v3lockpb::Lock::Stub::Lock, r, kCallLife);
        }
        // The call's txn is applied on both before anything else is sent.
        AwaitKeyOnBoth(own);
        pending_.push_back(std::move(p));
        return;
      }
      case 2: {  // Unlock a key a Lock answered (or a key no one holds)
        std::string key = held_.empty() || Pick(4) == 0 ? K("n0/none") : held_[Pick(held_.size())];
        if (Awaited(key)) return;
        EXPECT_SAME(Both(UnlockR(key)));
        Forget(key);
        return;
      }
      case 3:
      case 4: {  // Proclaim or Resign as a leader a Campaign answered
        if (leaders_.empty()) return;
        const LeaderKey leader = leaders_[Pick(leaders_.size())];
        if (Awaited(leader.key())) return;
        if (Pick(2) == 0) {
          EXPECT_SAME(Both(ProclaimR(leader, absl::StrCat("p", step_))));
        } else {
          EXPECT_SAME(Both(ResignR(leader)));
          // Kept now and then, to resign or proclaim as a stale leader.
          if (Pick(4) != 0) Forget(leader.key());
        }
        return;
      }
      case 5:
        EXPECT_SAME(Both(LeaderR(name)));
        return;
      case 6: {  // A waiting call gives up
        if (pending_.empty()) return;
        pending_[Pick(pending_.size())]->Cancel();
        return;
      }
      case 7: {  // Someone else writes under the prefix, or deletes a holder's key
        const std::string key = name + "/" + (Pick(2) == 0 ? "zz" : "0");
        if (Pick(2) == 0) {
          EXPECT_TRUE(Same(Both(PutR(key, absl::StrCat("x", step_)))));
        } else {
          std::string victim = held_.empty() || Pick(2) == 0 ? key : held_[Pick(held_.size())];
          if (Awaited(victim)) return;
          etcdserverpb::DeleteRangeRequest d;
          d.set_key(victim);
          EXPECT_SAME(Both(d));
          Forget(victim);
        }
        return;
      }
      default:
        return;
    }
  }

  static etcdserverpb::PutRequest PutR(const std::string& key, const std::string& value) {
    etcdserverpb::PutRequest r;
    r.set_key(key);
    r.set_value(value);
    return r;
  }

  // Longer than any run: a waiting call ends only by an answer or a cancel.
  static constexpr std::chrono::seconds kCallLife{3600};

  std::mt19937_64 rng_;
  int step_ = 0;
  int64_t leases_[3] = {};
  std::vector<std::unique_ptr<Pending>> pending_;
  std::vector<std::string> held_;
  std::vector<LeaderKey> leaders_;
  int answered_[3] = {};  // OK, cancelled, another error
  int answered_after_waiting_ = 0;
};

TEST_P(DiffRandomRecipeTest, Run) {
  rng_.seed(static_cast<uint64_t>(GetParam()));
  for (auto& l : leases_) l = GrantBoth(600);
  const int steps = EnvCount("CAPSTAN_RANDOM_STEPS", 60);
  for (step_ = 0; step_ < steps && !HasFailure(); ++step_) {
    Step();
    Settle();
    for (int n = 0; n < 2; ++n) ASSERT_SAME(Both(PrefixR(Name(n) + "/"))) << "step " << step_;
  }
  // Let every call still waiting give up, and compare what that leaves.
  CancelAll();
  for (int n = 0; n < 2; ++n) EXPECT_SAME(Both(PrefixR(Name(n) + "/")));
  EXPECT_GT(answered_[0], 0) << "no Lock or Campaign was answered";
  EXPECT_EQ(answered_[2], 0) << "a Lock or Campaign failed on both servers";
  std::printf("seed %d: %d locks and campaigns answered OK (%d after waiting), %d cancelled, %d "
              "failed\n",
              GetParam(), answered_[0], answered_after_waiting_, answered_[1], answered_[2]);
  for (int64_t l : leases_) {
    etcdserverpb::LeaseRevokeRequest r;
    r.set_id(l);
    EXPECT_SAME(Both(r));
  }
}

std::vector<int> RecipeSeeds() {
  std::vector<int> seeds;
  for (int i = 1; i <= EnvCount("CAPSTAN_RANDOM_SEEDS", 2); ++i) seeds.push_back(i);
  return seeds;
}

INSTANTIATE_TEST_SUITE_P(Seeds, DiffRandomRecipeTest, ::testing::ValuesIn(RecipeSeeds()),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return absl::StrCat("Seed", info.param);
                         });

// ===========================================================================
// Shutdown

// A Lock behind a holder, a Campaign behind a leader and an Observe stream
// may wait forever: stopping the server answers them at once instead of
// waiting for them, and their keys stay under their leases.
TEST(RecipeShutdownTest, ServerStopsWithoutWaitingForWaitingCalls) {
  auto server = ServerProcess::Start(ServerOptions::Capstan());
  ASSERT_TRUE(server.ok()) << server.status();
  ServerStubs stubs((*server)->NewChannel());
  auto grant = [&] {
    grpc::ClientContext ctx;
    etcdserverpb::LeaseGrantRequest r;
    r.set_ttl(60);
    etcdserverpb::LeaseGrantResponse out;
    EXPECT_TRUE(stubs.lease->LeaseGrant(&ctx, r, &out).ok());
    return out.id();
  };
  const int64_t a = grant(), b = grant();
  LockRequest lock;
  lock.set_name("/shutdown/lock");
  lock.set_lease(a);
  {
    grpc::ClientContext ctx;
    LockResponse out;
    ASSERT_TRUE(stubs.lock->Lock(&ctx, lock, &out).ok());
  }
  CampaignRequest campaign;
  campaign.set_name("/shutdown/election");
  campaign.set_lease(a);
  campaign.set_value("a");
  {
    grpc::ClientContext ctx;
    CampaignResponse out;
    ASSERT_TRUE(stubs.election->Campaign(&ctx, campaign, &out).ok());
  }
  lock.set_lease(b);
  campaign.set_lease(b);
  Waiting<LockResponse> waiting_lock(stubs.lock.get(), &v3lockpb::Lock::Stub::Lock, lock);
  Waiting<CampaignResponse> waiting_campaign(stubs.election.get(),
                                             &v3electionpb::Election::Stub::Campaign, campaign);
  Observer observer(stubs.election.get(), "/shutdown/election");
  // Both waiters' keys are in: they wait.
  int64_t keys = 0;
  for (int i = 0; i < 500; ++i) {
    grpc::ClientContext ctx;
    etcdserverpb::RangeRequest r;
    r.set_key("/shutdown/");
    r.set_range_end("/shutdown0");
    r.set_count_only(true);
    etcdserverpb::RangeResponse out;
    ASSERT_TRUE(stubs.kv->Range(&ctx, r, &out).ok());
    keys = out.count();
    if (keys == 4 && observer.size() == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(keys, 4);
  ASSERT_EQ(observer.size(), 1u);
  ASSERT_FALSE(waiting_lock.done());
  ASSERT_FALSE(waiting_campaign.done());

  const auto start = std::chrono::steady_clock::now();
  ExitInfo exit = (*server)->Stop();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(exit.exited && exit.exit_code == 0) << exit.ToString();
  EXPECT_LT(took, std::chrono::seconds(3));
  Answer<LockResponse> l = waiting_lock.Wait();
  Answer<CampaignResponse> c = waiting_campaign.Wait();
  EXPECT_EQ(l.status.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(l.status);
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::UNAVAILABLE) << Describe(c.status);

  // After a restart every key is still there, each under its lease.
  ASSERT_TRUE((*server)->Restart().ok());
  ServerStubs again((*server)->NewChannel());
  grpc::ClientContext ctx;
  etcdserverpb::RangeRequest r;
  r.set_key("/shutdown/");
  r.set_range_end("/shutdown0");
  etcdserverpb::RangeResponse out;
  ASSERT_TRUE(again.kv->Range(&ctx, r, &out).ok());
  ASSERT_EQ(out.kvs_size(), 4);
  for (const auto& kv : out.kvs()) EXPECT_NE(kv.lease(), 0) << kv.key();
}

}  // namespace
}  // namespace capstan::testing
