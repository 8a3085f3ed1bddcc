// RaftLog: a member's durable Raft log, the RaftStorage the engine reads
// (etcd's raft.Storage, with MemoryStorage's exact answers) kept in a
// RocksDB of its own at <data-dir>/raft/ (storage::RaftLogDir), apart from
// the data so that the data's checkpoints and snapshots never hold it.
//
// Layout, in the backend's Cf::kRaft family:
//   8-byte big-endian index  -> entry record
//   "\xff" "hard_state"       -> hard state record
//   "\xff" "snapshot"         -> snapshot metadata record
// Every record ends with a CRC-32C of what precedes it; an entry record also
// repeats its index, so a record found under the wrong key is corrupt. The
// live log is the entries snapshot.index + 1 .. LastIndex(), contiguous,
// with terms never decreasing (and never below the snapshot's term).
//
// Recovery at Open (etcd repairs its WAL the same way): RocksDB drops a torn
// tail of its own WAL; then every stored entry is checked (CRC, index,
// contiguity, terms). Bad records in the last position(s), above the hard
// state's commit index, are a torn tail: dropped with a warning. A bad
// record at or below the commit index, or followed by a good one, fails
// Open with "raft log corrupt at index N: ...".
//
// Disk space: RocksDB keeps deleted entries' bytes until a compaction
// reaches their files, which nothing would soon trigger (a deleted range
// adds no data). After Compact, and after Save with a snapshot, a thread
// of the log's own gives the space back (Backend::ReclaimRange over the
// deleted indexes: whole files dropped, the rest compacted), off the raft
// loop; Open does it once for what a previous run left.
//
// Reads are answered from memory where raft asks most: Term, FirstIndex and
// LastIndex from the terms of the live log kept as runs of equal terms, and
// Entries from a bounded cache of the newest entries (older ones from
// RocksDB).
//
// Thread safety: not thread-safe, except as noted. The member's raft loop
// makes every call; LastIndex() and hard_state() may also be called from any
// other thread (metrics, status) at any time.

#ifndef CAPSTAN_REPLICATION_RAFT_LOG_H_
#define CAPSTAN_REPLICATION_RAFT_LOG_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "replication/raft_engine.h"
#include "storage/backend.h"
#include "util/mutex.h"
#include "util/work_queue.h"

namespace capstan::replication {

struct RaftLogOptions {
  // Directory of the log's RocksDB (storage::RaftLogDir(data_dir)).
  std::string dir;
  // When false, no write is fsynced (--unsafe-no-fsync), whatever Save asks.
  bool sync = true;
  // Bytes of the newest entries kept in memory for Entries (data plus a
  // fixed overhead per entry).
  size_t tail_cache_bytes = 4 << 20;
  // Memtable and block cache of the log's backend: the log is small and
  // short-lived, so both are small.
  size_t write_buffer_bytes = 16 << 20;
  size_t block_cache_bytes = 8 << 20;
  // As storage::BackendOptions::file_system (fault injection in tests).
  std::shared_ptr<storage::FileSystem> file_system;
};

class RaftLog final : public RaftStorage {
 public:
  // Opens (or creates) the log in options.dir and verifies it (above).
  static absl::StatusOr<std::unique_ptr<RaftLog>> Open(const RaftLogOptions& options);
  const RaftLogOptions& options() const { return options_; }

  ~RaftLog() override;
  RaftLog(const RaftLog&) = delete;
  RaftLog& operator=(const RaftLog&) = delete;

  // True when the log holds no hard state, no entry and no snapshot: the
  // member has never run (raft's StartNode rather than RestartNode).
  bool IsNew() const;

  // Persists one Ready in ONE backend write, fsynced when sync (and the log
  // was opened with sync), in raft's order:
  //  - snapshot: the log is reset to start after it (every entry goes, as
  //    MemoryStorage.ApplySnapshot does); one not newer than the current
  //    snapshot is ignored (raft's ErrSnapOutOfDate);
  //  - entries: contiguous, in index order; an entry at index i replaces i
  //    and every entry after it (a conflicting tail); entries at or below
  //    the snapshot index are skipped;
  //  - hard_state.
  // InvalidArgument, and nothing written, when the entries would leave a
  // hole after LastIndex(), are not contiguous, or have a term below the
  // entry before them. After a write error the log must be considered
  // failed (fail-stop), as the backend is.
  absl::Status Save(const std::optional<HardState>& hard_state,
                    const std::vector<RaftEntry>& entries,
                    const std::optional<SnapshotMeta>& snapshot, bool sync);

  // Log compaction (etcd's CreateSnapshot + Compact, after the store has a
  // snapshot of everything up to index): the snapshot metadata becomes
  // (index, Term(index), conf_state) and the entries <= index are deleted.
  // Term(index) keeps answering. FailedPrecondition when index is at or
  // below the snapshot index (raft.ErrCompacted); OutOfRange when it is
  // past the commit index or LastIndex().
  absl::Status Compact(uint64_t index, const ConfState& conf_state);

