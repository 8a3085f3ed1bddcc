// `capstan-bench compare`: runs one workload against Capstan and against a
// real etcd, both started here from their binaries (free loopback ports,
// fresh data dirs under /tmp, default fsync durability), alternating which
// goes first, for several rounds; prints medians side by side with the
// Capstan/etcd ratio. A third target, `floor`, is capstan-grpc-floor: gRPC
// alone, with no storage (bench/loadgen/grpc_floor.cc).

#ifndef CAPSTAN_BENCH_LOADGEN_COMPARE_H_
#define CAPSTAN_BENCH_LOADGEN_COMPARE_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "bench/loadgen/flags.h"
#include "bench/loadgen/workload.h"

namespace capstan::bench {

struct CompareOptions {
  int rounds = 3;
  std::string capstan_binary;  // default: next to capstan-bench
  std::string etcd_binary;      // default: DefaultEtcdBinary()
  std::string capstan_flags;   // extra flags, space-separated
  std::string etcd_flags;
  std::string floor_binary;    // default: capstan-grpc-floor next to capstan-bench
  std::string targets = "capstan,etcd";
  bool keep_data = false;
  absl::Duration ready_timeout = absl::Seconds(30);
  // A run still going after this is stopped by killing its server (its
  // in-flight requests then fail), so a stuck server cannot hang compare.
  absl::Duration run_timeout = absl::Minutes(10);

  void Register(FlagSet& flags);
};

// The capstan binary built beside capstan-bench: <dir>/server/capstan or <dir>/capstan.
std::string DefaultCapstanBinary();

// capstan-grpc-floor beside capstan-bench.
std::string DefaultFloorBinary();
// The etcd to compare with: $CAPSTAN_ETCD_BINARY, else etcd 3.5 as
// scripts/deps.sh extracts it (~/.cache/capstan/etcd-3.5/usr/bin/etcd),
// else Debian 12's /usr/bin/etcd (3.4).
std::string DefaultEtcdBinary();

// Returns the process exit code: 0 only if every run completed without a
// failed request.
int RunCompare(const CompareOptions& options, const GlobalOptions& global, Workload& workload,
               const std::string& workload_name, const std::string& command_line);

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_COMPARE_H_
