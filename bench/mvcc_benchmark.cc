// Google Benchmark micro-benchmarks of the KV store (mvcc/kv_store.h).
//
//   BM_Put         async Puts from `threads` submitters with `inflight` requests
//                  in flight each: group commit turns concurrency into bigger
//                  groups per fsync (writes_per_group).
//   BM_TxnPut      blocking Txns (one compare, `puts` puts) from each thread.
//   BM_RangeKey    single-key Range over a store of `keys` keys.
//   BM_RangeAll    every key of a store of 100k keys with 4 KiB values, in one
//                  request (limit 0) or in pages (limit 500) at one revision.
//   BM_RangeKeysOnly, BM_RangeCountOnly  keys_only / count_only Range over that
//                  store: answered from the key index.
//   BM_Open        reopening that store: rebuilding the key index from the
//                  backend.
//
// Writes are fsynced (BackendOptions::sync), as a server runs; the stores the
// reads use are loaded without fsync. Everything lives in a temporary
// directory under /tmp. On a shared 2-core machine absolute numbers are
// noise: compare ratios within one run (DESIGN.md, Performance contract).
//
//   capstan_mvcc_benchmark --benchmark_filter=BM_Put --benchmark_counters_tabular=true

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"
#include "etcdserverpb/rpc.pb.h"
#include "mvcc/kv_store.h"
#include "storage/backend.h"

namespace capstan::mvcc {
namespace {

using etcdserverpb::Compare;
using etcdserverpb::PutRequest;
using etcdserverpb::PutResponse;
using etcdserverpb::RangeRequest;
using etcdserverpb::RangeResponse;
using etcdserverpb::TxnRequest;

// A store in its own temporary directory, removed with it.
class BenchStore {
 public:
  // inline_commit: KvStoreOptions::inline_commit (writers commit their
  // groups themselves).
  explicit BenchStore(bool sync, bool inline_commit = false) {
    char tmpl[] = "/tmp/capstan-bench-XXXXXX";
    dir_ = mkdtemp(tmpl);
    sync_ = sync;
    inline_commit_ = inline_commit;
    Open();
  }
  ~BenchStore() {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Open() {
    storage::BackendOptions bo;
    bo.dir = dir_ + "/db";
    bo.sync = sync_;
    auto backend = storage::Backend::Open(bo);
    if (!backend.ok()) {
      std::fprintf(stderr, "backend: %s\n", backend.status().ToString().c_str());
      std::abort();
    }
    KvStoreOptions options;
    options.inline_commit = inline_commit_;
    auto store = KvStore::Open(options, std::move(*backend));
    if (!store.ok()) {
      std::fprintf(stderr, "store: %s\n", store.status().ToString().c_str());
      std::abort();
    }
    store_ = std::move(*store);
  }
  void Close() { store_.reset(); }

  KvStore* store() const { return store_.get(); }

 private:
  std::string dir_;
  bool sync_ = true;
  bool inline_commit_ = false;
  std::unique_ptr<KvStore> store_;
};

std::string Key(const char* prefix, int i) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%08d", prefix, i);
  return buf;
}

std::string Value(size_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string v(size, '\0');
  for (auto& c : v) c = static_cast<char>('a' + rng() % 26);
  return v;
}

// Keeps up to `window` async requests in flight and waits for them all.
class Window {
 public:
  explicit Window(int window) : free_(window) {}
  // Blocks until a slot is free, takes it.
  void Acquire() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return free_ > 0; });
    --free_;
  }
  absl::AnyInvocable<void(absl::Status)> Release() {
    return [this](absl::Status s) {
      if (!s.ok()) {
        std::fprintf(stderr, "write failed: %s\n", s.ToString().c_str());
        std::abort();
      }
      std::lock_guard<std::mutex> l(mu_);
      ++free_;
      cv_.notify_all();
    };
  }
  void Drain(int window) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return free_ == window; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int free_;
};

