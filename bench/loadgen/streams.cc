#include "bench/loadgen/streams.h"

#include <memory>

#include "absl/container/inlined_vector.h"
#include "bench/loadgen/async_call.h"

namespace capstan::bench {

// KeepAliveOnce

namespace {

class KeepAliveOnceCall final : public grpc::ClientBidiReactor<etcdserverpb::LeaseKeepAliveRequest,
                                                               etcdserverpb::LeaseKeepAliveResponse> {
 public:
  KeepAliveOnceCall(etcdserverpb::Lease::Stub& stub, int64_t lease_id,
                    std::function<void(const grpc::Status&, int64_t)> done)
      : done_(std::move(done)) {
    SetDeadline(&ctx_);
    request_.set_id(lease_id);
    stub.async()->LeaseKeepAlive(&ctx_, this);
    StartWrite(&request_);
    StartRead(&response_);
    StartCall();
  }

  void OnWriteDone(bool ok) override {}
  void OnReadDone(bool ok) override {
    got_response_ = ok;
    // One answer is all KeepAliveOnce wants; close the stream like the Go client.
    ctx_.TryCancel();
  }
  void OnDone(const grpc::Status& status) override {
    std::unique_ptr<KeepAliveOnceCall> self(this);
    if (got_response_) {
      done_(grpc::Status::OK, response_.ttl());
    } else if (!status.ok()) {
      done_(status, 0);
    } else {
      done_(grpc::Status(grpc::UNKNOWN, "keepalive stream closed without a response"), 0);
    }
  }

 private:
  grpc::ClientContext ctx_;
  etcdserverpb::LeaseKeepAliveRequest request_;
  etcdserverpb::LeaseKeepAliveResponse response_;
  std::function<void(const grpc::Status&, int64_t)> done_;
  bool got_response_ = false;
};

}  // namespace

void KeepAliveOnce(etcdserverpb::Lease::Stub& stub, int64_t lease_id,
                   std::function<void(const grpc::Status&, int64_t ttl)> done) {
  new KeepAliveOnceCall(stub, lease_id, std::move(done));  // deletes itself in OnDone
}

// DeliveryTracker

void DeliveryTracker::WriteCommitted(int64_t revision, SteadyClock::time_point started,
                                     int expected_events) {
  if (expected_events <= 0) return;
  const auto completed = SteadyClock::now();
  std::lock_guard<std::mutex> l(mu_);
  int remaining = expected_events;
  if (auto it = early_.find(revision); it != early_.end()) {
    for (auto received : it->second) {
      const auto ns = static_cast<uint64_t>(std::max<int64_t>(
          0, std::chrono::duration_cast<std::chrono::nanoseconds>(received - started).count()));
      latency_->Record(ns);
      if (timeline_ != nullptr) timeline_->Record(received, ns);
      if (after_completion_ != nullptr) after_completion_->Record(0);
      ++matched_;
      --remaining;
    }
    early_.erase(it);
  }
  if (remaining > 0) {
    pending_[revision] = Pending{started, completed, remaining};
    outstanding_ += remaining;
  }
  cv_.notify_all();
}

void DeliveryTracker::EventReceived(int64_t revision, SteadyClock::time_point received) {
  EventsReceived({revision}, received);
}

void DeliveryTracker::EventsReceived(absl::Span<const int64_t> revisions,
                                     SteadyClock::time_point received) {
  if (revisions.empty()) return;
  auto since = [received](SteadyClock::time_point t) {
    return static_cast<uint64_t>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::nanoseconds>(received - t).count()));
  };
  // One histogram update for all of them, before a waiter can see the last
  // of them counted.
  absl::InlinedVector<uint64_t, 64> latencies, after_completion;
  std::lock_guard<std::mutex> l(mu_);
  for (int64_t revision : revisions) {
    auto it = pending_.find(revision);
    if (it == pending_.end()) {
      early_[revision].push_back(received);
      continue;
    }
    latencies.push_back(since(it->second.started));
    if (after_completion_ != nullptr) after_completion.push_back(since(it->second.completed));
    ++matched_;
    --outstanding_;
    if (--it->second.remaining <= 0) pending_.erase(it);
  }
  latency_->RecordAll(latencies.data(), latencies.size());
  if (timeline_ != nullptr) {
    for (uint64_t ns : latencies) timeline_->Record(received, ns);
  }
  if (after_completion_ != nullptr) {
    after_completion_->RecordAll(after_completion.data(), after_completion.size());
  }
  if (outstanding_ == 0) cv_.notify_all();
}

uint64_t DeliveryTracker::Matched() const {
  std::lock_guard<std::mutex> l(mu_);
  return matched_;
}

uint64_t DeliveryTracker::Outstanding() const {
  std::lock_guard<std::mutex> l(mu_);
  return outstanding_;
}

uint64_t DeliveryTracker::WaitForAll(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, timeout, [this] { return outstanding_ == 0; });
  return outstanding_;
}

}  // namespace capstan::bench
