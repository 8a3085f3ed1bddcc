#include "server/observability/metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "server/api/cache_range.h"
#include "server/api/client_traffic.h"
#include "server/api/errors.h"
#include "server/api/recipes.h"
#include "server/config/feature_gates.h"
#include "server/config/version.h"
#include "server/observability/request_metrics.h"
#include "mvcc/watch_hub.h"
#include "watchcache/cache.h"

namespace capstan::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// What Prometheus's Go process collector reads from /proc/self, which
// etcd serves as process_* (and os_fd_* beside it).
struct ProcessState {
  double cpu_seconds = 0;
  double virtual_bytes = 0;
  double resident_bytes = 0;
  double start_seconds = 0;  // since the Unix epoch
  double open_fds = 0;
  double max_fds = 0;
  double max_virtual_bytes = 0;
  double received_bytes = 0, transmitted_bytes = 0;  // the network namespace's interfaces
};

ProcessState ReadProcess() {
  ProcessState p;
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  {
    std::ifstream in("/proc/self/stat");
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // The fields after the command name, which may hold spaces: from state
    // (field 3) on, utime is field 14, stime 15, starttime 22, vsize 23,
    // rss 24.
    const size_t close = stat.rfind(')');
    if (close != std::string::npos) {
      std::vector<std::string> f = absl::StrSplit(stat.substr(close + 2), ' ');
      auto field = [&](size_t n) {
        double v = 0;
        return n - 3 < f.size() && absl::SimpleAtod(f[n - 3], &v) ? v : 0.0;
      };
      p.cpu_seconds = (field(14) + field(15)) / ticks;
      p.virtual_bytes = field(23);
      p.resident_bytes = field(24) * static_cast<double>(sysconf(_SC_PAGESIZE));
      std::ifstream proc_stat("/proc/stat");
      for (std::string line; std::getline(proc_stat, line);) {
        double boot = 0;
        if (absl::StartsWith(line, "btime ") && absl::SimpleAtod(line.substr(6), &boot)) {
          p.start_seconds = boot + field(22) / ticks;
        }
      }
    }
  }
  if (DIR* fds = opendir("/proc/self/fd"); fds != nullptr) {
    while (dirent* e = readdir(fds)) p.open_fds += e->d_name[0] == '.' ? 0 : 1;
    closedir(fds);
    p.open_fds -= 1;  // the directory being read
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) p.max_fds = static_cast<double>(limit.rlim_cur);
  if (getrlimit(RLIMIT_AS, &limit) == 0) p.max_virtual_bytes = static_cast<double>(limit.rlim_cur);
  std::ifstream dev("/proc/self/net/dev");
  for (std::string line; std::getline(dev, line);) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;  // the two header lines
    std::vector<std::string> f = absl::StrSplit(line.substr(colon + 1), ' ', absl::SkipEmpty());
    double rx = 0, tx = 0;
    if (f.size() > 8 && absl::SimpleAtod(f[0], &rx) && absl::SimpleAtod(f[8], &tx)) {
      p.received_bytes += rx;
      p.transmitted_bytes += tx;
    }
  }
  return p;
}

