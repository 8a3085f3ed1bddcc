#include "server/grpc_metrics.h"

#include "absl/strings/str_cat.h"

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

const char* CodeName(int code) {
  static const char* kNames[] = {"OK",           "Canceled",          "Unknown",
                                 "InvalidArgument", "DeadlineExceeded", "NotFound",
                                 "AlreadyExists", "PermissionDenied",  "ResourceExhausted",
                                 "FailedPrecondition", "Aborted",      "OutOfRange",
                                 "Unimplemented", "Internal",          "Unavailable",
                                 "DataLoss",     "Unauthenticated"};
  return code >= 0 && code <= 16 ? kNames[code] : "Unknown";
}

// "/etcdserverpb.KV/Range" -> labels for service and method.
std::string MethodLabels(const std::string& full) {
  const size_t slash = full.find('/', 1);
  std::string service = slash == std::string::npos ? full : full.substr(1, slash - 1);
  std::string method = slash == std::string::npos ? "" : full.substr(slash + 1);
  return absl::StrCat("grpc_method=\"", method, "\",grpc_service=\"", service, "\"");
}

class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(GrpcMetrics* metrics, grpc::experimental::ServerRpcInfo* info)
      : metrics_(metrics), info_(info) {
    metrics_->Started(info_->method(), static_cast<RpcType>(info_->type()));
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_->Handled(info_->method(), static_cast<RpcType>(info_->type()),
                        methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  GrpcMetrics* const metrics_;
  grpc::experimental::ServerRpcInfo* const info_;
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

void GrpcMetrics::Started(const char* method, RpcType type) {
  std::lock_guard<std::mutex> l(mu_);
  ++started_[{method, static_cast<int>(type)}];
}

void GrpcMetrics::Handled(const char* method, RpcType type, grpc::StatusCode code) {
  std::lock_guard<std::mutex> l(mu_);
  ++handled_[{method, static_cast<int>(type), static_cast<int>(code)}];
}

std::string GrpcMetrics::Render() const {
  std::lock_guard<std::mutex> l(mu_);
  std::string out =
      "# HELP grpc_server_started_total Total number of RPCs started on the server.\n"
      "# TYPE grpc_server_started_total counter\n";
  for (const auto& [k, n] : started_) {
    absl::StrAppend(&out, "grpc_server_started_total{", MethodLabels(k.first), ",grpc_type=\"",
                    TypeName(k.second), "\"} ", n, "\n");
  }
  absl::StrAppend(&out,
                  "# HELP grpc_server_handled_total Total number of RPCs completed on the server, "
                  "regardless of success or failure.\n"
                  "# TYPE grpc_server_handled_total counter\n");
  for (const auto& [k, n] : handled_) {
    absl::StrAppend(&out, "grpc_server_handled_total{grpc_code=\"", CodeName(std::get<2>(k)), "\",",
                    MethodLabels(std::get<0>(k)), ",grpc_type=\"", TypeName(std::get<1>(k)), "\"} ",
                    n, "\n");
  }
  return out;
}

}  // namespace capstan::server
