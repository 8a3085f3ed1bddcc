// large-list: loads N Kubernetes-shaped objects of a size distribution under
// a prefix, then measures what hurts etcd at scale: full (unpaginated) lists,
// kube-apiserver-style paginated lists (limit 500, continuing from the last
// key + "\0" at the first page's revision), several lists at once, and the
// latency of small writes while those lists run, against the same writes
// with no list running. With --list-endpoints the lists go to other
// members than the writes: a cluster's follower lists while its leader takes
// the puts, so the puts' latency shows what a follower's lists cost the
// leader. With --list-process the lists run in a child capstan-bench of
// their own: receiving hundreds of megabytes takes the client's gRPC
// threads, which in one process would also have to read the puts' answers,
// so the puts' latency would measure the client more than the servers.

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
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

extern "C" char** environ;

// The lists of one phase: each list's latency (ns) and result, and the
// latencies of the pages of the paginated ones.
struct PhaseLists {
  std::vector<std::pair<uint64_t, ListResult>> lists;
  Histogram pages;
};

// The allocator settings (jemalloc's, which capstan-bench links) of a list
// process that reserves memory: one arena, so that the memory its main thread
// reserves is the memory its gRPC threads receive into; freed memory never
// given back to the kernel; and a free extent of any size split for a small
// allocation (by default jemalloc splits none more than 64 times larger,
// which after the reservation is every one, and maps new memory instead).
constexpr char kReservedMallocConf[] =
    "narenas:1,dirty_decay_ms:-1,muzzy_decay_ms:-1,lg_extent_max_active_fit:30";

// A list process: this binary started with --list-worker. It takes the name
// of a phase (full, paginated, concurrent) per line on its stdin, runs its
// lists, and prints "list NS OBJECTS BYTES", "pages NS COUNT" (COUNT pages of
// about NS) or "error MESSAGE" lines, then "faults N" (the page faults it took
// meanwhile) and "end". It first prints "ready" once it has reserved its
// memory. One process serves every phase, as one client would. Not
// thread-safe: one caller at a time; the destructor closes its stdin and
// waits for it to exit.
class ListProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ListProcess>> Start(const std::vector<std::string>& argv,
                                                            bool reserved_malloc) {
    // A list process that died must fail the run, not kill this one with
    // SIGPIPE when the next phase is written to it.
    std::signal(SIGPIPE, SIG_IGN);
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
    if (pipe2(out, O_CLOEXEC) != 0) {
      close(in[0]);
      close(in[1]);
      return absl::InternalError("pipe failed");
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::string malloc_conf = absl::StrCat("MALLOC_CONF=", kReservedMallocConf);
    std::vector<char*> env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (!reserved_malloc || !absl::StartsWith(*e, "MALLOC_CONF=")) env.push_back(*e);
    }
    if (reserved_malloc) env.push_back(malloc_conf.data());
    env.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), env.data());
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    if (rc != 0) {
      close(in[1]);
      close(out[0]);
      return absl::InternalError(absl::StrCat("cannot start the list process: ", std::strerror(rc)));
    }
    auto process = std::unique_ptr<ListProcess>(new ListProcess(pid, in[1], fdopen(out[0], "r")));
    auto ready = process->ReadUntil("ready");
    if (!ready.ok()) return ready.status();
    return process;
  }

  ~ListProcess() {
    close(to_);
    if (from_ != nullptr) fclose(from_);
    int status = 0;
    waitpid(pid_, &status, 0);
  }

  // The lists of phase `kind`, and the page faults the process took in it.
  absl::StatusOr<PhaseLists> Run(const std::string& kind, uint64_t* faults) {
    const std::string line = kind + "\n";
    if (write(to_, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      return absl::InternalError("the list process is gone");
    }
    auto text = ReadUntil("end");
    if (!text.ok()) return text.status();
    PhaseLists out_lists;
    for (absl::string_view l : absl::StrSplit(*text, '\n', absl::SkipEmpty())) {
      std::vector<absl::string_view> f = absl::StrSplit(l, ' ');
      uint64_t ns = 0;
      ListResult lr;
      if (f.size() == 4 && f[0] == "list" && absl::SimpleAtoi(f[1], &ns) &&
          absl::SimpleAtoi(f[2], &lr.objects) && absl::SimpleAtoi(f[3], &lr.bytes)) {
        out_lists.lists.emplace_back(ns, lr);
      } else if (uint64_t count = 0; f.size() == 3 && f[0] == "pages" &&
                                     absl::SimpleAtoi(f[1], &ns) && absl::SimpleAtoi(f[2], &count)) {
        out_lists.pages.RecordN(ns, count);
      } else if (f.size() == 2 && f[0] == "faults") {
        (void)absl::SimpleAtoi(f[1], faults);
      } else if (absl::StartsWith(l, "error ")) {
        lr.status = grpc::Status(grpc::StatusCode::UNKNOWN, std::string(l.substr(sizeof("error ") - 1)));
        out_lists.lists.emplace_back(0, lr);
      }
    }
    return out_lists;
  }

 private:
  ListProcess(pid_t pid, int to, FILE* from) : pid_(pid), to_(to), from_(from) {}

  // What the process prints up to a line `last` (not included).
  absl::StatusOr<std::string> ReadUntil(absl::string_view last) {
    std::string text;
    char* line = nullptr;
    size_t cap = 0;
    for (ssize_t n; from_ != nullptr && (n = getline(&line, &cap, from_)) > 0;) {
      absl::string_view l(line, static_cast<size_t>(n));
      if (absl::ConsumeSuffix(&l, "\n") && l == last) {
        std::free(line);
        return text;
      }
      absl::StrAppend(&text, l, "\n");
    }
    std::free(line);
    return absl::InternalError(absl::StrCat("the list process ended early: ", text));
  }

  const pid_t pid_;
  const int to_;
  FILE* const from_;
};

