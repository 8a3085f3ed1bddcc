// One voter's propose -> ready -> advance cycle through the Go shim: the
// cost the engine adds per entry, without I/O. Entries of 256 bytes; each
// iteration proposes one group (one MsgProp) of `batch` entries and handles
// the Readies it makes (append to a MemoryRaftStorage, apply, Advance).

#include <string>
#include <string_view>
#include <vector>

#include "benchmark/benchmark.h"
#include "replication/goraft/go_raft_engine.h"
#include "replication/goraft/memory_raft_storage_for_test.h"

namespace capstan::replication {
namespace {

void BM_ProposeReadyAdvance(benchmark::State& state) {
  const size_t batch = static_cast<size_t>(state.range(0));
  GoRaftEngineFactory factory;
  factory.RunLoop([&] {
    MemoryRaftStorage storage;
    RaftConfig config;
    config.id = 1;
    config.bootstrap_voters = {1};
    config.storage = &storage;
    config.log = [](int, std::string_view) {};
    auto made = factory.NewEngine(config);
    if (!made.ok()) {
      state.SkipWithError(std::string(made.status().message()).c_str());
      return;
    }
    std::unique_ptr<RaftEngine> engine = *std::move(made);
    ConfState conf_state;
    uint64_t applied = 0;
    size_t applied_bytes = 0;
    auto drain = [&] {
      while (engine->HasReady()) {
        Ready rd = engine->GetReady();
        if (rd.hard_state) storage.SetHardState(*rd.hard_state);
        storage.Append(rd.entries);
        for (const RaftEntry& e : rd.committed) {
          if (e.type != EntryType::kNormal) conf_state = engine->ApplyConfChange(e.type, e.data);
          applied_bytes += e.data.size();
          applied = e.index;
        }
        engine->Advance();
      }
      // Keep the log short, as a member does after a snapshot.
      if (applied > storage.FirstIndex() + 4096) storage.Compact(applied, conf_state);
    };
    drain();
    if (!engine->Campaign().ok()) {
      state.SkipWithError("campaign failed");
      return;
    }
    drain();
    const std::string payload(256, 'x');
    const std::vector<std::string_view> group(batch, payload);
    for (auto _ : state) {
      if (!engine->Propose(group).ok()) {
        state.SkipWithError("proposal dropped");
        break;
      }
      drain();
    }
    benchmark::DoNotOptimize(applied_bytes);
  });
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * batch));
  state.counters["ns_per_entry"] = benchmark::Counter(
      static_cast<double>(state.iterations() * batch) / 1e9,
      benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_ProposeReadyAdvance)->ArgNames({"batch"})->Arg(1)->Arg(16)->Arg(128)->UseRealTime();

}  // namespace
}  // namespace capstan::replication
