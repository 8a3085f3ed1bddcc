// The Prometheus metrics served at /metrics, kept in a prometheus-cpp
// registry and written with its text serializer. Names, types and labels are
// etcd's where etcd has the metric (etcd_server_has_leader,
// etcd_mvcc_db_total_size_in_bytes, grpc_server_handled_total{grpc_code=...},
// ...); what only Capstan has is named capstan_*.
//
// Two kinds of metric live here:
//  - gRPC counters, incremented by the interceptor (server/observability/grpc_metrics.h)
//    as RPCs start and finish;
//  - the store's state (sizes, revisions, operation counts, commit latency)
//    and the watch cache's, read when /metrics is scraped, like etcd's
//    GaugeFuncs.

#ifndef CAPSTAN_SERVER_OBSERVABILITY_METRICS_H_
#define CAPSTAN_SERVER_OBSERVABILITY_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "membership/member.h"
#include "mvcc/kv_store.h"

namespace prometheus {
class Collectable;
class Registry;
}  // namespace prometheus

namespace capstan::watchcache {
class Cache;
}  // namespace capstan::watchcache

namespace capstan::server {

class CacheRange;
class FeatureGates;
class Recipes;
class RequestMetrics;

// Thread-safe. `store` and `member` must outlive the Metrics.
class Metrics {
 public:
  // etcd_server_has_leader and etcd_server_is_leader come from
  // member->raft, read at each scrape (a single member, without one, always
  // leads).
  Metrics(mvcc::KvStore* store, const membership::MemberInfo* member, std::string server_version);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The registry for metrics that are recorded as events happen (gRPC).
  // Valid as long as this object.
  prometheus::Registry* registry() { return registry_.get(); }

  // Request latencies and health check outcomes, recorded as they happen
  // (server/observability/request_metrics.h). Valid as long as this object.
  RequestMetrics* requests() { return requests_.get(); }

  // Adds the watch cache's state per cached prefix and how many Ranges on
  // those prefixes it answered (capstan_watch_cache_*), read at each scrape.
  // Call before the first Render; cache and ranges must stay valid while
  // Render may be called.
  void AddWatchCache(const watchcache::Cache* cache, const CacheRange* ranges);

  // Adds etcd's etcd_debugging_mvcc_watcher_total, _slow_watcher_total,
  // _watch_stream_total and _events_total, read at each scrape from the
  // hub and the watch cache's watchers (cache may be null). Call before the
  // first Render; both must stay valid while Render may be called.
  void AddWatches(const mvcc::WatchHub* hub, const watchcache::Cache* cache);

  // Adds the Lock and Election services' calls in progress and Observe
  // pauses (capstan_lock_election_*), read at each scrape. Call before the
  // first Render; recipes must stay valid while Render may be called.
  void AddRecipes(const Recipes* recipes);

  // Adds etcd's peer metrics, read at each scrape from `peers`:
  // etcd_network_peer_sent_bytes_total{To}, _received_bytes_total{From} and
  // _sent_failures_total{To} (a series once it is not zero, as etcd's appear
  // on first use) and etcd_network_active_peers{Local,Remote}. Call before
  // the first Render; peers must stay callable while Render may be called.
  void AddPeers(uint64_t local_id,
                std::function<std::vector<membership::PeerTraffic>()> peers);

  // Adds etcd 3.6's etcd_server_feature_enabled{name,stage}: 1 for each
  // gate of `gates` that is enabled, 0 for the others (AllAlpha and AllBeta
  // included, as etcd lists them). Fixed at this call. Call before the first
  // Render.
  void AddFeatureGates(const FeatureGates& gates);

  // The Prometheus text exposition format (version 0.0.4) of every metric.
  std::string Render() const;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<RequestMetrics> requests_;
  // Read at each scrape: the store's, then those added (watch cache,
  // recipes). Fixed before the first Render.
  std::vector<std::unique_ptr<prometheus::Collectable>> scraped_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_OBSERVABILITY_METRICS_H_
