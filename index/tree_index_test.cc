// Copyright 2025 The Capstan Authors.
//
// TreeIndex: etcd's server/mvcc/index_test.go cases, copy-on-write and
// snapshot isolation, splits and merges, bulk loading. The randomized model
// test and the concurrency test live in tree_index_model_test.cc and
// tree_index_concurrency_test.cc.

#include "index/tree_index.h"

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "index/tree_index_test_util.h"

namespace capstan::index {
namespace {

using test_util::Dump;
using test_util::ExpectSameDump;
using test_util::kMaxRev;
using test_util::R;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

// Keys and modified revisions of Range(key, end, at).
std::vector<std::pair<std::string, Revision>> RangeOf(const IndexView& v, std::string_view key,
                                                      std::string_view end, int64_t at) {
  std::vector<std::pair<std::string, Revision>> out;
  v.Range(key, end, at, [&](std::string_view k, const RangeHit& hit) {
    out.emplace_back(std::string(k), hit.modified);
    return true;
  });
  return out;
}

TEST(TreeIndexTest, Get) {
  TreeIndex ti;
  ti.Put("foo", R(2));
  ti.Put("foo", R(4));
  ASSERT_TRUE(ti.Tombstone("foo", R(6)).ok());
  ti.Publish();
  const IndexSnapshot snap = ti.Snapshot();

  struct Case {
    int64_t rev;
    Revision wrev, wcreated;
    int64_t wver;
    bool found;
  };
  const std::vector<Case> cases = {
      {0, {}, {}, 0, false},    {1, {}, {}, 0, false},    {2, R(2), R(2), 1, true},
      {3, R(2), R(2), 1, true}, {4, R(4), R(2), 2, true}, {5, R(4), R(2), 2, true},
      {6, {}, {}, 0, false},
  };
  for (const Case& c : cases) {
    Revision rev, created;
    int64_t ver;
    const absl::Status s = snap.Get("foo", c.rev, &rev, &created, &ver);
    EXPECT_EQ(s.ok(), c.found) << c.rev;
    if (!c.found) {
      EXPECT_TRUE(absl::IsNotFound(s));
    }
    EXPECT_EQ(rev, c.wrev);
    EXPECT_EQ(created, c.wcreated);
    EXPECT_EQ(ver, c.wver);
  }
  Revision rev, created;
  int64_t ver;
  const absl::Status s = snap.Get("bar", 5, &rev, &created, &ver);
  EXPECT_TRUE(absl::IsNotFound(s));
  EXPECT_EQ(s.message(), "revision not found");
}

TEST(TreeIndexTest, Range) {
  TreeIndex ti;
  ti.Put("foo", R(1));
  ti.Put("foo1", R(2));
  ti.Put("foo2", R(3));
  ti.Publish();
  const IndexSnapshot s = ti.Snapshot();
  using KR = std::pair<std::string, Revision>;
  const KR foo{"foo", R(1)}, foo1{"foo1", R(2)}, foo2{"foo2", R(3)};

  EXPECT_THAT(RangeOf(s, "bar", "", 3), IsEmpty());
  EXPECT_THAT(RangeOf(s, "foo", "", 3), ElementsAre(foo));
  EXPECT_THAT(RangeOf(s, "foo", "foo1", 3), ElementsAre(foo));
  EXPECT_THAT(RangeOf(s, "foo", "foo2", 3), ElementsAre(foo, foo1));
  EXPECT_THAT(RangeOf(s, "foo", "fop", 3), ElementsAre(foo, foo1, foo2));
  EXPECT_THAT(RangeOf(s, "foo1", "fop", 3), ElementsAre(foo1, foo2));
  EXPECT_THAT(RangeOf(s, "foo2", "fop", 3), ElementsAre(foo2));
  EXPECT_THAT(RangeOf(s, "foo3", "fop", 3), IsEmpty());
  // "\0": every key >= key.
  EXPECT_THAT(RangeOf(s, "foo1", kRangeEndAll, 3), ElementsAre(foo1, foo2));
  EXPECT_THAT(RangeOf(s, "", kRangeEndAll, 3), ElementsAre(foo, foo1, foo2));
  // range_end <= key: nothing.
  EXPECT_THAT(RangeOf(s, "foo2", "foo", 3), IsEmpty());
  EXPECT_THAT(RangeOf(s, "foo", "foo", 3), IsEmpty());
  // Not yet created at rev 2.
  EXPECT_THAT(RangeOf(s, "foo", "fop", 2), ElementsAre(foo, foo1));

  EXPECT_EQ(s.Count("foo", "fop", 3), 3);
  EXPECT_EQ(s.Count("foo", "fop", 3, /*limit=*/2), 2);
  EXPECT_EQ(s.Count("foo", "", 3), 1);
  EXPECT_EQ(s.Count("bar", "", 3), 0);

  // The visitor stops the range.
  int visited = 0;
  s.Range("", kRangeEndAll, 3, [&](std::string_view, const RangeHit&) { return ++visited < 2; });
  EXPECT_EQ(visited, 2);
}

TEST(TreeIndexTest, RangeHitAndUnsignedKeyOrder) {
  TreeIndex ti;
  ti.Put("a\xff", R(1));
  ti.Put("a\x01", R(2));
  ti.Put(std::string("a\0", 2), R(3));
  ti.Put("a", R(4));
  ti.Put("a\x01", R(5));
  ti.Publish();
  std::vector<std::string> keys;
  std::vector<RangeHit> hits;
  ti.Snapshot().Range("a", "b", 5, [&](std::string_view k, const RangeHit& h) {
    keys.emplace_back(k);
    hits.push_back(h);
    return true;
  });
  EXPECT_THAT(keys, ElementsAre("a", std::string("a\0", 2), "a\x01", "a\xff"));
  EXPECT_EQ(hits[2].modified, R(5));
  EXPECT_EQ(hits[2].created, R(2));
  EXPECT_EQ(hits[2].version, 2);
}

TEST(TreeIndexTest, Tombstone) {
  TreeIndex ti;
  ti.Put("foo", R(1));
  ASSERT_TRUE(ti.Tombstone("foo", R(2)).ok());
  ti.Publish();
  Revision rev, created;
  int64_t ver;
  EXPECT_TRUE(absl::IsNotFound(ti.Snapshot().Get("foo", 2, &rev, &created, &ver)));
  EXPECT_TRUE(absl::IsNotFound(ti.Tombstone("foo", R(3))));
  EXPECT_TRUE(absl::IsNotFound(ti.Tombstone("bar", R(3))));
  EXPECT_EQ(ti.Snapshot().size(), 1u);  // dead until compacted
  EXPECT_EQ(ti.Snapshot().live(), 0u);
  ti.Put("foo", R(4));
  ti.Put("bar", R(5));
  ti.Put("foo", R(6));
  ti.Publish();
  EXPECT_EQ(ti.Snapshot().live(), 2u);
}

TEST(TreeIndexTest, RangeSince) {
  const std::vector<std::string> keys = {"foo", "foo1", "foo2", "foo2", "foo1", "foo"};
  TreeIndex ti;
  for (size_t i = 0; i < keys.size(); ++i) ti.Put(keys[i], R(i + 1));
  ti.Publish();
  const IndexSnapshot s = ti.Snapshot();
  const std::vector<Revision> all = {R(1), R(2), R(3), R(4), R(5), R(6)};

  EXPECT_THAT(s.RangeSince("bar", "", 1), IsEmpty());
  EXPECT_THAT(s.RangeSince("foo", "", 1), ElementsAre(R(1), R(6)));
  EXPECT_THAT(s.RangeSince("foo", "foo1", 1), ElementsAre(R(1), R(6)));
  EXPECT_THAT(s.RangeSince("foo", "foo2", 1), ElementsAre(R(1), R(2), R(5), R(6)));
  EXPECT_THAT(s.RangeSince("foo", "fop", 1), ElementsAreArray(all));
  EXPECT_THAT(s.RangeSince("foo1", "fop", 1), ElementsAre(R(2), R(3), R(4), R(5)));
  EXPECT_THAT(s.RangeSince("foo2", "fop", 1), ElementsAre(R(3), R(4)));
  EXPECT_THAT(s.RangeSince("foo3", "fop", 1), IsEmpty());

  // The per-key form.
  std::vector<std::pair<std::string, std::vector<Revision>>> per_key;
  s.RangeSince("foo", "fop", 3, [&](std::string_view k, std::span<const Revision> revs) {
    per_key.emplace_back(std::string(k), std::vector<Revision>(revs.begin(), revs.end()));
    return true;
  });
  EXPECT_THAT(per_key,
              ElementsAre(std::pair<std::string, std::vector<Revision>>{"foo", {R(6)}},
                          std::pair<std::string, std::vector<Revision>>{"foo1", {R(5)}},
                          std::pair<std::string, std::vector<Revision>>{"foo2", {R(3), R(4)}}));
}

// etcd's TestIndexCompactAndKeep: compacting every key (CompactKeys over all
// keys = etcd's treeIndex.Compact) reports what Keep reports and leaves the
// index that restoring only the kept revisions builds.
struct IndexOp {
  std::string key;
  bool remove;
  Revision rev, created;
  int64_t ver;
};

std::vector<IndexOp> CompactTestOps() {
  return {
      {"foo", false, R(1), R(1), 1},
      {"foo1", false, R(2), R(2), 1},
      {"foo2", false, R(3), R(3), 1},
      {"foo2", false, R(4), R(3), 2},
      {"foo", false, R(5), R(1), 2},
      {"foo1", false, R(6), R(2), 2},
      {"foo1", true, R(7), {}, 0},
      {"foo2", true, R(8), {}, 0},
      {"foo", true, R(9), {}, 0},
      {"foo", false, R(10, 0), R(10, 0), 1},
      {"foo1", false, R(10, 1), R(10, 1), 1},
  };
}

void Apply(TreeIndex* ti, const std::vector<IndexOp>& ops) {
  for (const IndexOp& op : ops) {
    if (op.remove) {
      ASSERT_TRUE(ti->Tombstone(op.key, op.rev).ok());
    } else {
      ti->Put(op.key, op.rev);
    }
  }
}

std::vector<std::string> AllKeys(const IndexView& v) {
  std::vector<std::string> keys;
  v.ForEach("", kRangeEndAll, [&](std::string_view k, const KeyIndex&) {
    keys.emplace_back(k);
    return true;
  });
  return keys;
}

void CheckCompactAndKeep(TreeIndex* ti, int64_t at, const std::vector<IndexOp>& ops) {
  SCOPED_TRACE(at);
  ti->Publish();
  RevisionSet keep;
  ti->Snapshot().Keep(at, &keep);
  RevisionSet am;
  const std::vector<std::string> keys = AllKeys(ti->Unpublished());
  ti->CompactKeys(keys, at, &am);
  // A tombstone at `at` stays, alone in its generation (etcd 3.5.16): Keep
  // leaves it out, and a restored index cannot hold it, so it is checked
  // apart.
  std::map<std::string, Revision> kept_tombstones;
  RevisionSet am_but_tombstones = am;
  for (const IndexOp& op : ops) {
    if (!op.remove || op.rev.main != at) continue;
    EXPECT_TRUE(am.contains(op.rev)) << op.key;
    kept_tombstones[op.key] = op.rev;
    am_but_tombstones.erase(op.rev);
  }
  EXPECT_EQ(am_but_tombstones, keep);

  TreeIndex want;
  for (const IndexOp& op : ops) {
    if (kept_tombstones.contains(op.key) && op.rev <= R(at)) continue;
    if (am.contains(op.rev) || op.rev > R(at)) {
      if (op.remove) {
        ASSERT_TRUE(want.Tombstone(op.key, op.rev).ok());
      } else {
        want.Restore(op.key, op.created, op.rev, op.ver);
      }
    }
  }
  const auto got = Dump(ti->Unpublished());
  const auto expected = Dump(want.Unpublished());
  size_t j = 0;
  for (const auto& [key, ki] : got) {
    const KeyIndex* w = nullptr;
    if (j < expected.size() && expected[j].first == key) w = &expected[j++].second;
    auto t = kept_tombstones.find(key);
    if (t == kept_tombstones.end()) {
      ASSERT_NE(w, nullptr) << key;
      EXPECT_TRUE(ki == *w) << key << ": " << ki.DebugString() << " vs " << w->DebugString();
      continue;
    }
    // The tombstone alone, then what the later revisions restore (or the
    // empty generation).
    const size_t later = w == nullptr ? 1 : w->generation_count();
    ASSERT_EQ(ki.generation_count(), 1 + later) << key << ": " << ki.DebugString();
    const auto first = ki.generation(0).revs;
    EXPECT_EQ(std::vector<Revision>(first.begin(), first.end()), std::vector<Revision>{t->second})
        << key << ": " << ki.DebugString();
    for (size_t g = 0; w != nullptr && g < later; ++g) {
      const auto a = ki.generation(g + 1), b = w->generation(g);
      EXPECT_EQ(std::vector<Revision>(a.revs.begin(), a.revs.end()),
                std::vector<Revision>(b.revs.begin(), b.revs.end()))
          << key << ": " << ki.DebugString() << " vs " << w->DebugString();
      if (!b.revs.empty()) EXPECT_EQ(a.version, b.version) << key;
    }
  }
  EXPECT_EQ(j, expected.size());
  EXPECT_TRUE(ti->Unpublished().TEST_Validate().ok());
}

TEST(TreeIndexTest, CompactAndKeepContinuous) {
  const std::vector<IndexOp> ops = CompactTestOps();
  TreeIndex ti;
  Apply(&ti, ops);
  for (int64_t i = 1; i < 20; ++i) CheckCompactAndKeep(&ti, i, ops);
}

TEST(TreeIndexTest, CompactAndKeepOnce) {
  const std::vector<IndexOp> ops = CompactTestOps();
  for (int64_t i = 1; i < 20; ++i) {
    TreeIndex ti;
    Apply(&ti, ops);
    CheckCompactAndKeep(&ti, i, ops);
  }
}

TEST(TreeIndexTest, KeysToCompactListsOnlyChangingKeys) {
  TreeIndex ti;
  ti.Put("a", R(1));  // single revision: nothing to drop
  ti.Put("b", R(2));
  ti.Put("b", R(3));  // R(2) goes at 3
  ti.Put("c", R(4));
  ASSERT_TRUE(ti.Tombstone("c", R(5)).ok());  // whole key goes at 5
  ti.Put("d", R(6));                          // created after the compaction
  ti.Publish();
  EXPECT_THAT(ti.Snapshot().KeysToCompact(5), ElementsAre("b", "c"));
  EXPECT_THAT(ti.Snapshot().KeysToCompact(2), IsEmpty());

  const std::vector<std::string> keys = ti.Snapshot().KeysToCompact(5);
  ti.CompactKeys(keys, 5, nullptr);
  ti.Publish();
  // c's tombstone at 5 stays until a later compaction (etcd 3.5.16).
  EXPECT_THAT(AllKeys(ti.Snapshot()), ElementsAre("a", "b", "c", "d"));
  EXPECT_EQ(ti.Snapshot().size(), 4u);
  EXPECT_EQ(ti.Snapshot().Count("", kRangeEndAll, 5), 2);
  EXPECT_THAT(ti.Snapshot().KeysToCompact(6), ElementsAre("c"));
  ti.CompactKeys(ti.Snapshot().KeysToCompact(6), 6, nullptr);
  ti.Publish();
  EXPECT_THAT(AllKeys(ti.Snapshot()), ElementsAre("a", "b", "d"));
  EXPECT_EQ(ti.Snapshot().size(), 3u);
}

// CompactKeys over keys already compacted at the same revision (a batched
// compaction that goes over them again) reports what the first pass kept,
// the tombstone at the compaction revision included, as etcd's
// treeIndex.Compact would; so does Retained on a snapshot of either state.
TEST(TreeIndexTest, CompactKeysAgainReportsWhatTheFirstPassKept) {
  TreeIndex ti;
  ti.Put("a", R(2));
  ASSERT_TRUE(ti.Tombstone("a", R(3)).ok());  // a tombstone at the compaction revision
  ti.Put("b", R(2, 1));
  ti.Put("b", R(4));
  ti.Put("c", R(5));
  ti.Publish();
  RevisionSet retained;
  ti.Snapshot().Retained(3, &retained);
  const std::vector<std::string> keys = AllKeys(ti.Snapshot());
  RevisionSet first;
  ti.CompactKeys(keys, 3, &first);
  EXPECT_EQ(first, (RevisionSet{R(3), R(2, 1)}));
  EXPECT_EQ(retained, first);
  ti.Publish();
  EXPECT_THAT(ti.Snapshot().KeysToCompact(3), IsEmpty());
  RevisionSet retained_after;
  ti.Snapshot().Retained(3, &retained_after);
  EXPECT_EQ(retained_after, first);
  RevisionSet second;
  ti.CompactKeys(keys, 3, &second);
  EXPECT_EQ(second, first);
}

TEST(TreeIndexTest, WritesAreInvisibleUntilPublish) {
  TreeIndex ti;
  EXPECT_TRUE(ti.Snapshot().empty());
  ti.Put("a", R(1));
  EXPECT_TRUE(ti.Snapshot().empty());
  EXPECT_EQ(ti.Unpublished().size(), 1u);
  ti.Publish();
  const IndexSnapshot s1 = ti.Snapshot();
  ti.Put("a", R(2));
  ti.Put("b", R(2, 1));
  EXPECT_EQ(ti.Snapshot().size(), 1u);
  EXPECT_EQ(ti.Snapshot().Find("a")->modified(), R(1));
  ti.Publish();
  const IndexSnapshot s2 = ti.Snapshot();
  EXPECT_EQ(s2.size(), 2u);
  EXPECT_EQ(s2.Find("a")->modified(), R(2));
  // s1 is unchanged.
  EXPECT_EQ(s1.size(), 1u);
  EXPECT_EQ(s1.Find("a")->modified(), R(1));
  EXPECT_EQ(s1.Find("b"), nullptr);
}

TEST(TreeIndexTest, SnapshotOutlivesIndexAndCopiesShareRoot) {
  IndexSnapshot s;
  {
    TreeIndex ti;
    for (int i = 0; i < 1000; ++i) ti.Put(absl::StrFormat("k%04d", i), R(i + 1));
    ti.Publish();
    s = ti.Snapshot();
  }
  IndexSnapshot copy = s;
  IndexSnapshot moved = std::move(s);
  EXPECT_TRUE(s.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(copy.size(), 1000u);
  EXPECT_EQ(moved.Count("", kRangeEndAll, kMaxRev), 1000);
  EXPECT_EQ(copy.Find("k0500"), moved.Find("k0500"));
}

// Entries the writer replaces or erases stay readable through every snapshot
// that may reach them, whatever order snapshots are released in and whether or
// not the index is still there (ASan checks the lifetimes in make sanitize).
TEST(TreeIndexTest, RetiredEntriesLiveAsLongAsSnapshotsReachThem) {
  auto ti = std::make_unique<TreeIndex>();
  int64_t rev = 0;
  for (int i = 0; i < 2000; ++i) ti->Put(absl::StrFormat("k%04d", i), R(++rev));
  ti->Publish();
  IndexSnapshot oldest = ti->Snapshot();
  const auto oldest_dump = Dump(oldest);

  // Every key replaced, half deleted: each entry is copied once and retired.
  for (int i = 0; i < 2000; ++i) {
    const std::string key = absl::StrFormat("k%04d", i);
    ti->Put(key, R(++rev));
    if (i % 2 == 0) {
      ASSERT_TRUE(ti->Tombstone(key, R(++rev)).ok());
    }
  }
  ti->Publish();
  IndexSnapshot middle = ti->Snapshot();
  const auto middle_dump = Dump(middle);

  // Compaction erases the deleted keys and copies the rest.
  std::vector<std::string> keys = ti->Snapshot().KeysToCompact(rev);
  ti->CompactKeys(keys, rev, nullptr);
  ti->Publish();
  IndexSnapshot newest = ti->Snapshot();
  const auto newest_dump = Dump(newest);
  ASSERT_EQ(newest.size(), 1000u);

  // The middle version goes first, then the oldest: each survivor still
  // reads what it read.
  middle = IndexSnapshot();
  ExpectSameDump(Dump(oldest), oldest_dump);
  ExpectSameDump(Dump(newest), newest_dump);
  for (int i = 1; i < 2000; i += 2) ti->Put(absl::StrFormat("k%04d", i), R(++rev));
  ti->Publish();
  oldest = IndexSnapshot();
  ExpectSameDump(Dump(newest), newest_dump);

  // The index goes with writes left unpublished; the snapshots stay valid.
  IndexSnapshot latest = ti->Snapshot();
  const auto latest_dump = Dump(latest);
  for (int i = 1; i < 2000; i += 2) ti->Put(absl::StrFormat("k%04d", i), R(++rev));
  ti.reset();
  ExpectSameDump(Dump(newest), newest_dump);
  ExpectSameDump(Dump(latest), latest_dump);
  EXPECT_EQ(middle_dump.size(), 2000u);
}

// Between publishes each touched node and entry is copied once; neighbours'
// KeyIndexes stay shared with the published snapshot.
TEST(TreeIndexTest, CopyOnWriteCopiesEachPathOnce) {
  TreeIndex ti;
  for (int i = 0; i < 20000; ++i) ti.Put(absl::StrFormat("k%05d", i), R(i + 1));
  ti.Publish();
  const IndexSnapshot before = ti.Snapshot();
  const int height = before.TEST_Height();
  ASSERT_GE(height, 3);

  const TreeIndex::WriteStats s0 = ti.TEST_write_stats();
  ti.Put("k00100", R(30000));
  const TreeIndex::WriteStats s1 = ti.TEST_write_stats();
  EXPECT_EQ(s1.nodes_copied - s0.nodes_copied, static_cast<uint64_t>(height));
  EXPECT_EQ(s1.entries_copied - s0.entries_copied, 1u);

  // More writes to the same key and to a neighbour in the same leaf copy only
  // the neighbour's entry.
  ti.Put("k00100", R(30001));
  ti.Put("k00101", R(30002));
  const TreeIndex::WriteStats s2 = ti.TEST_write_stats();
  EXPECT_EQ(s2.nodes_copied - s1.nodes_copied, 0u);
  EXPECT_EQ(s2.entries_copied - s1.entries_copied, 1u);

  // Untouched keys share their KeyIndex with the snapshot; touched ones do not.
  const IndexView live = ti.Unpublished();
  EXPECT_EQ(live.Find("k00102"), before.Find("k00102"));
  EXPECT_EQ(live.Find("k00099"), before.Find("k00099"));
  EXPECT_NE(live.Find("k00100"), before.Find("k00100"));
  EXPECT_EQ(before.Find("k00100")->modified(), R(101));
  EXPECT_EQ(live.Find("k00100")->modified(), R(30001));

  // After a publish, the next write copies again.
  ti.Publish();
  ti.Put("k00100", R(30003));
  EXPECT_EQ(ti.TEST_write_stats().nodes_copied - s2.nodes_copied, static_cast<uint64_t>(height));
}

TEST(TreeIndexTest, FailedTombstoneCopiesNothing) {
  TreeIndex ti;
  ti.Put("a", R(1));
  ASSERT_TRUE(ti.Tombstone("a", R(2)).ok());
  ti.Publish();
  const TreeIndex::WriteStats s0 = ti.TEST_write_stats();
  EXPECT_TRUE(absl::IsNotFound(ti.Tombstone("a", R(3))));
  EXPECT_TRUE(absl::IsNotFound(ti.Tombstone("zz", R(3))));
  EXPECT_EQ(ti.TEST_write_stats().nodes_copied, s0.nodes_copied);
  EXPECT_EQ(ti.TEST_write_stats().entries_copied, s0.entries_copied);
}

TEST(TreeIndexTest, SplitsAndMergesKeepInvariants) {
  std::mt19937_64 rng(7);
  TreeIndex ti;
  std::vector<std::string> keys;
  for (int i = 0; i < 50000; ++i) keys.push_back(absl::StrFormat("key/%08x", rng()));
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<std::string> shuffled = keys;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);
  int64_t rev = 0;
  for (size_t i = 0; i < shuffled.size(); ++i) {
    ti.Put(shuffled[i], R(++rev));
    if (i % 997 == 0) ti.Publish();
  }
  ti.Publish();
  const IndexSnapshot full = ti.Snapshot();
  ASSERT_TRUE(full.TEST_Validate().ok()) << full.TEST_Validate();
  EXPECT_EQ(AllKeys(full), keys);

  // Delete 95% of the keys, compact them away in batches, publishing between.
  std::vector<std::string> kept;
  for (const std::string& k : shuffled) {
    if (rng() % 20 == 0) {
      kept.push_back(k);
    } else {
      ASSERT_TRUE(ti.Tombstone(k, R(++rev)).ok());
    }
  }
  std::sort(kept.begin(), kept.end());
  ti.Publish();
  // Above the last tombstone, which a compaction at its revision would keep.
  const std::vector<std::string> to_compact = ti.Snapshot().KeysToCompact(rev + 1);
  EXPECT_EQ(to_compact.size(), keys.size() - kept.size());
  for (size_t i = 0; i < to_compact.size(); i += 1000) {
    const size_t n = std::min<size_t>(1000, to_compact.size() - i);
    ti.CompactKeys(std::span<const std::string>(to_compact).subspan(i, n), rev + 1, nullptr);
    if (i % 5000 == 0) {
      ASSERT_TRUE(ti.Unpublished().TEST_Validate().ok()) << ti.Unpublished().TEST_Validate();
    }
    ti.Publish();
  }
  const IndexSnapshot after = ti.Snapshot();
  ASSERT_TRUE(after.TEST_Validate().ok()) << after.TEST_Validate();
  EXPECT_EQ(AllKeys(after), kept);
  EXPECT_LE(after.TEST_Height(), full.TEST_Height());
  // The old snapshot is untouched.
  ASSERT_TRUE(full.TEST_Validate().ok());
  EXPECT_EQ(AllKeys(full), keys);
  EXPECT_EQ(full.Count("", kRangeEndAll, static_cast<int64_t>(shuffled.size())),
            static_cast<int64_t>(keys.size()));

  // Compact everything else away: the index ends empty.
  for (const std::string& k : kept) ASSERT_TRUE(ti.Tombstone(k, R(++rev)).ok());
  const std::vector<std::string> rest = ti.Unpublished().KeysToCompact(rev + 1);
  ti.CompactKeys(rest, rev + 1, nullptr);
  ti.Publish();
  EXPECT_TRUE(ti.Snapshot().empty());
  EXPECT_EQ(ti.Snapshot().TEST_Height(), 0);
  ti.Put("again", R(++rev));
  ti.Publish();
  EXPECT_THAT(AllKeys(ti.Snapshot()), ElementsAre("again"));
}

TEST(TreeIndexTest, AscendingPutsFillNodes) {
  TreeIndex ti;
  const int n = 64 * 64 * 4;
  for (int i = 0; i < n; ++i) ti.Put(absl::StrFormat("k%07d", i), R(i + 1));
  ti.Publish();
  const IndexSnapshot s = ti.Snapshot();
  ASSERT_TRUE(s.TEST_Validate().ok()) << s.TEST_Validate();
  EXPECT_EQ(s.TEST_Height(), 3);  // full nodes: 64 leaves per inner node
  EXPECT_EQ(s.size(), static_cast<size_t>(n));
}

TEST(TreeIndexTest, LoadSortedMatchesPuts) {
  TreeIndex by_put;
  std::vector<std::pair<std::string, KeyIndex>> entries;
  for (int i = 0; i < 10000; ++i) {
    const std::string key = absl::StrFormat("k%05d", i);
    KeyIndex ki;
    ki.Put(R(i + 1));
    by_put.Put(key, R(i + 1));
    if (i % 3 == 0) {
      ASSERT_TRUE(ki.Tombstone(R(20000 + i)).ok());
      ASSERT_TRUE(by_put.Tombstone(key, R(20000 + i)).ok());
    }
    entries.emplace_back(key, std::move(ki));
  }
  TreeIndex loaded;
  loaded.LoadSorted(std::move(entries));
  ASSERT_TRUE(loaded.Unpublished().TEST_Validate().ok());
  const auto a = Dump(loaded.Unpublished());
  const auto b = Dump(by_put.Unpublished());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    ASSERT_TRUE(a[i].second == b[i].second) << a[i].first;
  }
  // The loaded tree takes further writes and compactions.
  loaded.Publish();
  for (int i = 0; i < 10000; i += 7) loaded.Put(absl::StrFormat("k%05d", i), R(40000 + i));
  loaded.Put("k99999", R(60000));
  const std::vector<std::string> keys = loaded.Unpublished().KeysToCompact(50000);
  loaded.CompactKeys(keys, 50000, nullptr);
  ASSERT_TRUE(loaded.Unpublished().TEST_Validate().ok()) << loaded.Unpublished().TEST_Validate();
}

TEST(TreeIndexTest, RestoreFollowsEtcdRestoreIntoIndex) {
  TreeIndex ti;
  ti.Restore("a", R(3), R(7), 4);  // first time seen: restore
  ti.Restore("a", R(3), R(9), 5);  // seen again: put
  ASSERT_TRUE(ti.Tombstone("a", R(10)).ok());
  const KeyIndex* ki = ti.Unpublished().Find("a");
  ASSERT_NE(ki, nullptr);
  EXPECT_EQ(ki->DebugString(), "modified={10,0} [created={3,0} ver=6 revs={7,0}{9,0}{10,0}] []");
}

TEST(TreeIndexDeathTest, PutSmallerRevisionCrashes) {
  TreeIndex ti;
  ti.Put("a", R(5));
  EXPECT_DEATH(ti.Put("a", R(4)), "unexpected smaller revision");
}

TEST(TreeIndexDeathTest, LoadSortedRejectsUnsortedKeys) {
  std::vector<std::pair<std::string, KeyIndex>> entries(2);
  entries[0].first = "b";
  entries[0].second.Put(R(1));
  entries[1].first = "a";
  entries[1].second.Put(R(2));
  TreeIndex ti;
  EXPECT_DEATH(ti.LoadSorted(std::move(entries)), "not strictly ascending");
}

}  // namespace
// Range reports the lease of each hit's put when the index knows it.
TEST(TreeIndexTest, RangeHitLease) {
  TreeIndex ti;
  ti.Put("a", Revision{1, 0}, 5);
  ti.Put("b", Revision{2, 0});
  ti.Put("a", Revision{3, 0});  // detached
  ti.Restore("c", Revision{4, 0}, Revision{4, 0}, 1, 9);
  ti.Publish();
  struct Seen {
    std::string key;
    int64_t lease;
    bool known;
  };
  auto range = [&](int64_t rev) {
    std::vector<Seen> seen;
    ti.Snapshot().Range("a", kRangeEndAll, rev, [&](std::string_view k, const RangeHit& hit) {
      seen.push_back({std::string(k), hit.lease, hit.lease_known});
      return true;
    });
    return seen;
  };
  auto now = range(4);
  ASSERT_EQ(now.size(), 3u);
  EXPECT_TRUE(now[0].known && now[0].lease == 0);
  EXPECT_TRUE(now[1].known && now[1].lease == 0);
  EXPECT_TRUE(now[2].known && now[2].lease == 9);
  auto before = range(2);
  ASSERT_EQ(before.size(), 2u);
  EXPECT_FALSE(before[0].known);  // "a" at 1 had lease 5: only its record says so
  EXPECT_TRUE(before[1].known);
}

}  // namespace capstan::index
