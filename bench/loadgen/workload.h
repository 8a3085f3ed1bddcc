// A workload is one capstan-bench subcommand that generates load against an
// etcd endpoint: its flags, a check of its arguments, and a run that returns
// what it measured. `compare` runs the same Workload object several times,
// against Capstan and against etcd.

#ifndef CAPSTAN_BENCH_LOADGEN_WORKLOAD_H_
#define CAPSTAN_BENCH_LOADGEN_WORKLOAD_H_

#include <sys/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/loadgen/connection_pool.h"
#include "bench/loadgen/flags.h"
#include "bench/loadgen/report.h"

namespace capstan::bench {

// Flags every subcommand takes (etcd benchmark's persistent flags and ours).
struct GlobalOptions {
  std::vector<std::string> endpoints{"127.0.0.1:2379"};
  int conns = 1;
  int clients = 1;
  absl::Duration dial_timeout = absl::Seconds(10);
  absl::Duration request_timeout = absl::ZeroDuration();  // none, like etcd's tool
  std::string json_path;
  std::string markdown_path;
  std::string plot_dir;
  bool no_progress = false;
  int server_pid = 0;  // the server's pid, for RSS and CPU, when it runs on this machine
  ClientSecurity security;  // --cacert, --cert, --key, --user
  // --target-leader: every connection to the leader's client URLs, found
  // through the endpoints (ConnectionPool::LeaderEndpoints).
  bool target_leader = false;

  void Register(FlagSet& flags);
};

// What a run may use. The pool is connected to the server under test.
struct BenchContext {
  const GlobalOptions* global = nullptr;
  ConnectionPool* pool = nullptr;
  pid_t server_pid = 0;  // 0: unknown
  std::string target;    // "capstan", "etcd" or the endpoint
};

// The path of this capstan-bench binary (/proc/self/exe), or
// "capstan-bench" if it cannot be read: for running it again as a child.
std::string SelfPath();

// One lease of ttl seconds per client, each granted on that client's
// connection; the first failure ends it with the error.
absl::StatusOr<std::vector<int64_t>> GrantClientLeases(BenchContext& ctx, int clients,
                                                       int64_t ttl);
// Revokes the leases of GrantClientLeases, best effort (a run's clean-up).
void RevokeClientLeases(BenchContext& ctx, const std::vector<int64_t>& leases);

// Not thread-safe; one run at a time.
class Workload {
 public:
  virtual ~Workload() = default;
  virtual void RegisterFlags(FlagSet& flags) = 0;
  // Checks the parsed flags and the positional arguments; called once.
  virtual absl::Status Prepare(const std::vector<std::string>& args) { return absl::OkStatus(); }
  // Runs once against ctx's server. Failed requests are counted in the
  // report; an error status means the run itself could not proceed.
  virtual absl::StatusOr<RunReport> Run(BenchContext& ctx) = 0;
};

struct WorkloadInfo {
  std::string name;
  std::string usage;  // "range key [end-range]"
  std::string help;
  std::function<std::unique_ptr<Workload>()> make;
};

// Every subcommand that generates load, in help order.
const std::vector<WorkloadInfo>& Workloads();
const WorkloadInfo* FindWorkload(const std::string& name);

// Factories, one per workload file.
std::unique_ptr<Workload> NewPutWorkload();
std::unique_ptr<Workload> NewRangeWorkload();
std::unique_ptr<Workload> NewTxnPutWorkload();
std::unique_ptr<Workload> NewTxnMixedWorkload();
std::unique_ptr<Workload> NewWatchWorkload();
std::unique_ptr<Workload> NewWatchLatencyWorkload();
std::unique_ptr<Workload> NewWatchPrefixWorkload();
std::unique_ptr<Workload> NewLeaseKeepaliveWorkload();
std::unique_ptr<Workload> NewLockWorkload();  // lock_workload.cc
std::unique_ptr<Workload> NewLeaseStormWorkload();
std::unique_ptr<Workload> NewLargeListWorkload();
std::unique_ptr<Workload> NewRangeStreamWorkload();
std::unique_ptr<Workload> NewCompactionWorkload();
std::unique_ptr<Workload> NewFillWorkload();
std::unique_ptr<Workload> NewK8sWorkload();
std::unique_ptr<Workload> NewDefragWorkload();

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_WORKLOAD_H_
