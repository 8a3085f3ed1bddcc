// RaftLog micro-benchmarks: what one Ready's Save costs (1, 16 or 128
// entries of 256 bytes, synced or not), what raft's reads cost (Term,
// Entries from the tail cache and from RocksDB), and what a log compaction
// costs the raft loop and the thread that gives the disk space back. The log lives under
// $TMPDIR (default /tmp): the synced figures are that disk's fsync.
//
//   capstan_raft_log_benchmark --benchmark_filter=Save
//   capstan_raft_log_benchmark --benchmark_counters_tabular=true

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <chrono>
#include <cstring>
#include <thread>

#include "benchmark/benchmark.h"
#include "replication/raft_log.h"

namespace capstan::replication {
namespace {

std::string TempDir() {
  const char* base = getenv("TMPDIR");
  std::string tmpl = std::string(base != nullptr ? base : "/tmp") + "/capstan-raft-bench-XXXXXX";
  return mkdtemp(tmpl.data());
}

// A log in a fresh directory, removed with it.
struct ScratchLog {
  explicit ScratchLog(size_t tail_cache_bytes = 4 << 20) : dir(TempDir()) {
    RaftLogOptions options;
    options.dir = dir + "/raft";
    options.tail_cache_bytes = tail_cache_bytes;
    log = std::move(RaftLog::Open(options).value());
  }
  ~ScratchLog() {
    log.reset();
    std::filesystem::remove_all(dir);
  }
  std::string dir;
  std::unique_ptr<RaftLog> log;
};

std::vector<RaftEntry> Batch(uint64_t first, int n, size_t bytes) {
  std::vector<RaftEntry> out(n);
  for (int k = 0; k < n; ++k) {
    out[k].index = first + k;
    out[k].term = 1;
    out[k].data.assign(bytes, static_cast<char>('a' + k % 26));
  }
  return out;
}

void BM_Save(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const bool sync = state.range(1) != 0;
  ScratchLog scratch;
  uint64_t next = 1;
  std::vector<RaftEntry> batch = Batch(next, n, 256);
  for (auto _ : state) {
    state.PauseTiming();
    for (auto& e : batch) e.index = next++;
    const HardState hs{1, 1, next - 1};
    state.ResumeTiming();
    if (!scratch.log->Save(hs, batch, std::nullopt, sync).ok()) {
      state.SkipWithError("Save failed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetBytesProcessed(state.iterations() * n * 256);
}
BENCHMARK(BM_Save)
    ->ArgNames({"entries", "sync"})
    ->ArgsProduct({{1, 16, 128}, {0, 1}})
    ->UseRealTime();

// raft's Term lookups over a log of 10,000 entries with a new term every
// 100 entries (runs of equal terms), at random indexes.
void BM_Term(benchmark::State& state) {
  ScratchLog scratch;
  for (uint64_t first = 1; first <= 10000; first += 100) {
    auto batch = Batch(first, 100, 16);
    for (auto& e : batch) e.term = 1 + first / 100;
    (void)scratch.log->Save(std::nullopt, batch, std::nullopt, false);
  }
  std::mt19937_64 rng(1);
  std::vector<uint64_t> indexes(4096);
  for (auto& i : indexes) i = 1 + rng() % 10000;
  size_t k = 0;
  uint64_t sum = 0;
  for (auto _ : state) {
    uint64_t t = 0;
    scratch.log->Term(state.range(0) != 0 ? indexes[k++ & 4095] : 10000, &t);
    sum += t;
  }
  benchmark::DoNotOptimize(sum);
}
BENCHMARK(BM_Term)->ArgNames({"random"})->Arg(0)->Arg(1);

// Entries(lo, lo + n) of 256-byte entries, from the tail cache
// (cached=1) or from RocksDB (cached=0).
void BM_Entries(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  const bool cached = state.range(1) != 0;
  ScratchLog scratch(cached ? 64 << 20 : 0);
  for (uint64_t first = 1; first <= 10000; first += 100) {
    (void)scratch.log->Save(std::nullopt, Batch(first, 100, 256), std::nullopt, false);
  }
  std::mt19937_64 rng(1);
  std::vector<RaftEntry> out;
  for (auto _ : state) {
    const uint64_t lo = 1 + rng() % (10000 - n);
    if (scratch.log->Entries(lo, lo + n, UINT64_MAX, &out) != LogError::kOk) {
      state.SkipWithError("Entries failed");
      break;
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetItemsProcessed(state.iterations() * n);
}
BENCHMARK(BM_Entries)->ArgNames({"entries", "cached"})->ArgsProduct({{1, 16, 128}, {0, 1}});

// Compact over a log of `entries` entries of 16 KiB (random bytes, as
// values mostly are after compression), all in files: the time is
// Compact's, on the raft loop; reclaim_ms is the pass that gives the
// deleted entries' space back, on the log's own thread; MB_before and
// MB_after the log's size on disk around both.
void BM_CompactReclaim(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  std::mt19937_64 rng(7);
  double reclaim_ms = 0, before = 0, after = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto scratch = std::make_unique<ScratchLog>(1 << 20);
    for (int first = 1; first <= n; first += 64) {
      auto batch = Batch(first, 64, 16 << 10);
      for (auto& e : batch) {
        for (size_t i = 0; i < e.data.size(); i += 8) {
          const uint64_t v = rng();
          memcpy(&e.data[i], &v, 8);
        }
      }
      (void)scratch->log->Save(HardState{1, 1, static_cast<uint64_t>(first + 63)}, batch,
                               std::nullopt, false);
    }
    before += static_cast<double>(scratch->log->SizeOnDisk());
    const uint64_t index = static_cast<uint64_t>(n) - 16;
    state.ResumeTiming();
    if (!scratch->log->Compact(index, {}).ok()) {
      state.SkipWithError("Compact failed");
      break;
    }
    state.PauseTiming();
    const auto start = std::chrono::steady_clock::now();
    while (scratch->log->ReclaimedBelow() <= index) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));  // polling the pass's end
    }
    reclaim_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                      .count();
    after += static_cast<double>(scratch->log->SizeOnDisk());
    scratch.reset();
    state.ResumeTiming();
  }
  const double iters = static_cast<double>(state.iterations());
  state.counters["reclaim_ms"] = reclaim_ms / iters;
  state.counters["MB_before"] = before / iters / 1e6;
  state.counters["MB_after"] = after / iters / 1e6;
}
BENCHMARK(BM_CompactReclaim)
    ->ArgNames({"entries"})
    ->Arg(1024)
    ->Arg(8192)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

}  // namespace
}  // namespace capstan::replication
