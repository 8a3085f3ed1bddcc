#include "replication/raft_log.h"

#include <stdlib.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "replication/raft_log_model_for_test.h"
#include "storage/backend.h"
#include "util/coding.h"

namespace capstan::replication {
namespace {

RaftEntry Ent(uint64_t index, uint64_t term, std::string data = "") {
  RaftEntry e;
  e.index = index;
  e.term = term;
  e.data = data.empty() ? absl::StrCat("entry-", index, "-", term) : std::move(data);
  return e;
}

std::vector<RaftEntry> Range(uint64_t first, uint64_t last, uint64_t term) {
  std::vector<RaftEntry> out;
  for (uint64_t i = first; i <= last; ++i) out.push_back(Ent(i, term));
  return out;
}

HardState Hs(uint64_t term, uint64_t commit) { return HardState{term, 1, commit}; }

class RaftLogTest : public RaftLogFixture {
 protected:
  void Append(const std::vector<RaftEntry>& entries, std::optional<HardState> hs = std::nullopt) {
    ASSERT_TRUE(log_->Save(hs, entries, std::nullopt, /*sync=*/true).ok());
  }

  std::vector<RaftEntry> Read(uint64_t lo, uint64_t hi, uint64_t max_bytes = UINT64_MAX) {
    std::vector<RaftEntry> out;
    EXPECT_EQ(log_->Entries(lo, hi, max_bytes, &out), LogError::kOk) << lo << ".." << hi;
    return out;
  }

  uint64_t TermAt(uint64_t i) {
    uint64_t t = 0;
    EXPECT_EQ(log_->Term(i, &t), LogError::kOk) << i;
    return t;
  }

  // Overwrites the stored record of entry index with bytes, the log closed.
  void CorruptRecord(uint64_t index, std::string bytes) {
    log_.reset();
    storage::BackendOptions bo;
    bo.dir = options_.dir;
    auto b = storage::Backend::Open(bo);
    ASSERT_TRUE(b.ok()) << b.status();
    std::string key;
    util::AppendBigEndian64(index, &key);
    storage::WriteBatch batch;
    if (bytes.empty()) {
      batch.Delete(storage::Cf::kRaft, key);
    } else {
      batch.Put(storage::Cf::kRaft, key, bytes);
    }
    ASSERT_TRUE((*b)->Write(&batch).ok());
  }

  // Flips one byte of the stored record of entry index, the log closed.
  void FlipByte(uint64_t index) {
    log_.reset();
    std::string value;
    {
      storage::BackendOptions bo;
      bo.dir = options_.dir;
      auto b = storage::Backend::Open(bo);
      ASSERT_TRUE(b.ok()) << b.status();
      std::string key;
      util::AppendBigEndian64(index, &key);
      ASSERT_TRUE((*b)->Get(storage::Cf::kRaft, key, &value).ok());
    }
    value[value.size() / 2] ^= 0x20;
    CorruptRecord(index, value);
  }

};

TEST_F(RaftLogTest, NewLogIsEmpty) {
  ASSERT_TRUE(Reopen().ok());
  EXPECT_TRUE(log_->IsNew());
  EXPECT_EQ(log_->FirstIndex(), 1u);
  EXPECT_EQ(log_->LastIndex(), 0u);
  EXPECT_EQ(TermAt(0), 0u);
  uint64_t t;
  EXPECT_EQ(log_->Term(1, &t), LogError::kUnavailable);
  std::vector<RaftEntry> out;
  EXPECT_EQ(log_->Entries(1, 1, 100, &out), LogError::kUnavailable);
  EXPECT_EQ(log_->Entries(0, 1, 100, &out), LogError::kCompacted);
  HardState hs;
  ConfState cs;
  EXPECT_EQ(log_->InitialState(&hs, &cs), LogError::kOk);
  EXPECT_EQ(hs, HardState{});
  EXPECT_TRUE(cs.voters.empty());
  ASSERT_TRUE(log_->Save(Hs(1, 0), {}, std::nullopt, true).ok());
  EXPECT_FALSE(log_->IsNew());
  ASSERT_TRUE(Reopen().ok());
  EXPECT_FALSE(log_->IsNew());
  EXPECT_EQ(log_->hard_state(), Hs(1, 0));
}

TEST_F(RaftLogTest, EntriesAndTermAnswerAsRaftStorage) {
  ASSERT_TRUE(Reopen().ok());
  Append(Range(1, 4, 1));
  Append(Range(5, 10, 2), Hs(2, 8));
  EXPECT_EQ(log_->LastIndex(), 10u);
  EXPECT_EQ(TermAt(4), 1u);
  EXPECT_EQ(TermAt(5), 2u);
  auto got = Read(3, 7);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0].index, 3u);
  EXPECT_EQ(got[0].data, "entry-3-1");
  EXPECT_EQ(got[3].term, 2u);
  EXPECT_TRUE(Read(4, 4).empty());
  std::vector<RaftEntry> out;
  EXPECT_EQ(log_->Entries(5, 12, UINT64_MAX, &out), LogError::kUnavailable);

