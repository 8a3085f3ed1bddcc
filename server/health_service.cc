#include "server/health_service.h"

#include <atomic>
#include <string>

namespace capstan::server {

using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

namespace {

// etcd registers its status under the empty name only.
HealthCheckResponse::ServingStatus StatusOf(const std::string& service) {
  return service.empty() ? HealthCheckResponse::SERVING : HealthCheckResponse::SERVICE_UNKNOWN;
}

// Sends the status once, then holds the stream open until the client goes
// away or the server stops (the status never changes). Deletes itself.
class WatchReactor final : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  explicit WatchReactor(HealthCheckResponse::ServingStatus status) {
    status_.set_status(status);
    StartWrite(&status_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) End();
  }
  void OnCancel() override { End(); }
  void OnDone() override { delete this; }

 private:
  // Both a failed write and the cancel may report the client gone, on
  // different threads: finish once.
  void End() {
    if (!ended_.exchange(true)) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "Stream has ended."));
    }
  }

  HealthCheckResponse status_;
  std::atomic<bool> ended_{false};
};

}  // namespace

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* ctx,
                                               const HealthCheckRequest* request,
                                               HealthCheckResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  const HealthCheckResponse::ServingStatus status = StatusOf(request->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service"));
    return reactor;
  }
  response->set_status(status);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext*, const HealthCheckRequest* request) {
  return new WatchReactor(StatusOf(request->service()));
}

}  // namespace capstan::server
