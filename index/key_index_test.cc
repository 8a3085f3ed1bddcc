// Copyright 2025 The Capstan Authors.
//
// KeyIndex against the cases of etcd's server/mvcc/key_index_test.go, plus a
// randomized check of compaction against the key's full history.

#include "index/key_index.h"

#include <map>
#include <memory>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace capstan::index {
namespace {

using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

struct Gen {
  Revision created;
  int64_t version = 0;
  std::vector<Revision> revs;
};

// Checks `ki` against etcd's expected keyIndex{modified, generations}.
void ExpectKeyIndex(const KeyIndex& ki, Revision modified, const std::vector<Gen>& gens) {
  SCOPED_TRACE(ki.DebugString());
  EXPECT_EQ(ki.modified(), modified);
  ASSERT_EQ(ki.generation_count(), gens.size());
  for (size_t i = 0; i < gens.size(); ++i) {
    const KeyIndex::Generation g = ki.generation(i);
    EXPECT_EQ(g.created, gens[i].created) << "generation " << i;
    EXPECT_EQ(g.version, gens[i].version) << "generation " << i;
    EXPECT_THAT(std::vector<Revision>(g.revs.begin(), g.revs.end()), ElementsAreArray(gens[i].revs))
        << "generation " << i;
  }
}

Revision R(int64_t main, int64_t sub = 0) { return Revision{main, sub}; }

// etcd's newTestKeyIndex:
//    {empty}
//    {{14, 0}[1], {15, 1}[2], {16, 0}(t)[3]}
//    {{8, 0}[1], {10, 0}[2], {12, 0}(t)[3]}
//    {{2, 0}[1], {4, 0}[2], {6, 0}(t)[3]}
KeyIndex NewTestKeyIndex() {
  KeyIndex ki;
  ki.Put(R(2));
  ki.Put(R(4));
  EXPECT_TRUE(ki.Tombstone(R(6)).ok());
  ki.Put(R(8));
  ki.Put(R(10));
  EXPECT_TRUE(ki.Tombstone(R(12)).ok());
  ki.Put(R(14));
  ki.Put(R(15, 1));
  EXPECT_TRUE(ki.Tombstone(R(16)).ok());
  return ki;
}

TEST(RevisionTest, OrderAndHash) {
  EXPECT_LT(R(1, 5), R(2, 0));
  EXPECT_LT(R(2, 0), R(2, 1));
  EXPECT_EQ(R(3, 4), R(3, 4));
  RevisionSet set{R(1), R(1), R(1, 1)};
  EXPECT_EQ(set.size(), 2u);
}

TEST(KeyIndexTest, Get) {
  KeyIndex ki = NewTestKeyIndex();
  RevisionSet am;
  ki.Compact(4, &am);

  struct Case {
    int64_t rev;
    Revision wmod, wcreat;
    int64_t wver;
    bool found;
  };
  const std::vector<Case> cases = {
      {17, {}, {}, 0, false},
      {16, {}, {}, 0, false},
      // get on generation 3
      {15, R(15, 1), R(14), 2, true},
      {14, R(14), R(14), 1, true},
      {13, {}, {}, 0, false},
      {12, {}, {}, 0, false},
      // get on generation 2
      {11, R(10), R(8), 2, true},
      {10, R(10), R(8), 2, true},
      {9, R(8), R(8), 1, true},
      {8, R(8), R(8), 1, true},
      {7, {}, {}, 0, false},
      {6, {}, {}, 0, false},
      // get on generation 1
      {5, R(4), R(2), 2, true},
      {4, R(4), R(2), 2, true},
      {3, {}, {}, 0, false},
      {2, {}, {}, 0, false},
      {1, {}, {}, 0, false},
      {0, {}, {}, 0, false},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.rev);
    Revision mod, creat;
    int64_t ver;
    const absl::Status s = ki.Get(c.rev, &mod, &creat, &ver);
    if (c.found) {
      EXPECT_TRUE(s.ok()) << s;
    } else {
      EXPECT_TRUE(absl::IsNotFound(s)) << s;
      EXPECT_EQ(s.message(), "revision not found");
    }
    EXPECT_EQ(mod, c.wmod);
    EXPECT_EQ(creat, c.wcreat);
    EXPECT_EQ(ver, c.wver);
  }
}