  ASSERT_TRUE(log_->Compact(5, ConfState{{1, 2, 3}, {4}, {}, {}, false}).ok());
  EXPECT_EQ(log_->FirstIndex(), 6u);
  EXPECT_EQ(log_->LastIndex(), 10u);
  EXPECT_EQ(log_->Entries(5, 7, UINT64_MAX, &out), LogError::kCompacted);
  EXPECT_EQ(log_->Entries(4, 7, UINT64_MAX, &out), LogError::kCompacted);
  EXPECT_EQ(Read(6, 11).size(), 5u);
  uint64_t t;
  EXPECT_EQ(log_->Term(4, &t), LogError::kCompacted);
  EXPECT_EQ(TermAt(5), 2u);  // the snapshot index answers with its term
  EXPECT_EQ(log_->Term(11, &t), LogError::kUnavailable);
  SnapshotMeta meta;
  EXPECT_EQ(log_->Snapshot(&meta), LogError::kOk);
  EXPECT_EQ(meta.index, 5u);
  EXPECT_EQ(meta.term, 2u);
  EXPECT_EQ(meta.conf_state.voters, (std::vector<uint64_t>{1, 2, 3}));
}

TEST_F(RaftLogTest, MaxBytesReturnsAtLeastOneEntry) {
  for (size_t cache : {size_t{4} << 20, size_t{0}}) {
    SCOPED_TRACE(cache);
    options_.tail_cache_bytes = cache;
    ASSERT_TRUE(Reopen().ok());
    if (log_->LastIndex() == 0) {
      std::vector<RaftEntry> entries;
      for (uint64_t i = 1; i <= 10; ++i) entries.push_back(Ent(i, 1, std::string(100, 'a' + i)));
      Append(entries);
      ASSERT_TRUE(Reopen().ok());
    }
    const uint64_t one = RaftLog::EntrySize(Read(1, 2)[0]);
    EXPECT_EQ(one, 3u + 1 + 1 + 1 + 1 + 1 + 100);
    EXPECT_EQ(Read(1, 11, 0).size(), 1u);
    EXPECT_EQ(Read(1, 11, one).size(), 1u);
    EXPECT_EQ(Read(1, 11, 3 * one).size(), 3u);
    EXPECT_EQ(Read(1, 11, 3 * one + 1).size(), 3u);
    EXPECT_EQ(Read(4, 11, 4 * one - 1).size(), 3u);
    EXPECT_EQ(Read(1, 11).size(), 10u);
  }
}

