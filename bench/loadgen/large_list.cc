// large-list: loads N Kubernetes-shaped objects of a size distribution under
// a prefix, then measures what hurts etcd at scale: full (unpaginated) lists,
// kube-apiserver-style paginated lists (limit 500, continuing from the last
// key + "\0" at the first page's revision), several lists at once, and the
// latency of small writes while those lists run, against the same writes
// with no list running. With --list-endpoints the lists go to other
// members than the writes: a cluster's follower lists while its leader takes
// the puts, so the puts' latency shows what a follower's lists cost the
// leader.

#include <atomic>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/loadgen/async_call.h"
#include "bench/loadgen/connection_pool.h"
#include "bench/loadgen/k8s_objects.h"
#include "bench/loadgen/keys.h"
#include "bench/loadgen/list_util.h"
#include "bench/loadgen/load_driver.h"
#include "bench/loadgen/proc_stats.h"
#include "bench/loadgen/workload.h"

namespace capstan::bench {

namespace {

uint64_t SinceNs(std::chrono::steady_clock::time_point start) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - start)
                                   .count());
}

// A server's memory growth over a scope (the lists of one phase): its peak
// RSS while the scope runs minus its RSS when it began, added to the report
// when the scope ends. Nothing when the server's pid is unknown.
class RssGrowth {
 public:
  RssGrowth(pid_t pid, std::string name, RunReport* report)
      : name_(std::move(name)), report_(report) {
    if (pid != 0 && ReadProcSample(pid, &before_)) {
      sampler_ = std::make_unique<ProcessSampler>(pid, std::chrono::milliseconds(20));
    }
  }
  ~RssGrowth() {
    if (sampler_ == nullptr) return;
    sampler_->Stop();
    const uint64_t peak = std::max(sampler_->PeakRss(), before_.rss_bytes);
    report_->extras.push_back({name_, (peak - before_.rss_bytes) / 1048576.0, "MiB", false});
  }

 private:
  const std::string name_;
  RunReport* const report_;
  ProcSample before_;
  std::unique_ptr<ProcessSampler> sampler_;
};

