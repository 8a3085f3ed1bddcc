// k8s: a reduced but faithful model of the etcd traffic of a Kubernetes
// control plane (the objects and writes are in k8s_cluster.h). After loading
// the cluster and the apiserver's initial paginated list, the steady state
// runs for --duration:
//   - node lease renewals, nodes/10 per second (each kubelet every 10 s);
//   - node status updates, nodes/60 per second;
//   - pod churn (create : update : delete = 1 : 2 : 1), nodes/20 per second;
//   - events, nodes/10 per second, one lease per --events-per-lease events;
//   - one watch per resource prefix with prev_kv, like the apiserver's cacher,
//     timing each write's event (write start -> event received);
//   - a paginated relist of all pods every --relist-interval (limit 500,
//     continuing from the last key + "\0" at the first page's revision);
//   - against a server with a pod watch cache (Capstan's capstan.v1.Cache),
//     the kubelets (k8s_kubelets.h): before the steady state every node lists
//     its pods by field selector and watches them from there; during it,
//     lists by node at --node-list-rate, and each pod write's event is timed
//     on its node's watch. Against etcd, which has no such service, the
//     lists by node are etcd's equivalent (the whole pod prefix, filtered
//     here), --etcd-node-lists of them after the steady state so that they
//     do not load the steady state, and node watches are not run.
// Writes are paced open-loop by a scheduler; each is timed from its start.

#include "bench/loadgen/k8s_scenario.h"

#include <unistd.h>

#include <atomic>
#include <cmath>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/k8s_cluster.h"
#include "bench/loadgen/k8s_kubelets.h"
#include "bench/loadgen/keys.h"
#include "bench/loadgen/list_util.h"
#include "bench/loadgen/load_driver.h"
#include "bench/loadgen/proc_stats.h"
#include "bench/loadgen/report.h"
#include "bench/loadgen/streams.h"
#include "bench/loadgen/workload.h"

namespace capstan::bench {

namespace {

using Clock = std::chrono::steady_clock;

uint64_t Since(Clock::time_point t) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t).count());
}

// Watch events' delivery latencies and the watches' failures, as a phase.
PhaseResult DeliveryPhase(std::string name, const Histogram& latency, const ErrorCounter& errors,
                          double seconds) {
  PhaseResult p;
  p.name = std::move(name);
  p.latency = latency;
  p.seconds = seconds;
  p.has_throughput = false;
  p.errors = errors.Total();
  p.error_counts = errors.Snapshot();
  return p;
}

// The apiserver's watches: one stream per resource prefix, with prev_kv,
// feeding every event to the delivery tracker.
class ApiserverWatches {
 public:
  ApiserverWatches(ConnectionPool& pool, int64_t start_revision, DeliveryTracker* delivery,
                   ErrorCounter* errors)
      : errors_(errors) {
    const std::vector<std::string> prefixes = {kPodsPrefix, kNodesPrefix, kNodeLeasesPrefix,
                                               kEventsPrefix};
    for (size_t i = 0; i < prefixes.size(); ++i) {
      streams_.push_back(std::make_unique<WatchStream>(
          pool.Watch(i), [this, delivery](const etcdserverpb::WatchResponse& w) {
            const auto now = Clock::now();
            if (w.created()) created_.fetch_add(1);
            if (w.canceled()) errors_->Add(absl::StrCat("watch canceled: ", w.cancel_reason()));
            for (const auto& ev : w.events()) {
              delivery->EventReceived(ev.kv().mod_revision(), now);
              events_.fetch_add(1);
            }
          }));
      etcdserverpb::WatchRequest req;
      auto* c = req.mutable_create_request();
      c->set_key(prefixes[i]);
      c->set_range_end(PrefixEnd(prefixes[i]));
      c->set_start_revision(start_revision);
      c->set_prev_kv(true);
      c->set_progress_notify(true);
      streams_.back()->Send(std::move(req));
    }
  }