TEST_F(RaftLogTest, ConflictingTailIsReplaced) {
  ASSERT_TRUE(Reopen().ok());
  Append(Range(1, 10, 1), Hs(1, 3));
  Append({Ent(6, 2, "new-6"), Ent(7, 2, "new-7")}, Hs(2, 3));
  EXPECT_EQ(log_->LastIndex(), 7u);
  EXPECT_EQ(TermAt(5), 1u);
  EXPECT_EQ(TermAt(6), 2u);
  std::vector<RaftEntry> out;
  EXPECT_EQ(log_->Entries(6, 9, UINT64_MAX, &out), LogError::kUnavailable);
  for (int round = 0; round < 2; ++round) {
    auto got = Read(5, 8);
    ASSERT_EQ(got.size(), 3u);
    EXPECT_EQ(got[0].data, "entry-5-1");
    EXPECT_EQ(got[1].data, "new-6");
    EXPECT_EQ(got[2].data, "new-7");
    ASSERT_TRUE(Reopen().ok());
    EXPECT_EQ(log_->LastIndex(), 7u);
  }
  // A replacement as long as the tail, and one past it.
  Append(Range(7, 12, 3));
  EXPECT_EQ(log_->LastIndex(), 12u);
  EXPECT_EQ(TermAt(6), 2u);
  EXPECT_EQ(TermAt(7), 3u);
}

TEST_F(RaftLogTest, BadAppendsAreRefusedAndWriteNothing) {
  ASSERT_TRUE(Reopen().ok());
  Append(Range(1, 5, 2));
  EXPECT_TRUE(absl::IsInvalidArgument(log_->Save(std::nullopt, {Ent(7, 2)}, std::nullopt, true)));
  EXPECT_TRUE(absl::IsInvalidArgument(log_->Save(std::nullopt, {Ent(6, 1)}, std::nullopt, true)));
  EXPECT_TRUE(absl::IsInvalidArgument(
      log_->Save(std::nullopt, {Ent(6, 2), Ent(8, 2)}, std::nullopt, true)));
  EXPECT_TRUE(absl::IsInvalidArgument(
      log_->Save(std::nullopt, {Ent(6, 3), Ent(7, 2)}, std::nullopt, true)));
  EXPECT_EQ(log_->LastIndex(), 5u);
  ASSERT_TRUE(Reopen().ok());
  EXPECT_EQ(log_->LastIndex(), 5u);
}

TEST_F(RaftLogTest, SnapshotResetsTheLog) {
  ASSERT_TRUE(Reopen().ok());
  Append(Range(1, 10, 1), Hs(1, 10));
  SnapshotMeta snap{20, 3, ConfState{{1, 2, 3}, {}, {}, {}, false}};
  ASSERT_TRUE(log_->Save(Hs(3, 20), {}, snap, true).ok());
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(log_->FirstIndex(), 21u);
    EXPECT_EQ(log_->LastIndex(), 20u);
    EXPECT_EQ(TermAt(20), 3u);
    std::vector<RaftEntry> out;
    EXPECT_EQ(log_->Entries(10, 11, UINT64_MAX, &out), LogError::kCompacted);
    HardState hs;
    ConfState cs;
    log_->InitialState(&hs, &cs);
    EXPECT_EQ(hs, Hs(3, 20));
    EXPECT_EQ(cs.voters, (std::vector<uint64_t>{1, 2, 3}));
    ASSERT_TRUE(Reopen().ok());
  }
  // Entries after it in the same Save; those at or below it are skipped.
  ASSERT_TRUE(log_->Save(std::nullopt, Range(19, 22, 3), std::nullopt, true).ok());
  EXPECT_EQ(log_->LastIndex(), 22u);
  EXPECT_EQ(Read(21, 23).size(), 2u);
  // An older snapshot changes nothing.
  ASSERT_TRUE(log_->Save(std::nullopt, {}, SnapshotMeta{15, 2, {}}, true).ok());
  EXPECT_EQ(log_->FirstIndex(), 21u);
  EXPECT_EQ(log_->LastIndex(), 22u);
}