class LargeListWorkload final : public Workload {
 public:
  void RegisterFlags(FlagSet& f) override {
    f.Int64("objects", &objects_, "Objects to load under the prefix");
    f.Int("min-size", &min_size_, "Smallest object, bytes (sizes are uniform in [min, max])");
    f.Int("max-size", &max_size_, "Largest object, bytes");
    f.String("prefix", &prefix_, "Key prefix of the objects");
    f.Int("namespaces", &namespaces_, "Namespaces the objects are spread over");
    f.Int64("page-limit", &page_limit_, "Page size of paginated lists");
    f.Int("lists", &lists_, "Lists of each kind (per thread for concurrent lists)");
    f.Int("concurrent-lists", &concurrent_, "Full lists running at once in the concurrent phase");
    f.Double("put-rate", &put_rate_, "Puts per second in the put phases");
    f.Duration("put-idle-duration", &idle_, "Length of the put phase with no list running");
    f.String("list-endpoints", &list_endpoints_,
             "Endpoints the lists go to (comma-separated; default: --endpoints), e.g. a "
             "follower's while --endpoints names the leader");
  }
  absl::Status Prepare(const std::vector<std::string>&) override {
    if (objects_ < 1 || min_size_ < 1 || max_size_ < min_size_ || namespaces_ < 1 || lists_ < 1 ||
        concurrent_ < 1 || page_limit_ < 1) {
      return absl::InvalidArgumentError("large-list: bad sizes or counts");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    RunReport r;
    r.workload = "large-list";
    r.target = ctx.target;
    auto key_of = [&](int64_t i) {
      return absl::StrFormat("%sns-%03d/app-%08d", prefix_, i % namespaces_, i);
    };
    auto encode = [&](int64_t i, int generation) {
      std::mt19937_64 rng(i * 7919 + generation);
      k8s::PodSpec p;
      p.ns = absl::StrFormat("ns-%03d", i % namespaces_);
      p.name = absl::StrFormat("app-%08d", i);
      p.node = absl::StrFormat("node-%06d", i % 1000);
      p.app = absl::StrFormat("app-%d", i % 50);
      p.generation = generation;
      p.target_size = std::uniform_int_distribution<int>(min_size_, max_size_)(rng);
      p.seed = i;
      return k8s::EncodePod(p);
    };

    // Where the lists go: a pool of their own on --list-endpoints.
    std::unique_ptr<ConnectionPool> list_pool;
    if (!list_endpoints_.empty()) {
      auto dialed = ConnectionPool::Dial(absl::StrSplit(list_endpoints_, ',', absl::SkipEmpty()),
                                         concurrent_, ctx.global->dial_timeout,
                                         ctx.global->security);
      if (!dialed.ok()) return dialed.status();
      list_pool = *std::move(dialed);
    }
    ConnectionPool& lists = list_pool ? *list_pool : *ctx.pool;

    // Load.
    std::atomic<uint64_t> stored_bytes{0};
    LoopOptions load{"load", static_cast<uint64_t>(objects_), absl::ZeroDuration(),
                     ctx.global->clients, 0};
    IssueFn load_issue = [&](uint64_t seq, size_t client, DoneFn done) {
      etcdserverpb::PutRequest req;
      req.set_key(key_of(seq));
      req.set_value(encode(seq, 1));
      stored_bytes.fetch_add(req.value().size());
      AsyncPut(ctx.pool->Kv(client), std::move(req),
               [done = std::move(done)](const grpc::Status& s, auto&) { done(s); });
    };
    r.phases.push_back(RunClosedLoop(load, load_issue));

    // Writes of single objects, at --put-rate, while something else runs.
    std::atomic<int> generation{2};
    IssueFn update_issue = [&](uint64_t, size_t client, DoneFn done) {
      etcdserverpb::PutRequest req;
      const int64_t i = RandomIndex(objects_);
      req.set_key(key_of(i));
      req.set_value(encode(i, generation.fetch_add(1)));
      AsyncPut(ctx.pool->Kv(client), std::move(req),
               [done = std::move(done)](const grpc::Status& s, auto&) { done(s); });
    };
    const int put_clients = std::max(1, std::min(ctx.global->clients, 16));
    r.phases.push_back(RunClosedLoop(
        {"put (no list running)", 0, idle_, put_clients, put_rate_}, update_issue));

    auto check = [&](ErrorCounter& list_errors, const ListResult& lr) {
      if (!lr.status.ok()) {
        list_errors.Add(lr.status);
      } else if (static_cast<int64_t>(lr.objects) != objects_) {
        list_errors.Add(absl::StrCat("list returned ", lr.objects, " objects, want ", objects_));
      }
      return lr.status.ok();
    };
    auto finish = [&](PhaseResult& p, std::chrono::steady_clock::time_point start,
                      const ErrorCounter& list_errors) {
      p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      p.error_counts = list_errors.Snapshot();
      p.errors = list_errors.Total();
    };

    // Full lists, one at a time.
    {
      RssGrowth growth(ctx.server_pid, "server RSS growth, full list", &r);
      ErrorCounter list_errors;
      PhaseResult p;
      p.name = "full list";
      ProgressMonitor progress(p.name, lists_, [&] { return p.latency.Count(); },
                               [&] { return list_errors.Total(); });
      const auto start = std::chrono::steady_clock::now();
      uint64_t bytes = 0;
      for (int i = 0; i < lists_; ++i) {
        const auto t = std::chrono::steady_clock::now();
        ListResult lr = CountPrefix(lists.Channel(i), prefix_, 0, nullptr);
        if (check(list_errors, lr)) p.latency.Record(SinceNs(t));
        bytes = lr.bytes;
      }
      progress.Stop();
      finish(p, start, list_errors);
      r.extras.push_back({"listed MiB", bytes / 1048576.0, "MiB", false});
      r.extras.push_back({"full list MiB/s",
                          p.latency.Count() ? bytes / 1048576.0 / (p.latency.Percentile(50) / 1e9) : 0,
                          "MiB/s", true});
      r.phases.push_back(std::move(p));
    }

    // Paginated lists, one at a time.
    {
      ErrorCounter list_errors;
      PhaseResult walk, page;
      walk.name = absl::StrCat("paginated list (limit ", page_limit_, ")");
      page.name = "list page";
      ProgressMonitor progress(walk.name, lists_, [&] { return walk.latency.Count(); },
                               [&] { return list_errors.Total(); });
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < lists_; ++i) {
        const auto t = std::chrono::steady_clock::now();
        ListResult lr = CountPrefix(lists.Channel(i), prefix_, page_limit_, &page.latency);
        if (check(list_errors, lr)) walk.latency.Record(SinceNs(t));
      }
      progress.Stop();
      finish(walk, start, list_errors);
      page.seconds = walk.seconds;
      page.has_throughput = false;
      r.phases.push_back(std::move(walk));
      r.phases.push_back(std::move(page));
    }

    // Concurrent full lists, with writes running under them.
    {
      RssGrowth growth(ctx.server_pid, "server RSS growth, concurrent full lists", &r);
      ErrorCounter list_errors;
      PhaseResult p;
      p.name = absl::StrCat("concurrent full list (x", concurrent_, ")");
      std::atomic<bool> stop_puts{false};
      PhaseResult puts;
      std::thread writer([&] {
        puts = RunClosedLoop({"put (during lists)", 0, absl::ZeroDuration(), put_clients, put_rate_,
                              &stop_puts},
                             update_issue);
      });
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      const auto start = std::chrono::steady_clock::now();
      std::vector<std::thread> listers;
      for (int t = 0; t < concurrent_; ++t) {
        listers.emplace_back([&, t] {
          for (int i = 0; i < lists_; ++i) {
            const auto s = std::chrono::steady_clock::now();
            ListResult lr = CountPrefix(lists.Channel(t), prefix_, 0, nullptr);
            if (check(list_errors, lr)) p.latency.Record(SinceNs(s));
          }
        });
      }
      for (auto& t : listers) t.join();
      finish(p, start, list_errors);
      stop_puts = true;
      writer.join();
      puts.name = "put (during lists)";
      r.phases.push_back(std::move(p));
      r.phases.push_back(std::move(puts));
    }
    r.extras.push_back({"stored MiB", stored_bytes.load() / 1048576.0, "MiB", false});
    return r;
  }

 private:
  int64_t objects_ = 10000;
  int min_size_ = 2048;
  int max_size_ = 8192;
  std::string prefix_ = "/registry/pods/";
  int namespaces_ = 20;
  int64_t page_limit_ = 500;
  int lists_ = 3;
  int concurrent_ = 4;
  double put_rate_ = 50;
  absl::Duration idle_ = absl::Seconds(3);
  std::string list_endpoints_;
};

}  // namespace

std::unique_ptr<Workload> NewLargeListWorkload() { return std::make_unique<LargeListWorkload>(); }

}  // namespace capstan::bench
