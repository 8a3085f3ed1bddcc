// gRPC server metrics with the names and labels of go-grpc-prometheus, which
// etcd exports: grpc_server_started_total and grpc_server_handled_total by
// service, method, type (and code).

#ifndef CAPSTAN_SERVER_GRPC_METRICS_H_
#define CAPSTAN_SERVER_GRPC_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>

#include "grpcpp/support/server_interceptor.h"

namespace capstan::server {

// Counts RPCs. Thread-safe.
class GrpcMetrics {
 public:
  // An interceptor factory to install with ServerBuilder; it records into
  // this object, which must outlive the server.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> NewInterceptorFactory();

  void Started(const char* method, grpc::internal::RpcMethod::RpcType type);
  void Handled(const char* method, grpc::internal::RpcMethod::RpcType type, grpc::StatusCode code);

  // Prometheus text for both families.
  std::string Render() const;

 private:
  // (full method "/service/Method", type) -> count; (.., code) -> count.
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> started_;
  std::map<std::tuple<std::string, int, int>, uint64_t> handled_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_GRPC_METRICS_H_
