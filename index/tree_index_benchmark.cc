// Copyright 2025 The Capstan Authors.
//
// TreeIndex micro-benchmarks. Keys look like Kubernetes registry keys
// (~40 bytes). Inputs are built outside the timed regions.
//
//   capstan_index_benchmark --benchmark_filter=Put
//   capstan_index_benchmark --benchmark_counters_tabular=true

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "benchmark/benchmark.h"
#include "index/tree_index.h"

namespace capstan::index {
namespace {

std::string KeyOf(int64_t i) {
  return absl::StrFormat("/registry/pods/ns-%04d/pod-%08d", i % 1000, i);
}

// Sorted distinct keys 0..n-1 (sorted by the zero padding of the formatting).
std::vector<std::string> SortedKeys(int64_t n) {
  std::vector<std::string> keys;
  keys.reserve(n);
  for (int64_t i = 0; i < n; ++i) keys.push_back(KeyOf(i));
  std::sort(keys.begin(), keys.end());
  return keys;
}

// A published index over `n` keys, each put once at revision i + 1, built
// once per size and shared by the read benchmarks.
struct Fixture {
  explicit Fixture(int64_t n) : keys(SortedKeys(n)) {
    for (int64_t i = 0; i < n; ++i) index.Put(keys[i], Revision{i + 1, 0});
    index.Publish();
    rev = n;
  }
  std::vector<std::string> keys;
  TreeIndex index;
  int64_t rev;
};

Fixture& SharedFixture(int64_t n) {
  static auto* fixtures = new std::vector<std::unique_ptr<Fixture>>();
  for (auto& f : *fixtures) {
    if (static_cast<int64_t>(f->keys.size()) == n) return *f;
  }
  fixtures->push_back(std::make_unique<Fixture>(n));
  return *fixtures->back();
}

size_t HeapInUse() { return mallinfo2().uordblks; }

// Writer throughput: puts to random existing keys of a 1M-key index,
// publishing every `publish_every` puts (the group-commit size).
void BM_PutPublishEvery(benchmark::State& state) {
  Fixture& f = SharedFixture(1'000'000);
  const int64_t publish_every = state.range(0);
  std::mt19937_64 rng(1);
  std::vector<uint32_t> order(1 << 20);
  for (auto& o : order) o = static_cast<uint32_t>(rng() % f.keys.size());
  size_t i = 0;
  int64_t since_publish = 0;
  const uint64_t copied_before = f.index.TEST_write_stats().nodes_copied;
  for (auto _ : state) {
    f.index.Put(f.keys[order[i++ & (order.size() - 1)]], Revision{++f.rev, 0});
    if (++since_publish == publish_every) {
      f.index.Publish();
      since_publish = 0;
    }
  }
  f.index.Publish();
  state.SetItemsProcessed(state.iterations());
  state.counters["nodes_copied_per_put"] = benchmark::Counter(
      static_cast<double>(f.index.TEST_write_stats().nodes_copied - copied_before) /
      static_cast<double>(state.iterations()));
}
BENCHMARK(BM_PutPublishEvery)->ArgNames({"publish_every"})->Arg(1)->Arg(10)->Arg(100)->Arg(1000);

// Start-up: n new keys put in key order into an empty index, no publish.
void BM_PutAscendingLoad(benchmark::State& state) {
  const int64_t n = state.range(0);
  const std::vector<std::string> keys = SortedKeys(n);
  double bytes_per_key = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const size_t heap0 = HeapInUse();
    auto index = std::make_unique<TreeIndex>();
    state.ResumeTiming();
    for (int64_t i = 0; i < n; ++i) index->Put(keys[i], Revision{i + 1, 0});
    index->Publish();
    state.PauseTiming();
    bytes_per_key = static_cast<double>(HeapInUse() - heap0) / static_cast<double>(n);
    index.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.counters["bytes_per_key"] = bytes_per_key;
}
BENCHMARK(BM_PutAscendingLoad)->ArgNames({"keys"})->Arg(1'000'000)->Unit(benchmark::kMillisecond);

// Start-up in revision order: n new keys in random key order (what replaying
// the key column family in revision order gives).
void BM_PutRandomOrderLoad(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<std::string> keys = SortedKeys(n);
  std::shuffle(keys.begin(), keys.end(), std::mt19937_64(3));
  for (auto _ : state) {
    state.PauseTiming();
    auto index = std::make_unique<TreeIndex>();
    state.ResumeTiming();
    for (int64_t i = 0; i < n; ++i) index->Put(keys[i], Revision{i + 1, 0});
    index->Publish();
    state.PauseTiming();
    index.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_PutRandomOrderLoad)->ArgNames({"keys"})->Arg(1'000'000)->Unit(benchmark::kMillisecond);

// Start-up through LoadSorted (KeyIndexes built by the caller, e.g. from a
// hash map filled in revision order, then sorted).
void BM_LoadSorted(benchmark::State& state) {
  const int64_t n = state.range(0);
  const std::vector<std::string> keys = SortedKeys(n);
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<std::pair<std::string, KeyIndex>> entries(n);
    for (int64_t i = 0; i < n; ++i) {
      entries[i].first = keys[i];
      entries[i].second.Put(Revision{i + 1, 0});
    }
    auto index = std::make_unique<TreeIndex>();
    state.ResumeTiming();
    index->LoadSorted(std::move(entries));
    index->Publish();
    state.PauseTiming();
    index.reset();
    state.ResumeTiming();
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_LoadSorted)->ArgNames({"keys"})->Arg(1'000'000)->Unit(benchmark::kMillisecond);

// Snapshot(): copy the published root (mutex + atomic increment) and drop it.
void BM_Snapshot(benchmark::State& state) {
  Fixture& f = SharedFixture(100'000);
  for (auto _ : state) {
    IndexSnapshot s = f.index.Snapshot();
    benchmark::DoNotOptimize(s);
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Snapshot)->Threads(1)->Threads(2)->Threads(4);

// A full Range over every key at the latest revision.
void BM_RangeAll(benchmark::State& state) {
  Fixture& f = SharedFixture(state.range(0));
  const IndexSnapshot s = f.index.Snapshot();
  int64_t visited = 0;
  for (auto _ : state) {
    s.Range("", kRangeEndAll, f.rev, [&](std::string_view key, const RangeHit& hit) {
      benchmark::DoNotOptimize(key);
      benchmark::DoNotOptimize(hit);
      ++visited;
      return true;
    });
  }
  state.SetItemsProcessed(visited);
}
BENCHMARK(BM_RangeAll)
    ->ArgNames({"keys"})
    ->Arg(100'000)
    ->Arg(1'000'000)
    ->Unit(benchmark::kMillisecond);

// Count over every key (Range without visiting).
void BM_CountAll(benchmark::State& state) {
  Fixture& f = SharedFixture(state.range(0));
  const IndexSnapshot s = f.index.Snapshot();
  for (auto _ : state) benchmark::DoNotOptimize(s.Count("", kRangeEndAll, f.rev));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
BENCHMARK(BM_CountAll)->ArgNames({"keys"})->Arg(1'000'000)->Unit(benchmark::kMillisecond);

// Count over every key at an older revision, after `changed` of every 1,000
// keys were put again (what a page of a paginated list counts: the keys
// after it, at the revision of the first page). Subtrees with no later write
// are counted from their aggregates; the others are walked.
void BM_CountAtOlderRevision(benchmark::State& state) {
  constexpr int64_t kKeys = 1'000'000;
  static Fixture* f = new Fixture(kKeys);
  // changed per mille -> the snapshot after those puts, all counted at the
  // revision before them.
  static std::map<int64_t, IndexSnapshot>* versions = [] {
    auto* v = new std::map<int64_t, IndexSnapshot>();
    std::mt19937_64 rng(3);
    int64_t changed = 0;
    for (int64_t per_mille : {0, 1, 10, 100}) {
      for (; changed < kKeys * per_mille / 1000; ++changed) {
        f->index.Put(f->keys[rng() % kKeys], Revision{++f->rev, 0});
      }
      f->index.Publish();
      v->emplace(per_mille, f->index.Snapshot());
    }
    return v;
  }();
  const IndexSnapshot& snapshot = versions->at(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(snapshot.Count("", kRangeEndAll, kKeys));
  state.SetItemsProcessed(state.iterations() * kKeys);
}
BENCHMARK(BM_CountAtOlderRevision)
    ->ArgNames({"changed_per_mille"})
    ->Arg(0)
    ->Arg(1)
    ->Arg(10)
    ->Arg(100)
    ->Unit(benchmark::kMillisecond);

// Point lookups of random existing keys on a snapshot.
void BM_Get(benchmark::State& state) {
  Fixture& f = SharedFixture(state.range(0));
  const IndexSnapshot s = f.index.Snapshot();
  std::mt19937_64 rng(2);
  std::vector<uint32_t> order(1 << 16);
  for (auto& o : order) o = static_cast<uint32_t>(rng() % f.keys.size());
  size_t i = 0;
  for (auto _ : state) {
    Revision modified, created;
    int64_t version;
    benchmark::DoNotOptimize(
        s.Get(f.keys[order[i++ & (order.size() - 1)]], f.rev, &modified, &created, &version));
  }
  state.SetItemsProcessed(state.iterations());
}
BENCHMARK(BM_Get)->ArgNames({"keys"})->Arg(100'000)->Arg(1'000'000)->Threads(1)->Threads(2);

// Compaction of n keys that each have an obsolete revision: KeysToCompact on a
// snapshot, then CompactKeys in batches of 1000 with a Publish after each,
// as mvcc would run it. Also reports Keep (the hash/compaction keep set).
void BM_CompactAll(benchmark::State& state) {
  const int64_t n = state.range(0);
  const std::vector<std::string> keys = SortedKeys(n);
  double keys_to_compact_ms = 0, compact_keys_ms = 0, keep_ms = 0;
  using Clock = std::chrono::steady_clock;
  auto ms = [](Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); };
  for (auto _ : state) {
    state.PauseTiming();
    auto index = std::make_unique<TreeIndex>();
    for (int64_t i = 0; i < n; ++i) index->Put(keys[i], Revision{i + 1, 0});
    for (int64_t i = 0; i < n; ++i) index->Put(keys[i], Revision{n + i + 1, 0});
    index->Publish();
    const int64_t at = 2 * n;
    state.ResumeTiming();

    const auto t0 = Clock::now();
    RevisionSet keep;
    index->Snapshot().Keep(at, &keep);
    const auto t1 = Clock::now();
    const std::vector<std::string> todo = index->Snapshot().KeysToCompact(at);
    const auto t2 = Clock::now();
    for (size_t i = 0; i < todo.size(); i += 1000) {
      const size_t len = std::min<size_t>(1000, todo.size() - i);
      index->CompactKeys(std::span<const std::string>(todo).subspan(i, len), at, nullptr);
      index->Publish();
    }
    const auto t3 = Clock::now();
    keep_ms += ms(t1 - t0);
    keys_to_compact_ms += ms(t2 - t1);
    compact_keys_ms += ms(t3 - t2);
    if (todo.size() != static_cast<size_t>(n) || keep.size() != static_cast<size_t>(n)) {
      state.SkipWithError("unexpected compaction result");
    }

    state.PauseTiming();
    index.reset();
    state.ResumeTiming();
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["keep_ms"] = keep_ms / iters;
  state.counters["keys_to_compact_ms"] = keys_to_compact_ms / iters;
  state.counters["compact_keys_ms"] = compact_keys_ms / iters;
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_CompactAll)
    ->ArgNames({"keys"})
    ->Arg(1'000'000)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2);

}  // namespace
}  // namespace capstan::index
