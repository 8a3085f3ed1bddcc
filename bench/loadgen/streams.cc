#include "bench/loadgen/streams.h"

#include <memory>

#include "bench/loadgen/async_call.h"

namespace capstan::bench {

// WatchStream

WatchStream::WatchStream(etcdserverpb::Watch::Stub& stub, Handler on_response)
    : on_response_(std::move(on_response)) {
  stub.async()->Watch(&ctx_, this);
  StartRead(&response_);
  StartCall();
}

void WatchStream::Send(etcdserverpb::WatchRequest request) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (done_ || finishing_ || write_failed_) return;
    if (writing_) {
      queue_.push_back(std::move(request));
      return;
    }
    writing_ = true;
    writing_request_ = std::move(request);
  }
  StartWrite(&writing_request_);
}

void WatchStream::OnWriteDone(bool ok) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!ok) write_failed_ = true;  // the stream is broken: no more writes
    if (!ok || queue_.empty() || finishing_) {
      writing_ = false;
      queue_.clear();
      return;
    }
    writing_request_ = std::move(queue_.front());
    queue_.pop_front();
  }
  StartWrite(&writing_request_);
}

void WatchStream::OnReadDone(bool ok) {
  if (!ok) return;  // the stream is ending; OnDone follows
  on_response_(response_);
  StartRead(&response_);
}

void WatchStream::OnDone(const grpc::Status& status) {
  std::lock_guard<std::mutex> l(mu_);
  done_ = true;
  status_ = status;
  done_cv_.notify_all();
}

grpc::Status WatchStream::Finish() {
  {
    std::lock_guard<std::mutex> l(mu_);
    finishing_ = true;
  }
  ctx_.TryCancel();
  std::unique_lock<std::mutex> l(mu_);
  done_cv_.wait(l, [this] { return done_; });
  return status_;
}

bool WatchStream::Broken(grpc::Status* status) {
  std::lock_guard<std::mutex> l(mu_);
  if (done_ && !finishing_) {
    *status = status_;
    return true;
  }
  return false;
}

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
  std::lock_guard<std::mutex> l(mu_);
  int remaining = expected_events;
  if (auto it = early_.find(revision); it != early_.end()) {
    for (auto received : it->second) {
      latency_->Record(static_cast<uint64_t>(
          std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(received - started).count())));
      ++matched_;
      --remaining;
    }
    early_.erase(it);
  }
  if (remaining > 0) {
    pending_[revision] = Pending{started, remaining};
    outstanding_ += remaining;
  }
  cv_.notify_all();
}

void DeliveryTracker::EventReceived(int64_t revision, SteadyClock::time_point received) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = pending_.find(revision);
  if (it == pending_.end()) {
    early_[revision].push_back(received);
    return;
  }
  latency_->Record(static_cast<uint64_t>(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::nanoseconds>(received - it->second.started).count())));
  ++matched_;
  --outstanding_;
  if (--it->second.remaining <= 0) pending_.erase(it);
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
