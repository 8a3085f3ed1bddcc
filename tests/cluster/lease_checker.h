// Checks what lease clients recorded (lease_client.h): per lease, its grant,
// every keep-alive, and linearizable reads of the key attached to it. Times
// are NowNs() (history.h) on the client's clock; the server's clock never
// enters, so each rule only uses what the client can know:
//
//   kRevokedEarly  a read that completed before the lease could have expired
//                  did not find the key. A grant or keep-alive invoked at t
//                  and answered with TTL T shows the lease alive when the
//                  server handled it, at or after t, for T more seconds: so
//                  it was alive until at least t + T. A read invoked after
//                  the key's put completed and completed before that (and
//                  before the client revoked it) must find the key.
//   kOutlived      the key was still there well after the lease had to be
//                  gone: a read invoked later than c + T + allowance, where c
//                  is the completion of the last answered keep-alive (or the
//                  grant) and T its TTL, found it. `allowance` says how much
//                  later is still right: etcd checks expiry every 500 ms, and
//                  a new leader gives every lease its full TTL again (lease
//                  checkpointing off, etcd's default), so each leader change
//                  in the window may add a TTL and an election. A lease the
//                  client revoked must be gone for reads invoked after the
//                  revoke completed (no allowance).
//
// Thread safety: CheckLeases is a pure function.

#ifndef CAPSTAN_TESTS_CLUSTER_LEASE_CHECKER_H_
#define CAPSTAN_TESTS_CLUSTER_LEASE_CHECKER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace capstan::testing::cluster {

struct LeaseRecord {
  struct Call {
    int64_t invoke_ns = 0;
    int64_t complete_ns = 0;
    int64_t ttl = 0;  // seconds answered; 0 or less: the lease was not found
    std::string endpoint;  // the member asked
  };
  struct Read {
    int64_t invoke_ns = 0;
    int64_t complete_ns = 0;
    bool found = false;
    std::string endpoint;
  };
  int64_t lease = 0;
  std::string key;
  Call grant;                    // ttl: the TTL granted
  int64_t put_complete_ns = 0;   // 0: the put of the key was not acknowledged
  std::vector<Call> keepalives;  // answered ones only
  std::vector<Read> reads;       // answered linearizable reads of the key
  int64_t revoke_invoke_ns = 0;  // 0: never revoked by the client
  int64_t revoke_complete_ns = 0;
};

enum class LeaseRule { kRevokedEarly, kOutlived };
const char* LeaseRuleName(LeaseRule r);

struct LeaseViolation {
  LeaseRule rule;
  std::string message;
};

struct LeaseCheckResult {
  std::vector<LeaseViolation> violations;
  int64_t leases = 0;
  int64_t keepalives = 0;
  int64_t reads_checked = 0;
  int64_t expired = 0;  // leases seen to expire (a read found the key gone, not revoked)
  int64_t excused = 0;  // revoked-early findings inside an excused window
  std::vector<std::string> excused_examples;  // a few of them, for the report

  bool ok() const { return violations.empty(); }
  size_t Count(LeaseRule r) const;
  std::string Report(size_t max_violations = 20) const;
};

// `allowance(from_ns, to_ns)`: how long after `to_ns` (the latest time the
// lease could expire if nothing extended it, its window starting at
// `from_ns`) the key may still be read, in nanoseconds.
// Times in messages are seconds since `origin_ns`.
struct ExcusedWindow {
  int64_t from_ns = 0;
  int64_t to_ns = 0;
  std::string why;
};
LeaseCheckResult CheckLeases(const std::vector<LeaseRecord>& records,
                             const std::function<int64_t(int64_t from_ns, int64_t to_ns)>& allowance,
                             int64_t origin_ns = 0,
                             const std::vector<ExcusedWindow>& excused_early = {});

}  // namespace capstan::testing::cluster

#endif  // CAPSTAN_TESTS_CLUSTER_LEASE_CHECKER_H_