// One family with one sample (and optional labels).
MetricFamily Single(std::string name, MetricType type, std::string help, double value,
                    std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  if (type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return MetricFamily{std::move(name), std::move(help), type, {std::move(m)}};
}

ClientMetric HistogramMetric(const util::LatencyHistogram& h) {
  ClientMetric m;
  for (int i = 0; i < h.buckets(); ++i) {
    m.histogram.bucket.push_back({h.Cumulative(i), h.UpperBound(i)});
  }
  const uint64_t total = h.Count();
  m.histogram.bucket.push_back({total, std::numeric_limits<double>::infinity()});
  m.histogram.sample_count = total;
  m.histogram.sample_sum = h.Sum();
  return m;
}

MetricFamily Histogram(std::string name, std::string help, const util::LatencyHistogram& h) {
  return MetricFamily{std::move(name), std::move(help), MetricType::Histogram, {HistogramMetric(h)}};
}

// The store's state, read at collection time (etcd registers most of these
// as GaugeFuncs over the backend and the mvcc store).
class StoreMetrics final : public prometheus::Collectable {
 public:
  StoreMetrics(mvcc::KvStore* store, const membership::MemberInfo* member,
               std::string server_version)
      : store_(store), member_(member), server_version_(std::move(server_version)) {}

  std::vector<MetricFamily> Collect() const override {
    const auto stats = store_->GetStats();
    const auto view = store_->View();
    auto d = [](auto v) { return static_cast<double>(v); };
    std::vector<MetricFamily> out;
    // A single member always has a leader: itself.
    const membership::RaftView* raft = member_ != nullptr ? member_->raft : nullptr;
    const uint64_t leader = raft != nullptr ? raft->Leader() : 0;
    out.push_back(Single("etcd_server_has_leader", MetricType::Gauge,
                         "Whether or not a leader exists. 1 is existence, 0 is not.",
                         raft == nullptr || leader != 0 ? 1 : 0));
    out.push_back(Single("etcd_server_is_leader", MetricType::Gauge,
                         "Whether or not this member is a leader. 1 if is, 0 otherwise.",
                         raft == nullptr || leader == member_->member_id ? 1 : 0));
    out.push_back(Single("etcd_server_version", MetricType::Gauge,
                         "Which version is running. 1 for 'server_version' label with current "
                         "version.",
                         1, {{"server_version", server_version_}}));
    // etcd's label is the cluster version's major.minor ("3.5"); none
    // until the cluster has a version.
    std::string cluster_version =
        member_ != nullptr ? member_->ClusterVersion(kEtcdClusterVersion) : kEtcdClusterVersion;
    if (size_t major = cluster_version.find('.'); major != std::string::npos) {
      cluster_version = cluster_version.substr(0, cluster_version.find('.', major + 1));
    }
    if (!cluster_version.empty()) {
      out.push_back(Single(
          "etcd_cluster_version", MetricType::Gauge,
          "Which version is running. 1 for 'cluster_version' label with current cluster version",
          1, {{"cluster_version", cluster_version}}));
    }
    out.push_back(Single("etcd_network_client_grpc_received_bytes_total", MetricType::Counter,
                         "The total number of bytes received from grpc clients.",
                         d(ClientTraffic::received())));
    out.push_back(Single("etcd_network_client_grpc_sent_bytes_total", MetricType::Counter,
                         "The total number of bytes sent to grpc clients.",
                         d(ClientTraffic::sent())));
    out.push_back(Single("etcd_mvcc_db_total_size_in_bytes", MetricType::Gauge,
                         "Total size of the underlying database physically allocated in bytes.",
                         d(store_->backend()->SizeOnDisk())));
    out.push_back(Single("etcd_mvcc_db_total_size_in_use_in_bytes", MetricType::Gauge,
                         "Total size of the underlying database logically in use in bytes.",
                         d(store_->backend()->LiveDataSize())));
    out.push_back(Single("etcd_debugging_mvcc_keys_total", MetricType::Gauge,
                         "Total number of keys.", d(stats.keys)));
    out.push_back(Single("etcd_mvcc_put_total", MetricType::Counter,
                         "Total number of puts seen by this member.", d(stats.puts)));
    out.push_back(Single("etcd_mvcc_delete_total", MetricType::Counter,
                         "Total number of deletes seen by this member.", d(stats.deletes)));
    out.push_back(Single("etcd_mvcc_range_total", MetricType::Counter,
                         "Total number of ranges seen by this member.", d(stats.ranges)));
    out.push_back(Single("etcd_mvcc_txn_total", MetricType::Counter,
                         "Total number of txns seen by this member.", d(stats.txns)));
    out.push_back(Single("etcd_debugging_mvcc_current_revision", MetricType::Gauge,
                         "The current revision of store.", d(view->rev)));
    out.push_back(Single("etcd_debugging_mvcc_compact_revision", MetricType::Gauge,
                         "The revision of the last compaction in store.", d(view->compact_rev)));
    out.push_back(Single("etcd_server_proposals_applied_total", MetricType::Gauge,
                         "The total number of consensus proposals applied.",
                         d(store_->AppliedIndex())));
    if (member_ != nullptr) {
      out.push_back(Single("etcd_server_id", MetricType::Gauge,
                           "Server or member ID in hexadecimal format. 1 for 'server_id' label "
                           "with current ID.",
                           1, {{"server_id", absl::StrFormat("%x", member_->member_id)}}));
    }
    // A single member is the one voter of its group: it committed what it
    // applied, and it saw one leader, itself, as etcd's does.
    out.push_back(Single("etcd_server_is_learner", MetricType::Gauge,
                         "Whether or not this member is a learner. 1 if is, 0 otherwise.",
                         raft != nullptr && raft->IsLearner() ? 1 : 0));
    out.push_back(Single("etcd_server_leader_changes_seen_total", MetricType::Counter,
                         "The number of leader changes seen.",
                         raft != nullptr ? d(raft->LeaderChanges()) : 1));
    out.push_back(Single("etcd_server_proposals_committed_total", MetricType::Gauge,
                         "The total number of consensus proposals committed.",
                         raft != nullptr ? d(raft->CommittedIndex()) : d(store_->AppliedIndex())));
    out.push_back(Single("etcd_server_proposals_pending", MetricType::Gauge,
                         "The current number of pending proposals to commit.",
                         raft != nullptr ? d(raft->ProposalsPending()) : 0));
    out.push_back(Single("etcd_server_proposals_failed_total", MetricType::Counter,
                         "The total number of failed proposals seen.",
                         raft != nullptr ? d(raft->ProposalsFailed()) : 0));
    out.push_back(Single("etcd_server_slow_read_indexes_total", MetricType::Counter,
                         "The total number of pending read indexes not in sync with leader's or "
                         "timed out read index requests.",
                         raft != nullptr ? d(raft->SlowReadIndexes()) : 0));
    out.push_back(Single("etcd_server_read_indexes_failed_total", MetricType::Counter,
                         "The total number of failed read indexes seen.",
                         raft != nullptr ? d(raft->ReadIndexesFailed()) : 0));
    const membership::RaftView::Promotions promotions =
        raft != nullptr ? raft->LearnerPromotions() : membership::RaftView::Promotions{};
    out.push_back(Single("etcd_server_learner_promote_successes", MetricType::Counter,
                         "The total number of successful learner promotions while this member "
                         "is leader.",
                         d(promotions.successes)));
    if (!promotions.failures.empty()) {
      // Labelled with the error's text as etcd's server holds it.
      MetricFamily failures{"etcd_server_learner_promote_failures",
                            "The total number of failed learner promotions (likely learner not "
                            "ready) while this member is leader.",
                            MetricType::Counter,
                            {}};
      for (const auto& [error, count] : promotions.failures) {
        ClientMetric m;
        m.label = {{"Reason", EtcdInternalText(error)}};
        m.counter.value = d(count);
        failures.metric.push_back(std::move(m));
      }
      out.push_back(std::move(failures));
    }
    out.push_back(Single("etcd_server_heartbeat_send_failures_total", MetricType::Counter,
                         "The total number of leader heartbeat send failures (likely overloaded "
                         "from slow disk).",
                         raft != nullptr ? d(raft->HeartbeatSendFailures()) : 0));
    out.push_back(Single("capstan_commit_groups_total", MetricType::Counter,
                         "Group commits written to the backend.", d(stats.groups)));
    out.push_back(Single("capstan_commit_group_requests_total", MetricType::Counter,
                         "Write requests carried by group commits.", d(stats.group_writes)));
    // etcd's backend commit is the store's group commit. Its WAL fsync is
    // the Raft log's synced write in a cluster; on a single member the
    // group commit is the one synced write, and both report it.
    const util::LatencyHistogram* log_sync = raft != nullptr ? raft->LogSyncLatency() : nullptr;
    out.push_back(Histogram("etcd_disk_backend_commit_duration_seconds",
                            "The latency distributions of commit called by backend.",
                            store_->commit_latency()));
    out.push_back(Histogram("etcd_disk_wal_fsync_duration_seconds",
                            "The latency distributions of fsync called by WAL.",
                            log_sync != nullptr ? *log_sync : store_->commit_latency()));
    // etcd_server_apply_duration_seconds: a series for each op and outcome
    // seen, as a Prometheus histogram vector shows them.
    const mvcc::ApplyTimings& applies = store_->apply_timings();
    MetricFamily apply_duration{"etcd_server_apply_duration_seconds",
                                "The latency distributions of v2 apply called by backend.",
                                MetricType::Histogram,
                                {}};
    for (size_t op = 0; op < mvcc::ApplyTimings::kOps.size(); ++op) {
      for (bool success : {false, true}) {
        const util::LatencyHistogram& h = applies.histogram(static_cast<int>(op), success);
        if (h.Count() == 0) continue;
        ClientMetric metric = HistogramMetric(h);
        metric.label = {{"op", mvcc::ApplyTimings::kOps[op]},
                        {"success", success ? "true" : "false"},
                        {"version", "v3"}};
        apply_duration.metric.push_back(std::move(metric));
      }
    }
    if (!apply_duration.metric.empty()) out.push_back(std::move(apply_duration));
    out.push_back(Single("etcd_server_slow_apply_total", MetricType::Counter,
                         "The total number of slow apply requests (likely overloaded from slow "
                         "disk).",
                         d(applies.slow())));
    const mvcc::KvStore::MaintenanceTimings& m = store_->maintenance_timings();
    out.push_back(Histogram("etcd_debugging_mvcc_index_compaction_pause_duration_milliseconds",
                            "Bucketed histogram of index compaction pause duration.",
                            m.index_compaction_pause_ms));
    out.push_back(Histogram("etcd_debugging_mvcc_db_compaction_pause_duration_milliseconds",
                            "Bucketed histogram of db compaction pause duration.",
                            m.db_compaction_pause_ms));
    out.push_back(Histogram("etcd_debugging_mvcc_db_compaction_total_duration_milliseconds",
                            "Bucketed histogram of db compaction total duration.",
                            m.db_compaction_total_ms));
    out.push_back(Single("etcd_debugging_mvcc_db_compaction_keys_total", MetricType::Counter,
                         "Total number of db keys compacted.",
                         d(m.db_compaction_keys.load(std::memory_order_relaxed))));
    out.push_back(Single("etcd_debugging_mvcc_db_compaction_last", MetricType::Gauge,
                         "The unix time of the last db compaction. Resets to 0 on start.",
                         d(m.db_compaction_last.load(std::memory_order_relaxed))));
    out.push_back(Histogram("etcd_disk_backend_defrag_duration_seconds",
                            "The latency distribution of backend defragmentation.",
                            m.defrag_seconds));
    out.push_back(Single("etcd_disk_defrag_inflight", MetricType::Gauge,
                         "Whether or not defrag is active on the member. 1 means active, 0 means "
                         "not.",
                         m.defrags_running.load(std::memory_order_relaxed) > 0 ? 1 : 0));
    out.push_back(Histogram("etcd_disk_backend_snapshot_duration_seconds",
                            "The latency distribution of backend snapshots.", m.snapshot_seconds));
    out.push_back(Histogram("etcd_mvcc_hash_duration_seconds",
                            "The latency distribution of storage hash operation.",
                            m.hash_seconds));
    out.push_back(Histogram("etcd_mvcc_hash_rev_duration_seconds",
                            "The latency distribution of storage hash by revision operation.",
                            m.hash_rev_seconds));
    out.push_back(Single("etcd_server_quota_backend_bytes", MetricType::Gauge,
                         "Current backend storage quota size in bytes.",
                         d(store_->options().quota_bytes)));
    // As etcd's lessor counts them: every grant, those of the Lock and
    // Election services' sessions included.
    out.push_back(Single("etcd_debugging_lease_granted_total", MetricType::Counter,
                         "The total number of granted leases.", d(stats.lease_grants)));
    out.push_back(Single("etcd_debugging_lease_renewed_total", MetricType::Counter,
                         "The number of renewed leases seen by the leader.",
                         d(stats.lease_renewals)));
    out.push_back(Single("etcd_debugging_lease_revoked_total", MetricType::Counter,
                         "The total number of revoked leases.", d(stats.lease_revokes)));
    out.push_back(Histogram("etcd_debugging_lease_ttl_total", "Bucketed histogram of lease TTLs.",
                            store_->lease_ttls()));
    out.push_back(Single("etcd_debugging_server_lease_expired_total", MetricType::Counter,
                         "The total number of expired leases.", d(stats.leases_expired)));
    out.push_back(Single("capstan_leases", MetricType::Gauge, "Leases held.",
                         d(store_->lessor()->size())));
    // etcd 3.6's etcd_debugging_server_alarms: the active alarms by member
    // (its id as etcd prints types.ID: lower-case hex) and type.
    MetricFamily alarms{"etcd_debugging_server_alarms",
                        "Alarms for every member in cluster. 1 for 'server_id' label with current "
                        "ID. 2 for 'alarm_type' label with type of this alarm",
                        MetricType::Gauge,
                        {}};
    for (const auto& a : store_->Alarms()) {
      ClientMetric m;
      m.label = {{"alarm_type", etcdserverpb::AlarmType_Name(a.alarm())},
                 {"server_id", absl::StrCat(absl::Hex(a.memberid()))}};
      m.gauge.value = 1;
      alarms.metric.push_back(std::move(m));
    }
    if (!alarms.metric.empty()) out.push_back(std::move(alarms));
    const ProcessState p = ReadProcess();
    out.push_back(Single("process_cpu_seconds_total", MetricType::Counter,
                         "Total user and system CPU time spent in seconds.", p.cpu_seconds));
    out.push_back(Single("process_open_fds", MetricType::Gauge, "Number of open file descriptors.",
                         p.open_fds));
    out.push_back(Single("process_max_fds", MetricType::Gauge,
                         "Maximum number of open file descriptors.", p.max_fds));
    out.push_back(Single("process_virtual_memory_bytes", MetricType::Gauge,
                         "Virtual memory size in bytes.", p.virtual_bytes));
    out.push_back(Single("process_virtual_memory_max_bytes", MetricType::Gauge,
                         "Maximum amount of virtual memory available in bytes.",
                         p.max_virtual_bytes));
    out.push_back(Single("process_resident_memory_bytes", MetricType::Gauge,
                         "Resident memory size in bytes.", p.resident_bytes));
    out.push_back(Single("process_start_time_seconds", MetricType::Gauge,
                         "Start time of the process since unix epoch in seconds.",
                         p.start_seconds));
    out.push_back(Single("process_network_receive_bytes_total", MetricType::Counter,
                         "Number of bytes received by the process over the network.",
                         p.received_bytes));
    out.push_back(Single("process_network_transmit_bytes_total", MetricType::Counter,
                         "Number of bytes sent by the process over the network.",
                         p.transmitted_bytes));
    out.push_back(Single("os_fd_used", MetricType::Gauge, "The number of used file descriptors.",
                         p.open_fds));
    out.push_back(Single("os_fd_limit", MetricType::Gauge, "The file descriptor limit.", p.max_fds));
    return out;
  }

 private:
  mvcc::KvStore* const store_;
  const membership::MemberInfo* const member_;
  const std::string server_version_;
};

// The watch cache's state per resource prefix, and the Ranges it answered.
class WatchCacheMetrics final : public prometheus::Collectable {
 public:
  WatchCacheMetrics(const watchcache::Cache* cache, const CacheRange* ranges)
      : cache_(cache), ranges_(ranges) {}

  std::vector<MetricFamily> Collect() const override {
    std::vector<MetricFamily> out;
    MetricFamily ranges{"capstan_watch_cache_ranges_total",
                        "Range requests within a cached prefix, by whether the watch cache "
                        "answered them (served) or left them to the store (declined).",
                        MetricType::Counter,
                        {}};
    for (const auto& [result, n] : {std::pair<const char*, uint64_t>{"served", ranges_->served()},
                                    {"declined", ranges_->declined()}}) {
      ClientMetric m;
      m.label = {{"result", result}};
      m.counter.value = static_cast<double>(n);
      ranges.metric.push_back(std::move(m));
    }
    out.push_back(std::move(ranges));

    struct Column {
      const char* name;
      const char* help;
      MetricType type;
      uint64_t (*get)(const watchcache::ResourceCache::Stats&);
    };
    static constexpr Column kColumns[] = {
        {"capstan_watch_cache_revision", "The revision the cached prefix is at.",
         MetricType::Gauge, [](const auto& s) { return static_cast<uint64_t>(s.rev); }},
        {"capstan_watch_cache_objects", "Objects held for the cached prefix.", MetricType::Gauge,
         [](const auto& s) { return s.objects; }},
        {"capstan_watch_cache_object_bytes", "Bytes of the cached prefix's objects.",
         MetricType::Gauge, [](const auto& s) { return s.object_bytes; }},
        {"capstan_watch_cache_watchers", "Watchers of the cached prefix.", MetricType::Gauge,
         [](const auto& s) { return s.watchers; }},
        {"capstan_watch_cache_watchers_behind", "Watchers catching up from the event ring.",
         MetricType::Gauge, [](const auto& s) { return s.watchers_behind; }},
        {"capstan_watch_cache_watchers_ended_total",
         "Watchers the cache ended with an error: too far behind, or the cache relisted.",
         MetricType::Counter, [](const auto& s) { return s.watchers_cut_off; }},
        {"capstan_watch_cache_events_total", "Changes applied to the cached prefix.",
         MetricType::Counter, [](const auto& s) { return s.events_applied; }},
    };
    std::vector<std::pair<std::string, watchcache::ResourceCache::Stats>> stats;
    for (const auto& rc : cache_->resources()) {
      stats.emplace_back(rc->spec().prefix, rc->GetStats(/*estimate_indexes=*/false));
    }
    for (const Column& c : kColumns) {
      MetricFamily f{c.name, c.help, c.type, {}};
      for (const auto& [prefix, st] : stats) {
        ClientMetric m;
        m.label = {{"prefix", prefix}};
        const auto v = static_cast<double>(c.get(st));
        if (c.type == MetricType::Counter) {
          m.counter.value = v;
        } else {
          m.gauge.value = v;
        }
        f.metric.push_back(std::move(m));
      }
      out.push_back(std::move(f));
    }
    const auto slab = cache_->allocator()->GetStats();
    out.push_back(Single("capstan_watch_cache_memory_bytes", MetricType::Gauge,
                         "Memory the watch cache's allocator holds for objects.",
                         static_cast<double>(slab.footprint_bytes)));
    return out;
  }

 private:
  const watchcache::Cache* const cache_;
  const CacheRange* const ranges_;
};

// The peers' traffic (replication::Transport::Traffic), as etcd's rafthttp
// counts it.
class PeerMetrics final : public prometheus::Collectable {
 public:
  PeerMetrics(uint64_t local_id, std::function<std::vector<membership::PeerTraffic>()> peers)
      : local_(absl::StrFormat("%x", local_id)), peers_(std::move(peers)) {}

  std::vector<MetricFamily> Collect() const override {
    const std::vector<membership::PeerTraffic> peers = peers_();
    MetricFamily sent{"etcd_network_peer_sent_bytes_total", "The total number of bytes sent to peers.",
                      MetricType::Counter, {}};
    MetricFamily received{"etcd_network_peer_received_bytes_total",
                          "The total number of bytes received from peers.", MetricType::Counter, {}};
    MetricFamily failures{"etcd_network_peer_sent_failures_total",
                          "The total number of send failures from peers.", MetricType::Counter, {}};
    MetricFamily active{"etcd_network_active_peers", "The current number of active peer connections.",
                        MetricType::Gauge, {}};
    MetricFamily round_trips{"etcd_network_peer_round_trip_time_seconds",
                             "Round-Trip-Time histogram between peers", MetricType::Histogram, {}};
    auto counter = [](MetricFamily& f, const char* label, const std::string& id, uint64_t v) {
      if (v == 0) return;
      ClientMetric m;
      m.label = {{label, id}};
      m.counter.value = static_cast<double>(v);
      f.metric.push_back(std::move(m));
    };
    for (const auto& p : peers) {
      const std::string id = absl::StrFormat("%x", p.id);
      counter(sent, "To", id, p.sent_bytes);
      counter(received, "From", id, p.received_bytes);
      counter(failures, "To", id, p.sent_failures);
      // A series once the prober observed the peer, as etcd's appears.
      if (p.round_trips != nullptr && p.round_trips->Count() > 0) {
        ClientMetric m = HistogramMetric(*p.round_trips);
        m.label = {{"To", id}};
        round_trips.metric.push_back(std::move(m));
      }
      ClientMetric m;
      m.label = {{"Local", local_}, {"Remote", id}};
      m.gauge.value = p.active ? 1 : 0;
      active.metric.push_back(std::move(m));
    }
    std::vector<MetricFamily> out;
    for (MetricFamily* f : {&active, &sent, &received, &failures, &round_trips}) {
      if (!f->metric.empty()) out.push_back(std::move(*f));
    }
    return out;
  }

 private:
  const std::string local_;
  const std::function<std::vector<membership::PeerTraffic>()> peers_;
};

// etcd's watch gauges and counter over the hub's watchers and those the
// watch cache serves (a client's watch is one or the other).
class WatchMetrics final : public prometheus::Collectable {
 public:
  WatchMetrics(const mvcc::WatchHub* hub, const watchcache::Cache* cache)
      : hub_(hub), cache_(cache) {}

  std::vector<MetricFamily> Collect() const override {
    const mvcc::WatchHub::Stats hub = hub_->GetStats();
    uint64_t cached = 0, cached_behind = 0;
    if (cache_ != nullptr) {
      for (const auto& rc : cache_->resources()) {
        const auto st = rc->GetStats(/*estimate_indexes=*/false);
        cached += st.watchers;
        cached_behind += st.watchers_behind;
      }
    }
    auto d = [](auto v) { return static_cast<double>(v); };
    return {Single("etcd_debugging_mvcc_watcher_total", MetricType::Gauge,
                   "Total number of watchers.", d(hub.synced + hub.unsynced + cached)),
            Single("etcd_debugging_mvcc_slow_watcher_total", MetricType::Gauge,
                   "Total number of unsynced slow watchers.", d(hub.unsynced + cached_behind)),
            Single("etcd_debugging_mvcc_watch_stream_total", MetricType::Gauge,
                   "Total number of watch streams.", d(hub.streams)),
            Single("etcd_debugging_mvcc_events_total", MetricType::Counter,
                   "Total number of events sent by this member.", d(hub.events_sent))};
  }

 private:
  const mvcc::WatchHub* const hub_;
  const watchcache::Cache* const cache_;
};

// The Lock and Election services' calls (server/api/recipes.h).
class RecipesMetrics final : public prometheus::Collectable {
 public:
  explicit RecipesMetrics(const Recipes* recipes) : recipes_(recipes) {}

  std::vector<MetricFamily> Collect() const override {
    return {Single("capstan_lock_election_calls", MetricType::Gauge,
                   "Lock and Election service calls in progress: mostly locks and campaigns "
                   "waiting and Observe streams open.",
                   static_cast<double>(recipes_->calls_in_progress())),
            Single("capstan_lock_election_observe_pauses_total", MetricType::Counter,
                   "Times an Observe stream held its watch back because its client read too "
                   "slowly.",
                   static_cast<double>(recipes_->observe_pauses()))};
  }

 private:
  const Recipes* const recipes_;
};

}  // namespace