TEST_F(RaftLogTest, CompactThenReopen) {
  options_.tail_cache_bytes = 1000;  // older entries come from RocksDB
  ASSERT_TRUE(Reopen().ok());
  for (uint64_t i = 1; i <= 100; i += 10) Append(Range(i, i + 9, 1 + i / 30), Hs(4, i + 9));
  EXPECT_TRUE(absl::IsOutOfRange(log_->Compact(101, {})));
  ASSERT_TRUE(log_->Compact(42, ConfState{{7}, {}, {}, {}, true}).ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(log_->Compact(42, {})));
  EXPECT_TRUE(absl::IsFailedPrecondition(log_->Compact(10, {})));
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(log_->FirstIndex(), 43u);
    EXPECT_EQ(log_->LastIndex(), 100u);
    EXPECT_EQ(TermAt(42), 2u);
    EXPECT_EQ(TermAt(43), 2u);
    EXPECT_EQ(TermAt(100), 4u);
    EXPECT_EQ(log_->snapshot_meta().conf_state.voters, std::vector<uint64_t>{7});
    EXPECT_TRUE(log_->snapshot_meta().conf_state.auto_leave);
    auto got = Read(43, 101);
    ASSERT_EQ(got.size(), 58u);
    for (size_t k = 0; k < got.size(); ++k) EXPECT_EQ(got[k].index, 43 + k);
    ASSERT_TRUE(Reopen().ok());
  }
  ASSERT_TRUE(log_->Compact(100, {}).ok());
  EXPECT_EQ(log_->FirstIndex(), 101u);
  EXPECT_EQ(log_->LastIndex(), 100u);
  EXPECT_EQ(TermAt(100), 4u);
  Append({Ent(101, 5)});
  ASSERT_TRUE(Reopen().ok());
  EXPECT_EQ(TermAt(100), 4u);
  EXPECT_EQ(TermAt(101), 5u);
}

// 64 KiB that no compression shrinks, different for each seed.
std::string Incompressible(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string out(64 << 10, '\0');
  for (size_t i = 0; i < out.size(); i += 8) {
    const uint64_t v = rng();
    memcpy(&out[i], &v, 8);
  }
  return out;
}

// The space of compacted entries comes back: RocksDB alone keeps it until
// a compaction happens to reach their files.
TEST_F(RaftLogTest, CompactGivesTheDiskSpaceBack) {
  options_.write_buffer_bytes = 1 << 20;  // entries reach files, as in a long run
  ASSERT_TRUE(Reopen().ok());
  const uint64_t kLast = 640;  // 40 MiB of entries
  for (uint64_t i = 1; i <= kLast; i += 16) {
    std::vector<RaftEntry> batch;
    for (uint64_t k = i; k < i + 16; ++k) batch.push_back(Ent(k, 1, Incompressible(k)));
    Append(batch, Hs(1, i + 15));
  }
  const uint64_t before = log_->SizeOnDisk();
  EXPECT_GT(before, 30u << 20);
  ASSERT_TRUE(log_->Compact(kLast - 8, {}).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (log_->ReclaimedBelow() < kLast - 7 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));  // polling a condition, with a deadline
  }
  ASSERT_EQ(log_->ReclaimedBelow(), kLast - 7);
  const uint64_t after = log_->SizeOnDisk();
  EXPECT_LT(after, before / 8) << "before " << before << " bytes, after " << after;
  // What is left reads as before, now and after a reopen.
  for (int round = 0; round < 2; ++round) {
    auto got = Read(kLast - 7, kLast + 1);
    ASSERT_EQ(got.size(), 8u);
    EXPECT_EQ(got.back().data, Incompressible(kLast));
    ASSERT_TRUE(Reopen().ok());
  }
}

