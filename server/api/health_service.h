// grpc.health.v1.Health as etcd serves it on the client port: the empty
// service name (every etcd service at once) is SERVING for as long as the
// server runs, and any other name is unknown (Check: NOT_FOUND "unknown
// service"; Watch: SERVICE_UNKNOWN, and the stream stays open). etcd 3.4
// and 3.5 never change the status; neither does Capstan.

#ifndef CAPSTAN_SERVER_API_HEALTH_SERVICE_H_
#define CAPSTAN_SERVER_API_HEALTH_SERVICE_H_

#include "grpc/health/v1/health.grpc.pb.h"

namespace capstan::server {

// Thread-safe.
class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* ctx,
      const grpc::health::v1::HealthCheckRequest* request) override;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_HEALTH_SERVICE_H_
