// Streaming etcd calls over the gRPC callback API: long-lived Watch and
// LeaseKeepAlive streams, a one-shot LeaseKeepAlive (etcd's KeepAliveOnce), and the tracker that
// matches watch events to the writes that caused them.

#ifndef CAPSTAN_BENCH_LOADGEN_STREAMS_H_
#define CAPSTAN_BENCH_LOADGEN_STREAMS_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include <google/protobuf/arena.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/types/span.h"
#include "bench/loadgen/histogram.h"
#include "bench/loadgen/response_summary.h"
#include "bench/loadgen/timeline.h"
#include "etcdserverpb/rpc.grpc.pb.h"

namespace capstan::bench {

using SteadyClock = std::chrono::steady_clock;

// One long-lived bidirectional stream. Responses go to on_response on a gRPC
// thread, one at a time, in stream order; it must not block. Send() may be
// called from any thread; requests are written in order, one write in
// flight.
//
// A protobuf response is parsed into an arena that is reset before the next
// read: a watch response carries thousands of events, and parsing them into
// a reused heap message would free and reallocate every event's KeyValue and
// its strings (protobuf's Clear deletes sub-messages). Any other Response (a
// summary, response_summary.h) is one object reused for every read.
template <typename Request, typename Response>
class BidiStream : public grpc::ClientBidiReactor<Request, Response> {
 public:
  using Handler = std::function<void(const Response&)>;

  // REQUIRES: Finish() has returned.
  ~BidiStream() override = default;

  void Send(Request request) {
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
    this->StartWrite(&writing_request_);
  }

  // Cancels the stream, waits until gRPC is done with it and returns the
  // status it ended with (CANCELLED when it was still healthy).
  grpc::Status Finish() {
    {
      std::lock_guard<std::mutex> l(mu_);
      finishing_ = true;
    }
    ctx_.TryCancel();
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [this] { return done_; });
    return status_;
  }

  // Whether the stream ended before Finish() was called, and why.
  bool Broken(grpc::Status* status) {
    std::lock_guard<std::mutex> l(mu_);
    if (done_ && !finishing_) {
      *status = status_;
      return true;
    }
    return false;
  }

  void OnWriteDone(bool ok) override {
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
    this->StartWrite(&writing_request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // the stream is ending; OnDone follows
    on_response_(*response_);
    if constexpr (std::is_base_of_v<google::protobuf::MessageLite, Response>) {
      arena_.Reset();
      response_ = google::protobuf::Arena::CreateMessage<Response>(&arena_);
    }
    this->StartRead(response_);
  }

  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> l(mu_);
    done_ = true;
    status_ = status;
    done_cv_.notify_all();
  }

 protected:
  explicit BidiStream(Handler on_response)
      : on_response_(std::move(on_response)), arena_(ArenaOptions()),
        response_(google::protobuf::Arena::Create<Response>(&arena_)) {}
  // Called by the subclass once the call is bound to this reactor.
  void Begin() {
    this->StartRead(response_);
    this->StartCall();
  }

  grpc::ClientContext ctx_;

 private:
  static google::protobuf::ArenaOptions ArenaOptions() {
    google::protobuf::ArenaOptions o;
    o.start_block_size = 64 << 10;
    o.max_block_size = 1 << 20;
    return o;
  }

  Handler on_response_;
  google::protobuf::Arena arena_;  // holds response_; reset between reads of a message
  Response* response_;             // owned by the read in flight

  std::mutex mu_;
  std::condition_variable done_cv_;
  std::deque<Request> queue_;  // guarded by mu_
  Request writing_request_;    // owned by the write in flight
  bool writing_ = false;       // guarded by mu_
  bool finishing_ = false;     // guarded by mu_
  bool write_failed_ = false;  // guarded by mu_
  bool done_ = false;          // guarded by mu_
  grpc::Status status_;        // guarded by mu_
};