  // A sole voter's entries through index (of term) are held by the store,
  // which applied them in writes it made durable itself, and are never
  // written to the log (replication/replicator.h, "A sole voter's log").
  // In memory only: the log answers as if compacted at (index, term,
  // conf_state). The next Save, which the caller makes only once the
  // store is durable through index, writes that snapshot record (and
  // drops older entries) in its batch. index must be at or past
  // LastIndex(); one at or below the snapshot index is ignored.
  void HoldInStore(uint64_t index, uint64_t term, const ConfState& conf_state);

  SnapshotMeta snapshot_meta() const { return snapshot_; }
  // Any thread.
  HardState hard_state() const ABSL_LOCKS_EXCLUDED(hard_state_mu_);

  // RaftStorage. Entries measures sizes as raft's limitSize does
  // (raftpb.Entry.Size(), the marshaled entry). kFailed when a stored
  // record cannot be read or is corrupt (logged).
  LogError InitialState(HardState* hard_state, ConfState* conf_state) override;
  LogError Entries(uint64_t lo, uint64_t hi, uint64_t max_bytes,
                   std::vector<RaftEntry>* out) override;
  LogError Term(uint64_t i, uint64_t* term) override;
  uint64_t FirstIndex() override { return snapshot_.index + 1; }
  // Any thread.
  uint64_t LastIndex() override { return last_index_.load(std::memory_order_acquire); }
  LogError Snapshot(SnapshotMeta* meta) override;

  // The size raft gives an entry (raftpb.Entry.Size()).
  static uint64_t EntrySize(const RaftEntry& entry);

  // Bytes of the log's backend on disk (files and WAL). Any thread.
  uint64_t SizeOnDisk() const { return backend_->SizeOnDisk(); }
  // Entries below this index have had their disk space given back (0: none
  // yet). Any thread.
  uint64_t ReclaimedBelow() const ABSL_LOCKS_EXCLUDED(reclaim_mu_);

  // Entries held by the tail cache, and its first index (LastIndex() + 1
  // when empty).
  size_t TEST_CachedEntries() const { return cache_.size(); }
  uint64_t TEST_CacheFirst() const { return cache_first_; }

 private:
  // A run of equal terms: entries first .. (next run's first - 1) have term.
  struct TermRun {
    uint64_t first;
    uint64_t term;
  };

  RaftLog(const RaftLogOptions& options, std::unique_ptr<storage::Backend> backend);
  absl::Status Recover();

  // The term of i, for snapshot_.index <= i <= LastIndex().
  uint64_t TermOf(uint64_t i) const;
  // Drops the live log's entries >= index from memory.
  void TruncateMemory(uint64_t index);
  void AppendMemory(const RaftEntry& entry);
  void TrimCache();
  // Reads entries [lo, hi) from the backend, at most max_bytes of them
  // (sizes counted from *bytes), at least one when none was taken yet.
  LogError ReadStored(uint64_t lo, uint64_t hi, uint64_t max_bytes, uint64_t* bytes,
                      std::vector<RaftEntry>* out);
  // Has the reclaimer give back the space of the entries below end (all
  // deleted), after what it was asked before.
  void ReclaimBelow(uint64_t end) ABSL_LOCKS_EXCLUDED(reclaim_mu_);
  // Reclaimer thread: one pass over the newest range asked for.
  void Reclaim() ABSL_LOCKS_EXCLUDED(reclaim_mu_);

  const RaftLogOptions options_;
  std::unique_ptr<storage::Backend> backend_;

  SnapshotMeta snapshot_;
  // snapshot_ came from HoldInStore and is not written yet.
  bool held_unwritten_ = false;
  // Terms of the live log, snapshot_.index + 1 .. LastIndex(), in order.
  std::deque<TermRun> runs_;
  // The newest entries, cache_first_ .. LastIndex(), and their bytes.
  std::deque<RaftEntry> cache_;
  uint64_t cache_first_ = 1;
  size_t cache_bytes_ = 0;

  // Written on the raft loop only; read anywhere.
  std::atomic<uint64_t> last_index_{0};
  // Guards only hard_state_ (the raft loop writes it, any thread reads);
  // nothing is called under it.
  mutable util::Mutex hard_state_mu_;
  HardState hard_state_ ABSL_GUARDED_BY(hard_state_mu_);
  bool has_hard_state_ = false;

  // The reclaimer's requests. A leaf lock: nothing is called under it.
  mutable util::Mutex reclaim_mu_;
  uint64_t reclaim_asked_ ABSL_GUARDED_BY(reclaim_mu_) = 0;  // newest end asked for
  uint64_t reclaimed_ ABSL_GUARDED_BY(reclaim_mu_) = 0;      // end of the last pass
  bool reclaim_queued_ ABSL_GUARDED_BY(reclaim_mu_) = false;
  // Declared last: destroyed (and drained: a pass not begun is called off)
  // before what its work uses.
  util::WorkQueue reclaimer_{1, "raft-log-gc"};
};

}  // namespace capstan::replication

#endif  // CAPSTAN_REPLICATION_RAFT_LOG_H_
