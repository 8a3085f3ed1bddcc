#include "lease/lessor.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace capstan::lease {
namespace {

using std::chrono::milliseconds;

// ---------------------------------------------------------------------------
// Lessor on its own. A TTL of 0 makes a lease due at once, so ordering
// tests need no waiting; one test uses the real clock for a 1 s TTL.

TEST(LessorTest, GrantGetListExists) {
  Lessor l;
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
  EXPECT_GE(info->remaining_ttl, 98);
  EXPECT_LE(info->remaining_ttl, 100);
  EXPECT_TRUE(info->keys.empty());
  EXPECT_TRUE(l.Expired(10).empty());
}

TEST(LessorTest, ExpiredIsOldestFirstAndRespectsMax) {
  Lessor l;
  // Deadlines in grant order, ids deliberately not sorted.
  for (int64_t id : {30, 10, 20, 40}) {
    l.Grant(id, 0);
    std::this_thread::sleep_for(milliseconds(2));
  }
  l.Grant(50, 1000);  // not due
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
}

TEST(LessorTest, RenewedLeaseIsNotExpired) {
  Lessor l;
  l.Grant(1, 1);
  l.Grant(2, 1);
  l.Grant(3, 1);
  EXPECT_FALSE(l.Renew(99).has_value());
  std::this_thread::sleep_for(milliseconds(600));
  EXPECT_TRUE(l.Expired(10).empty());
  EXPECT_EQ(l.Renew(2), std::optional<int64_t>(1));  // now due at ~1.6 s
  // Many renewals leave one live deadline (older heap entries are stale).
  for (int i = 0; i < 100; ++i) l.Renew(3);
  l.Grant(4, 1);
  l.Revoke(4);
  std::this_thread::sleep_for(milliseconds(600));  // ~1.2 s
  EXPECT_EQ(l.Expired(10), std::vector<int64_t>{1});
  EXPECT_EQ(l.Get(2, false)->remaining_ttl, 0);  // floor of < 1 s
  EXPECT_TRUE(l.Exists(2));
}

// etcd's lessor.Renew: a lease whose deadline passed is not extended; the
// renewal waits for the pending revoke and answers ErrLeaseNotFound (the
// keep-alive gets TTL 0). A late keep-alive must not revive a lease that is
// already due for revocation.
TEST(LessorTest, RenewAfterDeadlineDoesNotRevive) {
  Lessor l;
  l.Grant(1, 1);
  std::this_thread::sleep_for(milliseconds(1100));
  ASSERT_EQ(l.Expired(10), std::vector<int64_t>{1});
  EXPECT_FALSE(l.Renew(1).has_value()) << "an expired lease was renewed";
  EXPECT_EQ(l.Expired(10), std::vector<int64_t>{1}) << "an expired lease was revived";
}

TEST(LessorTest, AttachDetachAndMoveKeys) {
  Lessor l;
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
