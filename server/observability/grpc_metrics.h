// gRPC server metrics with the names and labels of go-grpc-prometheus, which
// etcd exports: grpc_server_started_total and grpc_server_handled_total by
// service, method, type (and code). With --metrics=extensive, also
// grpc_server_handling_seconds: the histogram of each RPC's time from its
// start to its status (a stream's whole life), with Prometheus's default
// buckets, as etcd exports it then.

#ifndef CAPSTAN_SERVER_OBSERVABILITY_GRPC_METRICS_H_
#define CAPSTAN_SERVER_OBSERVABILITY_GRPC_METRICS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"

#include "grpcpp/support/server_interceptor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/api/counted_call.h"
#include "util/mutex.h"

namespace capstan::server {

class RequestMetrics;

// Counts RPCs into two counter families of a prometheus registry: through
// an interceptor, except the methods that count themselves
// (server/api/counted_call.h). Thread-safe.
class GrpcMetrics final : public CallCounter {
 public:
  // The series of one method. Its labels are built and looked up in the
  // families once, on the method's first call, not on every call.
  using MethodSeries = CallCounter::Method;

  // Registers the families in `registry`, which must outlive this object;
  // the handling-time histogram only with `handling_time`. With requests
  // (which must outlive this object), also times the calls etcd times in
  // etcd_server_request_duration_seconds and _range_duration_seconds.
  GrpcMetrics(prometheus::Registry* registry, bool handling_time,
              RequestMetrics* requests = nullptr);
  ~GrpcMetrics() override;

  // An interceptor factory to install with ServerBuilder; it records into
  // this object, which must outlive the server. It intercepts no method
  // that counts itself.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewInterceptorFactory();

  // The series of `method`, gRPC's full name ("/etcdserverpb.KV/Range"),
  // made on first use and owned by this object.
  MethodSeries* ForMethod(const char* method, grpc::internal::RpcMethod::RpcType type);

  // CallCounter. Every call is counted through these, by the interceptor
  // or by the method itself; unary calls are also counted in flight.
  MethodSeries* CountsItself(const char* method, grpc::internal::RpcMethod::RpcType type) override;
  bool TimesCalls(const MethodSeries* series) const override;
  void CallStarted(MethodSeries* series) override;
  void CallEnded(MethodSeries* series, grpc::StatusCode code, double seconds) override;
  void CallDone(MethodSeries* series) override;

  // Unary RPCs started and not yet over (streams are not counted: they end
  // when the server stops).
  int64_t unary_in_flight() const { return unary_in_flight_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> unary_in_flight_{0};
  prometheus::Family<prometheus::Counter>& started_;
  prometheus::Family<prometheus::Counter>& handled_;
  prometheus::Family<prometheus::Histogram>* const handling_;  // null unless extensive
  RequestMetrics* const requests_;                             // may be null
  // The series of each method, made on first use. Lock order: before the
  // prometheus families' own locks (series are added to them under it).
  util::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<MethodSeries>> methods_ ABSL_GUARDED_BY(mu_);
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_OBSERVABILITY_GRPC_METRICS_H_
