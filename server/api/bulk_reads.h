// BulkReads: where big reads run.
//
// A full list of a large prefix builds a response of hundreds of megabytes.
// Built on gRPC's callback threads it would hold those threads, and at normal
// CPU priority it competes with the committer and with every small request
// for the machine's cores. BulkReads runs such reads on a few threads of its
// own, scheduled as batch work (SCHED_BATCH: they never preempt a thread that
// wakes up) at a somewhat lower priority (nice +5: about a third of a normal
// thread's CPU share when they compete), so that writes and small reads keep
// their latency while big reads still progress on a busy machine. It also
// bounds the memory of responses built but not yet sent: a new bulk read
// starts only while those hold fewer than `max_held_bytes` (one read always
// may run, so nothing waits forever).
//
// A big response's kvs are written into blocks of kBlockBytes (a BlockSink)
// that gRPC sends as they are; once sent, the blocks are kept for the next
// big read, up to `kept_block_bytes`, until no big read has taken one for
// `keep_idle_blocks`. Built as one fresh string instead, every full list of
// a 400 MiB prefix faulted in 400 MiB of new pages and gave them back to the
// kernel after the send; that memory churn, not the CPU of the list, was
// what stalled concurrent writes (put p99 during four concurrent full lists:
// 23-45 ms with one string per response, 12-17 ms with kept blocks; idle
// 1.7 ms).
//
// Thread-safe.

#ifndef CAPSTAN_SERVER_API_BULK_READS_H_
#define CAPSTAN_SERVER_API_BULK_READS_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <atomic>
#include <chrono>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "grpcpp/support/byte_buffer.h"
#include "mvcc/kv_codec.h"
#include "mvcc/kv_store.h"
#include "util/mutex.h"

namespace capstan::server {

class BulkReads {
 public:
  struct Options {
    int threads = 2;
    // The nice value of the bulk threads (Linux: per thread). Each step is
    // about 1.25x less CPU share when threads compete; +10 starves big reads
    // when other processes keep the cores busy.
    int nice = 5;
    size_t max_held_bytes = size_t{1} << 30;
    size_t kept_block_bytes = size_t{512} << 20;
    std::chrono::milliseconds keep_idle_blocks{30000};
  };

  static constexpr size_t kBlockBytes = size_t{1} << 20;

  class BlockSink;

  explicit BulkReads(Options options);
  // Runs every read already queued, then joins the threads.
  ~BulkReads();

  BulkReads(const BulkReads&) = delete;
  BulkReads& operator=(const BulkReads&) = delete;

  // Queues `read` to run on a bulk thread, in submission order.
  void Run(std::function<void()> read) ABSL_LOCKS_EXCLUDED(mu_);

  // Runs `task`, a helper of a read already running, on the next free bulk
  // thread, before any queued read and without waiting for the budget.
  void RunHelper(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

  // A ParallelRead for a Range on a bulk thread: parts written into this
  // BulkReads' blocks, one helper per other bulk thread.
  const mvcc::ParallelRead& parallel_read() const { return parallel_; }

  // Moves `parts` into `out` without copying their bytes, as one message in
  // that order. The bytes count against max_held_bytes until gRPC has sent
  // them and dropped the buffer.
  void Hold(std::vector<std::string> parts, grpc::ByteBuffer* out);

  // A sink that writes into this BulkReads' blocks. Use it on one thread.
  std::unique_ptr<BlockSink> NewSink();

  // As Hold(parts), for `head`, the bytes of each of `kvs` in order and
  // `tail`: the blocks go to gRPC as they are and come back for reuse once
  // it drops them. Every sink must come from this BulkReads.
  void Hold(std::string head, std::vector<std::unique_ptr<mvcc::ByteSink>> kvs, std::string tail,
            grpc::ByteBuffer* out);

  size_t held_bytes() const;
  // Sent blocks kept for reuse.
  size_t kept_block_bytes() const;

 private:
  struct Budget;
  struct HeldPart;
  struct SentBlock;

  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // A slice owning `bytes`, released from the budget when gRPC drops it.
  // REQUIRES: the bytes are already counted in the budget.
  grpc::Slice HeldSlice(std::string bytes);

  const Options options_;
  const std::shared_ptr<Budget> budget_;
  struct Task {
    std::function<void()> fn;
    bool helper;  // part of a running read: never waits for the budget
  };

  mvcc::ParallelRead parallel_;
  // The reads to run. A leaf: the bulk threads wait on a condition over
  // queue_ and stopping_, so a push under it wakes one.
  util::Mutex mu_;
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  // Written under mu_; atomic because a read waiting for the budget reads
  // it under the budget's lock instead.
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;
};

// Appends into a chain of kBlockBytes blocks taken from a BulkReads. Blocks
// not handed to gRPC go back to the BulkReads when the sink is destroyed.
class BulkReads::BlockSink final : public mvcc::ByteSink {
 public:
  explicit BlockSink(std::shared_ptr<Budget> budget);
  ~BlockSink() override;

  BlockSink(const BlockSink&) = delete;
  BlockSink& operator=(const BlockSink&) = delete;

  void Append(std::string_view bytes) override;

  // Bytes appended so far.
  size_t size() const;

 private:
  friend class BulkReads;

  const std::shared_ptr<Budget> budget_;
  std::vector<std::unique_ptr<char[]>> blocks_;
  size_t last_used_ = 0;  // bytes used in blocks_.back()
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_BULK_READS_H_
