#include "server/peer/peer_prober.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "capstan/v1/peer.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "server/peer/peer_protocol.h"
#include "spdlog/spdlog.h"
#include "util/thread_name.h"

namespace capstan::server::peer {

struct PeerProber::Peer {
  std::function<std::shared_ptr<grpc::Channel>()> channel;
  std::shared_ptr<util::LatencyHistogram> round_trips =
      std::make_shared<util::LatencyHistogram>(0.0001, 16);
  absl::Duration srtt;
  absl::Duration clock_difference;
  bool healthy = false;
  uint64_t probes = 0;
  std::string error = "no probe answered yet";
  absl::Time next_probe = absl::InfinitePast();
  absl::Time next_report;
  // The probe in flight (owned by its callback until it completes), to cancel.
  grpc::ClientContext* in_flight = nullptr;
};

// One probe, owned by its completion callback.
struct PeerProber::Call {
  uint64_t id = 0;
  // The round trip is timed on the steady clock: a step of the wall clock
  // (which the clock difference needs) must not enter the SRTT.
  std::chrono::steady_clock::time_point sent;
  grpc::ClientContext context;
  capstan::v1::ProbeRequest request;
  capstan::v1::ProbeResponse response;
  grpc::Status status;
  std::unique_ptr<capstan::v1::Peer::Stub> stub;
};

PeerProber::PeerProber(PeerProberOptions options) : options_(std::move(options)) {}

PeerProber::~PeerProber() { Stop(); }

void PeerProber::Start() {
  util::MutexLock l(&mu_);
  if (started_ || stopping_) return;
  started_ = true;
  StartThreadLocked();
}

void PeerProber::StartThreadLocked() {
  // No thread while there is nobody to probe (a single member has no
  // peers). Made under the lock, so that a Stop that sees started_ finds
  // the thread.
  if (!started_ || stopping_ || thread_.joinable() || peers_.empty()) return;
  thread_ = NamedThread("peer-prober", [this] { Run(); });
}

void PeerProber::AddPeer(uint64_t id, std::function<std::shared_ptr<grpc::Channel>()> channel) {
  util::MutexLock l(&mu_);
  auto& peer = peers_[id];
  if (!peer) {
    peer = std::make_unique<Peer>();
    peer->next_report = absl::Now() + options_.report_first;
  }
  peer->channel = std::move(channel);
  StartThreadLocked();
}

void PeerProber::RemovePeer(uint64_t id) {
  util::MutexLock l(&mu_);
  auto it = peers_.find(id);
  if (it == peers_.end()) return;
  // Its answer, still to come, finds no peer.
  if (it->second->in_flight != nullptr) it->second->in_flight->TryCancel();
  peers_.erase(it);
}

void PeerProber::Stop() {
  std::thread thread;  // the prober's, if Start made it
  {
    util::MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
    thread = std::move(thread_);
    for (auto& [id, peer] : peers_) {
      if (peer->in_flight != nullptr) peer->in_flight->TryCancel();
    }
  }
  if (thread.joinable()) thread.join();
  // Every probe in flight completes, cancelled, on gRPC's threads.
  util::MutexLock l(&mu_);
  auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return probes_in_flight_ == 0; };
  mu_.Await(absl::Condition(&answered));
}

std::shared_ptr<const util::LatencyHistogram> PeerProber::RoundTrips(uint64_t id) const {
  util::MutexLock l(&mu_);
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : it->second->round_trips;
}

PeerProber::Status PeerProber::StatusOf(uint64_t id) const {
  util::MutexLock l(&mu_);
  auto it = peers_.find(id);
  if (it == peers_.end()) return {};
  const Peer& p = *it->second;
  return {p.srtt, p.clock_difference, p.healthy, p.probes};
}

bool PeerProber::HasThread() const {
  util::MutexLock l(&mu_);
  return thread_.joinable();
}

void PeerProber::Run() {
  util::MutexLock l(&mu_);
  while (!stopping_) {
    const absl::Time now = absl::Now();
    // A peer added meanwhile waits at most a probe interval for its first
    // probe.
    const absl::Time until = std::min(ScheduleLocked(now), now + options_.probe_interval);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), until - now);
  }
}

absl::Time PeerProber::ScheduleLocked(absl::Time now) {
  absl::Time wake = now + options_.report_interval;
  for (auto& [id, peer] : peers_) {
    if (now >= peer->next_probe) {
      peer->next_probe = now + options_.probe_interval;
      // One probe at a time: a peer that does not answer is not asked twice.
      std::shared_ptr<grpc::Channel> channel = peer->channel ? peer->channel() : nullptr;
      if (peer->in_flight == nullptr && channel != nullptr) {
        auto* call = new Call;
        call->id = id;
        call->sent = std::chrono::steady_clock::now();
        call->context.set_deadline(absl::ToChronoTime(now + options_.probe_timeout));
        call->stub = capstan::v1::Peer::NewStub(channel);
        peer->in_flight = &call->context;
        ++probes_in_flight_;
        // gRPC runs the callback on its own threads, never inside this
        // call: mu_ is held here.
        call->stub->async()->Probe(&call->context, &call->request, &call->response,
                                   [this, call](grpc::Status status) {
                                     call->status = std::move(status);
                                     Answered(std::unique_ptr<Call>(call));
                                   });
      }
    }
    if (now >= peer->next_report) ReportLocked(id, *peer, now);
    wake = std::min({wake, peer->next_probe, peer->next_report});
  }
  return wake;
}

void PeerProber::Answered(std::unique_ptr<Call> call) {
  const absl::Time now = absl::Now();
  util::MutexLock l(&mu_);
  --probes_in_flight_;
  auto it = peers_.find(call->id);
  if (it == peers_.end() || it->second->in_flight != &call->context) return;
  Peer& p = *it->second;
  p.in_flight = nullptr;
  ++p.probes;
  if (!call->status.ok()) {
    p.healthy = false;
    p.error = call->status.error_message();
    return;
  }
  p.healthy = true;
  p.error.clear();
  p.srtt = p.srtt * 7 / 8 + absl::FromChrono(std::chrono::steady_clock::now() - call->sent) / 8;
  p.clock_difference = now - absl::FromUnixNanos(call->response.unix_nanos()) - p.srtt / 2;
}

void PeerProber::ReportLocked(uint64_t id, Peer& peer, absl::Time now) {
  peer.next_report =
      now + (peer.healthy ? options_.report_interval : options_.report_unhealthy_interval);
  if (!peer.healthy && options_.log_unhealthy) {
    SPDLOG_WARN(
        "prober detected unhealthy status (round-tripper-name ROUND_TRIPPER_RAFT_MESSAGE, "
        "remote-peer-id {}, rtt {}): {}",
        IdText(id), absl::FormatDuration(peer.srtt), peer.error);
  }
  if (absl::AbsDuration(peer.clock_difference) > absl::Seconds(1)) {
    SPDLOG_WARN(
        "prober found high clock drift (round-tripper-name ROUND_TRIPPER_RAFT_MESSAGE, "
        "remote-peer-id {}, clock-drift {}, rtt {})",
        IdText(id), absl::FormatDuration(peer.clock_difference), absl::FormatDuration(peer.srtt));
  }
  peer.round_trips->Record(absl::ToDoubleSeconds(peer.srtt));
}

}  // namespace capstan::server::peer
