// gRPC's completion-queue server model beside the callback API, for the
// methods where it costs less: a queue per core, each served by a thread of
// its own (waiting in gRPC only while its queue is busy: Serve), and every
// step of a call (accepted, read, written, finished) run on the thread that
// takes it from its queue, with no hand-off to gRPC's callback threads. capstan-grpc-floor measures the two models side by
// side (docs/BENCHMARKS.md, "gRPC's server models"): a stream per call, as
// etcd's clients open for each keep-alive, costs a third less server CPU
// on the queues.
//
//   CompletionQueues queues(&builder, 2);  // before BuildAndStart
//   server = builder.BuildAndStart();
//   queues.Start();                        // the queues' threads
//   ... services arm their calls on queues.queues() ...
//   queues.BeginStop();                    // no new calls armed
//   server->Shutdown(...);                 // every call fails or ends
//   queues.Stop();                         // waits for the calls, then drains
//
// A call is an AsyncCall: its own tag on its queue, whose Proceed runs when
// an operation it started completes. It registers with Enter (refused once
// stopping: the call is not armed) and leaves with Leave when it is done,
// so that Stop shuts the queues down only when nothing can start an
// operation on them any more.
//
// Thread safety: every method may be called from any thread, Start and
// Stop once each by the owner.

#ifndef CAPSTAN_SERVER_API_COMPLETION_QUEUES_H_
#define CAPSTAN_SERVER_API_COMPLETION_QUEUES_H_

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/server_builder.h"
#include "util/mutex.h"

namespace capstan::server {

class AsyncCall {
 public:
  virtual ~AsyncCall() = default;
  // An operation this call started completed; `ok` as gRPC reports it.
  virtual void Proceed(bool ok) = 0;
};

class CompletionQueues {
 public:
  // Adds `count` (>= 1) queues to `builder`, before it builds the server.
  CompletionQueues(grpc::ServerBuilder* builder, int count);
  // Stops (REQUIRES: the server is shut down, if it was started).
  ~CompletionQueues();
  CompletionQueues(const CompletionQueues&) = delete;
  CompletionQueues& operator=(const CompletionQueues&) = delete;

  // The queues, to arm calls on.
  const std::vector<grpc::ServerCompletionQueue*>& queues() const { return raw_; }

  // Starts a polling thread per queue. REQUIRES: the server was built.
  void Start();

  // A call that is about to be armed registers; false once stopping (do
  // not arm it). Each true is matched by a Leave when the call is done.
  bool Enter();
  void Leave();

  // From now on Enter refuses.
  void BeginStop();

  // Waits up to `timeout` until every queue's thread is idle (it had
  // nothing for a while and no longer waits in gRPC); false if one is not.
  bool TEST_AwaitIdle(absl::Duration timeout) const;
  // Waits (up to `wait`) until every registered call has left, then shuts
  // the queues down, drains them and joins the threads. REQUIRES: the
  // server's Shutdown has returned. Idempotent.
  void Stop(absl::Duration wait = absl::Seconds(10));

 private:
  // A queue's thread. While the queue has work it waits in gRPC, and so
  // takes part in gRPC's polling of the process's connections; once the
  // queue has had nothing for kLingerMs, it only looks at it every kIdleLook.
  // An idle poller is not free: on two cores each one more made the server
  // hand the polling over between its threads, a wake-up and a context
  // switch in every few unary calls (linearizable ranges 10-15% fewer per
  // second with two idle queue threads than with none). A call that comes
  // to an idle queue waits at most kIdleLook for its first step.
  void Serve(grpc::ServerCompletionQueue* cq) ABSL_LOCKS_EXCLUDED(mu_);
  // The idle looks; true once the queue has work again, false once the
  // queues stop.
  bool ServeIdle(grpc::ServerCompletionQueue* cq) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes every completion until the queue, shut down, is empty.
  static void Drain(grpc::ServerCompletionQueue* cq);
  static constexpr int64_t kLingerMs = 100;
  static constexpr absl::Duration kIdleLook = absl::Milliseconds(20);

  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> queues_;
  std::vector<grpc::ServerCompletionQueue*> raw_;
  std::vector<std::thread> threads_;
  bool stopped_ = false;

  mutable util::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  int idle_threads_ ABSL_GUARDED_BY(mu_) = 0;  // queue threads that only look
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_COMPLETION_QUEUES_H_
