// CorruptionCheck: etcd's checks that the members of a cluster hold the same
// data (etcd 3.5's server/etcdserver/corrupt.go), over the peer transport's
// HashKV call (etcd's GET /members/hashkv).
//
// - The initial check (--experimental-initial-corrupt-check, 3.6's feature
//   gate InitialCorruptCheck), before the member serves clients: the hash of
//   its keys at its own revision against each peer's hash at that revision.
//   A peer whose hash differs at the same compaction point is a mismatch,
//   and the member refuses to start: "<id> found data inconsistency with
//   peers". A peer that cannot answer (down, behind the revision, compacted
//   past it) is logged and left out, as etcd leaves it out.
// - The periodic check (--corrupt-check-time > 0), on the leader only, once
//   per interval: its own hash at its current revision; every peer's at that
//   revision; a linearizable read barrier; its own hash again. A changed hash
//   at the same revision and compaction point, a peer at a later revision
//   or compaction point than the leader's, or a peer's hash that differs at
//   the leader's earlier compaction point raises the CORRUPT alarm for that
//   member (through the log, so every member refuses writes with "corrupt
//   cluster" from its apply on; `etcdctl alarm list` shows it).
//
// Log lines are etcd's ("found hash mismatch", "finished peer corruption
// check", ...). Thread safety: CheckInitial before Start; Start and Stop from
// one thread; CheckOnce from any thread (the periodic thread calls it).

#ifndef CAPSTAN_REPLICATION_CORRUPTION_CHECK_H_
#define CAPSTAN_REPLICATION_CORRUPTION_CHECK_H_

#include <cstdint>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "mvcc/kv_store.h"
#include "replication/replicator.h"
#include "replication/transport.h"
#include "util/mutex.h"

namespace capstan::replication {

struct CorruptionCheckOptions {
  uint64_t member_id = 0;
  // Between two periodic checks (--corrupt-check-time); zero: none.
  absl::Duration interval = absl::ZeroDuration();
  // How long each peer's hash and the read barrier may take (etcd's request
  // timeout).
  absl::Duration timeout = absl::Seconds(7);
};

// What one periodic check found.
struct CorruptionCheckResult {
  int peers_checked = 0;
  // The member the CORRUPT alarm was raised for (0: none). One alarm per
  // check, for the first mismatch found, as etcd raises it.
  uint64_t alarmed = 0;
};

class CorruptionCheck {
 public:
  // store, replicator and transport must outlive the check.
  CorruptionCheck(const CorruptionCheckOptions& options, mvcc::KvStore* store,
                  Replicator* replicator, Transport* transport);
  // Stops.
  ~CorruptionCheck();
  CorruptionCheck(const CorruptionCheck&) = delete;
  CorruptionCheck& operator=(const CorruptionCheck&) = delete;

  // etcd's InitialCheck: ok, or FailedPrecondition "<id> found data
  // inconsistency with peers".
  absl::Status CheckInitial();

  // Starts the periodic check (nothing when the interval is zero).
  void Start() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops it and waits for a check under way. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // One periodic check, whether or not this member leads (the periodic
  // thread calls it only while it does). Errors: the member's own hash or
  // read barrier failed.
  absl::StatusOr<CorruptionCheckResult> CheckOnce();

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  bool Stopping() ABSL_LOCKS_EXCLUDED(mu_);
  // Proposes the CORRUPT alarm for member id.
  void RaiseAlarm(uint64_t id);

  const CorruptionCheckOptions options_;
  mvcc::KvStore* const store_;
  Replicator* const replicator_;
  Transport* const transport_;

  util::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace capstan::replication

#endif  // CAPSTAN_REPLICATION_CORRUPTION_CHECK_H_