  bool WaitCreated(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    while (created_.load() < static_cast<int>(streams_.size())) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  uint64_t events() const { return events_.load(); }

  // Ends the streams; a stream that broke before counts as an error.
  void Finish() {
    for (auto& w : streams_) {
      grpc::Status s;
      if (w->Broken(&s)) errors_->Add(s);
      w->Finish();
    }
    streams_.clear();
  }
  ~ApiserverWatches() { Finish(); }

 private:
  ErrorCounter* const errors_;
  std::vector<std::unique_ptr<WatchStream>> streams_;
  std::atomic<int> created_{0};
  std::atomic<uint64_t> events_{0};
};

class K8sWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.Int("nodes", &cluster_.nodes, "Nodes (a 10k-node cluster: --nodes 10000 --pods 150000)");
    f.Int("pods", &cluster_.pods, "Pods (0: 20 per node)");
    f.Int("namespaces", &cluster_.namespaces, "Namespaces the pods are spread over");
    f.Int("pod-min-size", &cluster_.pod_min_size, "Smallest stored pod, bytes");
    f.Int("pod-max-size", &cluster_.pod_max_size, "Largest stored pod, bytes");
    f.Int("events-per-lease", &cluster_.events_per_lease, "Events attached to one lease");
    f.Int64("event-ttl", &cluster_.event_ttl, "TTL of the events' leases, seconds");
    f.Duration("duration", &duration_, "Length of the steady state");
    f.Double("lease-rate", &lease_rate_, "Node lease renewals per second (0: nodes/10)");
    f.Double("node-status-rate", &node_rate_, "Node status updates per second (0: nodes/60)");
    f.Double("pod-churn-rate", &pod_rate_,
             "Pod creates+updates+deletes per second, 1:2:1 (0: nodes/20)");
    f.Double("event-rate", &event_rate_, "Events created per second (0: nodes/10)");
    f.Duration("relist-interval", &relist_interval_, "Period of the paginated relist of all pods");
    f.Int64("page-limit", &page_limit_, "Page size of lists");
    f.Int("max-inflight", &max_inflight_, "Most steady-state writes in flight at once");
    f.String("watch-cache", &watch_cache_,
             "Kubelets' lists and watches by node through capstan.v1.Cache: auto (when the "
             "server has it), on, off");
    f.Double("node-list-rate", &node_list_rate_,
             "Lists by node per second in the steady state, watch cache only (0: nodes/1000, at "
             "least 1)");
    f.Int("etcd-node-lists", &etcd_node_lists_,
          "Without a watch cache: lists by node done the etcd way (whole pod prefix, filtered "
          "here) after the steady state");
  }

  absl::Status Prepare(const std::vector<std::string>&) override {
    if (cluster_.nodes < 1 || cluster_.namespaces < 1 || cluster_.pod_min_size < 1 ||
        cluster_.pod_max_size < cluster_.pod_min_size || page_limit_ < 1) {
      return absl::InvalidArgumentError("k8s: bad --nodes, --namespaces, pod sizes or --page-limit");
    }
    const double nodes = cluster_.nodes;
    if (cluster_.pods <= 0) cluster_.pods = 20 * cluster_.nodes;
    if (lease_rate_ <= 0) lease_rate_ = nodes / 10;
    if (node_rate_ <= 0) node_rate_ = nodes / 60;
    if (pod_rate_ <= 0) pod_rate_ = nodes / 20;
    if (event_rate_ <= 0) event_rate_ = nodes / 10;
    if (node_list_rate_ <= 0) node_list_rate_ = std::max(1.0, nodes / 1000);
    if (watch_cache_ != "auto" && watch_cache_ != "on" && watch_cache_ != "off") {
      return absl::InvalidArgumentError("k8s: --watch-cache must be auto, on or off");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<RunReport> Run(BenchContext& ctx) override;

 private:
  PhaseResult InitialList(ConnectionPool& pool, RunReport& r) const;
  // Whether this run drives the kubelets through the server's watch cache.
  absl::StatusOr<bool> UseWatchCache(ConnectionPool& pool) const;
  // Issues the steady-state writes at their rates until `end`.
  void Schedule(K8sCluster& cluster, Clock::time_point start, Clock::time_point end,
                Histogram* lag) const;

  K8sCluster::Options cluster_{.pods = 0};  // 0: 20 per node, decided in Prepare
  absl::Duration duration_ = absl::Seconds(30);
  double lease_rate_ = 0;
  double node_rate_ = 0;
  double pod_rate_ = 0;
  double event_rate_ = 0;
  absl::Duration relist_interval_ = absl::Seconds(10);
  int64_t page_limit_ = 500;
  int max_inflight_ = 2000;
  std::string watch_cache_ = "auto";
  double node_list_rate_ = 0;
  int etcd_node_lists_ = 3;
};

absl::StatusOr<bool> K8sWorkload::UseWatchCache(ConnectionPool& pool) const {
  if (watch_cache_ == "off") return false;
  absl::StatusOr<bool> has = HasPodWatchCache(pool);
  if (!has.ok()) return has.status();
  if (watch_cache_ == "on" && !*has) {
    return absl::FailedPreconditionError(
        "k8s --watch-cache=on: the server has no capstan.v1.Cache for /registry/pods/");
  }
  return *has;
}

PhaseResult K8sWorkload::InitialList(ConnectionPool& pool, RunReport& r) const {
  PhaseResult p;
  p.name = "initial list";
  p.has_throughput = false;
  const auto t = Clock::now();
  ListResult lr = CountPrefix(pool.Channel(0), kPodsPrefix, page_limit_, nullptr);
  p.seconds = Since(t) / 1e9;
  if (!lr.status.ok()) {
    p.errors = 1;
    p.error_counts[absl::StrCat("initial list: ", lr.status.error_message())] = 1;
    return p;
  }
  p.latency.Record(Since(t));
  const int64_t listed = static_cast<int64_t>(lr.objects);
  if (listed < cluster_.pods) {
    p.errors = 1;
    p.error_counts[absl::StrCat("initial list returned ", listed, " pods, want ", cluster_.pods)] = 1;
  } else if (listed > cluster_.pods) {
    r.notes.push_back(absl::StrCat("the server held ", listed - cluster_.pods,
                                   " other objects under /registry/pods/ before the run"));
  }
  return p;
}

void K8sWorkload::Schedule(K8sCluster& cluster, Clock::time_point start, Clock::time_point end,
                           Histogram* lag) const {
  struct Stream {
    double rate;
    void (K8sCluster::*issue)();
    Clock::time_point next;
  };
  std::vector<Stream> streams = {{lease_rate_, &K8sCluster::RenewNodeLease, start},
                                 {node_rate_, &K8sCluster::UpdateNodeStatus, start},
                                 {pod_rate_, &K8sCluster::ChurnPod, start},
                                 {event_rate_, &K8sCluster::CreateEvent, start}};
  // Stagger the streams' first writes within one period.
  for (size_t i = 0; i < streams.size(); ++i) {
    streams[i].next += std::chrono::nanoseconds(
        static_cast<int64_t>((i + 1) / (streams.size() + 1.0) * 1e9 / streams[i].rate));
  }
  for (;;) {
    Stream* s = &streams[0];
    for (auto& st : streams) {
      if (st.next < s->next) s = &st;
    }
    if (s->next >= end) return;
    std::this_thread::sleep_until(s->next);
    while (cluster.Inflight() >= max_inflight_ && Clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    lag->Record(Since(s->next));
    (cluster.*(s->issue))();
    s->next += std::chrono::nanoseconds(static_cast<int64_t>(1e9 / s->rate));
  }
}

absl::StatusOr<RunReport> K8sWorkload::Run(BenchContext& ctx) {
  RunReport r;
  r.workload = "k8s";
  r.target = ctx.target;
  Histogram delivery_latency;
  DeliveryTracker delivery(&delivery_latency);
  K8sCluster cluster(cluster_, ctx.pool, ctx.global->clients, &delivery);

  // Load the cluster as the apiserver creates it, then list it as it starts.
  r.phases.push_back(RunClosedLoop(
      {"load (create)", cluster.LoadTotal(), absl::ZeroDuration(), ctx.global->clients, 0},
      [&cluster](uint64_t seq, size_t client, DoneFn done) {
        cluster.IssueLoad(seq, client, std::move(done));
      }));
  if (r.phases.back().errors > 0) {
    r.notes.push_back("the load phase failed; the steady state did not run");
    return r;
  }
  r.phases.push_back(InitialList(*ctx.pool, r));

  ErrorCounter watch_errors;
  ApiserverWatches watches(*ctx.pool, cluster.LoadedRevision() + 1, &delivery, &watch_errors);
  if (!watches.WaitCreated(std::chrono::seconds(10))) watch_errors.Add("watch creation timed out");

  // The kubelets: each node lists its pods and watches them from there.
  absl::StatusOr<bool> use_cache = UseWatchCache(*ctx.pool);
  if (!use_cache.ok()) return use_cache.status();
  Histogram node_delivery_latency;
  DeliveryTracker node_delivery(&node_delivery_latency);
  ErrorCounter node_watch_errors;
  Kubelets kubelets(ctx.pool, &node_delivery, &node_watch_errors);
  if (*use_cache) {
    r.phases.push_back(kubelets.Start(cluster.NodeNames(), ctx.global->clients,
                                      [&cluster](size_t node) { return cluster.LoadedPodsOn(node); }));
    // A watch replays from its list's revision, so a late registration only
    // delays its first events; give the registrations a moment anyway.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    cluster.SetPodDelivery(&node_delivery);
  }

  // Steady state: the scheduler on this thread, the relister on its own.
  std::unique_ptr<ProcessSampler> sampler;
  if (ctx.server_pid > 0) sampler = std::make_unique<ProcessSampler>(ctx.server_pid);
  // The harness shares the machine with the server: its own CPU shows how
  // much of the machine the load itself took.
  ProcessSampler self_sampler(getpid());
  const auto start = Clock::now();
  const auto end = start + absl::ToChronoNanoseconds(duration_);
  // Writes, relists and watch events second by second, for figures over time.
  Timeline write_timeline(start), page_timeline(start), delivery_timeline(start);
  cluster.SetWriteTimeline(&write_timeline);
  delivery.SetTimeline(&delivery_timeline);
  OpStats relist("relist (full)"), page("relist page"), node_list("list by node");
  std::atomic<bool> stop_relist{false};
  std::thread node_lister;
  if (*use_cache) {
    node_lister = std::thread([&] {
      const std::vector<std::string> nodes = cluster.NodeNames();
      const auto period = std::chrono::nanoseconds(static_cast<int64_t>(1e9 / node_list_rate_));
      auto next = start;
      for (size_t i = 0; !stop_relist.load(); ++i) {
        std::this_thread::sleep_until(next);
        next += period;
        const auto t = Clock::now();
        uint64_t count;
        const grpc::Status s = ListNodePods(ctx.pool->Cache(i), nodes[(i * 7919) % nodes.size()], &count);
        if (s.ok()) {
          node_list.latency.Record(Since(t));
        } else {
          node_list.errors.Add(s);
        }
      }
    });
  }
  std::thread relister([&] {
    auto next = start + absl::ToChronoNanoseconds(relist_interval_) / 2;
    for (int i = 0; !stop_relist.load();) {
      if (Clock::now() < next) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      next += absl::ToChronoNanoseconds(relist_interval_);
      const auto t = Clock::now();
      ListResult lr = CountPrefix(ctx.pool->Channel(i++), kPodsPrefix, page_limit_, &page.latency,
                                  &page_timeline);
      if (lr.status.ok()) {
        relist.latency.Record(Since(t));
      } else {
        relist.errors.Add(lr.status);
      }
    }
  });
  Histogram lag;
  {
    ProgressMonitor progress("k8s steady state", 0, [&] { return cluster.Issued(); }, [&] {
      uint64_t n = 0;
      for (OpStats* op : cluster.stats().All()) n += op->errors.Total();
      return n;
    });
    Schedule(cluster, start, end, &lag);
    // Let the last writes land (every attempt has a deadline, so this ends).
    while (cluster.Inflight() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  stop_relist = true;
  relister.join();
  if (node_lister.joinable()) node_lister.join();
  if (sampler) sampler->Stop();
  self_sampler.Stop();
  const uint64_t missing = delivery.WaitForAll(std::chrono::seconds(10));
  if (missing > 0) watch_errors.Add(absl::StrCat(missing, " watch events never arrived (waited 10s)"));
  watches.Finish();
  if (*use_cache) {
    const uint64_t node_missing = node_delivery.WaitForAll(std::chrono::seconds(10));
    if (node_missing > 0) {
      node_watch_errors.Add(
          absl::StrCat(node_missing, " node watch events never arrived (waited 10s)"));
    }
    r.extras.push_back({"node watches", static_cast<double>(kubelets.watches()), "watches", true});
    r.extras.push_back(
        {"node watch events received", static_cast<double>(kubelets.events()), "events", true});
    kubelets.Finish();
  } else {
    // etcd's way of listing by node, after the steady state so that it does
    // not weigh on it.
    const std::vector<std::string> nodes = cluster.NodeNames();
    for (int i = 0; i < etcd_node_lists_; ++i) {
      const auto t = Clock::now();
      uint64_t count;
      const grpc::Status s =
          ListNodePodsFromEtcd(ctx.pool->Kv(i), nodes[(i * 7919) % nodes.size()], page_limit_, &count);
      if (s.ok()) {
        node_list.latency.Record(Since(t));
      } else {
        node_list.errors.Add(s);
      }
    }
    if (etcd_node_lists_ > 0) {
      r.notes.push_back(absl::StrFormat(
          "no watch cache: \"list by node\" is etcd's equivalent, a paginated Range of all of "
          "%s (limit %d) filtered here by spec.nodeName, %d times after the steady state; no "
          "node watches",
          kPodsPrefix, page_limit_, etcd_node_lists_));
    }
  }

  OpStats mutating("mutating (all)");  // failures are counted in each op's own phase
  for (OpStats* op : cluster.stats().All()) {
    r.phases.push_back(op->ToPhase(seconds));
    mutating.latency.Merge(op->latency);
  }
  auto with_timeline = [](PhaseResult p, const Timeline& timeline, bool counts) {
    if (counts) p.per_second = timeline.Counts();
    p.p99_ms_per_second = timeline.PercentileMs(99);
    return p;
  };
  r.phases.push_back(with_timeline(mutating.ToPhase(seconds), write_timeline, true));
  r.phases.push_back(relist.ToPhase(seconds, false));
  r.phases.push_back(with_timeline(page.ToPhase(seconds, false), page_timeline, false));
  if (node_list.latency.Count() > 0 || node_list.errors.Total() > 0) {
    r.phases.push_back(node_list.ToPhase(seconds, false));
  }
  if (*use_cache) {
    r.phases.push_back(
        DeliveryPhase("node watch delivery", node_delivery_latency, node_watch_errors, seconds));
  }
  r.phases.push_back(with_timeline(
      DeliveryPhase("watch delivery", delivery_latency, watch_errors, seconds), delivery_timeline,
      false));

  if (sampler && sampler->valid()) {
    r.extras.push_back({"server CPU (steady state)", sampler->CpuCores(), "cores", false});
    r.extras.push_back({"server RSS peak (steady state)", sampler->PeakRss() / 1048576.0, "MiB", false});
    r.extras.push_back({"server RSS at end", sampler->EndRss() / 1048576.0, "MiB", false});
  }
  if (self_sampler.valid()) {
    r.extras.push_back({"capstan-bench CPU (steady state)", self_sampler.CpuCores(), "cores", false});
  }
  r.extras.push_back({"watch events received", static_cast<double>(watches.events()), "events", true});
  r.extras.push_back({"scheduling lag p99", lag.Percentile(99) / 1e6, "ms", false});
  r.extras.push_back({"write conflicts", static_cast<double>(cluster.Conflicts()), "txns", false});
  r.extras.push_back({"skipped writes (object busy)", static_cast<double>(cluster.Skipped()), "ops", false});
  {
    grpc::ClientContext c;
    SetDeadline(&c);
    etcdserverpb::StatusResponse st;
    if (ctx.pool->Maintenance(0).Status(&c, etcdserverpb::StatusRequest(), &st).ok()) {
      r.extras.push_back({"reported db size", st.dbsize() / 1048576.0, "MiB", false});
    }
  }
  r.notes.push_back(absl::StrFormat(
      "%d nodes, %d pods; per second: %.1f lease renewals, %.1f node status updates, %.1f pod "
      "writes, %.1f events%s; relist every %s; steady state %.1fs",
      cluster_.nodes, cluster_.pods, lease_rate_, node_rate_, pod_rate_, event_rate_,
      *use_cache ? absl::StrFormat(", %.1f lists by node (watch cache)", node_list_rate_) : "",
      absl::FormatDuration(relist_interval_), seconds));
  return r;
}

}  // namespace

std::string K8sSloTable(const std::vector<std::string>& targets,
                        const std::vector<std::map<std::string, double>>& metrics) {
  struct Row {
    const char* label;
    const char* metric;
    const char* slo;
    double limit_ms;  // 0: no official SLO
    const char* unit;
  };
  const Row rows[] = {
      {"mutating request latency p99 (all writes)", "mutating (all) p99", "<= 1 s", 1000, "ms"},
      {"cluster-scope list p99 (paginated relist of all pods)", "relist (full) p99", "<= 30 s", 30000, "ms"},
      {"watch event delivery p99 (write start -> event)", "watch delivery p99", "none official", 0, "ms"},
      {"list by node p99, steady state (Capstan: Cache List spec.nodeName=N; etcd: Range of all "
       "pods filtered client side, after the steady state)",
       "list by node p99", "<= 30 s", 30000, "ms"},
      {"list by node p99, kubelet start (Cache List, every node at once)",
       "list by node (kubelet start) p99", "<= 30 s", 30000, "ms"},
      {"node watch delivery p99 (Cache Watch spec.nodeName=N, write start -> event)",
       "node watch delivery p99", "none official", 0, "ms"},
      {"server CPU, steady state", "server CPU (steady state)", "-", 0, "cores"},
      {"server RSS peak, steady state", "server RSS peak (steady state)", "-", 0, "MiB"},
  };
  std::string s = "| SLI | Kubernetes SLO |";
  for (const auto& t : targets) absl::StrAppend(&s, " ", t, " |");
  if (targets.size() == 2) absl::StrAppend(&s, " ", targets[0], "/", targets[1], " |");
  s += "\n| --- | --- |";
  for (size_t i = 0; i < targets.size() + (targets.size() == 2 ? 1 : 0); ++i) s += " ---: |";
  s += "\n";
  for (const Row& row : rows) {
    absl::StrAppend(&s, "| ", row.label, " | ", row.slo, " |");
    std::vector<double> vals;
    for (const auto& m : metrics) {
      auto it = m.find(row.metric);
      if (it == m.end()) {
        s += " n/a |";
        vals.push_back(NAN);
        continue;
      }
      vals.push_back(it->second);
      std::string verdict;
      if (row.limit_ms > 0) verdict = it->second <= row.limit_ms ? " (pass)" : " (FAIL)";
      absl::StrAppend(&s, " ", FormatNumber(it->second), " ", row.unit, verdict, " |");
    }
    if (vals.size() == 2) {
      absl::StrAppend(&s, " ", (std::isnan(vals[0]) || std::isnan(vals[1]) || vals[1] == 0)
                                   ? std::string("-")
                                   : absl::StrFormat("%.2f", vals[0] / vals[1]),
                      " |");
    }
    s += "\n";
  }
  return s;
}

std::unique_ptr<Workload> NewK8sWorkload() { return std::make_unique<K8sWorkload>(); }

}  // namespace capstan::bench