// Loads n keys with values of value_size bytes, many writes per group.
void Load(KvStore* store, const char* prefix, int n, size_t value_size) {
  constexpr int kWindow = 2000;
  Window window(kWindow);
  std::vector<PutRequest> reqs(kWindow);
  std::vector<PutResponse> resps(kWindow);
  for (int i = 0; i < n; ++i) {
    window.Acquire();
    // Slot i % kWindow is free: its previous request completed (FIFO).
    PutRequest& req = reqs[i % kWindow];
    req.set_key(Key(prefix, i));
    req.set_value(Value(value_size, i));
    store->Submit({PutOp{&req, &resps[i % kWindow]}, window.Release()});
  }
  window.Drain(kWindow);
}

void GroupCounters(benchmark::State& state, const KvStore::Stats& before, const KvStore::Stats& after) {
  const double groups = static_cast<double>(after.groups - before.groups);
  const double writes = static_cast<double>(after.group_writes - before.group_writes);
  state.counters["writes_per_group"] = groups > 0 ? writes / groups : 0;
  state.counters["groups_per_s"] = benchmark::Counter(groups, benchmark::Counter::kIsRate);
}

// ---------------------------------------------------------------------------
// Writes.

BenchStore* g_write_store = nullptr;
KvStore::Stats g_write_stats;
std::atomic<int> g_drained{0};

// Thread 0 creates the store before the loop (the others touch it only in the
// loop, which starts after every thread is ready) and deletes it once every
// thread has drained its window.
void SetUpWriteStore(benchmark::State& state, bool inline_commit = false) {
  if (state.thread_index() != 0) return;
  g_write_store = new BenchStore(/*sync=*/true, inline_commit);
  g_drained = 0;
  g_write_stats = g_write_store->store()->GetStats();
}

void TearDownWriteStore(benchmark::State& state) {
  g_drained.fetch_add(1);
  if (state.thread_index() != 0) return;
  while (g_drained.load() < state.threads()) std::this_thread::yield();
  GroupCounters(state, g_write_stats, g_write_store->store()->GetStats());
  delete g_write_store;
  g_write_store = nullptr;
}

void BM_Put(benchmark::State& state) {
  const int inflight = static_cast<int>(state.range(0));
  const size_t value_size = static_cast<size_t>(state.range(1));
  SetUpWriteStore(state, /*inline_commit=*/state.range(2) != 0);
  // Inputs: one request per slot and 1024 keys per thread, built up front.
  constexpr int kKeys = 1024;
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) keys.push_back(Key("/bench/put/", state.thread_index() * kKeys + i));
  const std::string value = Value(value_size, state.thread_index());
  std::vector<PutRequest> reqs(inflight);
  std::vector<PutResponse> resps(inflight);
  for (auto& r : reqs) r.set_value(value);
  Window window(inflight);
  int64_t i = 0;
  for (auto _ : state) {
    window.Acquire();
    const int slot = static_cast<int>(i % inflight);  // FIFO completion: slot i % inflight is free
    reqs[slot].set_key(keys[i % kKeys]);
    g_write_store->store()->Submit(
        {PutOp{&reqs[slot], &resps[slot]}, window.Release()});
    ++i;
  }
  window.Drain(inflight);
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(value_size));
  TearDownWriteStore(state);
}
BENCHMARK(BM_Put)
    ->ArgNames({"inflight", "value_bytes", "inline"})
    ->Args({1, 256, 0})
    ->Args({1, 256, 1})
    ->Args({16, 256, 0})
    ->Args({16, 256, 1})
    ->Threads(1)
    ->Threads(2)
    ->Threads(4)
    ->Threads(8)
    ->UseRealTime()
    ->MinTime(0.5);