// etcd's TestKeyIndexFindGeneration, observed through Get on the uncompacted
// index: the key exists at 2..5, 8..11 and 14..15 only.
TEST(KeyIndexTest, FindGeneration) {
  const KeyIndex ki = NewTestKeyIndex();
  for (int64_t rev = 0; rev <= 17; ++rev) {
    Revision mod, creat;
    int64_t ver;
    const bool want = (rev >= 2 && rev <= 5) || (rev >= 8 && rev <= 11) || (rev >= 14 && rev <= 15);
    EXPECT_EQ(ki.Get(rev, &mod, &creat, &ver).ok(), want) << rev;
  }
}

// AliveAt answers what Lookup does, on dead and live keys and after a
// compaction dropped old generations.
TEST(KeyIndexTest, AliveAtIsLookup) {
  KeyIndex live = NewTestKeyIndex();
  live.Put(R(18));
  KeyIndex compacted = NewTestKeyIndex();
  compacted.Compact(9, nullptr);
  for (const KeyIndex* ki : {&live, &compacted}) {
    const KeyIndex dead = NewTestKeyIndex();
    for (const KeyIndex* k : {ki, &dead}) {
      for (int64_t rev = 0; rev <= 20; ++rev) {
        Revision mod, creat;
        int64_t ver;
        EXPECT_EQ(k->AliveAt(rev), k->Lookup(rev, &mod, &creat, &ver))
            << rev << " " << k->DebugString();
      }
    }
  }
  EXPECT_TRUE(live.AliveAt(18));
  EXPECT_FALSE(NewTestKeyIndex().AliveAt(17));
}

TEST(KeyIndexTest, Since) {
  KeyIndex ki = NewTestKeyIndex();
  RevisionSet am;
  ki.Compact(4, &am);

  const std::vector<Revision> all = {R(4), R(6), R(8), R(10), R(12), R(14), R(15, 1), R(16)};
  auto from = [&](size_t i) { return std::vector<Revision>(all.begin() + i, all.end()); };
  const std::vector<std::pair<int64_t, std::vector<Revision>>> cases = {
      {17, {}},      {16, from(7)}, {15, from(6)}, {14, from(5)}, {13, from(5)}, {12, from(4)},
      {11, from(4)}, {10, from(3)}, {9, from(3)},  {8, from(2)},  {7, from(2)},  {6, from(1)},
      {5, from(1)},  {4, all},      {3, all},      {2, all},      {1, all},      {0, all},
  };
  for (const auto& [rev, want] : cases) {
    EXPECT_EQ(ki.Since(rev), want) << rev;
  }
}

TEST(KeyIndexTest, SinceKeepsLargestSubRevision) {
  KeyIndex ki;
  ki.Put(R(5, 0));
  ki.Put(R(5, 2));
  ki.Put(R(6, 0));
  ASSERT_TRUE(ki.Tombstone(R(6, 3)).ok());
  ki.Put(R(7, 1));
  EXPECT_EQ(ki.Since(0), (std::vector<Revision>{R(5, 2), R(6, 3), R(7, 1)}));
  EXPECT_EQ(ki.Since(7), (std::vector<Revision>{R(7, 1)}));
  EXPECT_THAT(KeyIndex().Since(0), IsEmpty());
}

TEST(KeyIndexTest, Put) {
  KeyIndex ki;
  ki.Put(R(5));
  ExpectKeyIndex(ki, R(5), {{R(5), 1, {R(5)}}});
  ki.Put(R(7));
  ExpectKeyIndex(ki, R(7), {{R(5), 2, {R(5), R(7)}}});
}

TEST(KeyIndexTest, Restore) {
  KeyIndex ki;
  ki.Restore(R(5), R(7), 2);
  ExpectKeyIndex(ki, R(7), {{R(5), 2, {R(7)}}});
}

