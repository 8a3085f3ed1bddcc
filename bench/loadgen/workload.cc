#include "bench/loadgen/workload.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "bench/loadgen/async_call.h"

namespace capstan::bench {

std::unique_ptr<Workload> NewWatchStalledWorkload();  // watch_stalled.cc

void GlobalOptions::Register(FlagSet& f) {
  f.StringList("endpoints", &endpoints, "gRPC endpoints");
  f.Bool("target-leader", &target_leader, "connect only to the leader node");
  f.Int("conns", &conns, "Total number of gRPC connections");
  f.Int("clients", &clients, "Total number of gRPC clients (requests in flight)");
  f.Duration("dial-timeout", &dial_timeout, "dial timeout for client connections");
  f.Duration("request-timeout", &request_timeout,
             "deadline of each request (0: none, as in etcd's benchmark)");
  f.String("json", &json_path, "write the results as JSON to this file");
  f.String("markdown", &markdown_path, "write the results as a markdown table to this file");
  f.String("plot", &plot_dir, "write gnuplot data, scripts and PNG plots into this directory");
  f.Bool("no-progress", &no_progress, "never draw the progress line");
  f.Int("server-pid", &server_pid, "pid of the server under test, to report its RSS and CPU");
  f.String("cacert", &security.ca_file, "verify certificates of TLS-enabled secure servers using this CA bundle");
  f.String("cert", &security.cert_file, "identify secure client using this TLS certificate file");
  f.String("key", &security.key_file, "identify secure client using this TLS key file");
  f.String("user", &security.user, "username:password: authenticate (etcd auth) and send the token with every request");
}

std::string SelfPath() {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("capstan-bench") : self.string();
}

absl::StatusOr<std::vector<int64_t>> GrantClientLeases(BenchContext& ctx, int clients,
                                                       int64_t ttl) {
  std::vector<int64_t> leases(clients);
  for (int i = 0; i < clients; ++i) {
    grpc::ClientContext c;
    SetDeadline(&c);
    etcdserverpb::LeaseGrantRequest req;
    req.set_ttl(ttl);
    etcdserverpb::LeaseGrantResponse resp;
    grpc::Status s = ctx.pool->Lease(i).LeaseGrant(&c, req, &resp);
    if (!s.ok()) return absl::UnavailableError(absl::StrCat("LeaseGrant: ", s.error_message()));
    leases[i] = resp.id();
  }
  return leases;
}

void RevokeClientLeases(BenchContext& ctx, const std::vector<int64_t>& leases) {
  for (size_t i = 0; i < leases.size(); ++i) {
    grpc::ClientContext c;
    SetDeadline(&c);
    etcdserverpb::LeaseRevokeRequest req;
    req.set_id(leases[i]);
    etcdserverpb::LeaseRevokeResponse resp;
    ctx.pool->Lease(i).LeaseRevoke(&c, req, &resp);
  }
}

const std::vector<WorkloadInfo>& Workloads() {
  static const auto* all = new std::vector<WorkloadInfo>{
      {"put", "put", "Benchmark put", NewPutWorkload},
      {"range", "range key [end-range]", "Benchmark range", NewRangeWorkload},
      {"txn-put", "txn-put", "Benchmark txn-put", NewTxnPutWorkload},
      {"txn-mixed", "txn-mixed", "Benchmark a mixed load of txn-put & txn-range",
       NewTxnMixedWorkload},
      {"watch", "watch", "Benchmark watch", NewWatchWorkload},
      {"watch-latency", "watch-latency", "Benchmark watch latency", NewWatchLatencyWorkload},
      {"watch-prefix", "watch-prefix",
       "One prev_kv watcher on a prefix taking puts at --put-rate: does it keep up",
       NewWatchPrefixWorkload},
      {"watch-stalled", "watch-stalled",
       "Put latency, server RSS and other watchers' events while watch streams never read",
       NewWatchStalledWorkload},
      {"lease-keepalive", "lease-keepalive", "Benchmark lease keepalive",
       NewLeaseKeepaliveWorkload},
      {"lock", "lock",
       "Lock and unlock through etcd's Lock service, each client with its own lease, on its "
       "own lock or (--names) on a few shared ones",
       NewLockWorkload},
      {"lease-storm", "lease-storm",
       "Hold many leases with keep-alives, let a burst of them expire at once, measure revocation "
       "and put latency",
       NewLeaseStormWorkload},
      {"large-list", "large-list",
       "Load N objects under a prefix, then measure full, paginated and concurrent lists and put "
       "latency while they run",
       NewLargeListWorkload},
      {"range-stream", "range-stream",
       "Load N keys, then list them by RangeStream (etcd 3.7), one Range and pages, in turn: "
       "time to the first chunk, total time, server RSS growth",
       NewRangeStreamWorkload},
      {"compaction", "compaction",
       "Write N keys twice, then measure put and range latency while a physical compaction "
       "removes the stale revisions",
       NewCompactionWorkload},
      {"fill", "fill", "Write N keys in batched txns (a loader for scripts)", NewFillWorkload},
      {"k8s", "k8s", "A Kubernetes control plane's etcd traffic (nodes, pods, leases, events; kubelets via the watch cache)",
       NewK8sWorkload},
      {"defrag", "defrag", "Write latency during Defragment of a large data set vs idle",
       NewDefragWorkload},
  };
  return *all;
}

const WorkloadInfo* FindWorkload(const std::string& name) {
  for (const auto& w : Workloads()) {
    if (w.name == name) return &w;
  }
  return nullptr;
}

}  // namespace capstan::bench
