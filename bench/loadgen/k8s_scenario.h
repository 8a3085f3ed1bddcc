// The Kubernetes control-plane scenario (`capstan-bench k8s`): what
// kube-apiserver sends to etcd for a cluster of --nodes nodes and --pods pods.

#ifndef CAPSTAN_BENCH_LOADGEN_K8S_SCENARIO_H_
#define CAPSTAN_BENCH_LOADGEN_K8S_SCENARIO_H_

#include <map>
#include <string>
#include <vector>

namespace capstan::bench {

// The Kubernetes SLO table: mutating p99 against 1 s, cluster-scope list p99
// against 30 s, watch delivery p99 (no official SLO), server CPU and RSS. One
// column per target; metrics are RunReport::Metrics() values by name (medians
// when comparing).
std::string K8sSloTable(const std::vector<std::string>& targets,
                        const std::vector<std::map<std::string, double>>& metrics);

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_K8S_SCENARIO_H_
