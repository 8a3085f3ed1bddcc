#include "server/grpc_metrics.h"

#include <chrono>
#include <string>

#include "server/errors.h"

namespace capstan::server {
namespace {

using RpcType = grpc::internal::RpcMethod::RpcType;

const char* TypeName(int type) {
  switch (static_cast<RpcType>(type)) {
    case RpcType::NORMAL_RPC: return "unary";
    case RpcType::CLIENT_STREAMING: return "client_stream";
    case RpcType::SERVER_STREAMING: return "server_stream";
    default: return "bidi_stream";
  }
}

// "/etcdserverpb.KV/Range" -> go-grpc-prometheus's labels (grpc_code added
// by the caller where it applies).
prometheus::Labels MethodLabels(const std::string& full, int type) {
  const size_t slash = full.find('/', 1);
  std::string service = slash == std::string::npos ? full : full.substr(1, slash - 1);
  std::string method = slash == std::string::npos ? "" : full.substr(slash + 1);
  return {{"grpc_method", std::move(method)},
          {"grpc_service", std::move(service)},
          {"grpc_type", TypeName(type)}};
}

class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(GrpcMetrics* metrics, grpc::experimental::ServerRpcInfo* info)
      : metrics_(metrics), info_(info), start_(std::chrono::steady_clock::now()) {
    metrics_->Started(info_->method(), static_cast<RpcType>(info_->type()));
    if (unary()) metrics_->UnaryBegan();
  }
  // gRPC destroys the interceptor when the call is over, however it ended.
  ~MetricsInterceptor() override {
    if (unary()) metrics_->UnaryEnded();
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start_;
      metrics_->Handled(info_->method(), static_cast<RpcType>(info_->type()),
                        methods->GetSendStatus().error_code(), took.count());
    }
    methods->Proceed();
  }

 private:
  bool unary() const {
    return info_->type() == grpc::experimental::ServerRpcInfo::Type::UNARY;
  }

  GrpcMetrics* const metrics_;
  grpc::experimental::ServerRpcInfo* const info_;
  const std::chrono::steady_clock::time_point start_;
};

class MetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsInterceptorFactory(GrpcMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new MetricsInterceptor(metrics_, info);
  }

 private:
  GrpcMetrics* const metrics_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
GrpcMetrics::NewInterceptorFactory() {
  return std::make_unique<MetricsInterceptorFactory>(this);
}

GrpcMetrics::GrpcMetrics(prometheus::Registry* registry, bool handling_time)
    : started_(prometheus::BuildCounter()
                   .Name("grpc_server_started_total")
                   .Help("Total number of RPCs started on the server.")
                   .Register(*registry)),
      handled_(prometheus::BuildCounter()
                   .Name("grpc_server_handled_total")
                   .Help("Total number of RPCs completed on the server, regardless of success or "
                         "failure.")
                   .Register(*registry)),
      handling_(handling_time
                    ? &prometheus::BuildHistogram()
                           .Name("grpc_server_handling_seconds")
                           .Help("Histogram of response latency (seconds) of gRPC that had been "
                                 "application-level handled by the server.")
                           .Register(*registry)
                    : nullptr) {}

void GrpcMetrics::Started(const char* method, RpcType type) {
  started_.Add(MethodLabels(method, static_cast<int>(type))).Increment();
}

void GrpcMetrics::Handled(const char* method, RpcType type, grpc::StatusCode code,
                          double seconds) {
  auto labels = MethodLabels(method, static_cast<int>(type));
  if (handling_ != nullptr) {
    // Prometheus's default buckets (prometheus.DefBuckets in Go).
    static const prometheus::Histogram::BucketBoundaries kBuckets = {
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
    handling_->Add(labels, kBuckets).Observe(seconds);
  }
  labels.emplace("grpc_code", GoCodeName(code));
  handled_.Add(labels).Increment();
}

}  // namespace capstan::server