// A snapshot that resets the log gives back the space of what it deleted.
TEST_F(RaftLogTest, ASnapshotGivesTheDiskSpaceBack) {
  options_.write_buffer_bytes = 1 << 20;
  ASSERT_TRUE(Reopen().ok());
  for (uint64_t i = 1; i <= 480; i += 16) {
    std::vector<RaftEntry> batch;
    for (uint64_t k = i; k < i + 16; ++k) batch.push_back(Ent(k, 1, Incompressible(k)));
    Append(batch, Hs(1, i + 15));
  }
  const uint64_t before = log_->SizeOnDisk();
  EXPECT_GT(before, 20u << 20);
  SnapshotMeta snap{1000, 2, ConfState{{1}, {}, {}, {}, false}};
  ASSERT_TRUE(log_->Save(Hs(2, 1000), {}, snap, /*sync=*/true).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (log_->ReclaimedBelow() < 1001 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(5));  // polling a condition, with a deadline
  }
  ASSERT_EQ(log_->ReclaimedBelow(), 1001u);
  EXPECT_LT(log_->SizeOnDisk(), before / 8);
  EXPECT_EQ(log_->FirstIndex(), 1001u);
}

TEST_F(RaftLogTest, LastIndexAndHardStateMayBeReadFromAnotherThread) {
  ASSERT_TRUE(Reopen().ok());
  std::atomic<bool> done{false};
  std::thread reader([&] {
    uint64_t last = 0, commit = 0;
    while (!done.load()) {
      const uint64_t l = log_->LastIndex();
      const HardState hs = log_->hard_state();
      EXPECT_GE(l, last);
      EXPECT_GE(hs.commit, commit);
      EXPECT_EQ(hs.term, hs.commit == 0 ? hs.term : 7u);
      last = l;
      commit = hs.commit;
    }
  });
  for (uint64_t i = 1; i <= 300; ++i) {
    ASSERT_TRUE(log_->Save(HardState{7, 1, i}, {Ent(i, 7)}, std::nullopt, false).ok());
  }
  done.store(true);
  reader.join();
  EXPECT_EQ(log_->LastIndex(), 300u);
}

// --- The model-based random test ------------------------------------------

// Checks every answer of the log against the model.
void CheckAgainst(RaftLog* log, const Model& m, std::mt19937_64& rng) {
  ASSERT_EQ(log->FirstIndex(), m.snap.index + 1);
  ASSERT_EQ(log->LastIndex(), m.last());
  ASSERT_EQ(log->hard_state(), m.hs);
  for (uint64_t i = m.snap.index; i <= m.last() + 1; ++i) {
    uint64_t t = 0;
    if (i > m.last()) {
      ASSERT_EQ(log->Term(i, &t), LogError::kUnavailable);
    } else {
      ASSERT_EQ(log->Term(i, &t), LogError::kOk) << i;
      ASSERT_EQ(t, m.term(i)) << i;
    }
  }
  if (m.snap.index > 0) {
    uint64_t t;
    ASSERT_EQ(log->Term(m.snap.index - 1, &t), LogError::kCompacted);
  }
  if (m.entries.empty()) return;
  for (int q = 0; q < 8; ++q) {
    const uint64_t lo = m.snap.index + 1 + rng() % (m.last() - m.snap.index);
    const uint64_t hi = lo + rng() % (m.last() + 2 - lo);
    const uint64_t max_bytes = rng() % 4 == 0 ? UINT64_MAX : rng() % 2000;
    std::vector<RaftEntry> got;
    ASSERT_EQ(log->Entries(lo, hi, max_bytes, &got), LogError::kOk);
    // raft's limitSize over the model.
    std::vector<const RaftEntry*> want;
    uint64_t bytes = 0;
    for (uint64_t i = lo; i < hi; ++i) {
      const RaftEntry& e = m.entries.at(i);
      const uint64_t size = RaftLog::EntrySize(e);
      if (!want.empty() && bytes + size > max_bytes) break;
      bytes += size;
      want.push_back(&e);
    }
    ASSERT_EQ(got.size(), want.size()) << lo << ".." << hi << " max " << max_bytes;
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_EQ(got[k].index, want[k]->index);
      ASSERT_EQ(got[k].term, want[k]->term);
      ASSERT_EQ(got[k].data, want[k]->data);
      ASSERT_EQ(got[k].type, want[k]->type);
    }
  }
}

