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
// Thread-safe.

#ifndef CAPSTAN_SERVER_BULK_READS_H_
#define CAPSTAN_SERVER_BULK_READS_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/support/byte_buffer.h"

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
  };

  explicit BulkReads(Options options);
  // Runs every read already queued, then joins the threads.
  ~BulkReads();

  BulkReads(const BulkReads&) = delete;
  BulkReads& operator=(const BulkReads&) = delete;

  // Queues `read` to run on a bulk thread, in submission order.
  void Run(std::function<void()> read);

  // Moves `parts` into `out` without copying their bytes, as one message in
  // that order. The bytes count against max_held_bytes until gRPC has sent
  // them and dropped the buffer.
  void Hold(std::vector<std::string> parts, grpc::ByteBuffer* out);

  size_t held_bytes() const;

 private:
  struct Budget;
  struct HeldPart;

  void Loop();

  const Options options_;
  const std::shared_ptr<Budget> budget_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_BULK_READS_H_
