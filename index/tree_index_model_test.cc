// Copyright 2025 The Capstan Authors.
//
// TreeIndex randomized model test: random writes, publishes, snapshots held
// across later writes and batched compactions, checked against two models:
// the full history of every key (what reads at or above the compaction
// revision must answer) and a std::map of KeyIndexes compacted all at once
// (what the tree must hold once every batch is applied).

#include <algorithm>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "index/tree_index.h"
#include "index/tree_index_test_util.h"

namespace capstan::index {
namespace {

// Sanitizers slow this test 20-50x; run fewer steps under them.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr int kSteps = 1500;
#else
constexpr int kSteps = 6000;
#endif

using test_util::Dump;
using test_util::ExpectSameDump;
using test_util::Hit;
using test_util::R;
using test_util::ViewRange;

struct Op {
  Revision rev;
  bool tombstone;
};

using History = std::map<std::string, std::vector<Op>>;

bool HistoryGet(const std::vector<Op>& ops, int64_t at, RangeHit* hit) {
  ptrdiff_t last = -1;
  for (size_t i = 0; i < ops.size() && ops[i].rev.main <= at; ++i) last = i;
  if (last < 0 || ops[last].tombstone) return false;
  ptrdiff_t first = last;
  while (first > 0 && !ops[first - 1].tombstone) --first;
  hit->modified = ops[last].rev;
  hit->created = ops[first].rev;
  hit->version = last - first + 1;
  return true;
}

bool InRange(const std::string& k, const std::string& key, const std::string& end) {
  if (end.empty()) return k == key;
  if (end == kRangeEndAll) return k >= key;
  return k >= key && k < end;
}

// The keys of `h` from `key` on; the caller stops at the first not InRange.
History::const_iterator RangeBegin(const History& h, const std::string& key) {
  return h.lower_bound(key);
}

std::vector<Hit> HistoryRange(const History& h, const std::string& key, const std::string& end,
                              int64_t at) {
  std::vector<Hit> out;
  for (auto it = RangeBegin(h, key); it != h.end() && InRange(it->first, key, end); ++it) {
    RangeHit hit;
    if (HistoryGet(it->second, at, &hit)) out.push_back({it->first, hit});
  }
  return out;
}

std::vector<Revision> HistorySince(const History& h, const std::string& key, const std::string& end,
                                   int64_t since, int64_t upto) {
  std::vector<Revision> out;
  for (auto it = RangeBegin(h, key); it != h.end() && InRange(it->first, key, end); ++it) {
    const std::vector<Op>& ops = it->second;
    const size_t first = out.size();
    for (const Op& op : ops) {
      if (op.rev.main < since || op.rev.main > upto) continue;
      if (out.size() > first && out.back().main == op.rev.main) {
        out.back() = op.rev;
      } else {
        out.push_back(op.rev);
      }
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

class TreeIndexModelTest : public ::testing::TestWithParam<uint64_t> {
 protected:
  // A random key range in etcd form: single key, [a, b) or [a, "\0").
  std::pair<std::string, std::string> RandomRange() {
    const std::string& a = universe_[rng_() % universe_.size()];
    switch (rng_() % 4) {
      case 0:
        return {a, ""};
      case 1:
        return {a, std::string(kRangeEndAll)};
      default: {
        const std::string& b = universe_[rng_() % universe_.size()];
        return {std::min(a, b), std::max(a, b)};
      }
    }
  }

  // Reads at revisions in [floor, rev] of a view that holds all writes up to
  // `rev` must match the history.
  void CheckReads(const IndexView& v, int64_t floor, int64_t rev) {
    ASSERT_TRUE(v.TEST_Validate().ok()) << v.TEST_Validate();
    const int64_t ats[] = {rev, floor, floor + static_cast<int64_t>(rng_() % (rev - floor + 1))};
    const int64_t full_at = ats[rng_() % 3];  // one whole-index range per call
    SCOPED_TRACE(absl::StrFormat("full at %d floor %d rev %d", full_at, floor, rev));
    ASSERT_EQ(ViewRange(v, "", std::string(kRangeEndAll), full_at),
              HistoryRange(history_, "", std::string(kRangeEndAll), full_at));
    for (int64_t at : ats) {
      SCOPED_TRACE(absl::StrFormat("at %d", at));
      for (int i = 0; i < 3; ++i) {
        const auto [key, end] = RandomRange();
        const std::vector<Hit> want = HistoryRange(history_, key, end, at);
        ASSERT_EQ(ViewRange(v, key, end, at), want);
        ASSERT_EQ(v.Count(key, end, at), static_cast<int64_t>(want.size()));
        const int64_t limit = 1 + static_cast<int64_t>(rng_() % 100);
        ASSERT_EQ(v.Count(key, end, at, limit),
                  std::min(limit, static_cast<int64_t>(want.size())));
        const int64_t since = floor + 1 + static_cast<int64_t>(rng_() % (rev - floor + 1));
        ASSERT_EQ(v.RangeSince(key, end, since), HistorySince(history_, key, end, since, rev));
      }
    }
  }

  std::mt19937_64 rng_{GetParam()};
  std::vector<std::string> universe_;
  History history_;
};

TEST_P(TreeIndexModelTest, RandomOpsMatchModel) {
  for (int i = 0; i < 3000; ++i) {
    std::string k = absl::StrFormat("/registry/%c/%05d", 'a' + i % 7, (i * 7919) % 100000);
    if (i % 11 == 0) k += std::string("\0\xff", 2);
    if (i % 13 == 0) k.resize(3 + i % 9);
    universe_.push_back(k);
  }
  std::sort(universe_.begin(), universe_.end());
  universe_.erase(std::unique(universe_.begin(), universe_.end()), universe_.end());

  struct Held {
    IndexSnapshot snap;
    std::vector<std::pair<std::string, KeyIndex>> dump;
    int64_t rev;
    int64_t floor;
  };
  TreeIndex ti;
  std::map<std::string, KeyIndex> mirror;  // compacted eagerly, all keys at once
  std::vector<std::pair<std::string, KeyIndex>> published_mirror;
  bool published_exact = true;
  int64_t main = 0, published_rev = 0, floor = 0;
  std::vector<std::string> pending;  // keys still to compact at pending_at
  int64_t pending_at = 0;
  RevisionSet etcd_available, batch_available;
  std::vector<Held> held;
  size_t hot = 0;

  auto publish = [&] {
    ti.Publish();
    published_rev = main;
    published_mirror = Dump(mirror);
    published_exact = pending.empty();
  };

  for (int step = 0; step < kSteps; ++step) {
    const int r = static_cast<int>(rng_() % 100);
    if (r < 50) {  // a write request with 1-3 changes
      ++main;
      int64_t sub = 0;
      const int n = 1 + static_cast<int>(rng_() % 3);
      if (rng_() % 50 == 0) hot = rng_() % universe_.size();
      for (int i = 0; i < n; ++i) {
        const std::string& key = rng_() % 10 < 7
                                     ? universe_[(hot + rng_() % 200) % universe_.size()]
                                     : universe_[rng_() % universe_.size()];
        const Revision rev = R(main, sub);
        if (rng_() % 4 == 0) {
          const absl::Status s = ti.Tombstone(key, rev);
          auto it = mirror.find(key);
          const bool live = it != mirror.end() && it->second.IsLive();
          ASSERT_EQ(s.ok(), live) << key << " " << s;
          if (!live) continue;
          ASSERT_TRUE(it->second.Tombstone(rev).ok());
          history_[key].push_back({rev, true});
        } else {
          ti.Put(key, rev);
          mirror[key].Put(rev);
          history_[key].push_back({rev, false});
        }
        ++sub;
      }
    } else if (r < 62) {
      publish();
    } else if (r < 70) {  // take and hold a snapshot
      Held h{ti.Snapshot(), {}, published_rev, floor};
      h.dump = Dump(h.snap);
      if (published_exact) ExpectSameDump(h.dump, published_mirror);
      CheckReads(h.snap, h.floor, h.rev);
      if (held.size() < 8) {
        held.push_back(std::move(h));
      } else {
        held[rng_() % held.size()] = std::move(h);
      }
    } else if (r < 76) {  // a held snapshot has not changed
      if (held.empty()) continue;
      const Held& h = held[rng_() % held.size()];
      ExpectSameDump(Dump(h.snap), h.dump);
      CheckReads(h.snap, h.floor, h.rev);
    } else if (r < 79) {  // schedule a compaction
      if (!pending.empty() || main == floor) continue;
      publish();
      const int64_t at = floor + static_cast<int64_t>(rng_() % (published_rev - floor + 1));
      const IndexSnapshot snap = ti.Snapshot();
      RevisionSet keep;
      snap.Keep(at, &keep);
      etcd_available.clear();
      std::vector<std::string> want_keys;
      for (auto it = mirror.begin(); it != mirror.end();) {
        const KeyIndex before = it->second;
        it->second.Compact(at, &etcd_available);
        if (!(before == it->second)) want_keys.push_back(it->first);
        it = it->second.IsEmpty() ? mirror.erase(it) : std::next(it);
      }
      // Compaction keeps a tombstone at `at` (etcd 3.5.16), Keep leaves it out.
      RevisionSet available_but_tombstones = etcd_available;
      for (const auto& [key, ops] : history_) {
        for (const Op& op : ops) {
          if (op.tombstone && op.rev.main == at) available_but_tombstones.erase(op.rev);
        }
      }
      ASSERT_EQ(keep, available_but_tombstones);
      RevisionSet retained;
      snap.Retained(at, &retained);
      ASSERT_EQ(retained, etcd_available);
      pending = snap.KeysToCompact(at);
      ASSERT_EQ(pending, want_keys);
      pending_at = at;
      floor = at;
      batch_available.clear();
    } else if (r < 92) {  // one compaction batch
      if (pending.empty()) continue;
      const size_t n = std::min<size_t>(pending.size(), 1 + rng_() % 40);
      ti.CompactKeys(std::span<const std::string>(pending).first(n), pending_at, &batch_available);
      pending.erase(pending.begin(), pending.begin() + n);
      if (pending.empty()) {
        for (const Revision& rev : batch_available) ASSERT_TRUE(etcd_available.contains(rev));
        ExpectSameDump(Dump(ti.Unpublished()), Dump(mirror));
        // Once compacted, the index still says what the compaction keeps.
        RevisionSet retained;
        ti.Unpublished().Retained(pending_at, &retained);
        ASSERT_EQ(retained, etcd_available);
      }
    } else {  // the writer reads its own unpublished writes
      CheckReads(ti.Unpublished(), floor, main);
    }
    if (HasFatalFailure()) return;
  }
  while (!pending.empty()) {
    ti.CompactKeys(pending, pending_at, &batch_available);
    pending.clear();
  }
  publish();
  ExpectSameDump(Dump(ti.Snapshot()), Dump(mirror));
  CheckReads(ti.Snapshot(), floor, main);
  for (const Held& h : held) ExpectSameDump(Dump(h.snap), h.dump);
}

INSTANTIATE_TEST_SUITE_P(Seeds, TreeIndexModelTest, ::testing::Values(1, 2, 3, 4));

}  // namespace
}  // namespace capstan::index
