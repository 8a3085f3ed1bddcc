// One-way throughput of Raft messages between two peer transports on
// 127.0.0.1, on a Raft stream (raft_stream.h) over an http peer URL (plain
// text) or an https one (https:1: both ends make the OpenSSL handshake
// themselves; certificates from --peer-auto-tls). The sender queues `batch` messages of `bytes` payload
// per Send call and the timed loop ends when the receiver's handler has seen
// them all. Reported: messages/s (items), payload bytes/s, the whole
// process's CPU time per message (both transports and all their threads,
// measured around the loop), and the time from AddPeer to the first
// message delivered (connection and, for https, handshake).
//
//   capstan_peer_transport_benchmark --benchmark_counters_tabular=true
//   capstan_peer_transport_benchmark --benchmark_filter='https:1/'   # https only
//   server/peer/peer_transport_benchmark_rounds.sh   # http and https alternating, medians

#include <stdlib.h>
#include <time.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "benchmark/benchmark.h"
#include "server/peer/peer_tls.h"
#include "server/peer/peer_transport.h"
#include "util/coding.h"
#include "util/mutex.h"

namespace capstan::server {
namespace {

constexpr uint64_t kCluster = 0x1234;

// The self-signed pair --peer-auto-tls makes in <dir>/fixtures/peer, which
// both transports present and neither verifies.
std::optional<PeerTls> AutoTls(const std::string& dir) {
  ServerConfig config;
  config.data_dir = dir;
  config.peer_auto_tls = true;
  config.listen_peer_urls = {{"https", "127.0.0.1:0"}};
  auto tls = ResolvePeerTls(config);
  if (!tls.ok()) return std::nullopt;
  return *tls;
}

double ProcessCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Listens on an https peer URL when tls is set, else on an http one.
std::unique_ptr<PeerTransport> Start(uint64_t id, replication::TransportHandler handler,
                                     size_t queue_capacity, const std::optional<PeerTls>& tls) {
  PeerTransportOptions o;
  o.member_id = id;
  o.cluster_id = kCluster;
  o.listen_peer_urls = {{tls ? "https" : "http", "127.0.0.1:0"}};
  o.tls = tls;
  o.queue_capacity = queue_capacity;
  auto t = std::make_unique<PeerTransport>(std::move(o));
  if (!t->Start(std::move(handler)).ok()) return nullptr;
  return t;
}

// What the handlers report. The timed loop waits on it without spinning: a
// spinning waiter would take one of a small machine's cores from the
// transports' threads (and count in their CPU time). Thread-safe.
class Deliveries {
 public:
  replication::TransportHandler Receiver() {
    replication::TransportHandler h;
    h.on_message = [this](uint64_t, std::string bytes) {
      util::MutexLock l(&mu_);
      ++received_;
      last_size_ = bytes.size();
    };
    return h;
  }
  replication::TransportHandler Sender() {
    replication::TransportHandler h;
    h.on_unreachable = [this](uint64_t) {
      util::MutexLock l(&mu_);
      ++unreachable_;
    };
    return h;
  }
  uint64_t received() {
    util::MutexLock l(&mu_);
    return received_;
  }
  uint64_t unreachable() {
    util::MutexLock l(&mu_);
    return unreachable_;
  }
  // Blocks until `count` messages in all were received, more than
  // `failures` streams failed, or `timeout` passed; true in the first case.
  bool AwaitReceived(uint64_t count, uint64_t failures,
                     absl::Duration timeout = absl::InfiniteDuration()) {
    util::MutexLock l(&mu_);
    const auto done = [this, count, failures]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return received_ >= count || unreachable_ > failures;
    };
    mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
    return received_ >= count;
  }
  // Blocks until the last message received has `size` bytes or `timeout`
  // passed; true in the first case.
  bool AwaitLastOfSize(size_t size, absl::Duration timeout) {
    util::MutexLock l(&mu_);
    const auto done = [this, size]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return last_size_ == size;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&done), timeout);
  }

 private:
  util::Mutex mu_;
  uint64_t received_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t unreachable_ ABSL_GUARDED_BY(mu_) = 0;
  size_t last_size_ ABSL_GUARDED_BY(mu_) = 0;
};

