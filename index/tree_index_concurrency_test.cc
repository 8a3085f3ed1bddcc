// Copyright 2025 The Capstan Authors.
//
// TreeIndex concurrency test: one writer (puts, tombstones, publishes,
// batched compaction) and four readers taking snapshots and ranging over
// them. Revision r puts the key "rev" at {r,0} and then puts or deletes one key
// of a fixed, seeded schedule at {r,1}, so a reader learns a snapshot's
// revision P from "rev" and replays the schedule up to P to know exactly what
// the snapshot must hold. Run it under ThreadSanitizer too
// (-DCAPSTAN_SANITIZE=thread).

#include <algorithm>
#include <atomic>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "index/tree_index.h"
#include "index/tree_index_test_util.h"

namespace capstan::index {
namespace {

using test_util::Hit;
using test_util::kMaxRev;
using test_util::R;
using test_util::ViewRange;

struct ScheduledOp {
  int key;
  bool tombstone;
};

std::string ConcurrencyKey(int k) { return absl::StrFormat("k/%05d", k); }

struct KeyModel {
  bool alive = false;
  int64_t created = 0, modified = 0, version = 0;
};

void ApplyScheduled(const ScheduledOp& op, int64_t r, std::vector<KeyModel>* model) {
  KeyModel& m = (*model)[op.key];
  if (op.tombstone) {
    m.alive = false;
    return;
  }
  if (!m.alive) {
    m.alive = true;
    m.created = r;
    m.version = 0;
  }
  m.modified = r;
  ++m.version;
}

TEST(TreeIndexConcurrencyTest, ReadersSeeConsistentSnapshots) {
  constexpr int kKeys = 3000;
  constexpr int64_t kRevisions = 40000;
  constexpr int kReaders = 4;
  std::vector<ScheduledOp> schedule(kRevisions + 1);
  {
    std::mt19937_64 rng(99);
    for (auto& op : schedule) {
      op.key = static_cast<int>(rng() % kKeys);
      op.tombstone = rng() % 3 == 0;
    }
  }

  TreeIndex ti;
  std::atomic<bool> done{false};
  std::atomic<int64_t> snapshots_checked{0};

  std::thread writer([&] {
    std::mt19937_64 rng(5);
    std::vector<bool> alive(kKeys);
    std::vector<std::string> pending;
    int64_t pending_at = 0;
    int64_t r = 1;
    while (r <= kRevisions) {
      const int group = 1 + static_cast<int>(rng() % 16);
      for (int g = 0; g < group && r <= kRevisions; ++g, ++r) {
        ti.Put("rev", R(r, 0));
        const ScheduledOp& op = schedule[r];
        const std::string key = ConcurrencyKey(op.key);
        if (op.tombstone) {
          const absl::Status s = ti.Tombstone(key, R(r, 1));
          EXPECT_EQ(s.ok(), static_cast<bool>(alive[op.key]));
        } else {
          ti.Put(key, R(r, 1));
        }
        alive[op.key] = !op.tombstone;
      }
      // One compaction batch between write groups.
      if (!pending.empty()) {
        const size_t n = std::min<size_t>(pending.size(), 200);
        ti.CompactKeys(std::span<const std::string>(pending).first(n), pending_at, nullptr);
        pending.erase(pending.begin(), pending.begin() + n);
      }
      ti.Publish();
      if (pending.empty() && r > 2000 && rng() % 50 == 0) {
        pending_at = r - 1 - static_cast<int64_t>(rng() % 1000);
        pending = ti.Snapshot().KeysToCompact(pending_at);  // lock-free on a snapshot
      }
    }
    done.store(true);
  });

  auto reader = [&](int id) {
    std::mt19937_64 rng(1000 + id);
    std::vector<KeyModel> model(kKeys);
    int64_t model_rev = 0;
    struct Held {
      IndexSnapshot snap;
      int64_t rev;
      std::vector<Hit> hits;
    };
    std::vector<Held> held;
    int64_t checked = 0;
    while (!done.load() || checked < 20) {
      const IndexSnapshot snap = ti.Snapshot();
      Revision rev_mod, created;
      int64_t version;
      if (!snap.Get("rev", kMaxRev, &rev_mod, &created, &version).ok()) continue;
      const int64_t p = rev_mod.main;
      ASSERT_GE(p, model_rev) << "published revisions went backwards";
      for (; model_rev < p;) {
        ++model_rev;
        ApplyScheduled(schedule[model_rev], model_rev, &model);
      }
      // The whole key space at P, in order, with exact revisions and versions.
      std::vector<Hit> want;
      for (int k = 0; k < kKeys; ++k) {
        if (!model[k].alive) continue;
        want.push_back({ConcurrencyKey(k), RangeHit{R(model[k].modified, 1), R(model[k].created, 1),
                                                    model[k].version}});
      }
      const std::vector<Hit> got = ViewRange(snap, "k/", "k0", p);
      ASSERT_EQ(got, want) << "snapshot at revision " << p;
      ASSERT_EQ(snap.Count("k/", "k0", p), static_cast<int64_t>(want.size()));
      // Nothing after P is visible.
      ASSERT_TRUE(snap.RangeSince("", kRangeEndAll, p + 1).empty());
      for (int i = 0; i < 20; ++i) {
        const int k = static_cast<int>(rng() % kKeys);
        Revision m, c;
        int64_t v;
        ASSERT_EQ(snap.Get(ConcurrencyKey(k), p, &m, &c, &v).ok(), model[k].alive);
      }
      if (checked % 25 == 0) {
        ASSERT_TRUE(snap.TEST_Validate().ok()) << snap.TEST_Validate();
      }
      // Hold a few snapshots and check they never change.
      if (held.size() < 4) {
        held.push_back({snap, p, got});
      } else if (rng() % 4 == 0) {
        Held& h = held[rng() % held.size()];
        ASSERT_EQ(ViewRange(h.snap, "k/", "k0", h.rev), h.hits) << "held snapshot changed";
        h = Held{snap, p, got};
      }
      ++checked;
    }
    for (const Held& h : held) {
      ASSERT_EQ(ViewRange(h.snap, "k/", "k0", h.rev), h.hits) << "held snapshot changed";
    }
    snapshots_checked.fetch_add(checked);
  };

  std::vector<std::thread> readers;
  for (int i = 0; i < kReaders; ++i) readers.emplace_back(reader, i);
  writer.join();
  for (std::thread& t : readers) t.join();
  EXPECT_GE(snapshots_checked.load(), kReaders * 20);
  const IndexSnapshot last = ti.Snapshot();
  EXPECT_TRUE(last.TEST_Validate().ok()) << last.TEST_Validate();
  RecordProperty("snapshots_checked", static_cast<int>(snapshots_checked.load()));
}

}  // namespace
}  // namespace capstan::index