TEST_F(RaftLogTest, RandomOperationsMatchAModel) {
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE(seed);
    log_.reset();
    std::filesystem::remove_all(options_.dir);
    options_.tail_cache_bytes = 1500 + seed * 500;
    options_.sync = false;  // durability is the crash test's
    ASSERT_TRUE(Reopen().ok());
    std::mt19937_64 rng(seed);
    Model m;
    uint64_t term = 1;
    for (int op = 0; op < 400; ++op) {
      const int kind = static_cast<int>(rng() % 20);
      if (kind < 12) {
        // Append, sometimes over a conflicting tail.
        uint64_t start = m.last() + 1;
        if (rng() % 4 == 0 && m.last() > std::max(m.snap.index, m.hs.commit)) {
          const uint64_t floor = std::max(m.snap.index, m.hs.commit) + 1;
          start = floor + rng() % (m.last() + 1 - floor);
          ++term;
        }
        if (rng() % 8 == 0) ++term;
        std::vector<RaftEntry> batch;
        const int n = 1 + static_cast<int>(rng() % 6);
        for (int k = 0; k < n; ++k) {
          RaftEntry e = Ent(start + k, term, std::string(rng() % 300, 'a' + rng() % 26));
          e.type = static_cast<EntryType>(rng() % 3);
          batch.push_back(e);
        }
        std::optional<HardState> hs;
        if (rng() % 2 == 0) {
          hs = HardState{term, rng() % 3, m.hs.commit + rng() % (start - m.hs.commit)};
        }
        ASSERT_TRUE(log_->Save(hs, batch, std::nullopt, rng() % 2 == 0).ok());
        for (auto it = m.entries.lower_bound(start); it != m.entries.end();) {
          it = m.entries.erase(it);
        }
        for (auto& e : batch) m.entries[e.index] = e;
        if (hs) m.hs = *hs;
      } else if (kind < 15) {
        // Compact up to the commit index.
        if (m.hs.commit > m.snap.index) {
          const uint64_t index = m.snap.index + 1 + rng() % (m.hs.commit - m.snap.index);
          ConfState cs{{1 + rng() % 5}, {}, {}, {}, false};
          ASSERT_TRUE(log_->Compact(index, cs).ok());
          m.snap = SnapshotMeta{index, m.term(index), cs};
          m.entries.erase(m.entries.begin(), m.entries.upper_bound(index));
        }
      } else if (kind < 16) {
        // Install a snapshot past the log.
        ++term;
        SnapshotMeta snap{m.last() + 1 + rng() % 5, term, ConfState{{1, 2}, {}, {}, {}, false}};
        HardState hs{term, 0, snap.index};
        ASSERT_TRUE(log_->Save(hs, {}, snap, true).ok());
        m.snap = snap;
        m.entries.clear();
        m.hs = hs;
      } else if (kind < 18) {
        ASSERT_TRUE(Reopen().ok());
      } else {
        const uint64_t commit = m.hs.commit + rng() % (m.last() + 1 - m.hs.commit);
        HardState hs{term, 2, commit};
        ASSERT_TRUE(log_->Save(hs, {}, std::nullopt, true).ok());
        m.hs = hs;
      }
      ASSERT_NO_FATAL_FAILURE(CheckAgainst(log_.get(), m, rng)) << "op " << op;
    }
    ASSERT_TRUE(Reopen().ok());
    ASSERT_NO_FATAL_FAILURE(CheckAgainst(log_.get(), m, rng));
  }
}

// --- Corruption at Open ------------------------------------------------------

TEST_F(RaftLogTest, CorruptRecordInTheMiddleFailsOpen) {
  ASSERT_TRUE(Reopen().ok());
  Append(Range(1, 10, 1), Hs(1, 3));
  FlipByte(6);
  auto s = Reopen();
  ASSERT_FALSE(s.ok());
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("raft log corrupt at index 6: CRC mismatch"), std::string::npos) << s;
}

