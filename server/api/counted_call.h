// Methods on the hot path count their own calls into the gRPC metrics
// (grpc_server_started_total, grpc_server_handled_total and the timings of
// server/observability/grpc_metrics.h) instead of through a gRPC
// interceptor. Installing an interceptor for a method makes every operation
// of each of its calls pass through gRPC's interception hooks: measured with
// capstan-grpc-floor --interceptor, 7.5 us of server CPU per unary put and
// 3 us per keep-alive stream, on calls that cost 20-60 us in all.
//
// The services of those methods hold a CountedMethod each; the metrics leave
// the methods they hand out to the services out of their interceptor.
//
// Counted this way: KV's unary methods and LeaseKeepAlive (5.5 us less per
// put, 7 us less per keep-alive stream; A/B in docs/BENCHMARKS.md). Watch
// stays intercepted: without the interceptor, a fan-out of one event to
// 100 watch streams cost the server more CPU (2,970 against 2,750 us per
// put in etcd's watch-latency workload, in two 7-round A/Bs). Why is not
// pinned down: both make the same system calls per event.

#ifndef CAPSTAN_SERVER_API_COUNTED_CALL_H_
#define CAPSTAN_SERVER_API_COUNTED_CALL_H_

#include <chrono>
#include <utility>

#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/status.h"

namespace capstan::server {

// Where calls are counted (implemented by GrpcMetrics, whose interceptor
// counts the other methods' calls the same way). Thread-safe.
class CallCounter {
 public:
  // One method's series, owned by the counter.
  class Method;

  virtual ~CallCounter() = default;

  // The method named `name` (gRPC's full name, "/etcdserverpb.KV/Put"),
  // which from now on counts its own calls: the interceptor leaves it out.
  // Call before the server serves.
  virtual Method* CountsItself(const char* name, grpc::internal::RpcMethod::RpcType type) = 0;
  // Whether CallEnded uses the calls' durations (only then are they timed).
  virtual bool TimesCalls(const Method* method) const = 0;
  // A call started; it is handled (CallEnded) as its status is sent, and
  // over (CallDone) when gRPC is done with it.
  virtual void CallStarted(Method* method) = 0;
  virtual void CallEnded(Method* method, grpc::StatusCode code, double seconds) = 0;
  virtual void CallDone(Method* method) = 0;
};

// One call: started when made, ended once (Ended, before its status is
// sent), done when destroyed or replaced. A default-made call counts
// nothing (a service without metrics). Not thread-safe: the call's own
// steps are ordered by gRPC.
class CountedCall {
 public:
  CountedCall() = default;
  CountedCall(CallCounter* counter, CallCounter::Method* method)
      : counter_(counter), method_(method) {
    if (counter_->TimesCalls(method_)) start_ = std::chrono::steady_clock::now();
    counter_->CallStarted(method_);
  }
  CountedCall(CountedCall&& other) noexcept
      : counter_(std::exchange(other.counter_, nullptr)),
        method_(other.method_),
        start_(other.start_),
        ended_(other.ended_) {}
  CountedCall& operator=(CountedCall&& other) noexcept {
    if (this != &other) {
      Done();
      counter_ = std::exchange(other.counter_, nullptr);
      method_ = other.method_;
      start_ = other.start_;
      ended_ = other.ended_;
    }
    return *this;
  }
  CountedCall(const CountedCall&) = delete;
  CountedCall& operator=(const CountedCall&) = delete;
  ~CountedCall() { Done(); }

  // Counts the call handled with `code`; only the first time.
  void Ended(grpc::StatusCode code) {
    if (counter_ == nullptr || ended_) return;
    ended_ = true;
    double seconds = 0;
    if (counter_->TimesCalls(method_)) {
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
    counter_->CallEnded(method_, code, seconds);
  }

 private:
  void Done() {
    if (counter_ != nullptr) counter_->CallDone(method_);
    counter_ = nullptr;
  }

  CallCounter* counter_ = nullptr;  // null: nothing (more) to count
  CallCounter::Method* method_ = nullptr;
  std::chrono::steady_clock::time_point start_;
  bool ended_ = false;
};

// A method that counts its own calls, or nothing until Count is called.
class CountedMethod {
 public:
  // REQUIRES: before the server serves; counter outlives the service.
  void Count(CallCounter* counter, const char* name, grpc::internal::RpcMethod::RpcType type) {
    counter_ = counter;
    method_ = counter->CountsItself(name, type);
  }

  CountedCall Start() const {
    return counter_ == nullptr ? CountedCall() : CountedCall(counter_, method_);
  }

 private:
  CallCounter* counter_ = nullptr;
  CallCounter::Method* method_ = nullptr;
};

// The reactor of one unary call of a counted method, made per call and
// deleted when gRPC is done with it. Only this class's Finish finishes the
// call (the reactor is a private base), and counts it.
class CountedUnary final : private grpc::ServerUnaryReactor {
 public:
  explicit CountedUnary(const CountedMethod& method) : call_(method.Start()) {}

  void Finish(grpc::Status status) {
    call_.Ended(status.error_code());
    grpc::ServerUnaryReactor::Finish(std::move(status));
  }

  // What the method returns to gRPC.
  grpc::ServerUnaryReactor* reactor() { return this; }

 private:
  void OnDone() override { delete this; }
  // OnDone is trivial, so gRPC may run it on the thread that completes the
  // call, as it runs its own default reactor's: otherwise it hands OnDone to
  // its executor, a thread wake-up per call (measured: 4 us more server CPU
  // per linearizable range than the default reactor).
  bool InternalInlineable() override { return true; }

  CountedCall call_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_COUNTED_CALL_H_
