// Lessor: etcd's leases. Which leases exist, their TTLs and expiry times,
// and which keys each one holds.
//
// Grants and revocations are writes: they go through the KV store's
// committer (WriteRequest kinds kLeaseGrant and kLeaseRevoke), which calls
// the mutators below from the committer thread, so a lease and the keys it
// deletes change in one durable revision. Keep-alives and time-to-live
// reads are in memory only, as in etcd.
//
// Expiry uses a min-heap of deadlines (no scan of every lease) on the
// monotonic Clock the lessor is given (lease/clock.h): the real one in the
// server, a ManualClock in tests. Expired leases are revoked by the KV
// store's expiry thread at no more than --lease-revoke-rate per second, each
// as an ordinary revoke request, so a storm of expiries is spread out and
// group-committed.
//
// Thread safety: every method may be called from any thread; the committer
// methods are called by one thread at a time. One internal mutex, a leaf:
// nothing is called with it held but the clock's Now().

#ifndef CAPSTAN_LEASE_LESSOR_H_
#define CAPSTAN_LEASE_LESSOR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <queue>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "lease/clock.h"
#include "util/mutex.h"

namespace capstan::lease {

class Lessor {
 public:
  // etcd's limits: a lease lives at least kMinTtlSeconds (etcd derives 2 s
  // from its default election timeout; KvStoreOptions::min_lease_ttl_seconds
  // follows the flags) and at most kMaxTtlSeconds.
  static constexpr int64_t kMinTtlSeconds = 2;
  static constexpr int64_t kMaxTtlSeconds = 9000000000LL;

  struct LeaseInfo {
    int64_t id = 0;
    int64_t granted_ttl = 0;    // seconds, after the minimum is applied
    int64_t remaining_ttl = 0;  // whole seconds left (floor), never negative
    std::vector<std::string> keys;  // sorted; filled only when asked
  };

  // Measures TTLs and deadlines on clock. clock is not owned and must
  // outlive the lessor.
  explicit Lessor(const Clock* clock);

  Lessor(const Lessor&) = delete;
  Lessor& operator=(const Lessor&) = delete;

  bool Exists(int64_t id) const;
  std::optional<LeaseInfo> Get(int64_t id, bool with_keys) const;
  std::vector<int64_t> List() const;
  size_t size() const;

  // Extends the lease by its TTL from the clock's now. Returns the TTL, or nullopt if
  // the lease does not exist or has already expired (an expired lease is
  // only ever revoked).
  std::optional<int64_t> Renew(int64_t id);
  // The renewals that extended a lease (etcd_debugging_lease_renewed_total).
  uint64_t renewed() const { return renewed_.load(std::memory_order_relaxed); }

  // A member that becomes its cluster's leader: every lease gets its full
  // TTL again plus `extend` from now (etcd's Lessor.Promote, which extends
  // by the election timeout), since a follower never saw the keep-alives
  // the old leader took.
  void Promote(Clock::Duration extend);

  // Leases whose deadline passed, at most `max` of them, oldest first. A
  // lease returned here is returned again by later calls until it is
  // revoked (a revoke that failed is retried).
  std::vector<int64_t> Expired(size_t max);

  // ---- Committer thread only (called while applying writes). ----

  // Records a granted lease, expiring TTL seconds from now.
  void Grant(int64_t id, int64_t ttl);
  // Forgets a lease and its keys; returns the keys it held, sorted.
  std::vector<std::string> Revoke(int64_t id);
  // Moves key to lease `id` (0: no lease), detaching it from its old lease.
  void Attach(const std::string& key, int64_t id);
  // The lease key is attached to, or 0.
  int64_t LeaseOf(const std::string& key) const;

  // At start-up: every lease gets its full TTL again, as etcd's leader
  // does when it takes over (time spent down is not counted).
  void Restore(int64_t id, int64_t ttl) { Grant(id, ttl); }

 private:
  std::atomic<uint64_t> renewed_{0};
  struct Lease {
    int64_t ttl = 0;
    Clock::TimePoint deadline;
    absl::flat_hash_set<std::string> keys;
  };
  struct HeapEntry {
    Clock::TimePoint deadline;
    int64_t id;
    bool operator>(const HeapEntry& o) const { return deadline > o.deadline; }
  };

  void PushLocked(int64_t id, Clock::TimePoint deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock* const clock_;

  // Lock order: mu_ is a leaf lock: no other lock is taken while it is held,
  // and clock_->Now() is the only call made under it.
  mutable util::Mutex mu_;
  absl::flat_hash_map<int64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> key_lease_ ABSL_GUARDED_BY(mu_);
  // Deadlines; entries for renewed or revoked leases are stale and skipped.
  std::priority_queue<HeapEntry, std::vector<HeapEntry>, std::greater<HeapEntry>> heap_
      ABSL_GUARDED_BY(mu_);
};

// etcd's leasepb.Lease as stored in the lease column family:
// ID (1), TTL (2), RemainingTTL (3).
std::string EncodeLeaseRecord(int64_t id, int64_t ttl);
bool DecodeLeaseRecord(std::string_view bytes, int64_t* id, int64_t* ttl);
// The lease family's key of a lease: 8 bytes, big-endian.
std::string LeaseKey(int64_t id);

}  // namespace capstan::lease

#endif  // CAPSTAN_LEASE_LESSOR_H_
