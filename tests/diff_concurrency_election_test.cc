// Differential tests of etcd's Election service (v3electionpb.Election):
// campaigns, proclamations, resignations and the Observe stream, compared
// with etcd's answers. Shares diff_concurrency.h with the Lock tests.

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "diff_concurrency.h"

namespace capstan::testing {
namespace {

// ===========================================================================
// Election

TEST_F(DiffConcurrencyTest, LeaderOfAnEmptyElection) {
  auto p = Both(LeaderR(K("election")));
  EXPECT_SAME(p);
  EXPECT_FALSE(p.etcd.status.ok());
}

TEST_F(DiffConcurrencyTest, CampaignUncontendedThenLeaderProclaimResign) {
  int64_t lease = GrantBoth(60);
  auto c = Both(CampaignR(K("election"), lease, "first"));
  EXPECT_SAME(c);
  ASSERT_TRUE(c.etcd.status.ok()) << Describe(c.etcd.status);
  const LeaderKey leader = c.etcd.resp.leader();
  EXPECT_EQ(leader.key(), K("election/") + GoHex(lease));
  EXPECT_SAME(Both(LeaderR(K("election"))));
  EXPECT_SAME(Both(ProclaimR(leader, "second")));
  auto l = Both(LeaderR(K("election")));
  EXPECT_SAME(l);
  EXPECT_EQ(l.etcd.resp.kv().value(), "second");
  EXPECT_SAME(Both(ResignR(leader)));
  EXPECT_SAME(Both(LeaderR(K("election"))));
  // A resigned leader can neither proclaim nor resign again.
  EXPECT_SAME(Both(ProclaimR(leader, "third")));
  EXPECT_SAME(Both(ResignR(leader)));
}

TEST_F(DiffConcurrencyTest, CampaignAgainWithAnotherValueProclaimsIt) {
  int64_t lease = GrantBoth(60);
  ASSERT_SAME(Both(CampaignR(K("election"), lease, "one")));
  auto again = Both(CampaignR(K("election"), lease, "two"));
  EXPECT_SAME(again);
  auto l = Both(LeaderR(K("election")));
  EXPECT_SAME(l);
  EXPECT_EQ(l.etcd.resp.kv().value(), "two");
}

TEST_F(DiffConcurrencyTest, CampaignWithAnUnknownLease) {
  EXPECT_SAME(Both(CampaignR(K("election"), 0x5eadbeef, "v")));
  EXPECT_SAME(Both(PrefixR(K("election/"))));
}

TEST_F(DiffConcurrencyTest, ProclaimOrResignWithoutALeader) {
  ProclaimRequest p;
  p.set_value("v");
  EXPECT_SAME(Both(p));
  EXPECT_SAME(Both(ResignRequest()));
}

TEST_F(DiffConcurrencyTest, ProclaimWithTheWrongRevision) {
  int64_t lease = GrantBoth(60);
  auto c = Both(CampaignR(K("election"), lease, "v"));
  ASSERT_SAME(c);
  LeaderKey wrong = c.etcd.resp.leader();
  wrong.set_rev(wrong.rev() + 1000);
  EXPECT_SAME(Both(ProclaimR(wrong, "x")));
  EXPECT_SAME(Both(ResignR(wrong)));
  EXPECT_SAME(Both(LeaderR(K("election"))));
}

// The next candidate leads once the leader resigns; the answer's header is
// the revision of its own campaign put, as in etcd.
TEST_F(DiffConcurrencyTest, SecondCandidateLeadsAfterTheFirstResigns) {
  int64_t a = GrantBoth(60);
  int64_t b = GrantBoth(60);
  auto first = Both(CampaignR(K("election"), a, "a"));
  ASSERT_SAME(first);
  auto second = CampaignInBackground(CampaignR(K("election"), b, "b"));
  AwaitKeyOnBoth(K("election/") + GoHex(b));
  auto leader = Both(LeaderR(K("election")));
  EXPECT_SAME(leader);
  EXPECT_EQ(leader.capstan.resp.kv().key(), K("election/") + GoHex(a));
  ExpectWaitingOnBoth(K("election/"), K("election/") + GoHex(b), *second.etcd,
                      *second.capstan);
  EXPECT_SAME(Both(ResignR(first.etcd.resp.leader())));
  auto e = second.etcd->Wait();
  auto c = second.capstan->Wait();
  ExpectSame(e, c);
  EXPECT_EQ(e.resp.leader().key(), K("election/") + GoHex(b));
  EXPECT_SAME(Both(LeaderR(K("election"))));
}

TEST_F(DiffConcurrencyTest, CancelledCandidateResigns) {
  int64_t a = GrantBoth(60);
  int64_t b = GrantBoth(60);
  ASSERT_SAME(Both(CampaignR(K("election"), a, "a")));
  auto second = CampaignInBackground(CampaignR(K("election"), b, "b"));
  AwaitKeyOnBoth(K("election/") + GoHex(b));
  second.etcd->Cancel();
  second.capstan->Cancel();
  second.etcd->Wait();
  second.capstan->Wait();
  AwaitNoKeyOnBoth(K("election/") + GoHex(b));
  EXPECT_SAME(Both(PrefixR(K("election/"))));
}

// ===========================================================================
// Observe

// Observers opened on an empty election get each leader and each value in
// turn. (Whether a stream is open before the first campaign does not show
// in the answers: etcd's observer reads the election, then watches from
// that revision, so the first leader comes either way.) "Nothing else
// came" is checked with a fence, the new leader's proclamation: answers
// come in revision order, so anything extra would arrive before it.
TEST_F(DiffConcurrencyTest, ObserveFollowsTheLeader) {
  Observer on_etcd(etcd_stubs().election.get(), K("election"));
  Observer on_capstan(capstan_stubs().election.get(), K("election"));
  // Waits (bounded only to catch a failure) until both observers have n
  // answers.
  auto await = [&](size_t n) {
    for (int i = 0; i < 500 && (on_etcd.size() < n || on_capstan.size() < n); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return on_etcd.size() >= n && on_capstan.size() >= n;
  };
  int64_t a = GrantBoth(60);
  int64_t b = GrantBoth(60);
  auto first = Both(CampaignR(K("election"), a, "a1"));
  ASSERT_SAME(first);
  ASSERT_TRUE(await(1));
  ASSERT_SAME(Both(ProclaimR(first.etcd.resp.leader(), "a2")));
  ASSERT_TRUE(await(2));
  auto second = CampaignInBackground(CampaignR(K("election"), b, "b1"));
  AwaitKeyOnBoth(K("election/") + GoHex(b));
  ASSERT_SAME(Both(ResignR(first.etcd.resp.leader())));
  auto e2 = second.etcd->Wait();
  auto c2 = second.capstan->Wait();
  ExpectSame(e2, c2);
  ASSERT_TRUE(c2.status.ok()) << Describe(c2.status);
  ASSERT_TRUE(await(3));
  ASSERT_SAME(Both(ProclaimR(e2.resp.leader(), "fence")));
  ASSERT_TRUE(await(4));
  auto e = on_etcd.got();
  auto c = on_capstan.got();
  ASSERT_EQ(e.size(), 4u);
  ASSERT_EQ(c.size(), e.size());
  const char* values[] = {"a1", "a2", "b1", "fence"};
  for (size_t i = 0; i < e.size(); ++i) {
    EXPECT_EQ(e[i].kv().value(), values[i]) << "etcd's answer " << i;
    EXPECT_TRUE(SameAnswer(grpc::Status::OK, e[i], etcd(), grpc::Status::OK, c[i], capstan()))
        << "observed answer " << i;
  }
}

// An observer that starts while there is a leader gets it first.
TEST_F(DiffConcurrencyTest, ObserveStartsWithTheCurrentLeader) {
  int64_t a = GrantBoth(60);
  ASSERT_SAME(Both(CampaignR(K("election"), a, "a")));
  Observer on_etcd(etcd_stubs().election.get(), K("election"));
  Observer on_capstan(capstan_stubs().election.get(), K("election"));
  for (int i = 0; i < 300 && (on_etcd.size() < 1 || on_capstan.size() < 1); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  auto e = on_etcd.got();
  auto c = on_capstan.got();
  ASSERT_EQ(e.size(), 1u);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_TRUE(SameAnswer(grpc::Status::OK, e[0], etcd(), grpc::Status::OK, c[0], capstan()));
}

// An observer that does not read while the leader proclaims many values
// (more than the stream's flow-control window holds, so that the server
// must hold them back) still gets every one of them, in order, once it
// reads. Checked on Capstan only: etcd 3.4's observer, this far behind,
// now and then starts over from an older value and then stops short (in 3
// of 33 runs), so its stream is not a reference here.
TEST_F(DiffConcurrencyTest, ObserverThatReadsLateMissesNothing) {
  constexpr int kProclaims = 400;
  const std::string padding(32 * 1024, 'x');
  HeldBackObserver observer;
  ProclaimToAnObserverThatDoesNotRead(
      kProclaims, [&](int i) { return absl::StrCat("v", i, padding); }, &observer);
  ASSERT_FALSE(HasFailure());
  auto& reader = observer.reader;
  auto& ctx = observer.ctx;
  LeaderResponse resp;
  int64_t last_rev = 0;
  for (int i = 0; i <= kProclaims; ++i) {
    ASSERT_TRUE(reader->Read(&resp)) << "answer " << i;
    ASSERT_EQ(resp.kv().value(), i == 0 ? "v0" : absl::StrCat("v", i, padding))
        << "answer " << i;
    EXPECT_GT(resp.kv().mod_revision(), last_rev);
    EXPECT_GE(resp.header().revision(), resp.kv().mod_revision());
    last_rev = resp.kv().mod_revision();
  }
  ctx.TryCancel();
}

// An observer held back (it does not read) while the revisions it has not
// been sent are compacted goes on from the current leader's value: it
// skips what is gone, and never goes back.
TEST_F(DiffConcurrencyTest, ObserverHeldBackPastACompactionGoesOnFromTheLatestValue) {
  constexpr int kProclaims = 400;
  const std::string padding(32 * 1024, 'x');
  HeldBackObserver observer;
  ProclaimToAnObserverThatDoesNotRead(
      kProclaims, [&](int i) { return absl::StrCat(i, "/", padding); }, &observer);
  ASSERT_FALSE(HasFailure());
  auto& reader = observer.reader;
  auto& ctx = observer.ctx;
  const int64_t rev = observer.last_rev;
  etcdserverpb::CompactionRequest compact;
  compact.set_revision(rev);
  compact.set_physical(true);
  ASSERT_SAME(Both(compact));
  LeaderResponse resp;
  int last = -1;
  while (last < kProclaims) {
    ASSERT_TRUE(reader->Read(&resp)) << "after value " << last;
    int value = 0;
    const std::string number = resp.kv().value().substr(0, resp.kv().value().find('/'));
    ASSERT_TRUE(number == "v0" || absl::SimpleAtoi(number, &value)) << number;
    EXPECT_GT(value, last) << "values go forward";
    last = value;
  }
  // Caught up: the next proclamation arrives as usual.
  ASSERT_SAME(Both(ProclaimR(observer.leader, "after")));
  ASSERT_TRUE(reader->Read(&resp));
  EXPECT_EQ(resp.kv().value(), "after");
  ctx.TryCancel();
}

}  // namespace
}  // namespace capstan::testing
