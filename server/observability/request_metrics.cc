#include "server/observability/request_metrics.h"

#include <cmath>
#include <limits>
#include <utility>

namespace capstan::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// etcd's request types (getRequestType in etcdserver/v3_server.go) of the
// gRPC methods that carry them.
struct RequestType {
  const char* method;  // gRPC's full name
  const char* type;
};
constexpr RequestType kRequestTypes[] = {
    {"/etcdserverpb.KV/Range", "Range"},
    {"/etcdserverpb.KV/Put", "Put"},
    {"/etcdserverpb.KV/DeleteRange", "DeleteRange"},
    {"/etcdserverpb.KV/Txn", "Txn"},
    {"/etcdserverpb.KV/Compact", "Compaction"},
    {"/etcdserverpb.Lease/LeaseGrant", "LeaseGrant"},
    {"/etcdserverpb.Lease/LeaseRevoke", "LeaseRevoke"},
    {"/etcdserverpb.Maintenance/Alarm", "Alarm"},
    {"/etcdserverpb.Auth/Authenticate", "Authenticate"},
    {"/etcdserverpb.Auth/AuthEnable", "AuthEnable"},
    {"/etcdserverpb.Auth/AuthDisable", "AuthDisable"},
    {"/etcdserverpb.Auth/AuthStatus", "AuthStatus"},
    {"/etcdserverpb.Auth/UserAdd", "AuthUserAdd"},
    {"/etcdserverpb.Auth/UserDelete", "AuthUserDelete"},
    {"/etcdserverpb.Auth/UserChangePassword", "AuthUserChangePassword"},
    {"/etcdserverpb.Auth/UserGrantRole", "AuthUserGrantRole"},
    {"/etcdserverpb.Auth/UserGet", "AuthUserGet"},
    {"/etcdserverpb.Auth/UserRevokeRole", "AuthUserRevokeRole"},
    {"/etcdserverpb.Auth/RoleAdd", "AuthRoleAdd"},
    {"/etcdserverpb.Auth/RoleGrantPermission", "AuthRoleGrantPermission"},
    {"/etcdserverpb.Auth/RoleGet", "AuthRoleGet"},
    {"/etcdserverpb.Auth/RoleRevokePermission", "AuthRoleRevokePermission"},
    {"/etcdserverpb.Auth/RoleDelete", "AuthRoleDelete"},
    {"/etcdserverpb.Auth/UserList", "AuthUserList"},
    {"/etcdserverpb.Auth/RoleList", "AuthRoleList"},
};
constexpr int kTypes = sizeof(kRequestTypes) / sizeof(kRequestTypes[0]);

// The /livez and /readyz checks (server/http/http_endpoints.h).
struct CheckName {
  const char* kind;
  const char* name;
};
constexpr CheckName kChecks[] = {
    {"livez", "serializable_read"},  {"readyz", "data_corruption"},
    {"readyz", "serializable_read"}, {"readyz", "linearizable_read"},
    {"readyz", "non_learner"},
};
constexpr int kCheckCount = sizeof(kChecks) / sizeof(kChecks[0]);

MetricFamily Counter(std::string name, std::string help, double value) {
  ClientMetric m;
  m.counter.value = value;
  return MetricFamily{std::move(name), std::move(help), MetricType::Counter, {std::move(m)}};
}

}  // namespace