TEST(KeyIndexTest, Tombstone) {
  KeyIndex ki;
  ki.Put(R(5));
  ASSERT_TRUE(ki.Tombstone(R(7)).ok());
  ExpectKeyIndex(ki, R(7), {{R(5), 2, {R(5), R(7)}}, {}});

  ki.Put(R(8));
  ki.Put(R(9));
  ASSERT_TRUE(ki.Tombstone(R(15)).ok());
  ExpectKeyIndex(ki, R(15), {{R(5), 2, {R(5), R(7)}}, {R(8), 3, {R(8), R(9), R(15)}}, {}});

  const absl::Status s = ki.Tombstone(R(16));
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_EQ(s.message(), "revision not found");
  EXPECT_EQ(ki.modified(), R(15));
}

TEST(KeyIndexTest, TombstoneOnNewIndexIsNotFound) {
  KeyIndex ki;
  EXPECT_TRUE(absl::IsNotFound(ki.Tombstone(R(1))));
  EXPECT_EQ(ki.generation_count(), 0u);
}

struct CompactCase {
  int64_t compact;
  std::vector<Gen> wgens;
  RevisionSet wam;
  // The compaction revision is a tombstone: Compact keeps it, Keep does not.
  bool at_tombstone = false;
};

// etcd 3.5.16's TestKeyIndexCompactAndKeep table (a tombstone at the
// compaction revision stays); modified is {16,0} throughout.
std::vector<CompactCase> CompactCases() {
  const Gen g1{R(2), 3, {R(2), R(4), R(6)}};
  const Gen g1_4{R(2), 3, {R(4), R(6)}};
  const Gen g2{R(8), 3, {R(8), R(10), R(12)}};
  const Gen g2_10{R(8), 3, {R(10), R(12)}};
  const Gen g3{R(14), 3, {R(14), R(15, 1), R(16)}};
  const Gen g3_15{R(14), 3, {R(15, 1), R(16)}};
  const Gen g1_6{R(2), 3, {R(6)}};
  const Gen g2_12{R(8), 3, {R(12)}};
  const Gen g3_16{R(14), 3, {R(16)}};
  const Gen empty{};
  return {
      {1, {g1, g2, g3, empty}, {}},
      {2, {g1, g2, g3, empty}, {R(2)}},
      {3, {g1, g2, g3, empty}, {R(2)}},
      {4, {g1_4, g2, g3, empty}, {R(4)}},
      {5, {g1_4, g2, g3, empty}, {R(4)}},
      {6, {g1_6, g2, g3, empty}, {R(6)}, true},
      {7, {g2, g3, empty}, {}},
      {8, {g2, g3, empty}, {R(8)}},
      {9, {g2, g3, empty}, {R(8)}},
      {10, {g2_10, g3, empty}, {R(10)}},
      {11, {g2_10, g3, empty}, {R(10)}},
      {12, {g2_12, g3, empty}, {R(12)}, true},
      {13, {g3, empty}, {}},
      {14, {g3, empty}, {R(14)}},
      {15, {g3_15, empty}, {R(15, 1)}},
      {16, {g3_16, empty}, {R(16)}, true},
      {17, {empty}, {}},
  };
}

void CheckKeepThenCompact(KeyIndex* ki, const CompactCase& c) {
  SCOPED_TRACE(c.compact);
  const KeyIndex before = *ki;
  RevisionSet am;
  ki->Keep(c.compact, &am);
  EXPECT_TRUE(*ki == before) << "keep changed the index";
  EXPECT_EQ(am, c.at_tombstone ? RevisionSet{} : c.wam);
  am.clear();
  ki->Compact(c.compact, &am);
  // etcd's keyIndex keeps its modified revision when compacted to nothing;
  // a KeyIndex derives it from its revisions (the tree drops an empty one).
  ExpectKeyIndex(*ki, ki->IsEmpty() ? Revision{} : R(16), c.wgens);
  EXPECT_EQ(am, c.wam);
}

TEST(KeyIndexTest, CompactAndKeepContinuous) {
  KeyIndex ki = NewTestKeyIndex();
  for (const CompactCase& c : CompactCases()) CheckKeepThenCompact(&ki, c);
  EXPECT_TRUE(ki.IsEmpty());
}

