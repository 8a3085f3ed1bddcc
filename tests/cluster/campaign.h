// A fault campaign: a cluster of separate member processes (etcd 3.5 or
// Capstan) whose peer traffic goes through a FaultProxy (fault_proxy.h),
// clients running etcd-style and Kubernetes-shaped traffic and watchers
// recording what they receive, while faults are injected one at a time:
// each is held for a while, then healed, and the cluster must serve writes
// again before the next. At the end every checker runs on the recorded
// history:
//   - linearizability of the KV operations (checker.h);
//   - watch correctness of every watcher (watch_checker.h);
//   - leases (lease_checker.h): none revoked before its TTL ran out, none
//     outliving its expiry by more than leader changes allow;
//   - every member's HashKV equal at the final revision;
//   - progress: after each heal the cluster acknowledges writes again
//     within `recovery_timeout`.
// The Kubernetes-shaped clients also list in pages at a revision, and a
// compactor compacts as the apiserver's does (through compact_rev_key), so
// the event log the checkers read is recorded as the campaign runs, by a
// watch from revision 1 that the compactor never overtakes.
//
//   CampaignOptions o;
//   o.flavor = ServerFlavor::kCapstan;
//   o.seed = 7;
//   CampaignResult r = RunCampaign(o);
//   EXPECT_TRUE(r.ok()) << r.Report();
//
// The same seed gives the same faults in the same order, on the same
// members' roles (the leader, a follower), for both flavors; what the
// cluster does in between is up to it.
//
// Thread safety: RunCampaign may be called from one thread at a time per
// process (it owns a cluster and a proxy for its duration).

#ifndef CAPSTAN_TESTS_CLUSTER_CAMPAIGN_H_
#define CAPSTAN_TESTS_CLUSTER_CAMPAIGN_H_

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cluster/checker.h"
#include "cluster/history.h"
#include "cluster/lease_checker.h"
#include "cluster/watch_checker.h"
#include "process_fixture.h"

namespace capstan::testing::cluster {

enum class Fault {
  kKillMember,       // SIGKILL a random member, restart it after the hold
  kKillLeader,       // SIGKILL the leader
  kPauseMember,      // SIGSTOP a random member for longer than the election timeout
  kPauseLeader,      // SIGSTOP the leader
  kIsolateLeader,    // the leader cut off from every other member
  kIsolateFollower,  // a follower cut off
  kSplitMajority,    // the members split in a minority holding the leader and a majority
  kOneWayFromLeader, // what the leader sends to the others is lost; it hears them
  kOneWayToLeader,   // what the others send to the leader is lost
  kFlappingLink,     // the link between the leader and a follower up and down every ~200 ms
  kSlowFollower,     // a follower's links delayed by 150 ms each way
  kDiskFailure,      // a random member's fsyncs fail (EIO) or its disk is full (ENOSPC), then
                     // it is restarted on a working disk; Capstan only (its test hook,
                     // cmd/disk_fault_switch.h); on etcd drawn but skipped
  kLaggingLearner,   // a learner joins over slow links and catches up (by snapshot once the
                     // log is compacted), is SIGKILLed once while it does and restarted, and
                     // is removed once it has caught up
};
const char* FaultName(Fault f);
// Parses a FaultName; false if unknown.
bool ParseFault(const std::string& name, Fault* f);
std::vector<Fault> AllFaults();

struct CampaignOptions {
  ServerFlavor flavor = ServerFlavor::kCapstan;
  int members = 3;
  uint64_t seed = 1;
  // Traffic runs this long; faults are injected while it runs.
  std::chrono::milliseconds duration{20000};
  // The faults drawn from (uniformly), in seed order. Empty: AllFaults().
  std::vector<Fault> faults;
  // Take the faults in their order, round and round, instead of drawing.
  bool cycle_faults = false;
  // How long each fault is held: drawn between these.
  std::chrono::milliseconds hold_min{1500};
  std::chrono::milliseconds hold_max{3500};
  // After each heal, the cluster must acknowledge this many new operations
  // within recovery_timeout.
  std::chrono::milliseconds recovery_timeout{20000};
  int etcd_clients = 4;
  int kubernetes_clients = 4;
  int keys = 8;
  // The Kubernetes clients' list page size (keys per page).
  int list_page = 3;
  // The apiserver's compaction interval (--etcd-compaction-interval, 5 min
  // by default there); 0: no compaction.
  std::chrono::milliseconds compaction_interval{3000};
  int watchers = 3;
  // Lease clients (lease_client.h): a lease at a time each, kept alive, then
  // revoked or left to expire, under /campaign-leases/.
  int lease_clients = 2;
  // --snapshot-count: low, so that the leader compacts its log and a
  // lagging learner catches up by snapshot. Capstan also keeps only 500
  // entries after a compaction (etcd 3.5 keeps 5000, fixed).
  int64_t snapshot_count = 2000;
  int heartbeat_interval_ms = 100;
  int election_timeout_ms = 1000;
  // Print each fault as it is injected and healed.
  bool verbose = false;
  // Peer traffic through the fault proxy. Without it, only the faults on
  // processes (kill, pause) can be injected; the others are skipped.
  bool proxy = true;
  // Peer URLs over TLS with client certificates required (the --peer-*
  // flags kubeadm sets), certificates made by openssl.
  bool peer_tls = false;
  // Keep what the checkers read in the result (history, log, watch_records).
  bool keep_history = false;
};

struct InjectedFault {
  Fault fault;
  int member = -1;  // the member it hit (-1: several)
  double at_seconds = 0;
  double held_seconds = 0;
  double recovered_seconds = 0;  // from the heal to the next acknowledged writes
  // On NowNs()'s clock (history.h): injected, and serving again after it.
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  // From the injection to the first write invoked after it that was
  // acknowledged (on the majority's side, for a partition); -1 if none.
  double first_write_seconds = -1;
};

struct CampaignResult {
  std::string flavor;
  uint64_t seed = 0;
  double seconds = 0;
  int64_t operations = 0;
  int64_t ok = 0;
  int64_t unknown = 0;
  int64_t watch_events = 0;
  int64_t watch_progress = 0;
  int64_t watch_reconnects = 0;
  int64_t leases = 0;
  int64_t leases_expired = 0;
  // Early revocations excused (etcd only: after a paused leader resumes),
  // with a few of them described.
  int64_t leases_revoked_early_excused = 0;
  std::vector<std::string> excused;
  // List pages answered, and compactions made.
  int64_t list_pages = 0;
  int64_t compactions = 0;
  int64_t final_revision = 0;
  // Peer connections through the proxy, and those not from a member.
  int64_t peer_connections = 0;
  int64_t peer_unattributed = 0;
  std::vector<InjectedFault> faults;
  // Every violation found, one line each, prefixed with its checker.
  std::vector<std::string> violations;
  // An error that stopped the campaign before it could check (the cluster
  // did not start, a member did not restart): counted as a violation.
  std::string error;

  // With keep_history: the recorded operations, the event log they were
  // checked against, and each watcher's records.
  std::vector<Operation> history;
  std::vector<Event> log;
  std::vector<std::vector<WatchRecord>> watch_records;
  std::vector<LeaseRecord> lease_records;

  bool passed() const { return error.empty() && violations.empty(); }
  // Totals, the faults with their recovery times, and the violations.
  std::string Report() const;
};

CampaignResult RunCampaign(const CampaignOptions& options);

}  // namespace capstan::testing::cluster

#endif  // CAPSTAN_TESTS_CLUSTER_CAMPAIGN_H_
