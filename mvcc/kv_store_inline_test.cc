// KvStoreOptions::inline_commit (the submitting thread commits when no group
// is being committed) and a sole voter's direct writes
// (KvStore::StartDirectWrites), on a real RocksDB backend.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "mvcc/kv_store.h"
#include "mvcc/kv_store_test_fixture.h"
#include "util/mutex.h"

namespace capstan::mvcc {
namespace {

KvStoreOptions Inline() {
  KvStoreOptions o;
  o.inline_commit = true;
  return o;
}

class InlineCommitTest : public KvStoreInTempDir {
 protected:
  void SetUp() override {
    KvStoreInTempDir::SetUp();
    Reopen(Inline());
  }
};

// Every write gets a revision of its own, and with no write log every group
// is committed and answered by a thread that submitted one of its writes:
// never by the store's committer or answer thread.
TEST_F(InlineCommitTest, ConcurrentWritersAreAnsweredOnSubmittingThreads) {
  constexpr int kThreads = 8;
  constexpr int kPuts = 300;
  util::Mutex mu;
  std::vector<int64_t> revisions;
  std::set<std::thread::id> submitters, answerers;
  std::atomic<int> answered_elsewhere{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      {
        util::MutexLock l(&mu);
        submitters.insert(std::this_thread::get_id());
      }
      for (int i = 0; i < kPuts; ++i) {
        auto req = std::make_shared<etcdserverpb::PutRequest>();
        auto resp = std::make_shared<etcdserverpb::PutResponse>();
        req->set_key(absl::StrCat("/k/", t, "/", i));
        req->set_value("v");
        std::promise<void> done;
        std::future<void> answered = done.get_future();
        const std::thread::id me = std::this_thread::get_id();
        store_->Submit({PutOp{req.get(), resp.get()}, [&, req, resp, me](absl::Status s) {
                          EXPECT_TRUE(s.ok()) << s;
                          util::MutexLock l(&mu);
                          revisions.push_back(resp->header().revision());
                          answerers.insert(std::this_thread::get_id());
                          if (std::this_thread::get_id() != me) answered_elsewhere.fetch_add(1);
                          done.set_value();
                        }});
        answered.wait();
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(revisions.size(), static_cast<size_t>(kThreads * kPuts));
  std::sort(revisions.begin(), revisions.end());
  for (size_t i = 0; i < revisions.size(); ++i) {
    ASSERT_EQ(revisions[i], static_cast<int64_t>(i) + 2) << "revisions are not one per write";
  }
  for (const auto& id : answerers) {
    EXPECT_TRUE(submitters.count(id)) << "a write was answered by a thread that submitted none";
  }
  EXPECT_EQ(store_->AppliedIndex(), static_cast<uint64_t>(kThreads * kPuts));
  // Some writes rode in another writer's group (not a requirement of the
  // design, but 8 writers never all find the store idle).
  EXPECT_GT(answered_elsewhere.load(), 0);
}

// A thread waiting for its own write (the blocking Put) commits its group
// and returns; what was queued meanwhile goes to the committer thread, not
// to it. A thread that does not wait (Submit) goes on committing (above).
TEST_F(InlineCommitTest, AWaitingCallerCommitsOnlyItsOwnGroup) {
  std::promise<void> in_first_group, release_first_group;
  std::future<void> first_group_held = in_first_group.get_future();
  std::future<void> first_group_released = release_first_group.get_future();
  std::atomic<int> groups{0};
  store_->TEST_SetBeforeApplyHook([&] {
    if (groups.fetch_add(1) == 0) {
      in_first_group.set_value();
      first_group_released.wait();
    }
  });
  std::thread::id leader_id;
  std::thread leader([&] {
    leader_id = std::this_thread::get_id();
    Put("/mine");
  });
  first_group_held.wait();
  constexpr int kQueued = 5;
  util::Mutex mu;
  std::vector<std::thread::id> answered_on;
  std::vector<std::unique_ptr<etcdserverpb::PutRequest>> reqs;
  std::vector<std::unique_ptr<etcdserverpb::PutResponse>> resps;
  std::promise<void> all_answered;
  std::future<void> queued_answered = all_answered.get_future();
  for (int i = 0; i < kQueued; ++i) {
    reqs.push_back(std::make_unique<etcdserverpb::PutRequest>());
    resps.push_back(std::make_unique<etcdserverpb::PutResponse>());
    reqs.back()->set_key(absl::StrCat("/queued/", i));
    store_->Submit({PutOp{reqs.back().get(), resps.back().get()}, [&](absl::Status s) {
                      EXPECT_TRUE(s.ok()) << s;
                      util::MutexLock l(&mu);
                      answered_on.push_back(std::this_thread::get_id());
                      if (answered_on.size() == kQueued) all_answered.set_value();
                    }});
  }
  release_first_group.set_value();
  leader.join();
  ASSERT_EQ(queued_answered.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  store_->TEST_SetBeforeApplyHook(nullptr);
  util::MutexLock l(&mu);
  for (const auto& id : answered_on) {
    EXPECT_NE(id, leader_id) << "the waiting caller committed writes queued behind its own";
    EXPECT_NE(id, std::this_thread::get_id()) << "a queued write was committed by its submitter";
  }
  EXPECT_EQ(store_->Rev(), 1 + 1 + kQueued);
}

// An answer runs on the committing thread: one that submits another write
// gets it committed (by that thread, once it has handed the committer's
// part back) rather than waiting for itself.
TEST_F(InlineCommitTest, AnAnswerMaySubmitAnotherWrite) {
  etcdserverpb::PutRequest first, second;
  etcdserverpb::PutResponse first_resp, second_resp;
  first.set_key("a");
  second.set_key("b");
  std::promise<void> done;
  std::future<void> both_answered = done.get_future();
  store_->Submit({PutOp{&first, &first_resp}, [&](absl::Status s) {
                    ASSERT_TRUE(s.ok()) << s;
                    auto again = store_->Put(second);
                    ASSERT_TRUE(again.ok()) << again.status();
                    second_resp = *again;
                    done.set_value();
                  }});
  ASSERT_EQ(both_answered.wait_for(std::chrono::seconds(20)), std::future_status::ready);
  EXPECT_EQ(first_resp.header().revision(), 2);
  EXPECT_EQ(second_resp.header().revision(), 3);
}

// Physical compactions run the key index's compaction as the store's own
// steps between groups: they still do while writers commit inline.
TEST_F(InlineCommitTest, CompactionRunsBetweenInlineGroups) {
  for (int i = 0; i < 100; ++i) Put("/c/" + std::to_string(i % 10));
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 0; !stop.load(); ++i) Put("/w/" + std::to_string(i % 50));
  });
  etcdserverpb::CompactionRequest compact;
  compact.set_revision(store_->Rev());
  compact.set_physical(true);
  auto compacted = store_->Compact(compact);
  stop.store(true);
  writer.join();
  ASSERT_TRUE(compacted.ok()) << compacted.status();
  etcdserverpb::RangeRequest range;
  range.set_key("/c/");
  range.set_range_end("/c0");
  RangeResult result;
  ASSERT_TRUE(store_->Range(range, &result).ok());
  EXPECT_EQ(result.count, 10);
}

// A write log that orders writes by handing them back with the next index,
// as a sole voter's Raft log would, counting what it was given. While held
// it keeps them, as the raft loop appends nothing until direct writes are
// off and its log has caught up (GoOnAt).
class CountingLog final : public WriteLog {
 public:
  void Submit(WriteRequest w) override {
    util::MutexLock l(&mu_);
    ++submitted_;
    if (held_) {
      waiting_.push_back(std::move(w));
      return;
    }
    w.raft_index = ++index_;
    store->SubmitCommitted(std::move(w));
  }
  int submitted() const {
    util::MutexLock l(&mu_);
    return submitted_;
  }
  void Hold() {
    util::MutexLock l(&mu_);
    held_ = true;
  }
  // The log goes on after index, as the replicator's catch-up makes it.
  void GoOnAt(uint64_t index) {
    util::MutexLock l(&mu_);
    index_ = index;
    held_ = false;
    for (auto& w : waiting_) {
      w.raft_index = ++index_;
      store->SubmitCommitted(std::move(w));
    }
    waiting_.clear();
  }