ExponentialHistogram::ExponentialHistogram(double start, int count)
    : start_(start), count_(count), counts_(new std::atomic<uint64_t>[count + 1]) {
  for (int i = 0; i <= count_; ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void ExponentialHistogram::Observe(double seconds) {
  int i = 0;
  double bound = start_;
  while (i < count_ && seconds > bound) {
    ++i;
    bound *= 2;
  }
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  if (seconds > 0) {
    sum_nanos_.fetch_add(static_cast<uint64_t>(std::llround(seconds * 1e9)),
                         std::memory_order_relaxed);
  }
}

uint64_t ExponentialHistogram::count() const {
  uint64_t n = 0;
  for (int i = 0; i <= count_; ++i) n += counts_[i].load(std::memory_order_relaxed);
  return n;
}

ClientMetric ExponentialHistogram::ToMetric(std::vector<ClientMetric::Label> labels) const {
  ClientMetric m;
  m.label = std::move(labels);
  uint64_t cumulative = 0;
  double bound = start_;
  for (int i = 0; i < count_; ++i, bound *= 2) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    m.histogram.bucket.push_back({cumulative, bound});
  }
  cumulative += counts_[count_].load(std::memory_order_relaxed);
  m.histogram.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
  m.histogram.sample_count = cumulative;
  m.histogram.sample_sum = static_cast<double>(sum_nanos_.load(std::memory_order_relaxed)) / 1e9;
  return m;
}

struct RequestMetrics::Check {
  std::atomic<int> last{-1};  // -1: never run; 0: failed; 1: ok
  std::atomic<uint64_t> ok{0};
  std::atomic<uint64_t> failed{0};
};

RequestMetrics::RequestMetrics()
    : ranges_{ExponentialHistogram(0.0001, 20), ExponentialHistogram(0.0001, 20)},
      checks_(new Check[kCheckCount]) {
  for (int i = 0; i < 2 * kTypes; ++i) {
    requests_.push_back(std::make_unique<ExponentialHistogram>(0.001, 14));
  }
}

RequestMetrics::~RequestMetrics() = default;

int RequestMetrics::RequestTypeOf(absl::string_view grpc_method) {
  for (int i = 0; i < kTypes; ++i) {
    if (grpc_method == kRequestTypes[i].method) return i;
  }
  return -1;
}

bool RequestMetrics::IsRange(absl::string_view grpc_method) {
  return grpc_method == kRequestTypes[0].method;
}

void RequestMetrics::ObserveRequest(int type, bool success, double seconds) {
  requests_[2 * type + (success ? 1 : 0)]->Observe(seconds);
}

void RequestMetrics::ObserveRange(bool success, double seconds) {
  ranges_[success ? 1 : 0].Observe(seconds);
}

void RequestMetrics::CountHealth(bool healthy) {
  (healthy ? health_success_ : health_failures_).fetch_add(1, std::memory_order_relaxed);
}

void RequestMetrics::RecordHealthCheck(absl::string_view kind, absl::string_view check, bool ok) {
  for (int i = 0; i < kCheckCount; ++i) {
    if (kind == kChecks[i].kind && check == kChecks[i].name) {
      checks_[i].last.store(ok ? 1 : 0, std::memory_order_relaxed);
      (ok ? checks_[i].ok : checks_[i].failed).fetch_add(1, std::memory_order_relaxed);
      return;
    }
  }
}

std::vector<MetricFamily> RequestMetrics::Collect() const {
  std::vector<MetricFamily> out;
  // As Go's client: a labelled series appears once it has been recorded.
  MetricFamily requests{"etcd_server_request_duration_seconds",
                        "Response latency distribution in seconds for each type.",
                        MetricType::Histogram,
                        {}};
  for (int t = 0; t < kTypes; ++t) {
    for (int success = 0; success < 2; ++success) {
      const ExponentialHistogram& h = *requests_[2 * t + success];
      if (h.count() == 0) continue;
      requests.metric.push_back(h.ToMetric(
          {{"success", success ? "true" : "false"}, {"type", kRequestTypes[t].type}}));
    }
  }
  if (!requests.metric.empty()) out.push_back(std::move(requests));
  MetricFamily ranges{"etcd_server_range_duration_seconds", "The latency distributions of txn.Range",
                      MetricType::Histogram, {}};
  for (int success = 0; success < 2; ++success) {
    if (ranges_[success].count() == 0) continue;
    ranges.metric.push_back(ranges_[success].ToMetric({{"success", success ? "true" : "false"}}));
  }
  if (!ranges.metric.empty()) out.push_back(std::move(ranges));
  out.push_back(Counter("etcd_server_health_success", "The total number of successful health checks",
                        static_cast<double>(health_success_.load(std::memory_order_relaxed))));
  out.push_back(Counter("etcd_server_health_failures", "The total number of failed health checks",
                        static_cast<double>(health_failures_.load(std::memory_order_relaxed))));
  MetricFamily gauge{"etcd_server_healthcheck", "The result of each kind of healthcheck.",
                     MetricType::Gauge, {}};
  MetricFamily total{"etcd_server_healthchecks_total", "The total number of each kind of healthcheck.",
                     MetricType::Counter, {}};
  for (int i = 0; i < kCheckCount; ++i) {
    const int last = checks_[i].last.load(std::memory_order_relaxed);
    if (last < 0) continue;
    ClientMetric g;
    g.label = {{"name", kChecks[i].name}, {"type", kChecks[i].kind}};
    g.gauge.value = last;
    gauge.metric.push_back(std::move(g));
    for (const auto& [status, n] :
         {std::pair<const char*, uint64_t>{"error", checks_[i].failed.load(std::memory_order_relaxed)},
          {"success", checks_[i].ok.load(std::memory_order_relaxed)}}) {
      if (n == 0) continue;
      ClientMetric c;
      c.label = {{"name", kChecks[i].name}, {"status", status}, {"type", kChecks[i].kind}};
      c.counter.value = static_cast<double>(n);
      total.metric.push_back(std::move(c));
    }
  }
  if (!gauge.metric.empty()) out.push_back(std::move(gauge));
  if (!total.metric.empty()) out.push_back(std::move(total));
  return out;
}

}  // namespace capstan::server
