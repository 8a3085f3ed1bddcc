// Streaming etcd calls over the gRPC callback API: a long-lived Watch stream,
// a one-shot LeaseKeepAlive (etcd's KeepAliveOnce), and the tracker that
// matches watch events to the writes that caused them.

#ifndef CAPSTAN_BENCH_LOADGEN_STREAMS_H_
#define CAPSTAN_BENCH_LOADGEN_STREAMS_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <unordered_map>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "bench/loadgen/histogram.h"
#include "etcdserverpb/rpc.grpc.pb.h"

namespace capstan::bench {

using SteadyClock = std::chrono::steady_clock;

// One Watch stream. Responses go to on_response on a gRPC thread, one at a
// time, in stream order; it must not block. Send() may be called from any
// thread; requests are written in order, one write in flight.
class WatchStream final
    : public grpc::ClientBidiReactor<etcdserverpb::WatchRequest, etcdserverpb::WatchResponse> {
 public:
  using Handler = std::function<void(const etcdserverpb::WatchResponse&)>;

  // Starts the stream at once.
  WatchStream(etcdserverpb::Watch::Stub& stub, Handler on_response);
  // REQUIRES: Finish() has returned.
  ~WatchStream() override = default;

  void Send(etcdserverpb::WatchRequest request);
  // Cancels the stream, waits until gRPC is done with it and returns the
  // status it ended with (CANCELLED when it was still healthy).
  grpc::Status Finish();
  // Whether the stream ended before Finish() was called, and why.
  bool Broken(grpc::Status* status);

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  grpc::ClientContext ctx_;
  Handler on_response_;
  etcdserverpb::WatchResponse response_;  // owned by the read in flight

  std::mutex mu_;
  std::condition_variable done_cv_;
  std::deque<etcdserverpb::WatchRequest> queue_;  // guarded by mu_
  etcdserverpb::WatchRequest writing_request_;    // owned by the write in flight
  bool writing_ = false;                          // guarded by mu_
  bool finishing_ = false;                        // guarded by mu_
  bool write_failed_ = false;                     // guarded by mu_
  bool done_ = false;                             // guarded by mu_
  grpc::Status status_;                           // guarded by mu_
};

// etcd clientv3's KeepAliveOnce: opens a LeaseKeepAlive stream, sends one
// request, reads one response, closes the stream, then calls done (on a gRPC
// thread) with the status and the TTL the server granted (0 or less: the
// lease is gone). Deletes itself.
void KeepAliveOnce(etcdserverpb::Lease::Stub& stub, int64_t lease_id,
                   std::function<void(const grpc::Status&, int64_t ttl)> done);

// Matches watch events to the writes that caused them by revision, and records
// event delivery latency: event received - write started. A write is known by
// its revision only once it completes, so events that arrive first wait here.
// Thread-safe.
class DeliveryTracker {
 public:
  explicit DeliveryTracker(Histogram* latency) : latency_(latency) {}

  // The write that made `revision` started at `started` and should produce
  // `expected_events` events across all watchers.
  void WriteCommitted(int64_t revision, SteadyClock::time_point started, int expected_events);
  void EventReceived(int64_t revision, SteadyClock::time_point received);

  uint64_t Matched() const;
  // Events still expected from committed writes.
  uint64_t Outstanding() const;
  // Blocks until Outstanding() is 0 or the timeout passes; returns Outstanding().
  uint64_t WaitForAll(std::chrono::milliseconds timeout);

 private:
  struct Pending {
    SteadyClock::time_point started;
    int remaining = 0;
  };
  Histogram* const latency_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<int64_t, Pending> pending_;                              // guarded by mu_
  std::unordered_map<int64_t, std::vector<SteadyClock::time_point>> early_;  // guarded by mu_
  uint64_t outstanding_ = 0;                                                  // guarded by mu_
  uint64_t matched_ = 0;                                                      // guarded by mu_
};

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_STREAMS_H_