TEST(KeyIndexTest, CompactAndKeepJump) {
  KeyIndex ki = NewTestKeyIndex();
  const std::vector<CompactCase> cases = CompactCases();
  for (size_t i = 0; i < cases.size(); ++i) {
    if ((i % 2 == 0 && i < 6) || (i % 2 == 1 && i > 6)) CheckKeepThenCompact(&ki, cases[i]);
  }
}

TEST(KeyIndexTest, CompactAndKeepOnce) {
  for (const CompactCase& c : CompactCases()) {
    KeyIndex ki = NewTestKeyIndex();
    CheckKeepThenCompact(&ki, c);
  }
}

TEST(KeyIndexTest, CompactOnFurtherRev) {
  KeyIndex ki;
  ki.Put(R(1));
  ki.Put(R(2));
  RevisionSet am;
  ki.Compact(3, &am);
  ExpectKeyIndex(ki, R(2), {{R(1), 2, {R(2)}}});
  EXPECT_EQ(am, (RevisionSet{R(2)}));
}

TEST(KeyIndexTest, IsEmpty) {
  EXPECT_TRUE(KeyIndex().IsEmpty());
  KeyIndex ki;
  ki.Put(R(1));
  ki.Put(R(2));
  RevisionSet am;
  ki.Compact(3, &am);
  EXPECT_FALSE(ki.IsEmpty());
  ASSERT_TRUE(ki.Tombstone(R(4)).ok());
  // The tombstone at the compaction revision stays until the next one.
  ki.Compact(4, &am);
  EXPECT_FALSE(ki.IsEmpty());
  EXPECT_FALSE(ki.AliveAt(4));
  ki.Compact(5, &am);
  EXPECT_TRUE(ki.IsEmpty());
}

// A key deleted and created again in the compaction revision (one txn):
// its value at that revision stays, the tombstone goes (etcd 3.5.16 keeps
// the tombstone and loses the value, etcd-io/etcd#22376).
TEST(KeyIndexTest, CompactKeepsAKeyRecreatedAtTheCompactionRevision) {
  KeyIndex ki;
  ki.Put(R(4));
  ASSERT_TRUE(ki.Tombstone(R(7, 2)).ok());
  ki.Put(R(7, 5));
  RevisionSet keep, am;
  ki.Keep(7, &keep);
  EXPECT_EQ(keep, (RevisionSet{R(7, 5)}));
  EXPECT_TRUE(ki.NeedsCompaction(7));
  ki.Compact(7, &am);
  EXPECT_EQ(am, (RevisionSet{R(7, 5)}));
  ExpectKeyIndex(ki, R(7, 5), {{R(7, 5), 1, {R(7, 5)}}});
  Revision mod, created;
  int64_t ver;
  ASSERT_TRUE(ki.Get(7, &mod, &created, &ver).ok());
  EXPECT_EQ(mod, R(7, 5));
}

TEST(KeyIndexTest, NeedsCompactionMatchesCompact) {
  for (int64_t at = 0; at <= 17; ++at) {
    const KeyIndex ki = NewTestKeyIndex();
    KeyIndex compacted = ki;
    compacted.Compact(at, nullptr);
    EXPECT_EQ(ki.NeedsCompaction(at), !(compacted == ki)) << at;
  }
}

// Retained reports what Compact keeps, and reports it again once the index
// is compacted: a compaction that goes over keys it has compacted already
// (resumed, or run a second time) must still keep the tombstone at its
// revision, which Keep on the compacted index leaves out.
TEST(KeyIndexTest, RetainedIsWhatCompactKeepsBeforeAndAfterIt) {
  for (int64_t at = 0; at <= 17; ++at) {
    SCOPED_TRACE(at);
    KeyIndex ki = NewTestKeyIndex();
    RevisionSet retained, available, again, compacted_again;
    ki.Retained(at, &retained);
    ki.Compact(at, &available);
    EXPECT_EQ(retained, available);
    if (ki.IsEmpty()) continue;
    ki.Retained(at, &again);
    EXPECT_EQ(again, available);
    EXPECT_FALSE(ki.NeedsCompaction(at));
    ki.Compact(at, &compacted_again);
    EXPECT_EQ(compacted_again, available);
  }
  // The tombstone at the compaction revision, alone in its generation.
  KeyIndex ki = NewTestKeyIndex();
  ki.Compact(6, nullptr);
  RevisionSet keep, retained;
  ki.Keep(6, &keep);
  ki.Retained(6, &retained);
  EXPECT_EQ(keep, RevisionSet{});
  EXPECT_EQ(retained, RevisionSet{R(6)});
}

