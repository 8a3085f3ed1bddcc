// One-way throughput of small Raft messages between two peer transports on
// 127.0.0.1 (plain text): the sender queues `batch` messages of `bytes`
// payload per Send call and the timed loop ends when the receiver's handler
// has seen them all. Reported: messages/s (items) and payload bytes/s.
//
//   capstan_peer_transport_benchmark --benchmark_counters_tabular=true

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "server/peer/peer_transport.h"
#include "util/coding.h"

namespace capstan::server {
namespace {

constexpr uint64_t kCluster = 0x1234;

std::unique_ptr<PeerTransport> Start(uint64_t id, replication::TransportHandler handler,
                                     size_t queue_capacity) {
  PeerTransportOptions o;
  o.member_id = id;
  o.cluster_id = kCluster;
  o.listen_peer_urls = {{"http", "127.0.0.1:0"}};
  o.queue_capacity = queue_capacity;
  auto t = std::make_unique<PeerTransport>(std::move(o));
  if (!t->Start(std::move(handler)).ok()) return nullptr;
  return t;
}

void BM_OneWaySmallMessages(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t batch = static_cast<size_t>(state.range(1));
  std::atomic<uint64_t> received{0};
  std::atomic<uint64_t> unreachable{0};
  replication::TransportHandler receiver;
  receiver.on_message = [&](uint64_t, std::string) {
    received.fetch_add(1, std::memory_order_relaxed);
  };
  replication::TransportHandler sender;
  sender.on_unreachable = [&](uint64_t) { unreachable.fetch_add(1, std::memory_order_relaxed); };
  // The queue holds a whole round, so nothing is dropped by design.
  auto b = Start(2, receiver, batch);
  auto a = Start(1, sender, batch);
  if (!a || !b) {
    state.SkipWithError("cannot start the transports");
    return;
  }
  a->AddPeer(2, {absl::StrCat("http://127.0.0.1:", b->BoundPorts()[0])});

  // A MsgApp (type 3) 1 -> 2 with one entry of `bytes` bytes, as raftpb
  // marshals it: type, to, from, term, logTerm, index, entries, commit.
  std::string entry;
  util::AppendVarintField(2, 5, &entry);
  util::AppendVarintField(3, 101, &entry);
  util::AppendBytesField(4, std::string(bytes, 'v'), &entry);
  std::string wire;
  util::AppendVarintField(1, 3, &wire);
  util::AppendVarintField(2, 2, &wire);
  util::AppendVarintField(3, 1, &wire);
  util::AppendVarintField(4, 5, &wire);
  util::AppendVarintField(5, 5, &wire);
  util::AppendVarintField(6, 100, &wire);
  util::AppendBytesField(7, entry, &wire);
  util::AppendVarintField(8, 99, &wire);
  replication::RaftMessage message{2, 3, wire};

  // Warm up: the stream is open and delivering.
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (received.load() == 0 && absl::Now() < deadline) {
    a->Send({message});
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (received.load() == 0) {
    state.SkipWithError("the stream did not open");
    return;
  }

  uint64_t sent = 0;
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<replication::RaftMessage> round(batch, message);
    const uint64_t want = received.load() + batch;
    state.ResumeTiming();
    a->Send(std::move(round));
    while (received.load(std::memory_order_relaxed) < want) {
      if (unreachable.load() > 0) break;
    }
    sent += batch;
  }
  state.SetItemsProcessed(static_cast<int64_t>(sent));
  state.SetBytesProcessed(static_cast<int64_t>(sent * bytes));
  state.counters["wire_bytes_per_msg"] = static_cast<double>(message.bytes.size());
  state.counters["unreachable"] = static_cast<double>(unreachable.load());
  a->Stop();
  b->Stop();
}
BENCHMARK(BM_OneWaySmallMessages)
    ->ArgNames({"bytes", "batch"})
    ->Args({16, 1})
    ->Args({16, 64})
    ->Args({16, 1024})
    ->Args({128, 1024})
    ->Args({1024, 1024})
    ->UseRealTime()
    ->MinTime(1.0);

}  // namespace
}  // namespace capstan::server
