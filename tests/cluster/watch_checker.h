// Checks what one watcher received (a WatchClient's records, watch_client.h)
// against the key space's event log (checker.h's Event: every change under
// the prefix from revision 1, in revision order and, within a revision, in
// the order its transaction made them). A watch on a prefix from
// `start_revision` must deliver every change of the log from that revision
// on, each once, in log order, with the values the log has, across however
// many streams the watcher had to reopen; and a progress notification at
// revision R promises that every change up to R has already been delivered.
//
// The rules (each WatchViolation names one, with the records involved):
//   kMissedEvent       a change of the log at or above start_revision and at
//                      or below the watcher's last revision (the highest an
//                      event or a progress notification reached) was never
//                      received.
//   kDuplicateEvent    a change (revision and key) was received twice.
//   kOutOfOrder        a change arrived after one that follows it in the log:
//                      the whole record stream, reconnections included, must
//                      follow (revision, order within the revision).
//   kWrongEvent        a received event is not in the log (no change of that
//                      key at that revision, or a key outside the prefix), or
//                      its value or delete flag differs from the log's.
//   kWrongPrevKv       an event's prev_kv differs from the key's state just
//                      before its revision by the log: absent when the key
//                      did not exist or was deleted, else the last put value.
//   kProgressOvertook  a progress notification at revision R came before a
//                      change at or below R was first received, or a change
//                      at or below R (and at or above start_revision) was
//                      never received.
//   kEventBeforeStart  an event below start_revision was received.
//   kWatchError        the watcher recorded an error it could not resume
//                      from (the server canceled the watch as compacted).
//   kBadLog            the event log itself is malformed (revisions going
//                      back, a key changed twice in one revision).
//
// A change that is never received and lies at or below a progress
// notification's revision is reported twice, as kMissedEvent and as
// kProgressOvertook: the watch lost it and the notification vouched for it.
//
// Requirements: the log starts at revision 1 (or at least below
// start_revision, with every earlier change of each key the watcher sees, so
// that prev_kv can be checked) and is not compacted; events outside the
// prefix in the log are ignored.
//
// Cost: O((r + e) log e) for r records and e events.
//
// Thread safety: CheckWatch is a pure function; WatchRecord is a value.

#ifndef CAPSTAN_TESTS_CLUSTER_WATCH_CHECKER_H_
#define CAPSTAN_TESTS_CLUSTER_WATCH_CHECKER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "cluster/checker.h"

namespace capstan::testing::cluster {

// One thing a watcher saw, in arrival order.
struct WatchRecord {
  enum Kind {
    kEvent,      // a change delivered by the watch
    kProgress,   // a progress notification: no events, not created/canceled
    kReconnect,  // the stream ended and a new one was opened
    kError,      // the watch ended in a way it cannot resume from
  };
  Kind kind = kEvent;
  // kEvent: the change's revision (its kv's mod_revision). kProgress: the
  // notification's header revision. kReconnect: the start_revision of the
  // new watch. kError: the compact revision when the watch was compacted,
  // else 0.
  int64_t revision = 0;
  // kEvent: the change.
  std::string key;
  bool is_delete = false;
  std::string value;  // for a put
  bool has_prev = false;  // the event carried a prev_kv
  std::string prev_value;
  // The member the stream was open at ("127.0.0.1:<port>"); for kReconnect,
  // the member of the new stream.
  std::string endpoint;
  // kReconnect: why the previous stream ended. kError: what failed.
  std::string detail;
  int64_t at_ns = 0;  // NowNs() (history.h) when recorded; 0 in synthetic records

  // One line: "put k1=v7 rev 12 prev=v3 @127.0.0.1:2379",
  // "progress rev 15 @...", "reconnect from rev 16 @... (stream ended: ...)".
  std::string ToString() const;
};

enum class WatchRule {
  kMissedEvent,
  kDuplicateEvent,
  kOutOfOrder,
  kWrongEvent,
  kWrongPrevKv,
  kProgressOvertook,
  kEventBeforeStart,
  kWatchError,
  kBadLog,
};
const char* WatchRuleName(WatchRule r);

struct WatchViolation {
  WatchRule rule;
  std::string message;          // what is wrong, with the records described
  std::vector<size_t> records;  // indexes into the records checked
};

struct WatchCheckStats {
  int64_t events = 0;          // event records received
  int64_t progress = 0;        // progress notifications received
  int64_t reconnects = 0;      // reconnect records
  int64_t last_revision = 0;   // the highest revision of an event or a notification
  int64_t events_checked = 0;  // changes of the log in [start_revision, last_revision]
  int64_t log_events = 0;      // changes of the log under the prefix
  double seconds = 0;          // time CheckWatch took
};

struct WatchCheckResult {
  std::vector<WatchViolation> violations;
  WatchCheckStats stats;

  bool ok() const { return violations.empty(); }
  size_t Count(WatchRule r) const;
  // The statistics and up to `max_violations` violations, one paragraph each.
  std::string Report(size_t max_violations = 20) const;
};

// `records`: one watcher's records in arrival order; `start_revision`: the
// revision its first watch started from; `prefix`: the key prefix it
// watched; `log`: every change under `prefix` from revision 1, in order.
WatchCheckResult CheckWatch(const std::vector<WatchRecord>& records, int64_t start_revision,
                            const std::string& prefix, const std::vector<Event>& log);

}  // namespace capstan::testing::cluster

#endif  // CAPSTAN_TESTS_CLUSTER_WATCH_CHECKER_H_
