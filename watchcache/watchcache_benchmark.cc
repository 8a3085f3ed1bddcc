// Watch cache benchmarks at Kubernetes scale: 10k nodes, 150k pods of 2-8
// KiB (Kubernetes protobuf, generated here).
//
//   capstan_watchcache_benchmark --benchmark_filter=ListByNode
//
// - ListByNode/index vs ListByNode/scan: List(spec.nodeName=X) through the
//   index and by scanning every pod (the ratio is the index's speed-up).
// - ListAllPods: the full pod list from the cache (references, no copies).
// - Dispatch/watchers:N: per-event cost of a pod update with N watchers,
//   each selecting one node (flat in N), and DispatchUnindexed with
//   watchers the index cannot route (linear in N), for contrast.
// - CacheMemory/<allocator>: process memory of a 150k-pod cache over the
//   raw bytes of its records, with the slab allocator, jemalloc and glibc.
// - Alloc/<allocator>: churn of 2-8 KiB blocks (cache-like: allocate,
//   replace at random), single- and multi-threaded.

#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "jemalloc/jemalloc.h"
#include "watchcache/k8s_test_objects.h"
#include "watchcache/resource_cache.h"

extern "C" void* __libc_malloc(size_t);
extern "C" void __libc_free(void*);

namespace capstan::watchcache {
namespace {

constexpr int kNodes = 10000;
constexpr int kPods = 150000;
constexpr int kNamespaces = 500;

std::string PodValue(int i, int node, const char* phase, std::mt19937* rng) {
  testing::PodFields p;
  p.name = absl::StrCat("pod-", i);
  p.ns = absl::StrCat("ns-", i % kNamespaces);
  p.node = absl::StrCat("node-", node);
  p.phase = phase;
  p.labels = {{"app", absl::StrCat("app-", i % 1000)},
              {"pod-template-hash", absl::StrCat("h", i % 10000)},
              {"tier", i % 3 ? "backend" : "frontend"}};
  p.padding = 1700 + (*rng)() % 6200;  // records of ~2-8 KiB
  return testing::PodProtobuf(p);
}

std::string PodKey(int i) { return absl::StrCat("/registry/pods/ns-", i % kNamespaces, "/pod-", i); }

size_t RssBytes() {
  long pages = 0, resident = 0;
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
  std::fclose(f);
  return static_cast<size_t>(resident) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

void PurgeJemalloc() {
  mallctl("arena.4096.purge", nullptr, nullptr, nullptr, 0);  // MALLCTL_ARENAS_ALL
  malloc_trim(0);
}

// glibc's malloc, reached past jemalloc (which this binary links).
class LibcAllocator final : public ObjectAllocator {
 public:
  void* Allocate(size_t n) override {
    live_.fetch_add(n);
    return __libc_malloc(n);
  }
  void Free(void* p, size_t n) override {
    live_.fetch_sub(n);
    __libc_free(p);
  }
  Stats GetStats() const override {
    Stats s;
    s.live_bytes = live_.load();
    struct mallinfo2 mi = mallinfo2();
    s.footprint_bytes = mi.arena + mi.hblkhd;
    return s;
  }
  const char* name() const override { return "glibc"; }

 private:
  std::atomic<uint64_t> live_{0};
};

std::unique_ptr<ObjectAllocator> MakeAllocator(int kind) {
  switch (kind) {
    case 0: return NewSlabAllocator(FreeListKind::kMutex);
    case 1: return NewSlabAllocator(FreeListKind::kLockFree);
    case 2: return NewMallocAllocator();  // jemalloc here
    default: return std::make_unique<LibcAllocator>();
  }
}
const char* kAllocNames[] = {"slab-mutex", "slab-lockfree", "jemalloc", "glibc"};

// 150k pods on 10k nodes in one ResourceCache.
struct World {
  std::unique_ptr<ObjectAllocator> alloc;
  std::unique_ptr<ResourceCache> cache;
  std::vector<int> node_of;  // per pod
  uint64_t raw_bytes = 0;
  int64_t rev = 1;
};

std::unique_ptr<World> BuildWorld(std::unique_ptr<ObjectAllocator> alloc, CacheOptions options = {}) {
  auto w = std::make_unique<World>();
  w->alloc = std::move(alloc);
  options.resources = {PodResource()};
  options.ring_max_bytes = uint64_t{256} << 20;
  w->cache = std::make_unique<ResourceCache>(PodResource(), options, w->alloc.get());
  std::mt19937 rng(1);
  std::vector<ObjectRef> objs;
  objs.reserve(kPods);
  w->node_of.resize(kPods);
  for (int i = 0; i < kPods; ++i) {
    w->node_of[i] = static_cast<int>(rng() % kNodes);
    std::string rec = testing::KvRecord(PodKey(i), PodValue(i, w->node_of[i], "Running", &rng), 1);
    w->raw_bytes += rec.size();
    objs.push_back(w->cache->MakeObject(rec));
  }
  w->cache->Reset(1, std::move(objs));
  return w;
}

World* TheWorld() {
  // A bounded history, so the update benchmarks run in steady state (freed
  // versions reused) rather than measuring the history's growth.
  CacheOptions options;
  options.ring_max_capacity = 4096;
  static World* world = BuildWorld(NewSlabAllocator(), options).release();
  return world;
}

void BM_ListByNode(benchmark::State& state) {
  World* w = TheWorld();
  const bool index = state.range(0) != 0;
  w->cache->TEST_SetUseIndexes(index);
  std::mt19937 rng(2);
  size_t items = 0;
  for (auto _ : state) {
    ListOptions l;
    l.prefix = "/registry/pods/";
    l.field_selector = absl::StrCat("spec.nodeName=node-", rng() % kNodes);
    l.resource_version = "0";
    auto r = w->cache->List(l);
    if (!r.ok()) state.SkipWithError("list failed");
    items += r->objects.size();
  }
  w->cache->TEST_SetUseIndexes(true);
  state.counters["pods_per_list"] = static_cast<double>(items) / state.iterations();
}
BENCHMARK(BM_ListByNode)->ArgNames({"index"})->Arg(1)->Arg(0)->Unit(benchmark::kMicrosecond);

void BM_ListAllPods(benchmark::State& state) {
  World* w = TheWorld();
  size_t bytes = 0;
  for (auto _ : state) {
    ListOptions l;
    l.prefix = "/registry/pods/";
    l.resource_version = "0";
    l.limit = state.range(0);
    auto r = w->cache->List(l);
    for (const auto& o : r->objects) bytes += o->kv().size();
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
}
BENCHMARK(BM_ListAllPods)->ArgNames({"limit"})->Arg(0)->Arg(500)->Unit(benchmark::kMillisecond);

// Pod updates (phase flips on the same node) with N node watchers.
void RunDispatch(benchmark::State& state, bool indexed) {
  World* w = TheWorld();
  const int watchers = static_cast<int>(state.range(0));
  std::vector<std::unique_ptr<CacheWatch>> ws;
  for (int i = 0; i < watchers; ++i) {
    WatchOptions o;
    o.prefix = "/registry/pods/";
    o.resource_version = absl::StrCat(w->cache->rev());
    // Unindexed: a node selector the index cannot route (!= and a label
    // requirement it does not dispatch on); selects as much.
    // Indexed: one watcher per node (a kubelet); past 10k, watchers of
    // nodes without pods, so the watchers an event concerns stay at one
    // while the total grows.
    o.field_selector = !indexed      ? absl::StrCat("status.phase!=Gone-", i)
                       : i < kNodes ? absl::StrCat("spec.nodeName=node-", i)
                                    : absl::StrCat("spec.nodeName=spare-node-", i);
    auto r = w->cache->Watch(o);
    if (!r.ok()) {
      state.SkipWithError("watch failed");
      return;
    }
    ws.push_back(std::move(*r));
  }
  // Update records prepared outside the timed loop.
  std::mt19937 rng(3);
  std::vector<std::pair<int, std::string>> updates;
  for (int i = 0; i < 512; ++i) {
    int pod = static_cast<int>(rng() % kPods);
    updates.emplace_back(pod, PodValue(pod, w->node_of[pod], i % 2 ? "Running" : "Pending", &rng));
  }
  const auto before = w->cache->GetStats();
  std::vector<WatchEvent> sink;
  size_t n = 0;
  for (auto _ : state) {
    const auto& [pod, value] = updates[n++ % updates.size()];
    const int64_t rev = ++w->rev;
    std::vector<FeedChange> c(1);
    c[0].rev = rev;
    c[0].object = w->cache->MakeObject(testing::KvRecord(PodKey(pod), value, rev, 1, 2));
    w->cache->Apply(std::move(c), rev);
    if (n % 4096 == 0) {
      state.PauseTiming();
      for (auto& x : ws) {
        while (x->Pop(&sink, 64) > 0) sink.clear();
      }
      state.ResumeTiming();
    }
  }
  const auto after = w->cache->GetStats();
  state.counters["candidates_per_event"] =
      static_cast<double>(after.dispatch_candidates - before.dispatch_candidates) / state.iterations();
  state.counters["delivered_per_event"] =
      static_cast<double>(after.events_dispatched - before.events_dispatched) / state.iterations();
  ws.clear();
}

void BM_Dispatch(benchmark::State& state) { RunDispatch(state, true); }
BENCHMARK(BM_Dispatch)->ArgNames({"watchers"})->Arg(1000)->Arg(10000)->Arg(50000)->Unit(benchmark::kMicrosecond);

void BM_DispatchUnindexed(benchmark::State& state) { RunDispatch(state, false); }
BENCHMARK(BM_DispatchUnindexed)->ArgNames({"watchers"})->Arg(1000)->Arg(10000)->Unit(benchmark::kMicrosecond);

// Memory of a whole 150k-pod cache: RSS growth over the raw record bytes.
void BM_CacheMemory(benchmark::State& state) {
  const int kind = static_cast<int>(state.range(0));
  for (auto _ : state) {
    PurgeJemalloc();
    const size_t rss0 = RssBytes();
    auto w = BuildWorld(MakeAllocator(kind));
    PurgeJemalloc();
    const size_t rss1 = RssBytes();
    const auto st = w->cache->GetStats();
    state.counters["raw_MiB"] = static_cast<double>(w->raw_bytes) / (1 << 20);
    state.counters["rss_MiB"] = static_cast<double>(rss1 - rss0) / (1 << 20);
    state.counters["rss_over_raw"] = static_cast<double>(rss1 - rss0) / w->raw_bytes;
    state.counters["blocks_over_raw"] = static_cast<double>(st.object_bytes) / w->raw_bytes;
    state.counters["alloc_footprint_over_raw"] =
        static_cast<double>(w->alloc->GetStats().footprint_bytes) / w->raw_bytes;
    state.counters["index_MiB"] = static_cast<double>(st.index_bytes_estimate) / (1 << 20);
  }
  state.SetLabel(kAllocNames[kind]);
}
BENCHMARK(BM_CacheMemory)->ArgNames({"allocator"})->DenseRange(0, 3)->Iterations(1)->Unit(benchmark::kMillisecond);

// Allocator churn: a working set of 2-8 KiB blocks replaced at random.
void BM_Alloc(benchmark::State& state) {
  static std::unique_ptr<ObjectAllocator> shared;
  const int kind = static_cast<int>(state.range(0));
  if (state.thread_index() == 0) shared = MakeAllocator(kind);
  // All threads wait for thread 0's setup at the start of the loop.
  std::mt19937 rng(state.thread_index() + 7);
  std::vector<std::pair<void*, size_t>> live(20000, {nullptr, 0});
  for (auto _ : state) {
    auto& slot = live[rng() % live.size()];
    if (slot.first) shared->Free(slot.first, slot.second);
    slot.second = 2048 + rng() % 6144;
    slot.first = shared->Allocate(slot.second);
    static_cast<char*>(slot.first)[0] = 1;
  }
  uint64_t live_bytes = 0;
  for (auto& s : live) live_bytes += s.second;
  if (state.thread_index() == 0) {
    state.counters["footprint_over_live"] =
        static_cast<double>(shared->GetStats().footprint_bytes) / (live_bytes * state.threads());
  }
  for (auto& s : live) {
    if (s.first) shared->Free(s.first, s.second);
  }
  state.SetLabel(kAllocNames[kind]);
}
BENCHMARK(BM_Alloc)->ArgNames({"allocator"})->DenseRange(0, 3)->Threads(1)->Threads(2);

}  // namespace
}  // namespace capstan::watchcache
