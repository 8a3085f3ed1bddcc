// Loading many keys fast: puts batched into txns.

#ifndef CAPSTAN_BENCH_LOADGEN_FILL_H_
#define CAPSTAN_BENCH_LOADGEN_FILL_H_

#include <cstdint>
#include <functional>
#include <string>

#include "bench/loadgen/report.h"
#include "bench/loadgen/workload.h"

namespace capstan::bench {

// Puts keys [0, keys) named by key_of, each with `value`, in txns of `batch`
// puts (at most etcd's default --max-txn-ops, 128), from every client.
PhaseResult FillKeys(BenchContext& ctx, const std::string& phase_name, int64_t keys, int batch,
                     const std::function<std::string(int64_t)>& key_of, const std::string& value);

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_FILL_H_
