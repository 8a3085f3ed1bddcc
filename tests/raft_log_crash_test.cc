// Crash safety of the Raft log (replication/raft_log.h) and of the backend's
// unsynced batches it relies on, under the fault-injection file system
// (storage/testing/): a crash keeps exactly what was synced.

#include <stdlib.h>

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "replication/raft_log.h"
#include "replication/raft_log_model_for_test.h"
#include "storage/backend.h"
#include "storage/testing/fault_injection_fs.h"

namespace capstan::replication {
namespace {

using storage::FaultInjectionFs;
using Fault = storage::FaultInjectionFs::Fault;

RaftEntry Ent(uint64_t index, uint64_t term, std::string data) {
  RaftEntry e;
  e.index = index;
  e.term = term;
  e.data = absl::StrCat(index, "-", term, "-", data);
  return e;
}

using RaftLogCrashTest = RaftLogFixture;

// After a crash that loses what was not synced, the log is the state after
// one of the Saves from the last synced one on: everything a synced Save
// wrote survives, and an unsynced Save is lost whole or kept whole (with all
// before it), never leaving a hole.
TEST_F(RaftLogCrashTest, CrashKeepsEverySyncedSaveAndNeverLeavesAHole) {
  auto fs = FaultInjectionFs::Create();
  options_.file_system = fs;
  options_.tail_cache_bytes = 2000;
  ASSERT_TRUE(Reopen().ok());
  std::mt19937_64 rng(42);
  int lost_saves = 0;
  for (int round = 0; round < 30; ++round) {
    // The states the log passed through since its last synced Save.
    std::vector<Model> states = {Observe(log_.get())};
    Model m = states.back();
    uint64_t term = std::max<uint64_t>(1, m.hs.term);
    const int saves = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < saves; ++k) {
      uint64_t start = m.last() + 1;
      if (rng() % 3 == 0 && m.last() > std::max(m.snap.index, m.hs.commit)) {
        start = m.last();
        ++term;
      }
      std::vector<RaftEntry> batch;
      for (int j = 0; j < 1 + static_cast<int>(rng() % 4); ++j) {
        batch.push_back(Ent(start + j, term, std::string(rng() % 200, 'x')));
      }
      HardState hs{term, 1, std::max<uint64_t>(m.hs.commit, start > 3 ? start - 3 : 0)};
      const bool sync = rng() % 3 == 0;
      ASSERT_TRUE(log_->Save(hs, batch, std::nullopt, sync).ok());
      for (auto it = m.entries.lower_bound(start); it != m.entries.end();) it = m.entries.erase(it);
      for (auto& e : batch) m.entries[e.index] = e;
      m.hs = hs;
      if (sync) states.clear();
      states.push_back(m);
      if (m.hs.commit > m.snap.index + 20) {
        ASSERT_TRUE(log_->Compact(m.hs.commit - 10, {}).ok());
        m.snap = SnapshotMeta{m.hs.commit - 10, m.term(m.hs.commit - 10), {}};
        m.entries.erase(m.entries.begin(), m.entries.upper_bound(m.snap.index));
        // Compaction is synced, and leaves the log as it reads.
        states = {m};
      }
    }
    fs->SetFault(Fault::kInactive);
    log_.reset();
    ASSERT_TRUE(fs->DropUnsyncedData().ok());
    fs->SetFault(Fault::kNone);
    ASSERT_TRUE(Reopen().ok());
    const Model got = Observe(log_.get());
    size_t match = states.size();
    for (size_t k = 0; k < states.size(); ++k) {
      if (got == states[k]) match = k;
    }
    ASSERT_LT(match, states.size())
        << "round " << round << ": the log after the crash (last " << got.last() << ", commit "
        << got.hs.commit << ") is none of the states since the last synced save";
    lost_saves += static_cast<int>(states.size() - 1 - match);
  }
  // The test did lose unsynced saves (else it checked nothing of them).
  EXPECT_GT(lost_saves, 0);
}

// An unsynced batch may be lost at a power failure, but a later synced one
// carries it along: what survives is a prefix of the writes.
TEST_F(RaftLogCrashTest, UnsyncedBackendBatchIsMadeDurableByTheNextSyncedOne) {
  auto fs = FaultInjectionFs::Create();
  storage::BackendOptions options;
  options.dir = dir_ + "/db";
  options.file_system = fs;
  auto crash_and_open = [&]() -> std::unique_ptr<storage::Backend> {
    auto b = storage::Backend::Open(options);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? std::move(*b) : nullptr;
  };
  auto b = crash_and_open();
  ASSERT_NE(b, nullptr);
  storage::WriteBatch unsynced;
  unsynced.set_sync(false);
  unsynced.Put(storage::Cf::kRaft, "1", "a");
  ASSERT_TRUE(b->Write(&unsynced).ok());
  EXPECT_GT(fs->UnsyncedBytes(), 0);
  storage::WriteBatch synced;
  synced.Put(storage::Cf::kRaft, "2", "b");
  ASSERT_TRUE(b->Write(&synced).ok());
  storage::WriteBatch lost;
  lost.set_sync(false);
  lost.Put(storage::Cf::kRaft, "3", "c");
  ASSERT_TRUE(b->Write(&lost).ok());
  fs->SetFault(Fault::kInactive);
  b.reset();
  ASSERT_TRUE(fs->DropUnsyncedData().ok());
  fs->SetFault(Fault::kNone);
  b = crash_and_open();
  ASSERT_NE(b, nullptr);
  std::string v;
  EXPECT_TRUE(b->Get(storage::Cf::kRaft, "1", &v).ok());
  EXPECT_TRUE(b->Get(storage::Cf::kRaft, "2", &v).ok());
  EXPECT_TRUE(absl::IsNotFound(b->Get(storage::Cf::kRaft, "3", &v)));
}

}  // namespace
}  // namespace capstan::replication