void Metrics::AddWatches(const mvcc::WatchHub* hub, const watchcache::Cache* cache) {
  scraped_.push_back(std::make_unique<WatchMetrics>(hub, cache));
}

void Metrics::AddWatchCache(const watchcache::Cache* cache, const CacheRange* ranges) {
  scraped_.push_back(std::make_unique<WatchCacheMetrics>(cache, ranges));
}

void Metrics::AddPeers(uint64_t local_id,
                       std::function<std::vector<membership::PeerTraffic>()> peers) {
  scraped_.push_back(std::make_unique<PeerMetrics>(local_id, std::move(peers)));
}

void Metrics::AddRecipes(const Recipes* recipes) {
  scraped_.push_back(std::make_unique<RecipesMetrics>(recipes));
}

namespace {

// Families fixed when they are added (the feature gates).
class FixedMetrics final : public prometheus::Collectable {
 public:
  explicit FixedMetrics(std::vector<MetricFamily> families) : families_(std::move(families)) {}
  std::vector<MetricFamily> Collect() const override { return families_; }

 private:
  const std::vector<MetricFamily> families_;
};

}  // namespace

void Metrics::AddFeatureGates(const FeatureGates& gates) {
  MetricFamily family{"etcd_server_feature_enabled",
                      "Whether or not a feature is enabled. 1 is enabled, 0 is not.",
                      MetricType::Gauge,
                      {}};
  for (const FeatureGates::Resolved& gate : gates.All()) {
    ClientMetric m;
    m.label = {{"name", std::string(gate.spec->name)},
               {"stage", std::string(FeatureStageName(gate.spec->stage))}};
    m.gauge.value = gate.enabled ? 1 : 0;
    family.metric.push_back(std::move(m));
  }
  scraped_.push_back(std::make_unique<FixedMetrics>(std::vector<MetricFamily>{std::move(family)}));
}

Metrics::Metrics(mvcc::KvStore* store, const membership::MemberInfo* member,
                 std::string server_version)
    : registry_(std::make_shared<prometheus::Registry>()),
      requests_(std::make_unique<RequestMetrics>()) {
  scraped_.push_back(std::make_unique<StoreMetrics>(store, member, std::move(server_version)));
}

Metrics::~Metrics() = default;

std::string Metrics::Render() const {
  std::vector<MetricFamily> families;
  for (const auto& source : scraped_) {
    for (auto& f : source->Collect()) families.push_back(std::move(f));
  }
  for (auto& f : requests_->Collect()) families.push_back(std::move(f));
  for (auto& f : registry_->Collect()) families.push_back(std::move(f));
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace capstan::server
