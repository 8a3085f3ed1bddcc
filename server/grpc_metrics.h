// gRPC server metrics with the names and labels of go-grpc-prometheus, which
// etcd exports: grpc_server_started_total and grpc_server_handled_total by
// service, method, type (and code). With --metrics=extensive, also
// grpc_server_handling_seconds: the histogram of each RPC's time from its
// start to its status (a stream's whole life), with Prometheus's default
// buckets, as etcd exports it then.

#ifndef CAPSTAN_SERVER_GRPC_METRICS_H_
#define CAPSTAN_SERVER_GRPC_METRICS_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "grpcpp/support/server_interceptor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace capstan::server {

// Counts RPCs into two counter families of a prometheus registry. Thread-safe.
class GrpcMetrics {
 public:
  // Registers the families in `registry`, which must outlive this object;
  // the handling-time histogram only with `handling_time`.
  GrpcMetrics(prometheus::Registry* registry, bool handling_time);

  // An interceptor factory to install with ServerBuilder; it records into
  // this object, which must outlive the server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewInterceptorFactory();

  // `method` is gRPC's full name, "/etcdserverpb.KV/Range".
  void Started(const char* method, grpc::internal::RpcMethod::RpcType type);
  void Handled(const char* method, grpc::internal::RpcMethod::RpcType type, grpc::StatusCode code,
               double seconds);

  // Unary RPCs started and not yet over (streams are not counted: they end
  // when the server stops).
  int64_t unary_in_flight() const { return unary_in_flight_.load(std::memory_order_relaxed); }
  void UnaryBegan() { unary_in_flight_.fetch_add(1, std::memory_order_relaxed); }
  void UnaryEnded() { unary_in_flight_.fetch_sub(1, std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> unary_in_flight_{0};
  prometheus::Family<prometheus::Counter>& started_;
  prometheus::Family<prometheus::Counter>& handled_;
  prometheus::Family<prometheus::Histogram>* const handling_;  // null unless extensive
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_GRPC_METRICS_H_