  KvStore* store = nullptr;

 private:
  mutable util::Mutex mu_;
  int submitted_ ABSL_GUARDED_BY(mu_) = 0;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t index_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<WriteRequest> waiting_ ABSL_GUARDED_BY(mu_);
};

class DirectWritesTest : public KvStoreInTempDir {
 protected:
  void SetUp() override {
    KvStoreInTempDir::SetUp();
    KvStoreOptions o = Inline();
    o.requires_write_log = true;
    Reopen(o);
    log_.store = store_.get();
    store_->SetWriteLog(&log_);
  }
  void TearDown() override {
    store_->SetWriteLog(nullptr);
    KvStoreInTempDir::TearDown();
  }
  CountingLog log_;
};

TEST_F(DirectWritesTest, DirectWritesSkipTheLogAndTakeTheNextIndexes) {
  Put("a");
  EXPECT_EQ(log_.submitted(), 1);
  EXPECT_EQ(store_->AppliedIndex(), 1u);

  store_->StartDirectWrites();
  Put("b");
  Put("c");
  Delete("a");
  EXPECT_EQ(log_.submitted(), 1) << "a direct write went to the log";
  EXPECT_EQ(store_->AppliedIndex(), 4u);
  EXPECT_EQ(store_->Rev(), 5);

  const uint64_t through = store_->StopDirectWrites();
  EXPECT_EQ(through, 4u);
  log_.GoOnAt(through);
  Put("d");
  EXPECT_EQ(log_.submitted(), 2);
  EXPECT_EQ(store_->AppliedIndex(), 5u);
}

// StopDirectWrites returns only once every direct write taken before it is
// applied: the index it returns covers each one that was answered.
TEST_F(DirectWritesTest, StopWaitsForEveryDirectWriteTaken) {
  log_.Hold();
  store_->StartDirectWrites();
  constexpr int kThreads = 4;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> direct_answered{0};
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&, t] {
      for (int i = 0; !stop.load(); ++i) {
        etcdserverpb::PutRequest req;
        req.set_key(absl::StrCat("/d/", t, "/", i));
        auto resp = store_->Put(req);
        ASSERT_TRUE(resp.ok()) << resp.status();
        if (!stop.load()) direct_answered.fetch_add(1);
      }
    });
  }
  while (direct_answered.load() < 200) std::this_thread::yield();
  const int before_stop = log_.submitted();
  const uint64_t through = store_->StopDirectWrites();
  const uint64_t answered_by_then = direct_answered.load();
  log_.GoOnAt(through);
  stop.store(true);
  for (auto& w : writers) w.join();
  EXPECT_EQ(before_stop, 0);
  EXPECT_GE(through, answered_by_then);
  // Every write after the stop went through the log, at indexes after it
  // (each Put returned once its write was applied).
  EXPECT_EQ(store_->AppliedIndex(), through + static_cast<uint64_t>(log_.submitted()));
}

}  // namespace
}  // namespace capstan::mvcc