// One Watch stream; starts at once.
class WatchStream final
    : public BidiStream<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse> {
 public:
  WatchStream(etcdserverpb::Watch::Stub& stub, Handler on_response)
      : BidiStream(std::move(on_response)) {
    stub.async()->Watch(&ctx_, this);
    Begin();
  }
};

// A Watch stream read as WatchResponseSummary: what the watch benchmarks
// need of each response, without parsing keys and values; starts at once.
class WatchSummaryStream final
    : public BidiStream<etcdserverpb::WatchRequest, WatchResponseSummary> {
 public:
  WatchSummaryStream(const std::shared_ptr<grpc::Channel>& channel, Handler on_response)
      : BidiStream(std::move(on_response)) {
    grpc::TemplatedGenericStub<etcdserverpb::WatchRequest, WatchResponseSummary> stub(channel);
    stub.PrepareBidiStreamingCall(&ctx_, WatchMethod(), grpc::StubOptions(), this);
    Begin();
  }
};

// One LeaseKeepAlive stream carrying many leases' keep-alives, as etcd
// clientv3's KeepAlive loop uses it; starts at once.
class KeepAliveStream final
    : public BidiStream<etcdserverpb::LeaseKeepAliveRequest, etcdserverpb::LeaseKeepAliveResponse> {
 public:
  KeepAliveStream(etcdserverpb::Lease::Stub& stub, Handler on_response)
      : BidiStream(std::move(on_response)) {
    stub.async()->LeaseKeepAlive(&ctx_, this);
    Begin();
  }
};

// etcd clientv3's KeepAliveOnce: opens a LeaseKeepAlive stream, sends one
// request, reads one response, closes the stream, then calls done (on a gRPC
// thread) with the status and the TTL the server granted (0 or less: the
// lease is gone). Deletes itself.
void KeepAliveOnce(etcdserverpb::Lease::Stub& stub, int64_t lease_id,
                   std::function<void(const grpc::Status&, int64_t ttl)> done);

// Matches watch events to the writes that caused them by revision, and records
// event delivery latency: event received - write started; and, if asked,
// etcd's watch-latency measure: event received - write completed (0 for an
// event that arrived before its write's response). A write is known by its
// revision only once it completes, so events that arrive first wait here.
// Thread-safe.
class DeliveryTracker {
 public:
  explicit DeliveryTracker(Histogram* latency, Histogram* after_completion = nullptr)
      : latency_(latency), after_completion_(after_completion) {}

  // The write that made `revision` started at `started` and should produce
  // `expected_events` events across all watchers.
  void WriteCommitted(int64_t revision, SteadyClock::time_point started, int expected_events);
  void EventReceived(int64_t revision, SteadyClock::time_point received);
  // The events of one response, all received at `received`: one lock for
  // all of them.
  void EventsReceived(absl::Span<const int64_t> revisions, SteadyClock::time_point received);

  // Also records each event's latency, at the time it was received, in
  // timeline (which must outlive the tracker); before the events it is for.
  void SetTimeline(Timeline* timeline) { timeline_ = timeline; }

  uint64_t Matched() const;
  // Events still expected from committed writes.
  uint64_t Outstanding() const;
  // Blocks until Outstanding() is 0 or the timeout passes; returns Outstanding().
  uint64_t WaitForAll(std::chrono::milliseconds timeout);

 private:
  struct Pending {
    SteadyClock::time_point started, completed;
    int remaining = 0;
  };
  Histogram* const latency_;
  Histogram* const after_completion_;
  Timeline* timeline_ = nullptr;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<int64_t, Pending> pending_;                              // guarded by mu_
  std::unordered_map<int64_t, std::vector<SteadyClock::time_point>> early_;  // guarded by mu_
  uint64_t outstanding_ = 0;                                                  // guarded by mu_
  uint64_t matched_ = 0;                                                      // guarded by mu_
};

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_STREAMS_H_