TEST(KeyIndexDeathTest, PutSmallerRevisionCrashes) {
  KeyIndex ki;
  ki.Put(R(5, 1));
  EXPECT_DEATH(ki.Put(R(5, 1)), "unexpected smaller revision");
  EXPECT_DEATH(ki.Put(R(4, 9)), "unexpected smaller revision");
}

TEST(KeyIndexDeathTest, CompactEmptyCrashes) {
  KeyIndex ki;
  EXPECT_DEATH(ki.Compact(1, nullptr), "unexpected empty keyIndex");
}

TEST(KeyIndexDeathTest, RestoreTwiceCrashes) {
  KeyIndex ki;
  ki.Restore(R(1), R(2), 2);
  EXPECT_DEATH(ki.Restore(R(1), R(3), 3), "non-empty generations");
}

// One change of a key, for the history model below.
struct Op {
  Revision rev;
  bool tombstone;
};

// The state of a key at `at` derived from its whole history: what Get must
// answer for any `at` at or above the last compaction.
bool HistoryGet(const std::vector<Op>& ops, int64_t at, Revision* mod, Revision* created,
                int64_t* ver) {
  ptrdiff_t last = -1;
  for (size_t i = 0; i < ops.size() && ops[i].rev.main <= at; ++i) last = i;
  if (last < 0 || ops[last].tombstone) return false;
  ptrdiff_t first = last;
  while (first > 0 && !ops[first - 1].tombstone) --first;
  *mod = ops[last].rev;
  *created = ops[first].rev;
  *ver = last - first + 1;
  return true;
}

