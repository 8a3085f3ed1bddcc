// gRPC server metrics with the names and labels of go-grpc-prometheus, which
// etcd exports: grpc_server_started_total and grpc_server_handled_total by
// service, method, type (and code). Also etcd_debugging_lease_granted_total:
// etcd's lessor counts grants; here every grant is a successful LeaseGrant RPC.

#ifndef CAPSTAN_SERVER_GRPC_METRICS_H_
#define CAPSTAN_SERVER_GRPC_METRICS_H_

#include <memory>

#include "grpcpp/support/server_interceptor.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"

namespace capstan::server {

// Counts RPCs into two counter families of a prometheus registry. Thread-safe.
class GrpcMetrics {
 public:
  // Registers the families in `registry`, which must outlive this object.
  explicit GrpcMetrics(prometheus::Registry* registry);

  // An interceptor factory to install with ServerBuilder; it records into
  // this object, which must outlive the server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewInterceptorFactory();

  // `method` is gRPC's full name, "/etcdserverpb.KV/Range".
  void Started(const char* method, grpc::internal::RpcMethod::RpcType type);
  void Handled(const char* method, grpc::internal::RpcMethod::RpcType type, grpc::StatusCode code);

 private:
  prometheus::Family<prometheus::Counter>& started_;
  prometheus::Family<prometheus::Counter>& handled_;
  prometheus::Counter& lease_granted_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_GRPC_METRICS_H_