TEST_F(RaftLogTest, MissingRecordInTheMiddleFailsOpen) {
  ASSERT_TRUE(Reopen().ok());
  Append(Range(1, 10, 1), Hs(1, 3));
  CorruptRecord(7, "");
  auto s = Reopen();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("raft log corrupt at index 7: entry missing"), std::string::npos)
      << s;
}

TEST_F(RaftLogTest, CorruptLastRecordPastCommitIsDropped) {
  ASSERT_TRUE(Reopen().ok());
  Append(Range(1, 10, 1), Hs(1, 5));
  FlipByte(10);
  ASSERT_TRUE(Reopen().ok());
  EXPECT_EQ(log_->LastIndex(), 9u);
  EXPECT_EQ(Read(9, 10)[0].data, "entry-9-1");
  // The last two, one of them too short to hold a CRC.
  FlipByte(9);
  ASSERT_TRUE(Reopen().ok());
  Append({Ent(9, 1), Ent(10, 1)});
  CorruptRecord(9, "xy");
  FlipByte(10);
  ASSERT_TRUE(Reopen().ok());
  EXPECT_EQ(log_->LastIndex(), 8u);
  // The drop is durable, and the log goes on from there.
  ASSERT_TRUE(Reopen().ok());
  EXPECT_EQ(log_->LastIndex(), 8u);
  Append({Ent(9, 2)});
  EXPECT_EQ(TermAt(9), 2u);
}

TEST_F(RaftLogTest, CorruptRecordAtOrBelowCommitFailsOpen) {
  ASSERT_TRUE(Reopen().ok());
  Append(Range(1, 10, 1), Hs(1, 10));
  FlipByte(10);
  auto s = Reopen();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("raft log corrupt at index 10"), std::string::npos) << s;
  EXPECT_NE(s.message().find("commit index 10"), std::string::npos) << s;
}

TEST_F(RaftLogTest, RecordUnderTheWrongKeyFailsOpen) {
  ASSERT_TRUE(Reopen().ok());
  Append(Range(1, 5, 3), Hs(3, 5));
  Append(Range(6, 10, 3));
  // Entry 4's record stored as entry 3.
  {
    log_.reset();
    storage::BackendOptions bo;
    bo.dir = options_.dir;
    auto b = storage::Backend::Open(bo);
    ASSERT_TRUE(b.ok());
    std::string k3, k4, v4;
    util::AppendBigEndian64(3, &k3);
    util::AppendBigEndian64(4, &k4);
    ASSERT_TRUE((*b)->Get(storage::Cf::kRaft, k4, &v4).ok());
    storage::WriteBatch batch;
    batch.Put(storage::Cf::kRaft, k3, v4);
    ASSERT_TRUE((*b)->Write(&batch).ok());
  }
  auto s = Reopen();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("raft log corrupt at index 3: the record holds entry 4"),
            std::string::npos)
      << s;
}

TEST_F(RaftLogTest, IntactRecordWithAFallingTermFailsOpen) {
  // Entry 4 of term 1, its record intact, taken from another log.
  std::string record;
  {
    RaftLogOptions other;
    other.dir = dir_ + "/other";
    auto log = RaftLog::Open(other);
    ASSERT_TRUE(log.ok());
    ASSERT_TRUE((*log)->Save(std::nullopt, Range(1, 4, 1), std::nullopt, true).ok());
    log->reset();
    storage::BackendOptions bo;
    bo.dir = other.dir;
    auto b = storage::Backend::Open(bo);
    ASSERT_TRUE(b.ok());
    std::string k4;
    util::AppendBigEndian64(4, &k4);
    ASSERT_TRUE((*b)->Get(storage::Cf::kRaft, k4, &record).ok());
  }
  ASSERT_TRUE(Reopen().ok());
  Append(Range(1, 10, 3), Hs(3, 2));
  CorruptRecord(4, record);
  auto s = Reopen();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("raft log corrupt at index 4: term 1 is below the term 3 before it"),
            std::string::npos)
      << s;
}

}  // namespace
}  // namespace capstan::replication