// Random puts, tombstones and compactions of one key: Get at and above the
// compaction revision, Since above it, and Keep == Compact's available but
// for a tombstone at the compaction revision, all hold throughout.
TEST(KeyIndexTest, RandomAgainstHistory) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 300; ++round) {
    auto ki = std::make_unique<KeyIndex>();
    std::vector<Op> ops;
    int64_t main = 0;
    int64_t floor = 0;
    for (int step = 0; step < 60; ++step) {
      const int what = static_cast<int>(rng() % 10);
      if (what < 6) {
        main += 1 + rng() % 2;
        const Revision rev = R(main, rng() % 2);
        ki->Put(rev);
        ops.push_back({rev, false});
      } else if (what < 8) {
        main += 1;
        const Revision rev = R(main, rng() % 2);
        if (ki->Tombstone(rev).ok()) ops.push_back({rev, true});
      } else if (!ki->IsEmpty() && main > floor) {
        const int64_t at = floor + static_cast<int64_t>(rng() % (main - floor + 1));
        RevisionSet keep, avail, retained, retained_after;
        ki->Keep(at, &keep);
        ki->Retained(at, &retained);
        const KeyIndex before = *ki;
        ki->Compact(at, &avail);
        EXPECT_EQ(retained, avail);
        if (!ki->IsEmpty()) {
          ki->Retained(at, &retained_after);
          EXPECT_EQ(retained_after, avail);
        }
        // Compact keeps a tombstone at `at`, which Keep leaves out.
        for (const Op& op : ops) {
          if (op.tombstone && op.rev.main == at) avail.erase(op.rev);
        }
        EXPECT_EQ(keep, avail);
        EXPECT_EQ(before.NeedsCompaction(at), !(before == *ki));
        floor = at;
        if (ki->IsEmpty()) {
          // The owner drops an empty index; a later put starts afresh.
          ki = std::make_unique<KeyIndex>();
        }
      }
      for (int64_t at = floor; at <= main + 1; ++at) {
        Revision m1, c1, m2, c2;
        int64_t v1, v2;
        const bool want = HistoryGet(ops, at, &m1, &c1, &v1);
        ASSERT_EQ(ki->Get(at, &m2, &c2, &v2).ok(), want) << "at " << at << " " << ki->DebugString();
        if (want) {
          EXPECT_EQ(m1, m2);
          EXPECT_EQ(c1, c2);
          EXPECT_EQ(v1, v2);
        }
      }
      for (int64_t since = floor + 1; since <= main + 1; ++since) {
        std::vector<Revision> want;
        for (const Op& op : ops) {
          if (op.rev.main < since) continue;
          if (!want.empty() && want.back().main == op.rev.main) {
            want.back() = op.rev;
          } else {
            want.push_back(op.rev);
          }
        }
        ASSERT_EQ(ki->Since(since), want) << "since " << since << " " << ki->DebugString();
      }
    }
  }
}

}  // namespace
// The lease of a put is known from the put that last changed the lease on;
// a tombstone changes nothing, a restore knows only its own put.
TEST(KeyIndexTest, LeaseOf) {
  auto lease_of = [](const KeyIndex& ki, Revision put) -> int64_t {
    int64_t lease = -1;
    return ki.LeaseOf(put, &lease) ? lease : -1;  // -1: not known
  };
  KeyIndex ki;
  ki.Put(R(2));  // no lease ever: every put known
  ki.Put(R(3));
  EXPECT_EQ(lease_of(ki, R(2)), 0);
  EXPECT_EQ(ki.lease_since(), 0);
  ki.Put(R(4), 7);  // attached
  EXPECT_EQ(lease_of(ki, R(2)), -1);
  EXPECT_EQ(lease_of(ki, R(3)), -1);
  EXPECT_EQ(lease_of(ki, R(4)), 7);
  ki.Put(R(5), 7);  // the same lease: the mark stays
  EXPECT_EQ(lease_of(ki, R(4)), 7);
  EXPECT_EQ(lease_of(ki, R(5)), 7);
  ASSERT_TRUE(ki.Tombstone(R(6)).ok());
  EXPECT_EQ(ki.lease(), 7);  // a tombstone is not a put
  ki.Put(R(7), 7);           // re-created with the same lease
  EXPECT_EQ(lease_of(ki, R(4)), 7);
  EXPECT_EQ(lease_of(ki, R(7)), 7);
  ki.Put(R(8, 1));  // detached, in the middle of a request
  EXPECT_EQ(lease_of(ki, R(7)), -1);
  EXPECT_EQ(lease_of(ki, R(8, 1)), 0);
  EXPECT_EQ(ki.lease_since(), 8);
  EXPECT_THAT(ki.DebugString(), ::testing::HasSubstr(" lease=0 since=8"));

  // Compaction keeps the marks: a kept older put is still read from its
  // record.
  KeyIndex copy = ki;
  ki.Compact(7, nullptr);
  EXPECT_EQ(lease_of(ki, R(7)), -1);
  EXPECT_EQ(lease_of(ki, R(8, 1)), 0);
  EXPECT_FALSE(ki == copy);
  copy.Compact(7, nullptr);
  EXPECT_TRUE(ki == copy);

  KeyIndex restored;
  restored.Restore(R(3), R(9), 4, 7);
  EXPECT_EQ(lease_of(restored, R(9)), 7);
  restored.Put(R(10), 7);
  EXPECT_EQ(lease_of(restored, R(9)), 7);
  restored.Put(R(11), 0);
  EXPECT_EQ(lease_of(restored, R(10)), -1);
  KeyIndex unleased;
  unleased.Restore(R(3), R(9), 4);
  EXPECT_EQ(lease_of(unleased, R(9)), 0);
  EXPECT_EQ(unleased.lease_since(), 0);
}

// The lease marks take the place of a stored modified revision: a KeyIndex
// is as big as it was without them.
TEST(KeyIndexTest, SizeWithLease) { EXPECT_EQ(sizeof(KeyIndex), 96u); }

}  // namespace capstan::index
