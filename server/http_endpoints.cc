#include "server/http_endpoints.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "httplib.h"
#include "server/grpc_metrics.h"

namespace capstan::server {
namespace {

// Appends one metric family with a single sample.
void Metric(std::string* out, const char* name, const char* type, const char* help, double value,
            const std::string& labels = "") {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name,
                  labels.empty() ? "" : absl::StrCat("{", labels, "}"), " ", value, "\n");
}

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

}  // namespace

HttpEndpoints::HttpEndpoints(mvcc::KvStore* store, const MemberInfo* member, Versions versions,
                             const GrpcMetrics* grpc_metrics)
    : store_(store), member_(member), versions_(std::move(versions)), grpc_metrics_(grpc_metrics) {}

HttpEndpoints::~HttpEndpoints() { Stop(); }

void HttpEndpoints::Install(httplib::Server* server) {
  auto health = [this](const httplib::Request& req, httplib::Response& res) {
    // A single member always has a leader. Active alarms make it unhealthy
    // unless excluded (`?exclude=NOSPACE`, as kubeadm's probe asks).
    std::string reason;
    for (const auto& a : store_->Alarms()) {
      const std::string name = etcdserverpb::AlarmType_Name(a.alarm());
      bool excluded = false;
      for (size_t i = 0; i < req.get_param_value_count("exclude"); ++i) {
        excluded |= req.get_param_value("exclude", i) == name;
      }
      if (!excluded) {
        reason = "ALARM " + name;
        break;
      }
    }
    // A store that stopped accepting writes after a storage failure is
    // unhealthy whatever is excluded.
    if (reason.empty() && !store_->StorageFailure().ok()) reason = "STORAGE FAILED";
    if (!reason.empty()) {
      res.status = 503;
      res.set_content("{\"health\":\"false\",\"reason\":\"" + reason + "\"}",
                      "text/plain; charset=utf-8");
      return;
    }
    res.set_content("{\"health\":\"true\",\"reason\":\"\"}", "text/plain; charset=utf-8");
  };
  server->Get("/health", health);
  server->Get("/livez", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok", "text/plain; charset=utf-8");
  });
  server->Get("/readyz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok", "text/plain; charset=utf-8");
  });
  server->Get("/version", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(absl::StrCat("{\"etcdserver\":\"", versions_.server, "\",\"etcdcluster\":\"",
                                 versions_.cluster, "\"}"),
                    "application/json");
  });
  server->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(RenderMetrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
}

absl::Status HttpEndpoints::Listen(const std::string& host, int port) {
  auto server = std::make_unique<httplib::Server>();
  Install(server.get());
  if (!server->bind_to_port(host, port)) {
    const int err = errno;
    // Worded like Go's net.Listen error that etcd prints.
    return absl::UnavailableError(absl::StrCat("listen tcp ", host, ":", port, ": bind: ",
                                               err == EADDRINUSE ? "address already in use"
                                                                 : std::strerror(err)));
  }
  httplib::Server* raw = server.get();
  servers_.push_back(std::move(server));
  threads_.emplace_back([raw] { raw->listen_after_bind(); });
  return absl::OkStatus();
}

void HttpEndpoints::Stop() {
  for (auto& s : servers_) s->stop();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  threads_.clear();
  servers_.clear();
}

std::string HttpEndpoints::RenderMetrics() const {
  // Debian 12 packages no Prometheus client library for C++; the text
  // exposition format is simple and written here, with etcd's metric names.
  const auto stats = store_->GetStats();
  const auto view = store_->View();
  std::string out;
  Metric(&out, "etcd_server_has_leader", "gauge",
         "Whether or not a leader exists. 1 is existence, 0 is not.", 1);
  Metric(&out, "etcd_server_is_leader", "gauge",
         "Whether or not this member is a leader. 1 if is, 0 otherwise.", 1);
  Metric(&out, "etcd_server_version", "gauge", "Which version is running. 1 for 'server_version' label with current version.",
         1, absl::StrCat("server_version=\"", versions_.server, "\""));
  Metric(&out, "etcd_mvcc_db_total_size_in_bytes", "gauge",
         "Total size of the underlying database physically allocated in bytes.",
         static_cast<double>(store_->backend()->SizeOnDisk()));
  Metric(&out, "etcd_mvcc_db_total_size_in_use_in_bytes", "gauge",
         "Total size of the underlying database logically in use in bytes.",
         static_cast<double>(store_->backend()->LiveDataSize()));
  Metric(&out, "etcd_debugging_mvcc_keys_total", "gauge", "Total number of keys.",
         static_cast<double>(stats.keys));
  Metric(&out, "etcd_mvcc_put_total", "counter", "Total number of puts seen by this member.",
         static_cast<double>(stats.puts));
  Metric(&out, "etcd_mvcc_delete_total", "counter",
         "Total number of deletes seen by this member.", static_cast<double>(stats.deletes));
  Metric(&out, "etcd_mvcc_range_total", "counter", "Total number of ranges seen by this member.",
         static_cast<double>(stats.ranges));
  Metric(&out, "etcd_mvcc_txn_total", "counter", "Total number of txns seen by this member.",
         static_cast<double>(stats.txns));
  Metric(&out, "etcd_debugging_mvcc_current_revision", "gauge",
         "The current revision of store.", static_cast<double>(view->rev));
  Metric(&out, "etcd_debugging_mvcc_compact_revision", "gauge",
         "The revision of the last compaction in store.", static_cast<double>(view->compact_rev));
  Metric(&out, "etcd_server_proposals_applied_total", "gauge",
         "The total number of consensus proposals applied.",
         static_cast<double>(store_->AppliedIndex()));
  Metric(&out, "capstan_commit_groups_total", "counter",
         "Group commits written to the backend.", static_cast<double>(stats.groups));
  Metric(&out, "capstan_commit_group_requests_total", "counter",
         "Write requests carried by group commits.", static_cast<double>(stats.group_writes));
  // Group commit write latency: etcd's backend commit and WAL fsync are one
  // synced RocksDB write here, so both families report it.
  for (const char* name : {"etcd_disk_backend_commit_duration_seconds",
                           "etcd_disk_wal_fsync_duration_seconds"}) {
    const auto& h = store_->commit_latency();
    absl::StrAppend(&out, "# HELP ", name, " The latency distributions of durable group commits.\n",
                    "# TYPE ", name, " histogram\n");
    for (int i = 0; i < mvcc::LatencyHistogram::kBuckets; ++i) {
      absl::StrAppend(&out, name, "_bucket{le=\"", mvcc::LatencyHistogram::UpperBound(i), "\"} ",
                      h.Cumulative(i), "\n");
    }
    const uint64_t total = h.Cumulative(mvcc::LatencyHistogram::kBuckets);
    absl::StrAppend(&out, name, "_bucket{le=\"+Inf\"} ", total, "\n", name, "_sum ", h.Sum(), "\n",
                    name, "_count ", total, "\n");
  }
  Metric(&out, "etcd_server_quota_backend_bytes", "gauge",
         "Current backend storage quota size in bytes.",
         static_cast<double>(store_->options().quota_bytes));
  Metric(&out, "etcd_debugging_lease_granted_total", "gauge", "Leases held.",
         static_cast<double>(store_->lessor()->size()));
  if (grpc_metrics_) out += grpc_metrics_->Render();
  Metric(&out, "process_resident_memory_bytes", "gauge", "Resident memory size in bytes.",
         static_cast<double>(ResidentBytes()));
  return out;
}

}  // namespace capstan::server
