// Auto-compaction, as etcd's --auto-compaction-mode:
//
// - periodic: keeps `retention` of history. The revision is sampled every
//   retention/10; every retention/10 the store is compacted to the revision
//   it had `retention` ago.
// - revision: every 5 minutes the store is compacted to (current revision -
//   retention) when that has moved.
//
// Compactions are ordinary non-physical Compact writes. Thread-safe; runs one
// thread until destroyed.

#ifndef CAPSTAN_SERVER_AUTO_COMPACTOR_H_
#define CAPSTAN_SERVER_AUTO_COMPACTOR_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>

#include "absl/time/time.h"
#include "mvcc/kv_store.h"

namespace capstan::server {

class AutoCompactor {
 public:
  // Exactly one of period (periodic mode) or revisions (revision mode) is
  // positive. store must outlive the compactor.
  AutoCompactor(mvcc::KvStore* store, absl::Duration period, int64_t revisions,
                absl::Duration revision_check_interval = absl::Minutes(5));
  ~AutoCompactor();

 private:
  void Run();
  void Compact(int64_t rev);

  mvcc::KvStore* const store_;
  const absl::Duration period_;
  const int64_t revisions_;
  const absl::Duration revision_check_interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_AUTO_COMPACTOR_H_
