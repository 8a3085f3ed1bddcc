#include "lease/lessor.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "lease/clock.h"

namespace capstan::lease {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// ---------------------------------------------------------------------------
// Lessor on its own, on a ManualClock: time moves only when a test moves it,
// so deadlines are exact and no test waits.

TEST(ManualClockTest, MovesOnlyWhenAdvanced) {
  ManualClock clock;
  const Clock::TimePoint t0 = clock.Now();
  EXPECT_EQ(clock.Now(), t0);
  clock.Advance(milliseconds(1500));
  EXPECT_EQ(clock.Now() - t0, milliseconds(1500));
  clock.Advance(seconds(0));
  EXPECT_EQ(clock.Now() - t0, milliseconds(1500));
}

TEST(ManualClockTest, MonotonicIsTheSteadyClock) {
  const Clock* clock = Clock::Monotonic();
  ASSERT_NE(clock, nullptr);
  EXPECT_EQ(clock, Clock::Monotonic()) << "one instance";
  const auto before = std::chrono::steady_clock::now();
  const auto now = clock->Now();
  EXPECT_LE(before, now);
  EXPECT_LE(now, std::chrono::steady_clock::now());
}

TEST(LessorTest, GrantGetListExists) {
  ManualClock clock;
  Lessor l(&clock);
  EXPECT_FALSE(l.Exists(1));
  EXPECT_FALSE(l.Get(1, true).has_value());
  l.Grant(5, 100);
  l.Grant(1, 10);
  l.Grant(3, 50);
  EXPECT_TRUE(l.Exists(1));
  EXPECT_EQ(l.size(), 3u);
  EXPECT_EQ(l.List(), (std::vector<int64_t>{1, 3, 5}));
  auto info = l.Get(5, false);
  ASSERT_TRUE(info);
  EXPECT_EQ(info->id, 5);
  EXPECT_EQ(info->granted_ttl, 100);
  EXPECT_EQ(info->remaining_ttl, 100);
  EXPECT_TRUE(info->keys.empty());
  // Whole seconds left, rounded down.
  clock.Advance(milliseconds(2500));
  EXPECT_EQ(l.Get(5, false)->remaining_ttl, 97);
  EXPECT_EQ(l.Get(1, false)->remaining_ttl, 7);
  EXPECT_TRUE(l.Expired(10).empty());
}

TEST(LessorTest, ExpiredIsOldestFirstAndRespectsMax) {
  ManualClock clock;
  Lessor l(&clock);
  // Deadlines in grant order (a TTL of 0 is due at once), ids deliberately
  // not sorted.
  for (int64_t id : {30, 10, 20, 40}) {
    l.Grant(id, 0);
    clock.Advance(milliseconds(1));
  }
  l.Grant(50, 500);  // not due
  EXPECT_EQ(l.Expired(2), (std::vector<int64_t>{30, 10}));
  // Still due until revoked or renewed: returned again.
  EXPECT_EQ(l.Expired(10), (std::vector<int64_t>{30, 10, 20, 40}));
  EXPECT_TRUE(l.Expired(0).empty());
  // Revoked leases disappear.
  l.Revoke(10);
  EXPECT_EQ(l.Expired(10), (std::vector<int64_t>{30, 20, 40}));
  EXPECT_FALSE(l.Exists(10));
  // A re-granted id is judged by its new deadline, not a stale heap entry.
  l.Revoke(20);
  l.Grant(20, 1000);
  EXPECT_EQ(l.Expired(10), (std::vector<int64_t>{30, 40}));
  // Remaining TTL of a due lease is never negative.
  EXPECT_EQ(l.Get(30, false)->remaining_ttl, 0);
  // The longer lease falls due exactly at its deadline, after the others.
  clock.Advance(seconds(500) - std::chrono::nanoseconds(1));
  EXPECT_EQ(l.Expired(10), (std::vector<int64_t>{30, 40}));
  clock.Advance(std::chrono::nanoseconds(1));
  EXPECT_EQ(l.Expired(10), (std::vector<int64_t>{30, 40, 50}));
}

TEST(LessorTest, ExpiresExactlyAtTheDeadline) {
  ManualClock clock;
  Lessor l(&clock);
  l.Grant(1, 2);
  clock.Advance(seconds(2) - std::chrono::nanoseconds(1));
  EXPECT_TRUE(l.Expired(10).empty()) << "due before its deadline";
  EXPECT_EQ(l.Get(1, false)->remaining_ttl, 0);  // floor of < 1 s
  clock.Advance(std::chrono::nanoseconds(1));
  EXPECT_EQ(l.Expired(10), std::vector<int64_t>{1});
}

TEST(LessorTest, RenewedLeaseIsNotExpired) {
  ManualClock clock;
  Lessor l(&clock);
  l.Grant(1, 1);
  l.Grant(2, 1);
  l.Grant(3, 1);
  EXPECT_FALSE(l.Renew(99).has_value());
  clock.Advance(milliseconds(600));
  EXPECT_TRUE(l.Expired(10).empty());
  EXPECT_EQ(l.Renew(2), std::optional<int64_t>(1));  // now due at 1.6 s
  // Many renewals leave one live deadline (older heap entries are stale).
  for (int i = 0; i < 100; ++i) l.Renew(3);
  l.Grant(4, 1);
  l.Revoke(4);
  clock.Advance(milliseconds(400));  // 1.0 s
  EXPECT_EQ(l.Expired(10), std::vector<int64_t>{1});
  EXPECT_EQ(l.Get(2, false)->remaining_ttl, 0);  // 0.6 s left: floor
  EXPECT_TRUE(l.Exists(2));
  clock.Advance(milliseconds(599));  // 1.599 s
  EXPECT_EQ(l.Expired(10), std::vector<int64_t>{1});
  clock.Advance(milliseconds(1));  // 1.6 s: 2 and 3 (renewed at 0.6 s) are due
  auto due = l.Expired(10);
  ASSERT_EQ(due.size(), 3u);
  EXPECT_EQ(due[0], 1) << "oldest deadline first";
  std::sort(due.begin(), due.end());  // 2 and 3 share a deadline
  EXPECT_EQ(due, (std::vector<int64_t>{1, 2, 3}));
}

// Renewals and re-grants that land on the same instant leave one live heap
// entry per lease: a due lease is returned once, and does not take the
// place of another one under `max`.
TEST(LessorTest, LeaseDueOnceWhateverItsHeapEntries) {
  ManualClock clock;
  Lessor l(&clock);
  l.Grant(1, 1);
  l.Grant(2, 1);
  clock.Advance(milliseconds(100));
  for (int i = 0; i < 5; ++i) l.Renew(1);  // five renewals, one instant
  l.Grant(3, 1);
  l.Revoke(3);
  l.Grant(3, 1);  // again, with the same deadline as its stale entry
  clock.Advance(seconds(1));
  auto due = l.Expired(10);
  std::sort(due.begin(), due.end());
  EXPECT_EQ(due, (std::vector<int64_t>{1, 2, 3}));
  // Duplicates were dropped for good: still each once.
  due = l.Expired(10);
  std::sort(due.begin(), due.end());
  EXPECT_EQ(due, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(l.Expired(1), std::vector<int64_t>{2}) << "the oldest deadline first";
}

// etcd's lessor.Renew: a lease whose deadline passed is not extended; the
// renewal waits for the pending revoke and answers ErrLeaseNotFound (the
// keep-alive gets TTL 0). A late keep-alive must not revive a lease that is
// already due for revocation.
TEST(LessorTest, RenewAfterDeadlineDoesNotRevive) {
  ManualClock clock;
  Lessor l(&clock);
  l.Grant(1, 1);
  clock.Advance(seconds(1));
  ASSERT_EQ(l.Expired(10), std::vector<int64_t>{1});
  EXPECT_FALSE(l.Renew(1).has_value()) << "an expired lease was renewed";
  EXPECT_EQ(l.Expired(10), std::vector<int64_t>{1}) << "an expired lease was revived";
}

// Restore gives a lease its full TTL from the clock's now, not from when it
// was granted.
TEST(LessorTest, RestoreStartsTheTtlAfresh) {
  ManualClock clock;
  clock.Advance(seconds(3600));
  Lessor l(&clock);
  l.Restore(7, 10);
  EXPECT_EQ(l.Get(7, false)->remaining_ttl, 10);
  clock.Advance(seconds(10) - milliseconds(1));
  EXPECT_TRUE(l.Expired(10).empty());
  clock.Advance(milliseconds(1));
  EXPECT_EQ(l.Expired(10), std::vector<int64_t>{7});
}

TEST(LessorTest, AttachDetachAndMoveKeys) {
  ManualClock clock;
  Lessor l(&clock);
  l.Grant(1, 100);
  l.Grant(2, 100);
  l.Attach("b", 1);
  l.Attach("a", 1);
  l.Attach("c", 1);
  EXPECT_EQ(l.LeaseOf("a"), 1);
  EXPECT_EQ(l.LeaseOf("zz"), 0);
  EXPECT_EQ(l.Get(1, true)->keys, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_TRUE(l.Get(1, false)->keys.empty()) << "keys only when asked";
  // Move b to lease 2.
  l.Attach("b", 2);
  EXPECT_EQ(l.LeaseOf("b"), 2);
  EXPECT_EQ(l.Get(1, true)->keys, (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(l.Get(2, true)->keys, std::vector<std::string>{"b"});
  l.Attach("b", 2);  // no-op
  EXPECT_EQ(l.Get(2, true)->keys, std::vector<std::string>{"b"});
  // Detach.
  l.Attach("c", 0);
  EXPECT_EQ(l.LeaseOf("c"), 0);
  EXPECT_EQ(l.Get(1, true)->keys, std::vector<std::string>{"a"});
  // An unknown lease attaches nothing (and detaches from the old one).
  l.Attach("a", 77);
  EXPECT_EQ(l.LeaseOf("a"), 0);
  EXPECT_TRUE(l.Get(1, true)->keys.empty());
  // Revoke returns the keys, sorted, and forgets them.
  l.Attach("y", 2);
  l.Attach("x", 2);
  EXPECT_EQ(l.Revoke(2), (std::vector<std::string>{"b", "x", "y"}));
  EXPECT_EQ(l.LeaseOf("x"), 0);
  EXPECT_EQ(l.LeaseOf("b"), 0);
  EXPECT_TRUE(l.Revoke(2).empty());
  // A key of a revoked lease can be attached elsewhere.
  l.Attach("x", 1);
  EXPECT_EQ(l.LeaseOf("x"), 1);
}

TEST(LessorTest, LeaseRecordCodec) {
  int64_t id = 0, ttl = 0;
  ASSERT_TRUE(DecodeLeaseRecord(EncodeLeaseRecord(0x123456789aLL, 60), &id, &ttl));
  EXPECT_EQ(id, 0x123456789aLL);
  EXPECT_EQ(ttl, 60);
  EXPECT_FALSE(DecodeLeaseRecord(EncodeLeaseRecord(0, 60), &id, &ttl)) << "id 0 is no lease";
  EXPECT_FALSE(DecodeLeaseRecord("\x08", &id, &ttl));
  EXPECT_EQ(LeaseKey(0x0102030405060708LL), std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));
  EXPECT_LT(LeaseKey(255), LeaseKey(256)) << "big-endian keys sort by id";
}

}  // namespace
}  // namespace capstan::lease
