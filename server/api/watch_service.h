// etcdserverpb.Watch on gRPC's completion queues (completion_queues.h),
// served raw: responses are encoded by the watch hub and written as they
// are, one write in flight per stream. A stream that stops reading fills
// only its own bounded queue; the hub then parks its watchers (see
// mvcc/watch_hub.h).
//
// Every operation of a stream (accept, read, write, finish) starts and
// completes on its queue's thread. The hub's threads never write to a
// stream: a response for an idle stream is posted to the stream's queue
// writer, which wakes the queue's thread once for all the streams posted
// meanwhile; that thread writes each and takes the completions of its own
// writes from its queue without another thread's wake-up. A fan-out of one
// event to a hundred streams so costs one wake-up per queue instead of one
// per stream (docs/BENCHMARKS.md, "Watch streams on the completion queues").

#ifndef CAPSTAN_SERVER_API_WATCH_SERVICE_H_
#define CAPSTAN_SERVER_API_WATCH_SERVICE_H_

#include <memory>
#include <vector>

#include "etcdserverpb/rpc.grpc.pb.h"
#include "membership/member.h"
#include "mvcc/watch_hub.h"
#include "server/api/completion_queues.h"

namespace capstan::server {
class AuthGate;
class WatchWriter;
}  // namespace capstan::server

namespace capstan::server {

// Thread-safe. hub and member must outlive every stream the service serves
// (shut the gRPC server down and stop the queues first).
class WatchService final
    : public etcdserverpb::Watch::WithRawMethod_Watch<etcdserverpb::Watch::Service> {
 public:
  // auth: read permission checks on created watchers (null: none); must
  // outlive every stream.
  WatchService(mvcc::WatchHub* hub, const membership::MemberInfo* member,
               const AuthGate* auth = nullptr);
  ~WatchService() override;

  // Serves Watch streams on `queues` (after the server started),
  // `per_queue` accepted at a time on each queue. REQUIRES: called once;
  // `queues` outlives the streams (CompletionQueues::Stop waits for them)
  // and is stopped before the service is destroyed.
  void ServeWatches(CompletionQueues* queues, int per_queue);

  mvcc::WatchHub* hub() const { return hub_; }
  const membership::MemberInfo* member() const { return member_; }
  const AuthGate* auth() const { return auth_; }

 private:
  mvcc::WatchHub* const hub_;
  const membership::MemberInfo* const member_;
  const AuthGate* const auth_;
  std::vector<std::unique_ptr<WatchWriter>> writers_;  // one per queue
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_WATCH_SERVICE_H_
