// MemoryRaftStorage: a RaftStorage in memory for the engine's tests and
// benchmarks, with raft.MemoryStorage's semantics: the entry at the
// snapshot index is kept as a dummy that answers Term(snapshot index);
// Entries below it are kCompacted, beyond the last index kUnavailable; an
// Append that conflicts with the tail replaces it.
//
// Thread safety: none; like the engine, it is used on the raft loop only.

#ifndef CAPSTAN_REPLICATION_GORAFT_MEMORY_RAFT_STORAGE_FOR_TEST_H_
#define CAPSTAN_REPLICATION_GORAFT_MEMORY_RAFT_STORAGE_FOR_TEST_H_

#include <cstdint>
#include <vector>

#include "replication/raft_engine.h"
#include "util/check.h"

namespace capstan::replication {

class MemoryRaftStorage : public RaftStorage {
 public:
  MemoryRaftStorage() { entries_.push_back(RaftEntry{}); }

  LogError InitialState(HardState* hard_state, ConfState* conf_state) override {
    *hard_state = hard_state_;
    *conf_state = snapshot_.conf_state;
    return LogError::kOk;
  }

  LogError Entries(uint64_t lo, uint64_t hi, uint64_t max_bytes,
                   std::vector<RaftEntry>* out) override {
    uint64_t offset = entries_[0].index;
    if (lo <= offset) return LogError::kCompacted;
    if (hi > LastIndex() + 1) return LogError::kUnavailable;
    if (entries_.size() == 1) return LogError::kUnavailable;  // only the dummy
    uint64_t bytes = 0;
    for (uint64_t i = lo; i < hi; ++i) {
      const RaftEntry& e = entries_[i - offset];
      bytes += e.data.size();
      if (!out->empty() && bytes > max_bytes) break;  // always at least one
      out->push_back(e);
    }
    return LogError::kOk;
  }

  LogError Term(uint64_t i, uint64_t* term) override {
    uint64_t offset = entries_[0].index;
    if (i < offset) return LogError::kCompacted;
    if (i - offset >= entries_.size()) return LogError::kUnavailable;
    *term = entries_[i - offset].term;
    return LogError::kOk;
  }

  uint64_t FirstIndex() override { return entries_[0].index + 1; }
  uint64_t LastIndex() override { return entries_[0].index + entries_.size() - 1; }

  LogError Snapshot(SnapshotMeta* meta) override {
    *meta = snapshot_;
    return LogError::kOk;
  }

  // What a member does with a Ready, in raft.MemoryStorage's terms.
  void SetHardState(const HardState& hs) { hard_state_ = hs; }

  void ApplySnapshot(const SnapshotMeta& meta) {
    CHECK(meta.index >= snapshot_.index) << "snapshot out of date";
    snapshot_ = meta;
    entries_.assign(1, RaftEntry{.index = meta.index, .term = meta.term});
  }

  // Appends entries, replacing a conflicting tail.
  void Append(const std::vector<RaftEntry>& entries) {
    if (entries.empty()) return;
    uint64_t first = FirstIndex();
    uint64_t last = entries.back().index;
    if (last < first) return;  // all compacted already
    size_t skip = entries.front().index < first ? first - entries.front().index : 0;
    uint64_t offset = entries[skip].index - entries_[0].index;
    CHECK(offset <= entries_.size()) << "missing log entry: last " << LastIndex()
                                     << ", append at " << entries[skip].index;
    entries_.resize(offset);
    entries_.insert(entries_.end(), entries.begin() + skip, entries.end());
  }

  // Drops the entries up to index (applied), as a snapshot at index with
  // conf_state would.
  void Compact(uint64_t index, const ConfState& conf_state) {
    uint64_t offset = entries_[0].index;
    if (index <= offset) return;
    CHECK(index <= LastIndex()) << "compact " << index << " beyond the last index";
    snapshot_ = SnapshotMeta{.index = index, .term = entries_[index - offset].term,
                             .conf_state = conf_state};
    entries_.erase(entries_.begin(), entries_.begin() + (index - offset));
    entries_[0].data.clear();
    entries_[0].type = EntryType::kNormal;
  }

 private:
  HardState hard_state_;
  SnapshotMeta snapshot_;
  std::vector<RaftEntry> entries_;  // entries_[0]: the dummy at the snapshot index
};

}  // namespace capstan::replication

#endif  // CAPSTAN_REPLICATION_GORAFT_MEMORY_RAFT_STORAGE_FOR_TEST_H_