// A fresh directory under /tmp, removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    char dir[] = "/tmp/capstan-peer-bench-XXXXXX";
    if (::mkdtemp(dir) != nullptr) path_ = dir;
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }  // "" when it could not be made

 private:
  std::string path_;
};

void BM_OneWay(benchmark::State& state) {
  const bool https = state.range(0) != 0;
  const size_t bytes = static_cast<size_t>(state.range(1));
  const size_t batch = static_cast<size_t>(state.range(2));
  ScratchDir dir;
  std::optional<PeerTls> tls;
  if (https && (dir.path().empty() || !(tls = AutoTls(dir.path())))) {
    state.SkipWithError("cannot make the auto TLS certificate");
    return;
  }
  Deliveries deliveries;
  // The queue holds a whole round, so nothing is dropped by design.
  auto b = Start(2, deliveries.Receiver(), batch, tls);
  auto a = Start(1, deliveries.Sender(), batch, tls);
  if (!a || !b) {
    state.SkipWithError("cannot start the transports");
    return;
  }
  a->AddPeer(2, {absl::StrCat(https ? "https" : "http", "://127.0.0.1:", b->BoundPorts()[0])});

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

  // Warm up: one message at a time until one is delivered (the stream is
  // open; with https the first connection attempt may fail and drop what
  // was queued), then a marker of another size. Messages keep their order:
  // once the marker is delivered, so is every message sent before it, and
  // the first round starts with an empty queue.
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + absl::Seconds(20);
  do {
    a->Send({message});
  } while (!deliveries.AwaitReceived(1, UINT64_MAX, absl::Milliseconds(50)) &&
           absl::Now() < deadline);
  const absl::Duration first_delivery = absl::Now() - start;
  replication::RaftMessage marker = message;
  util::AppendVarintField(10, 1, &marker.bytes);  // reject: true
  bool drained = false;
  while (!drained && absl::Now() < deadline) {
    a->Send({marker});
    drained = deliveries.AwaitLastOfSize(marker.bytes.size(), absl::Seconds(2));
  }
  if (!drained) {
    state.SkipWithError("the stream did not open");
    return;
  }

  uint64_t sent = 0;
  const uint64_t failures = deliveries.unreachable();
  const double cpu_start = ProcessCpuSeconds();
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<replication::RaftMessage> round(batch, message);
    const uint64_t want = deliveries.received() + batch;
    state.ResumeTiming();
    a->Send(std::move(round));
    deliveries.AwaitReceived(want, failures);
    sent += batch;
  }
  const double cpu = ProcessCpuSeconds() - cpu_start;
  state.SetItemsProcessed(static_cast<int64_t>(sent));
  state.SetBytesProcessed(static_cast<int64_t>(sent * bytes));
  state.counters["wire_bytes_per_msg"] = static_cast<double>(message.bytes.size());
  state.counters["unreachable"] = static_cast<double>(deliveries.unreachable() - failures);
  state.counters["first_delivery_ms"] = absl::ToDoubleMilliseconds(first_delivery);
  state.counters["cpu_us_per_msg"] = sent > 0 ? cpu * 1e6 / static_cast<double>(sent) : 0;
  a->Stop();
  b->Stop();
}
BENCHMARK(BM_OneWay)
    ->ArgNames({"https", "bytes", "batch"})
    ->ArgsProduct({{0, 1}, {16}, {1, 64, 1024}})
    ->Args({0, 128, 1024})
    ->Args({1, 128, 1024})
    ->Args({0, 1024, 1024})
    ->Args({1, 1024, 1024})
    ->Args({0, 65536, 64})
    ->Args({1, 65536, 64})
    ->UseRealTime()
    ->MinTime(1.0);

}  // namespace
}  // namespace capstan::server
