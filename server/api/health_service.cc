#include "server/api/health_service.h"

#include <string>

#include "absl/base/thread_annotations.h"
#include "util/mutex.h"

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
    util::MutexLock l(&mu_);
    writing_ = false;
    if (!ok || cancelled_) FinishLocked();
  }
  // Finish waits for the write in flight: gRPC allows no Finish while one is.
  void OnCancel() override {
    util::MutexLock l(&mu_);
    cancelled_ = true;
    if (!writing_) FinishLocked();
  }
  void OnDone() override { delete this; }

 private:
  void FinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "Stream has ended."));
  }

  HealthCheckResponse status_;
  // A leaf. Finish is called under it (it does not block): the write and
  // the cancel race to it.
  util::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = true;  // the status is being written
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
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
