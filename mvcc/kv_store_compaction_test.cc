// Physical compaction (kv_store_compaction.cc) at the edges that timing
// alone rarely reaches, forced through the compactor's sync points.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "mvcc/errors.h"
#include "mvcc/kv_store.h"
#include "mvcc/kv_store_test_fixture.h"
#include "mvcc/revision_key.h"

namespace capstan::mvcc {
namespace {

using KvStoreCompactionTest = KvStoreInTempDir;

// The store begins to stop just after the index step of a compaction is
// done. The compactor must leave the compaction to the next Open rather than
// run it again: a second pass over an index already compacted at the same
// revision used to take the tombstone at that revision for unreachable and
// delete it from the backend, which etcd keeps until the next compaction.
TEST_F(KvStoreCompactionTest, StopAfterTheIndexStepKeepsTheTombstoneAtTheCompactionRevision) {
  Put("a");                      // 2
  const int64_t rev = Delete("a");  // 3
  Put("b");                      // 4
  ASSERT_EQ(rev, 3);

  struct Sync {
    std::mutex mu;
    std::condition_variable cv;
    int starts = 0;
    bool index_done = false, stopping = false, exited = false, release = false;
  };
  auto sync = std::make_shared<Sync>();
  store_->TEST_SetCompactionSyncPoint([sync](std::string_view point) {
    std::unique_lock<std::mutex> l(sync->mu);
    if (point == "KvStore::RunCompaction:Start") ++sync->starts;
    if (point == "KvStore::CompactionLoop:Exit") sync->exited = true;
    if (point == "KvStore::RunCompaction:AfterIndexBatch" && !sync->index_done) {
      // The whole index is compacted (one batch); hold on until the store
      // is stopping.
      sync->index_done = true;
      sync->cv.notify_all();
      sync->cv.wait(l, [&] { return sync->stopping; });
    }
    sync->cv.notify_all();
  });

  etcdserverpb::CompactionRequest creq;
  creq.set_revision(rev);
  ASSERT_TRUE(store_->Compact(creq).ok());  // not physical: answered at once
  {
    std::unique_lock<std::mutex> l(sync->mu);
    sync->cv.wait(l, [&] { return sync->index_done; });
  }

  // A write answered only once released: until then the store's stop waits
  // for its committer (or answer thread), and the compactor is not yet told
  // to exit.
  auto put = std::make_shared<etcdserverpb::PutRequest>();
  put->set_key("c");  // 5
  auto put_resp = std::make_shared<etcdserverpb::PutResponse>();
  store_->Submit({PutOp{put.get(), put_resp.get()}, [sync, put, put_resp](absl::Status) {
                    std::unique_lock<std::mutex> l(sync->mu);
                    sync->cv.wait(l, [&] { return sync->release; });
                  }});

  KvStore* store = store_.get();
  std::thread stopper([this] { store_.reset(); });
  // The store is stopping once a write is refused with kStopped (at once,
  // on this thread); the ones accepted before do nothing.
  for (;;) {
    auto refused = std::make_shared<std::atomic<bool>>(false);
    store->Submit({CustomOp{[](storage::WriteBatch*) { return absl::OkStatus(); }},
                   [refused](absl::Status s) { *refused = Is(s, Error::kStopped); }});
    if (*refused) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  int starts;
  {
    std::unique_lock<std::mutex> l(sync->mu);
    sync->stopping = true;
    sync->cv.notify_all();
    // Either the compactor runs the compaction again or it exits.
    sync->cv.wait(l, [&] { return sync->starts > 1 || sync->exited; });
    starts = sync->starts;
    sync->release = true;
    sync->cv.notify_all();
  }
  stopper.join();
  EXPECT_EQ(starts, 1) << "a compaction cut short by the stop ran again";

  // Open resumes the compaction from the stored data.
  Reopen();
  store_->WaitCompactionDone();
  EXPECT_EQ(store_->CompactRev(), rev);
  EXPECT_EQ(StoredRevisions(), (std::vector<std::string>{"3t", "4", "5"}));
}

// Two compactions in a row, the second applied while the first still runs:
// the second's hash is stored all the same (etcd stores it whenever its own
// compactor finished the first in time, which on a small store it does), and
// HashKV at its revision answers it once later compactions are past it.
TEST_F(KvStoreCompactionTest, HashOfACompactionAppliedWhileTheOneBeforeRunsIsStored) {
  for (int i = 0; i < 6; ++i) Put("k" + std::to_string(i % 3));  // 2..7

  struct Sync {
    std::mutex mu;
    std::condition_variable cv;
    bool held = false, release = false;
  };
  auto sync = std::make_shared<Sync>();
  store_->TEST_SetCompactionSyncPoint([sync](std::string_view point) {
    if (point != "KvStore::RunCompaction:Start") return;
    std::unique_lock<std::mutex> l(sync->mu);
    if (sync->held) return;  // only the first compaction waits
    sync->held = true;
    sync->cv.notify_all();
    sync->cv.wait(l, [&] { return sync->release; });
  });

  etcdserverpb::CompactionRequest creq;
  creq.set_revision(3);
  ASSERT_TRUE(store_->Compact(creq).ok());  // not physical: answered at once
  {
    std::unique_lock<std::mutex> l(sync->mu);
    sync->cv.wait(l, [&] { return sync->held; });
  }
  // What a compaction at 5 hashes, seen from a store compacted at 3.
  uint32_t expected;
  int64_t compact_rev, hash_rev;
  ASSERT_TRUE(store_->HashKV(5, &expected, &compact_rev, &hash_rev).ok());
  EXPECT_EQ(compact_rev, 3);
  creq.set_revision(5);
  ASSERT_TRUE(store_->Compact(creq).ok());  // the compaction at 3 has not finished
  {
    std::unique_lock<std::mutex> l(sync->mu);
    sync->release = true;
    sync->cv.notify_all();
  }
  store_->WaitCompactionDone();
  creq.set_revision(6);
  creq.set_physical(true);
  ASSERT_TRUE(store_->Compact(creq).ok());

  uint32_t stored;
  ASSERT_TRUE(store_->HashKV(5, &stored, &compact_rev, &hash_rev).ok());
  EXPECT_EQ(stored, expected);
  EXPECT_EQ(compact_rev, 3);
  EXPECT_EQ(hash_rev, 5);
  absl::Status below = store_->HashKV(4, &stored, &compact_rev, &hash_rev);
  EXPECT_TRUE(Is(below, Error::kCompacted)) << below;
}

}  // namespace
}  // namespace capstan::mvcc