// Page faults this process has taken so far.
uint64_t PageFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<uint64_t>(u.ru_minflt + u.ru_majflt);
}

// Touches `bytes` of memory in chunks of a MiB and frees it: with
// kReservedMallocConf the memory stays in the process, so what is
// received into it later takes no page fault. A client's heap is warm after
// its first lists (a Go program keeps its heap); a fresh process's is not,
// and on a virtual machine whose host backs memory as it is first touched,
// the faults of a list client that shares the servers' cores cost them more
// than the lists do.
void ReserveMemory(uint64_t bytes) {
  constexpr size_t kChunk = size_t{1} << 20;
  std::vector<void*> chunks;
  for (uint64_t done = 0; done < bytes; done += kChunk) {
    auto* p = static_cast<volatile char*>(std::malloc(kChunk));
    if (p == nullptr) break;
    for (size_t i = 0; i < kChunk; i += 4096) p[i] = 1;
    chunks.push_back(const_cast<char*>(p));
  }
  for (void* p : chunks) std::free(p);
}

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
    f.Bool("list-process", &list_process_,
           "Run the lists in a child capstan-bench, so that receiving them does not hold up the "
           "puts' answers in this process");
    f.Int("list-nice", &list_nice_,
          "With --list-process: the list process's niceness (0-19). Where the list client "
          "shares the servers' cores, at 19 it takes only the CPU the servers leave, as a client "
          "on another machine would");
    f.Int64("list-reserve-mib", &list_reserve_mib_,
            "With --list-process: memory (MiB) the list process touches and keeps before the "
            "load, so that receiving the lists takes no page fault (-1: 1.5 times what the "
            "concurrent lists will receive, from --objects and the sizes; 0: none)");
    f.Duration("settle", &settle_,
               "Wait up to this long after the load, until the servers (--settle-pids, else "
               "--server-pid) use under 5% of a core over a second, before the idle put phase; "
               "the puts right after the load are measured as a phase of their own first (0: "
               "no wait, one idle phase right after the load)");
    f.String("settle-pids", &settle_pids_,
             "With --settle: the servers' pids, comma-separated (a cluster's members)");
    f.Bool("list-worker", &list_worker_,
           "Internal (--list-process): run the lists of the phases named on stdin, printing a "
           "line per list");
  }
  absl::Status Prepare(const std::vector<std::string>&) override {
    if (objects_ < 1 || min_size_ < 1 || max_size_ < min_size_ || namespaces_ < 1 || lists_ < 1 ||
        concurrent_ < 1 || page_limit_ < 1 || list_nice_ < 0 || list_nice_ > 19 ||
        list_reserve_mib_ < -1 || settle_ < absl::ZeroDuration()) {
      return absl::InvalidArgumentError("large-list: bad sizes or counts");
    }
    return absl::OkStatus();
  }

  absl::StatusOr<RunReport> Run(BenchContext& ctx) override {
    if (list_worker_) return RunWorker(ctx);
    // The servers whose quiet --settle waits for.
    std::vector<pid_t> settle_pids;
    for (absl::string_view p : absl::StrSplit(settle_pids_, ',', absl::SkipEmpty())) {
      int pid = 0;
      if (!absl::SimpleAtoi(p, &pid) || pid <= 0) {
        return absl::InvalidArgumentError(absl::StrCat("large-list: --settle-pids: not a pid: ", p));
      }
      settle_pids.push_back(pid);
    }
    if (settle_pids.empty() && ctx.server_pid > 0) settle_pids.push_back(ctx.server_pid);
    if (settle_ > absl::ZeroDuration() && settle_pids.empty()) {
      return absl::InvalidArgumentError("large-list: --settle needs --settle-pids or --server-pid");
    }
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
    // The lists of a phase ("full", "paginated", "concurrent"), here or in the
    // list process.
    absl::StatusOr<std::unique_ptr<ListProcess>> list_process =
        absl::FailedPreconditionError("no list process");
    auto run_lists = [&](const std::string& kind) -> PhaseLists {
      if (!list_process_) return ListsOf(kind, lists);
      uint64_t faults = 0;
      absl::StatusOr<PhaseLists> done =
          list_process.ok() ? (*list_process)->Run(kind, &faults) : list_process.status();
      if (list_process.ok()) {
        r.extras.push_back(
            {absl::StrCat("list process page faults, ", kind), static_cast<double>(faults), "", false});
      }
      if (done.ok()) return *std::move(done);
      PhaseLists failed;
      failed.lists.emplace_back(0, ListResult{});
      failed.lists.back().second.status =
          grpc::Status(grpc::StatusCode::INTERNAL, std::string(done.status().message()));
      return failed;
    };
    auto start_list_process = [&](uint64_t expected_bytes) {
      const int64_t reserve_mib =
          list_reserve_mib_ >= 0
              ? list_reserve_mib_
              : static_cast<int64_t>(1.5 * concurrent_ * static_cast<double>(expected_bytes) / 1048576.0);
      std::vector<std::string> argv;
      if (list_nice_ > 0) argv = {"/usr/bin/nice", "-n", absl::StrCat(list_nice_)};
      std::vector<std::string> worker = {SelfPath(), "--no-progress", "--endpoints",
           list_endpoints_.empty() ? absl::StrJoin(ctx.global->endpoints, ",") : list_endpoints_,
           "--conns", absl::StrCat(concurrent_), "large-list", "--list-worker",
           "--list-reserve-mib", absl::StrCat(reserve_mib), "--prefix", prefix_,
           "--page-limit", absl::StrCat(page_limit_), "--lists", absl::StrCat(lists_),
           "--concurrent-lists", absl::StrCat(concurrent_)};
      argv.insert(argv.end(), worker.begin(), worker.end());
      list_process = ListProcess::Start(argv, reserve_mib > 0);
      if (list_process.ok()) {
        r.extras.push_back({"list process reserved MiB", static_cast<double>(reserve_mib), "MiB", false});
      }
    };

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
    // The list process starts, and reserves its memory, before the load:
    // a first touch of gigabytes disturbs the machine for a moment after
    // it (on this virtual machine the first put after it took 40-80 ms),
    // which would otherwise fall on the first put measured.
    if (list_process_) {
      start_list_process(static_cast<uint64_t>(objects_) * static_cast<uint64_t>(min_size_ + max_size_) / 2);
    }
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
    if (settle_ > absl::ZeroDuration()) {
      // The same puts right after the load, while the servers may still be
      // flushing and compacting it, and then once they are quiet: the idle
      // phase is a baseline for the lists, and the load is not theirs.
      r.phases.push_back(RunClosedLoop(
          {"put (right after the load)", 0, idle_, put_clients, put_rate_}, update_issue));
      const QuietWait waited =
          WaitUntilQuiet(settle_pids, 0.05, std::chrono::seconds(1),
                         std::chrono::milliseconds(absl::ToInt64Milliseconds(settle_)));
      r.extras.push_back({"settle wait", waited.seconds, "s", false});
      r.extras.push_back({"servers quiet before the idle puts", waited.quiet ? 1.0 : 0.0, "", false});
    }
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
      const auto start = std::chrono::steady_clock::now();
      uint64_t bytes = 0;
      for (const auto& [ns, lr] : run_lists("full").lists) {
        if (check(list_errors, lr)) p.latency.Record(ns);
        bytes = lr.bytes;
      }
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
      const auto start = std::chrono::steady_clock::now();
      const PhaseLists done = run_lists("paginated");
      for (const auto& [ns, lr] : done.lists) {
        if (check(list_errors, lr)) walk.latency.Record(ns);
      }
      page.latency.Merge(done.pages);
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
      for (const auto& [ns, lr] : run_lists("concurrent").lists) {
        if (check(list_errors, lr)) p.latency.Record(ns);
      }
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
  // The lists of one phase, run here on pool: `lists_` full lists one after
  // the other ("full"), paginated ("paginated"), or on each of
  // `concurrent_` threads at once ("concurrent").
  PhaseLists ListsOf(const std::string& kind, ConnectionPool& pool) const {
    PhaseLists out;
    std::mutex mu;
    auto one = [&](size_t channel, int64_t limit) {
      const auto t = std::chrono::steady_clock::now();
      ListResult lr = CountPrefix(pool.Channel(channel), prefix_, limit, limit ? &out.pages : nullptr);
      const uint64_t ns = SinceNs(t);
      std::lock_guard<std::mutex> lock(mu);
      out.lists.emplace_back(ns, std::move(lr));
    };
    if (kind == "concurrent") {
      std::vector<std::thread> threads;
      for (int t = 0; t < concurrent_; ++t) {
        threads.emplace_back([&, t] {
          for (int i = 0; i < lists_; ++i) one(static_cast<size_t>(t), 0);
        });
      }
      for (auto& t : threads) t.join();
    } else {
      for (int i = 0; i < lists_; ++i) one(static_cast<size_t>(i), kind == "paginated" ? page_limit_ : 0);
    }
    return out;
  }

  // --list-worker: reserves --list-reserve-mib, then runs the lists of each
  // phase named on stdin and prints them for the parent (ListProcess).
  absl::StatusOr<RunReport> RunWorker(BenchContext& ctx) {
    ReserveMemory(static_cast<uint64_t>(std::max<int64_t>(list_reserve_mib_, 0)) << 20);
    std::printf("ready\n");
    std::fflush(stdout);
    char line[64];
    while (std::fgets(line, sizeof line, stdin) != nullptr) {
      std::string kind(absl::StripTrailingAsciiWhitespace(line));
      if (kind != "full" && kind != "paginated" && kind != "concurrent") {
        std::printf("error unknown phase %s\n", kind.c_str());
      } else {
        const uint64_t faults_before = PageFaults();
        const PhaseLists done = ListsOf(kind, *ctx.pool);
        for (const auto& [ns, lr] : done.lists) {
          if (lr.status.ok()) {
            std::printf("list %llu %llu %llu\n", static_cast<unsigned long long>(ns),
                        static_cast<unsigned long long>(lr.objects),
                        static_cast<unsigned long long>(lr.bytes));
          } else {
            std::printf("error %s\n", lr.status.error_message().c_str());
          }
        }
        // The pages as their buckets: value and count, enough for percentiles.
        double below = 0;
        for (const auto& [value, fraction] : done.pages.Cdf()) {
          const auto count = static_cast<unsigned long long>(
              std::llround((fraction - below) * static_cast<double>(done.pages.Count())));
          below = fraction;
          if (count > 0) std::printf("pages %llu %llu\n", static_cast<unsigned long long>(value), count);
        }
        std::printf("faults %llu\n", static_cast<unsigned long long>(PageFaults() - faults_before));
      }
      std::printf("end\n");
      std::fflush(stdout);
    }
    std::_Exit(0);  // nothing else to report: the parent has read the lines above
  }

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
  bool list_process_ = false;
  int list_nice_ = 0;
  int64_t list_reserve_mib_ = -1;
  absl::Duration settle_ = absl::ZeroDuration();
  std::string settle_pids_;
  bool list_worker_ = false;
};

}  // namespace

std::unique_ptr<Workload> NewLargeListWorkload() { return std::make_unique<LargeListWorkload>(); }

}  // namespace capstan::bench
