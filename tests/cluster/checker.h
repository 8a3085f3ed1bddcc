// Checks a client history (history.h) against the key space's event log: every
// change the store made to the keys, in revision order, as a Watch from
// revision 1 returns them (or a Range at every revision). etcd's revisions
// make a linearizability check cheap: each write is placed by its revision,
// each read by its header revision, so no search over orders is needed.
//
// The rules (each Violation names one, with the operations involved):
//   kLostWrite       an acknowledged write is missing from the log, or sits at
//                    another revision than the one acknowledged, or its
//                    answer (prev_kv, the state its compare saw) disagrees
//                    with the log.
//   kRealTimeOrder   a write's revision is not above the revision of an
//                    operation that completed before the write was invoked.
//   kStaleRead       a read's header revision is below the revision of an
//                    operation that completed before the read was invoked.
//   kWrongRead       a read's answer is not the key's state at its header
//                    revision according to the log (gets, a failed CAS's
//                    else-branch Range, a delete that deleted nothing), or a
//                    list's page is not the range's keys at the revision it
//                    read (its own, or the header revision), limit and
//                    `more` included.
//   kDuplicateWrite  a written value appears more than once in the log.
//   kPhantomWrite    the log holds a change nobody asked for: a value never
//                    written, a key's deletion with no delete to account for it.
//   kFailedWriteApplied  a write answered with a definite failure (or a CAS
//                    answered "compare failed") is in the log.
//   kBadLog          the event log itself is malformed (revisions going back).
//
// Requirements on the history: each put/CAS writes a value unique in the
// history (the checker identifies writes by value); the key space is written
// only by the recorded clients; the log holds every change to the key space
// from revision 1 (a store compacted while the history was recorded needs a
// log recorded as it ran, by a watch that was never compacted away).
//
// Cost: O((n + e) log(n + e)) for n operations and e events, plus for each
// list page the keys its range ever held.
//
// Thread safety: CheckHistory is a pure function.

#ifndef CAPSTAN_TESTS_CLUSTER_CHECKER_H_
#define CAPSTAN_TESTS_CLUSTER_CHECKER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "cluster/history.h"

namespace capstan::testing::cluster {

// One change in the event log.
struct Event {
  int64_t revision = 0;  // the revision that made it (its mod_revision)
  std::string key;
  bool is_delete = false;
  std::string value;  // for a put
};

enum class Rule {
  kLostWrite,
  kRealTimeOrder,
  kStaleRead,
  kWrongRead,
  kDuplicateWrite,
  kPhantomWrite,
  kFailedWriteApplied,
  kBadLog,
};
const char* RuleName(Rule r);

struct Violation {
  Rule rule;
  std::string message;           // what is wrong, with the operations described
  std::vector<int64_t> op_ids;   // the operations involved
};

struct CheckStats {
  int64_t operations = 0;
  int64_t ok = 0;
  int64_t failed = 0;
  int64_t unknown = 0;          // unknown or never completed
  int64_t unknown_applied = 0;  // unknown writes found in the log
  int64_t reads_checked = 0;    // answers compared with the log
  int64_t writes_checked = 0;   // acknowledged writes found in the log
  int64_t events = 0;
  double seconds = 0;           // time CheckHistory took
};

struct CheckResult {
  std::vector<Violation> violations;
  CheckStats stats;

  bool ok() const { return violations.empty(); }
  size_t Count(Rule r) const;
  // The statistics and up to `max_violations` violations, one paragraph each.
  std::string Report(size_t max_violations = 20) const;
};

CheckResult CheckHistory(const std::vector<Operation>& ops, const std::vector<Event>& events);

}  // namespace capstan::testing::cluster

#endif  // CAPSTAN_TESTS_CLUSTER_CHECKER_H_
