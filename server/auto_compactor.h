// Auto-compaction, as etcd 3.5's --auto-compaction-mode (v3compactor):
//
// - periodic: keeps `retention` of history. The revision is sampled every
//   retention/10 (at most every 6 minutes). The first compaction comes once
//   `retention` has passed since start, to the revision sampled then; after
//   that one every min(retention, 1 hour) after the last successful one, to
//   the oldest revision still in the window of samples (about `retention`
//   old). PeriodicCompactionSchedule holds that logic.
// - revision: every 5 minutes the store is compacted to (current revision -
//   retention) when that is positive and has moved.
//
// Compactions are ordinary non-physical Compact writes. A target at or below
// the store's compacted revision counts as done (etcd: ErrCompacted is a
// success).

#ifndef CAPSTAN_SERVER_AUTO_COMPACTOR_H_
#define CAPSTAN_SERVER_AUTO_COMPACTOR_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/time/time.h"
#include "mvcc/kv_store.h"

namespace capstan::server {

// etcd's periodic schedule (v3compactor/periodic.go) without a thread or a
// clock: the caller samples, waits check_interval(), asks Due(), compacts
// and reports success. Not thread-safe; one caller.
class PeriodicCompactionSchedule {
 public:
  // REQUIRES: period > 0. start: when the compactor started.
  PeriodicCompactionSchedule(absl::Duration period, absl::Time start);

  // Time between two samples: period/10, capped at 6 minutes.
  absl::Duration check_interval() const { return check_interval_; }
  // Time between two compactions after the first: period, capped at 1 hour.
  absl::Duration compact_interval() const { return compact_interval_; }

  // Records the store's revision at the start of a check interval.
  void Sample(int64_t rev);
  // After a check interval: the revision to compact to now, or none if the
  // last success (or the start) is too recent.
  std::optional<int64_t> Due(absl::Time now);
  // The compaction Due() asked for succeeded at `now`.
  void Compacted(absl::Time now);

 private:
  const absl::Duration check_interval_;
  const absl::Duration compact_interval_;
  // How many samples the window holds: period/check_interval + 1; the oldest
  // is the revision about `period` ago.
  const size_t retained_;
  absl::Time last_success_;
  // The wait before the next compaction: period_ until the first one.
  absl::Duration wait_;
  std::deque<int64_t> revs_;
};

// Runs one thread until destroyed. Thread-safe.
class AutoCompactor {
 public:
  // Exactly one of period (periodic mode) or revisions (revision mode) is
  // positive. revision_check_interval is the wait between two checks in
  // revision mode (etcd's is 5 minutes; tests shorten it). store must
  // outlive the compactor.
  AutoCompactor(mvcc::KvStore* store, absl::Duration period, int64_t revisions,
                absl::Duration revision_check_interval = absl::Minutes(5));
  ~AutoCompactor();

 private:
  void Run();
  void RunPeriodic();
  void RunRevision();
  // Waits `d`; false if the compactor is stopping.
  bool Wait(absl::Duration d);
  // Compacts to rev; true on success or if rev is already compacted.
  bool Compact(int64_t rev);

  mvcc::KvStore* const store_;
  const absl::Duration period_;
  const int64_t revisions_;
  const absl::Duration revision_check_interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_AUTO_COMPACTOR_H_