void BM_TxnPut(benchmark::State& state) {
  const int puts = static_cast<int>(state.range(0));
  SetUpWriteStore(state);
  // One txn per key group: compare the first key's version (always >= 0),
  // then put every key of the group.
  constexpr int kTxns = 256;
  std::vector<TxnRequest> txns(kTxns);
  const std::string value = Value(256, state.thread_index());
  for (int t = 0; t < kTxns; ++t) {
    auto* c = txns[t].add_compare();
    c->set_key(Key("/bench/txn/", (state.thread_index() * kTxns + t) * puts));
    c->set_target(Compare::VERSION);
    c->set_result(Compare::GREATER);
    c->set_version(-1);
    for (int p = 0; p < puts; ++p) {
      auto* put = txns[t].add_success()->mutable_request_put();
      put->set_key(Key("/bench/txn/", (state.thread_index() * kTxns + t) * puts + p));
      put->set_value(value);
    }
  }
  int64_t i = 0;
  for (auto _ : state) {
    auto resp = g_write_store->store()->Txn(txns[i++ % kTxns]);
    if (!resp.ok() || !resp->succeeded()) {
      state.SkipWithError("txn failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["puts_per_s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * puts), benchmark::Counter::kIsRate);
  state.SetBytesProcessed(state.iterations() * puts * 256);
  TearDownWriteStore(state);
}
BENCHMARK(BM_TxnPut)
    ->ArgNames({"puts"})
    ->Arg(1)
    ->Arg(16)
    ->Threads(1)
    ->Threads(4)
    ->UseRealTime()
    ->MinTime(0.5);

// ---------------------------------------------------------------------------
// Reads. The stores are loaded once and shared by every run of a benchmark.

// Destroyed at exit, which removes their directories.
BenchStore* SmallStore() {  // 10k keys, 256-byte values
  static const std::unique_ptr<BenchStore> store = [] {
    auto s = std::make_unique<BenchStore>(/*sync=*/false);
    Load(s->store(), "/bench/key/", 10000, 256);
    return s;
  }();
  return store.get();
}

constexpr int kBigKeys = 100000;
constexpr size_t kBigValue = 4096;

BenchStore* BigStore() {  // 100k keys, 4 KiB values: 400 MB
  static const std::unique_ptr<BenchStore> store = [] {
    auto s = std::make_unique<BenchStore>(/*sync=*/false);
    const absl::Time start = absl::Now();
    Load(s->store(), "/bench/big/", kBigKeys, kBigValue);
    std::fprintf(stderr, "loaded %d keys of %zu bytes in %.1f s\n", kBigKeys, kBigValue,
                 absl::ToDoubleSeconds(absl::Now() - start));
    return s;
  }();
  return store.get();
}

void BM_RangeKey(benchmark::State& state) {
  KvStore* store = SmallStore()->store();
  // Inputs: 1024 requests for random keys.
  std::mt19937_64 rng(state.thread_index());
  std::vector<RangeRequest> reqs(1024);
  for (auto& r : reqs) r.set_key(Key("/bench/key/", static_cast<int>(rng() % 10000)));
  RangeResult result;
  int64_t i = 0, bytes = 0;
  for (auto _ : state) {
    if (!store->Range(reqs[i++ & 1023], &result).ok() || result.num_kvs != 1) {
      state.SkipWithError("range failed");
      break;
    }
    bytes += static_cast<int64_t>(result.kvs_wire.size());
  }
  state.SetItemsProcessed(state.iterations());
  state.SetBytesProcessed(bytes);
}
BENCHMARK(BM_RangeKey)->ArgNames({"keys"})->Arg(10000)->Threads(1)->Threads(2)->Threads(4)->UseRealTime();

// The oldest key under a prefix (sorted by create revision, limit 1), as a
// lock's or an election's waiters ask: the index orders the keys, and only
// the record returned is read.
void RangeFirstSorted(benchmark::State& state, RangeRequest::SortTarget target) {
  KvStore* store = SmallStore()->store();
  RangeRequest req;
  req.set_key("/bench/key/");
  req.set_range_end("/bench/key0");
  req.set_sort_target(target);
  req.set_sort_order(RangeRequest::ASCEND);
  req.set_limit(1);
  RangeResult result;
  for (auto _ : state) {
    if (!store->Range(req, &result).ok() || result.num_kvs != 1 || result.count != 10000) {
      state.SkipWithError("range failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}
void BM_RangeOldestCreated(benchmark::State& state) { RangeFirstSorted(state, RangeRequest::CREATE); }
BENCHMARK(BM_RangeOldestCreated)->ArgNames({"keys"})->Arg(10000)->Unit(benchmark::kMicrosecond);

// The first key under a prefix, sorted ascending by key (clientv3's
// WithFirstKey): the index's own order, so the walk stops at the limit.
void BM_RangeFirstKey(benchmark::State& state) { RangeFirstSorted(state, RangeRequest::KEY); }
BENCHMARK(BM_RangeFirstKey)->ArgNames({"keys"})->Arg(10000)->Unit(benchmark::kMicrosecond);

void BM_RangeAll(benchmark::State& state) {
  const int64_t limit = state.range(2);
  KvStore* store = BigStore()->store();
  RangeRequest first;
  first.set_key("/bench/big/");
  first.set_range_end("/bench/big0");
  first.set_limit(limit);
  RangeResult result;
  int64_t keys = 0, bytes = 0, pages = 0;
  size_t largest = 0;
  for (auto _ : state) {
    RangeRequest req = first;
    for (;;) {
      if (!store->Range(req, &result).ok()) {
        state.SkipWithError("range failed");
        return;
      }
      ++pages;
      keys += result.num_kvs;
      bytes += static_cast<int64_t>(result.kvs_wire.size());
      largest = std::max(largest, result.kvs_wire.size());
      if (!result.more) break;
      // The next page, at the revision of the first one.
      RangeResponse last;
      req.set_revision(result.rev);
      std::string_view wire = result.kvs_wire;
      // Cheap way to find the last key: parse the whole page (outside the
      // store, but inside the loop, like any client would).
      last.ParseFromArray(wire.data(), static_cast<int>(wire.size()));
      req.set_key(last.kvs(last.kvs_size() - 1).key() + std::string(1, '\0'));
    }
    if (keys % kBigKeys != 0) {
      state.SkipWithError("not every key came back");
      return;
    }
  }
  state.SetItemsProcessed(keys);
  state.SetBytesProcessed(bytes);
  state.counters["pages_per_scan"] = static_cast<double>(pages) / state.iterations();
  state.counters["largest_response_MB"] = static_cast<double>(largest) / (1 << 20);
}
BENCHMARK(BM_RangeAll)
    ->ArgNames({"keys", "value_bytes", "limit"})
    ->Args({kBigKeys, kBigValue, 0})
    ->Args({kBigKeys, kBigValue, 500})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(1.0);

// keys_only and count_only Ranges over every key of the big store (as
// Kubernetes lists keys only, e.g. to warm its watch cache): answered from
// the key index, no record read (docs/BENCHMARKS.md, Index-only reads).
void RangeIndexOnly(benchmark::State& state, bool count_only) {
  KvStore* store = BigStore()->store();
  RangeRequest req;
  req.set_key("/bench/big/");
  req.set_range_end("/bench/big0");
  req.set_keys_only(!count_only);
  req.set_count_only(count_only);
  RangeResult result;
  int64_t bytes = 0;
  for (auto _ : state) {
    if (!store->Range(req, &result).ok() || result.count != kBigKeys ||
        result.num_kvs != (count_only ? 0 : kBigKeys)) {
      state.SkipWithError("range failed");
      return;
    }
    bytes += static_cast<int64_t>(result.kvs_wire.size());
  }
  state.SetItemsProcessed(state.iterations() * kBigKeys);
  state.SetBytesProcessed(bytes);
}
void BM_RangeKeysOnly(benchmark::State& state) { RangeIndexOnly(state, /*count_only=*/false); }
BENCHMARK(BM_RangeKeysOnly)
    ->ArgNames({"keys", "value_bytes"})
    ->Args({kBigKeys, kBigValue})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MinTime(1.0);
void BM_RangeCountOnly(benchmark::State& state) { RangeIndexOnly(state, /*count_only=*/true); }
BENCHMARK(BM_RangeCountOnly)
    ->ArgNames({"keys", "value_bytes"})
    ->Args({kBigKeys, kBigValue})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->MinTime(1.0);

void BM_Open(benchmark::State& state) {
  BenchStore* big = BigStore();
  for (auto _ : state) {
    state.PauseTiming();
    big->Close();
    state.ResumeTiming();
    big->Open();
  }
  state.SetItemsProcessed(state.iterations() * kBigKeys);
  state.counters["keys"] = static_cast<double>(big->store()->GetStats().keys);
}
BENCHMARK(BM_Open)
    ->ArgNames({"keys", "value_bytes"})
    ->Args({kBigKeys, kBigValue})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(3);

}  // namespace
}  // namespace capstan::mvcc
