#include "server/observability/grpc_metrics.h"

#include <array>
#include <atomic>
#include <string>

#include "absl/strings/string_view.h"
#include "server/api/errors.h"
#include "server/observability/request_metrics.h"

namespace capstan::server {

// gRPC's codes run from OK (0) to UNAUTHENTICATED (16).
constexpr int kCodes = grpc::StatusCode::UNAUTHENTICATED + 1;

class CallCounter::Method {
 public:
  prometheus::Labels labels;  // grpc_method, grpc_service, grpc_type
  bool unary = false;
  bool counts_itself = false;  // not intercepted; set before the server serves
  prometheus::Counter* started = nullptr;
  prometheus::Histogram* handling = nullptr;  // null unless extensive
  int request_type = -1;  // RequestMetrics::RequestTypeOf; -1: not timed as a request
  bool range = false;     // KV.Range: also timed as a range
  // grpc_server_handled_total by code, each made on its first use.
  std::array<std::atomic<prometheus::Counter*>, kCodes> handled{};
};

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

// Counts one intercepted call as a method that counts itself does: gRPC
// destroys the interceptor when the call is over, however it ended.
class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(GrpcMetrics* metrics, GrpcMetrics::MethodSeries* series)
      : call_(metrics, series) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      call_.Ended(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  CountedCall call_;
};

class MetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsInterceptorFactory(GrpcMetrics* metrics) : metrics_(metrics) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    GrpcMetrics::MethodSeries* series =
        metrics_->ForMethod(info->method(), static_cast<RpcType>(info->type()));
    if (series->counts_itself) return nullptr;
    return new MetricsInterceptor(metrics_, series);
  }

 private:
  GrpcMetrics* const metrics_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
GrpcMetrics::NewInterceptorFactory() {
  return std::make_unique<MetricsInterceptorFactory>(this);
}

GrpcMetrics::GrpcMetrics(prometheus::Registry* registry, bool handling_time,
                         RequestMetrics* requests)
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
                    : nullptr),
      requests_(requests) {}

GrpcMetrics::~GrpcMetrics() = default;

GrpcMetrics::MethodSeries* GrpcMetrics::ForMethod(const char* method, RpcType type) {
  const absl::string_view name = method == nullptr ? absl::string_view() : method;
  util::MutexLock l(&mu_);
  auto& series = methods_[name];
  if (series == nullptr) {
    series = std::make_unique<MethodSeries>();
    series->labels = MethodLabels(std::string(name), static_cast<int>(type));
    series->unary = type == RpcType::NORMAL_RPC;
    series->started = &started_.Add(series->labels);
    if (requests_ != nullptr) {
      series->request_type = RequestMetrics::RequestTypeOf(name);
      series->range = RequestMetrics::IsRange(name);
    }
    if (handling_ != nullptr) {
      // Prometheus's default buckets (prometheus.DefBuckets in Go).
      static const prometheus::Histogram::BucketBoundaries kBuckets = {
          0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
      series->handling = &handling_->Add(series->labels, kBuckets);
    }
  }
  return series.get();
}

bool GrpcMetrics::TimesCalls(const MethodSeries* series) const {
  return handling_ != nullptr || series->request_type >= 0;
}

GrpcMetrics::MethodSeries* GrpcMetrics::CountsItself(const char* method, RpcType type) {
  MethodSeries* series = ForMethod(method, type);
  series->counts_itself = true;  // before the server serves: no call reads it yet
  return series;
}

void GrpcMetrics::CallStarted(MethodSeries* series) {
  series->started->Increment();
  if (series->unary) unary_in_flight_.fetch_add(1, std::memory_order_relaxed);
}

void GrpcMetrics::CallDone(MethodSeries* series) {
  if (series->unary) unary_in_flight_.fetch_sub(1, std::memory_order_relaxed);
}

void GrpcMetrics::CallEnded(MethodSeries* series, grpc::StatusCode code, double seconds) {
  if (series->handling != nullptr) series->handling->Observe(seconds);
  if (series->request_type >= 0) {
    // etcd times a request up to its answer or error, however it failed.
    requests_->ObserveRequest(series->request_type, code == grpc::StatusCode::OK, seconds);
    if (series->range) requests_->ObserveRange(code == grpc::StatusCode::OK, seconds);
  }
  const bool known = code >= 0 && code < kCodes;
  prometheus::Counter* counter =
      known ? series->handled[code].load(std::memory_order_acquire) : nullptr;
  if (counter == nullptr) {
    // The family hands out one counter per label set, so two threads that
    // both get here store the same pointer.
    prometheus::Labels labels = series->labels;
    labels.emplace("grpc_code", GoCodeName(code));
    counter = &handled_.Add(labels);
    if (known) series->handled[code].store(counter, std::memory_order_release);
  }
  counter->Increment();
}

}  // namespace capstan::server
