// Request-level metrics that etcd 3.6 and 3.7 added, recorded as the work
// happens without a lock or an allocation:
//
//   etcd_server_request_duration_seconds{type,success}  (3.7) each request
//       that etcd puts through raft (Put, Txn, LeaseGrant, AuthUserAdd, ...)
//       and each Range, from its arrival to its answer; buckets 1 ms * 2^i,
//       i < 14. type is etcd's name for the request (getRequestType).
//   etcd_server_range_duration_seconds{success}  (3.6) each Range's read;
//       buckets 0.1 ms * 2^i, i < 20.
//   etcd_server_health_success, etcd_server_health_failures  /health answers
//   etcd_server_healthcheck{type,name}, etcd_server_healthchecks_total
//       {type,name,status}  the /livez and /readyz checks (3.5.11+).
//
// Every series is made up front, so recording is an atomic add.

#ifndef CAPSTAN_SERVER_OBSERVABILITY_REQUEST_METRICS_H_
#define CAPSTAN_SERVER_OBSERVABILITY_REQUEST_METRICS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "prometheus/client_metric.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace capstan::server {

// A histogram with the buckets of Prometheus' ExponentialBuckets(start, 2,
// count), recorded with atomic adds. Thread-safe.
class ExponentialHistogram {
 public:
  ExponentialHistogram(double start, int count);

  void Observe(double seconds);

  // The histogram as one sample with labels.
  prometheus::ClientMetric ToMetric(std::vector<prometheus::ClientMetric::Label> labels) const;
  uint64_t count() const;

 private:
  const double start_;
  const int count_;
  // counts_[i]: observations in bucket i alone (i == count_: above the last).
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;
  std::atomic<uint64_t> sum_nanos_{0};
};

// Thread-safe.
class RequestMetrics final : public prometheus::Collectable {
 public:
  RequestMetrics();
  ~RequestMetrics() override;

  // etcd's request type for a gRPC method's full name
  // ("/etcdserverpb.KV/Put" -> "Put"), as an index for ObserveRequest;
  // -1 for a method etcd does not time.
  static int RequestTypeOf(absl::string_view grpc_method);
  static bool IsRange(absl::string_view grpc_method);

  // REQUIRES: type is from RequestTypeOf and not -1.
  void ObserveRequest(int type, bool success, double seconds);
  void ObserveRange(bool success, double seconds);

  // The outcome of a /health answer.
  void CountHealth(bool healthy);
  // One /livez or /readyz check's outcome. kind: "livez" or "readyz".
  void RecordHealthCheck(absl::string_view kind, absl::string_view check, bool ok);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  struct Check;
  std::vector<std::unique_ptr<ExponentialHistogram>> requests_;  // 2 per type: failed, succeeded
  ExponentialHistogram ranges_[2];                                // failed, succeeded
  std::atomic<uint64_t> health_success_{0};
  std::atomic<uint64_t> health_failures_{0};
  std::unique_ptr<Check[]> checks_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_OBSERVABILITY_REQUEST_METRICS_H_
