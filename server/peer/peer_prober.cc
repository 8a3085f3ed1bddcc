#include "server/peer/peer_prober.h"

#include <algorithm>
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
  std::shared_ptr<Call> in_flight;
};

struct PeerProber::Call {
  uint64_t id = 0;
  absl::Time sent;
  std::unique_ptr<capstan::v1::Peer::Stub> stub;
  grpc::ClientContext context;
  capstan::v1::ProbeRequest request;
  capstan::v1::ProbeResponse response;
};

PeerProber::PeerProber(PeerProberOptions options) : options_(std::move(options)) {}

PeerProber::~PeerProber() { Stop(); }

void PeerProber::Start() {
  {
    util::MutexLock l(&mu_);
    if (started_ || stopping_) return;
    started_ = true;
  }
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
  ++changes_;
}

void PeerProber::RemovePeer(uint64_t id) {
  std::shared_ptr<Call> in_flight;
  {
    util::MutexLock l(&mu_);
    auto it = peers_.find(id);
    if (it == peers_.end()) return;
    // An answer still to come finds no peer and only counts itself out.
    in_flight = it->second->in_flight;
    peers_.erase(it);
  }
  // Outside the lock: gRPC may run the call's callback inside TryCancel.
  if (in_flight) in_flight->context.TryCancel();
}

void PeerProber::Stop() {
  bool join = false;
  std::vector<std::shared_ptr<Call>> in_flight;
  {
    util::MutexLock l(&mu_);
    stopping_ = true;
    ++changes_;
    join = started_ && !joined_;
    joined_ = true;
    for (auto& [id, peer] : peers_) {
      if (peer->in_flight) in_flight.push_back(peer->in_flight);
    }
  }
  for (auto& call : in_flight) call->context.TryCancel();
  {
    // The answers refer to this prober: wait for every one.
    util::MutexLock l(&mu_);
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return in_flight_ == 0; };
    mu_.Await(absl::Condition(&idle));
  }
  if (join && thread_.joinable()) thread_.join();
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

void PeerProber::Run() {
  struct Start {
    std::shared_ptr<Call> call;
    std::function<std::shared_ptr<grpc::Channel>()> channel;
  };
  for (;;) {
    std::vector<Start> starts;
    {
      util::MutexLock l(&mu_);
      if (stopping_) return;
      const absl::Time now = absl::Now();
      absl::Time wake = now + options_.report_interval;
      for (auto& [id, peer] : peers_) {
        if (now >= peer->next_probe) {
          peer->next_probe = now + options_.probe_interval;
          // One probe at a time: a peer that does not answer is not asked twice.
          if (!peer->in_flight && peer->channel) {
            auto call = std::make_shared<Call>();
            call->id = id;
            call->sent = now;
            call->context.set_deadline(absl::ToChronoTime(now + options_.probe_timeout));
            peer->in_flight = call;
            ++in_flight_;
            starts.push_back({std::move(call), peer->channel});
          }
        }
        if (now >= peer->next_report) ReportLocked(id, *peer, now);
        wake = std::min({wake, peer->next_probe, peer->next_report});
      }
      if (starts.empty()) {
        const uint64_t seen = changes_;
        auto changed = [this, seen]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return changes_ != seen; };
        mu_.AwaitWithTimeout(absl::Condition(&changed),
                             std::max(wake - absl::Now(), absl::ZeroDuration()));
        continue;
      }
    }
    // Outside the lock: the channel's owner has a lock of its own, and a
    // call that fails at once may run its callback before Probe returns.
    for (Start& start : starts) StartProbe(std::move(start.call), start.channel());
  }
}

void PeerProber::StartProbe(std::shared_ptr<Call> call, std::shared_ptr<grpc::Channel> channel) {
  if (channel == nullptr) {
    Answered(call.get(), grpc::Status(grpc::UNAVAILABLE, "no channel to the peer"));
    return;
  }
  call->stub = capstan::v1::Peer::NewStub(channel);
  // The callback holds the call (its context, request and response) until
  // gRPC is done with it.
  Call* raw = call.get();
  raw->stub->async()->Probe(&raw->context, &raw->request, &raw->response,
                            [this, call = std::move(call)](grpc::Status s) { Answered(call.get(), s); });
}

void PeerProber::Answered(Call* call, const grpc::Status& status) {
  const absl::Time now = absl::Now();
  util::MutexLock l(&mu_);
  --in_flight_;
  auto it = peers_.find(call->id);
  if (it == peers_.end() || it->second->in_flight.get() != call) return;
  Peer& p = *it->second;
  p.in_flight = nullptr;
  ++p.probes;
  if (!status.ok()) {
    p.healthy = false;
    p.error = status.error_message();
    return;
  }
  p.healthy = true;
  p.error.clear();
  p.srtt = p.srtt * 7 / 8 + (now - call->sent) / 8;
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
