#include "server/auto_compactor.h"

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "storage/backend.h"

namespace capstan::server {
namespace {

// Drives the schedule the way AutoCompactor::RunPeriodic does, on a clock
// that only moves when told: sample, wait one check interval, ask. Revision
// k is sampled at check k (k * interval after start) and is 1000 + k.
// Returns, for each check that was due, (check index, target).
std::vector<std::pair<int, int64_t>> RunSchedule(absl::Duration period, int checks,
                                                 int fail_first = 0) {
  const absl::Time start = absl::FromUnixSeconds(1700000000);
  PeriodicCompactionSchedule s(period, start);
  std::vector<std::pair<int, int64_t>> due;
  int failures = 0;
  for (int k = 0; k < checks; ++k) {
    s.Sample(1000 + k);
    const absl::Time now = start + (k + 1) * s.check_interval();
    if (auto target = s.Due(now)) {
      due.emplace_back(k + 1, *target);
      if (failures++ >= fail_first) s.Compacted(now);
    }
  }
  return due;
}

using Due = std::vector<std::pair<int, int64_t>>;

// etcd (v3compactor/periodic.go) with --auto-compaction-retention=1h:
// samples every 6 minutes, keeps 11; the first compaction after an hour to
// the revision at start, then one an hour to the oldest sample in the window.
TEST(PeriodicCompactionScheduleTest, OneHourAsEtcd) {
  PeriodicCompactionSchedule s(absl::Hours(1), absl::Now());
  EXPECT_EQ(s.check_interval(), absl::Minutes(6));
  EXPECT_EQ(s.compact_interval(), absl::Hours(1));
  EXPECT_EQ(RunSchedule(absl::Hours(1), 40), (Due{{10, 1000}, {20, 1009}, {30, 1019}, {40, 1029}}));
}

// Above an hour: still sampled every 6 minutes and compacted every hour, but
// the window holds `retention` (2h: 21 samples), so each compaction keeps two
// hours of history.
TEST(PeriodicCompactionScheduleTest, TwoHoursCompactsHourlyKeepingTwo) {
  PeriodicCompactionSchedule s(absl::Hours(2), absl::Now());
  EXPECT_EQ(s.check_interval(), absl::Minutes(6));
  EXPECT_EQ(s.compact_interval(), absl::Hours(1));
  EXPECT_EQ(RunSchedule(absl::Hours(2), 40), (Due{{20, 1000}, {30, 1009}, {40, 1019}}));
}

// Below an hour: every retention/10 sampled, every retention compacted.
TEST(PeriodicCompactionScheduleTest, TenMinutes) {
  PeriodicCompactionSchedule s(absl::Minutes(10), absl::Now());
  EXPECT_EQ(s.check_interval(), absl::Minutes(1));
  EXPECT_EQ(s.compact_interval(), absl::Minutes(10));
  EXPECT_EQ(RunSchedule(absl::Minutes(10), 25), (Due{{10, 1000}, {20, 1009}}));
}

// A failed compaction is retried at every check until one succeeds, each
// time to the window's oldest revision; the next interval counts from the
// success.
TEST(PeriodicCompactionScheduleTest, FailureRetriedEachCheck) {
  EXPECT_EQ(RunSchedule(absl::Hours(1), 23, /*fail_first=*/2),
            (Due{{10, 1000}, {11, 1000}, {12, 1001}, {22, 1011}}));
}

class AutoCompactorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/capstan-autocompact-XXXXXX";
    dir_ = mkdtemp(tmpl);
    storage::BackendOptions bo;
    bo.dir = dir_ + "/db";
    auto backend = storage::Backend::Open(bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto store = mvcc::KvStore::Open({}, std::move(*backend));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  int64_t PutN(int n) {
    int64_t rev = 0;
    for (int i = 0; i < n; ++i) {
      etcdserverpb::PutRequest req;
      req.set_key("/k/" + std::to_string(i % 7));
      req.set_value("v");
      auto resp = store_->Put(req);
      EXPECT_TRUE(resp.ok()) << resp.status();
      if (resp.ok()) rev = resp->header().revision();
    }
    return rev;
  }

  // Polls until the store's compacted revision differs from `from`, for at
  // most 20 s (a generous bound for a loaded machine; the expected wait is a
  // few check intervals). Returns the new compacted revision, or `from`.
  int64_t WaitCompactRevChange(int64_t from) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (store_->CompactRev() == from && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    return store_->CompactRev();
  }

  std::string dir_;
  std::unique_ptr<mvcc::KvStore> store_;
};

// --auto-compaction-mode=revision --auto-compaction-retention=5: a check
// compacts to current - 5, and again once the store has moved.
TEST_F(AutoCompactorTest, RevisionModeCompactsToCurrentMinusRetention) {
  const int64_t rev = PutN(20);
  ASSERT_EQ(rev, 21);
  AutoCompactor compactor(store_.get(), absl::ZeroDuration(), 5, absl::Milliseconds(20));
  EXPECT_EQ(WaitCompactRevChange(0), rev - 5);
  // Ten more writes in one request each: the compactor may see any revision
  // in between, but it ends at the new current - 5.
  const int64_t rev2 = PutN(10);
  int64_t compacted = rev - 5;
  while (compacted != rev2 - 5) {
    const int64_t next = WaitCompactRevChange(compacted);
    if (next == compacted) break;  // timed out
    EXPECT_GT(next, compacted);
    EXPECT_LE(next, rev2 - 5);
    compacted = next;
  }
  EXPECT_EQ(compacted, rev2 - 5);
}

// --auto-compaction-mode=periodic on a real clock with a 1 s retention: the
// first compaction comes no earlier than 1 s after start, to the revision
// the store had at start (nothing is written meanwhile).
TEST_F(AutoCompactorTest, PeriodicModeFirstCompactionAfterRetention) {
  const int64_t rev = PutN(12);
  const absl::Time start = absl::Now();
  AutoCompactor compactor(store_.get(), absl::Seconds(1), 0);
  EXPECT_EQ(WaitCompactRevChange(0), rev);
  EXPECT_GE(absl::Now() - start, absl::Seconds(1));
}

}  // namespace
}  // namespace capstan::server
