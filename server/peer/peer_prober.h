// PeerProber: the round-trip probe of every peer, as etcd's rafthttp
// probes its peers (xiang90/probing over GET /raft/probing) for
// etcd_network_peer_round_trip_time_seconds and its prober warnings.
//
// Every probe_interval (etcd: 4 s) each peer gets a capstan.v1.Peer/Probe
// call over its sender's channel, with a deadline of probe_timeout (etcd's
// ConnReadTimeout, 5 s). An answer updates the peer's smoothed round trip
// as RFC 2988 and etcd's prober do (SRTT <- 7/8 SRTT + 1/8 RTT, from 0) and
// the clock difference (local clock at the answer, minus the peer's clock
// in it, minus half the SRTT); a failure marks the peer unhealthy until
// the next answer. The SRTT is observed into the peer's histogram
// (0.0001 s doubling up to 3.2768 s, etcd's buckets) report_first after
// the peer was added, then every report_interval while it is healthy
// (etcd: 30 s) and every report_unhealthy_interval while it is not (5 s),
// when etcd's warnings are logged too: "prober detected unhealthy status"
// (unless log_unhealthy is false) and "prober found high clock drift" (a
// difference of more than a second either way; etcd warns only when the
// local clock is ahead). etcd runs two probers per peer, one per round
// tripper, and observes both; this member observes once per interval.
//
// Thread safety: every method may be called from any thread. The probes
// are asynchronous calls on the prober's own completion queue, started,
// finished and freed by its thread, "peer-prober", which also runs the
// schedule: no gRPC thread ever calls into the prober.

#ifndef CAPSTAN_SERVER_PEER_PEER_PROBER_H_
#define CAPSTAN_SERVER_PEER_PEER_PROBER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "util/latency_histogram.h"
#include "util/mutex.h"

namespace capstan::server::peer {

struct PeerProberOptions {
  absl::Duration probe_interval = absl::Seconds(4);
  absl::Duration probe_timeout = absl::Seconds(5);
  absl::Duration report_first = absl::Seconds(5);
  absl::Duration report_interval = absl::Seconds(30);
  absl::Duration report_unhealthy_interval = absl::Seconds(5);
  bool log_unhealthy = true;
};

class PeerProber {
 public:
  explicit PeerProber(PeerProberOptions options);
  // Stops.
  ~PeerProber();
  PeerProber(const PeerProber&) = delete;
  PeerProber& operator=(const PeerProber&) = delete;

  // Starts probing: the thread is made now, or with the first peer (a
  // prober with no peer has no thread). Again, or after Stop, does nothing.
  void Start();
  // Probes peer `id` from now on through the channel `channel` returns
  // (called for each probe; nullptr skips it). A peer added again keeps its
  // history and takes the new channel.
  void AddPeer(uint64_t id, std::function<std::shared_ptr<grpc::Channel>()> channel);
  // Stops probing peer `id` and forgets it.
  void RemovePeer(uint64_t id);
  // Cancels the probes in flight, waits for their answers and joins the
  // thread. Idempotent.
  void Stop();

  // The histogram of peer `id`'s observed SRTTs; nullptr for an unknown
  // peer. It stays valid as long as the caller holds it.
  std::shared_ptr<const util::LatencyHistogram> RoundTrips(uint64_t id) const;
  // Peer `id`'s current SRTT and clock difference, and whether its last
  // probe was answered (false for an unknown peer).
  struct Status {
    absl::Duration srtt;
    absl::Duration clock_difference;
    bool healthy = false;
    uint64_t probes = 0;  // answered or failed
  };
  Status StatusOf(uint64_t id) const;
  // Whether the prober's thread has been made (and not yet joined).
  bool HasThread() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Peer;
  struct Call;

  void Run();
  // Makes the thread once the prober is started and has a peer.
  void StartThreadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Starts a probe of every peer whose turn it is, observes what is due,
  // and returns when the schedule next needs the thread.
  absl::Time ScheduleLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Observes and logs what the schedule says is due.
  void ReportLocked(uint64_t id, Peer& peer, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A probe's answer (or failure), on one of gRPC's callback threads.
  void Answered(std::unique_ptr<Call> call) ABSL_LOCKS_EXCLUDED(mu_);

  const PeerProberOptions options_;
  std::thread thread_ ABSL_GUARDED_BY(mu_);  // made once started with a peer; joined by the first Stop

  // Taken before a peer's channel getter (its sender's lock) and nothing
  // else; nothing blocks under it (a probe is an asynchronous call on
  // gRPC's callback API, which returns at once and answers on gRPC's
  // threads: the prober's thread only keeps the schedule, and never waits
  // in gRPC, where an idle thread would take part in polling the process's
  // connections).
  mutable util::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int probes_in_flight_ ABSL_GUARDED_BY(mu_) = 0;  // started, not yet answered
  std::map<uint64_t, std::unique_ptr<Peer>> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace capstan::server::peer

#endif  // CAPSTAN_SERVER_PEER_PEER_PROBER_H_
