#include "server/api/bulk_reads.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "util/thread_name.h"

namespace capstan::server {

// Bytes of responses handed to gRPC and not yet released. Shared with the
// slices, which may outlive a BulkReads destroyed before gRPC frees them.
// Also keeps the blocks gRPC has sent, for the next big read.
struct BulkReads::Budget {
  using Clock = std::chrono::steady_clock;

  explicit Budget(size_t max_kept) : max_kept_blocks(max_kept / kBlockBytes) {}

  // A leaf lock. A read waiting for the budget waits on a condition over
  // held: each release under it wakes the waiters.
  util::Mutex mu;
  size_t held ABSL_GUARDED_BY(mu) = 0;
  const size_t max_kept_blocks;
  std::vector<std::unique_ptr<char[]>> kept ABSL_GUARDED_BY(mu);
  Clock::time_point last_take ABSL_GUARDED_BY(mu) = Clock::now();

  // Counts `n` bytes about to be handed to gRPC: before any slice of them
  // exists, so that a release never comes first.
  void Hold(size_t n) ABSL_LOCKS_EXCLUDED(mu) {
    util::MutexLock l(&mu);
    held += n;
  }

  void Release(size_t n) ABSL_LOCKS_EXCLUDED(mu) {
    util::MutexLock l(&mu);
    held -= n;
  }

  // A kept block, or a new one (not zeroed: every byte sent is written).
  std::unique_ptr<char[]> Take() ABSL_LOCKS_EXCLUDED(mu) {
    {
      util::MutexLock l(&mu);
      last_take = Clock::now();
      if (!kept.empty()) {
        auto block = std::move(kept.back());
        kept.pop_back();
        return block;
      }
    }
    return std::make_unique_for_overwrite<char[]>(kBlockBytes);
  }

  // Takes back a block, of which `sent` bytes were held by gRPC (0 for one
  // never handed over).
  void Return(std::unique_ptr<char[]> block, size_t sent) ABSL_LOCKS_EXCLUDED(mu) {
    {
      util::MutexLock l(&mu);
      held -= sent;
      if (kept.size() < max_kept_blocks) kept.push_back(std::move(block));
    }
    // A block beyond the bound is freed here, outside the lock.
  }

  // Frees the kept blocks if none was taken for `idle`.
  void DropIdle(std::chrono::milliseconds idle) ABSL_LOCKS_EXCLUDED(mu) {
    std::vector<std::unique_ptr<char[]>> dropped;
    {
      util::MutexLock l(&mu);
      if (Clock::now() - last_take < idle) return;
      dropped.swap(kept);
    }
  }
};

// One sent block, owned by gRPC's slice until it drops it.
struct BulkReads::SentBlock {
  std::unique_ptr<char[]> block;
  size_t size;
  std::shared_ptr<Budget> budget;
};

BulkReads::BlockSink::BlockSink(std::shared_ptr<Budget> budget) : budget_(std::move(budget)) {}

BulkReads::BlockSink::~BlockSink() {
  for (auto& b : blocks_) budget_->Return(std::move(b), 0);
}

void BulkReads::BlockSink::Append(std::string_view bytes) {
  while (!bytes.empty()) {
    if (blocks_.empty() || last_used_ == kBlockBytes) {
      blocks_.push_back(budget_->Take());
      last_used_ = 0;
    }
    const size_t n = std::min(bytes.size(), kBlockBytes - last_used_);
    std::memcpy(blocks_.back().get() + last_used_, bytes.data(), n);
    last_used_ += n;
    bytes.remove_prefix(n);
  }
}

size_t BulkReads::BlockSink::size() const {
  return blocks_.empty() ? 0 : (blocks_.size() - 1) * kBlockBytes + last_used_;
}

// One part of a held response: owns the bytes and returns them to the
// budget when gRPC drops the slice.
struct BulkReads::HeldPart {
  std::string bytes;
  std::shared_ptr<Budget> budget;
};

BulkReads::BulkReads(Options options)
    : options_(options), budget_(std::make_shared<Budget>(options.kept_block_bytes)) {
  const int n = options_.threads > 0 ? options_.threads : 1;
  parallel_.new_sink = [this]() -> std::unique_ptr<mvcc::ByteSink> { return NewSink(); };
  parallel_.run = [this](std::function<void()> task) { RunHelper(std::move(task)); };
  parallel_.helpers = n - 1;
  for (int i = 0; i < n; ++i) threads_.push_back(NamedThread("bulk-read", [this] { Loop(); }));
}

BulkReads::~BulkReads() {
  {
    util::MutexLock l(&mu_);
    stopping_ = true;
  }
  // Wake reads waiting for the budget so the drain finishes even if gRPC
  // never releases what it holds: their condition reads stopping_, and is
  // evaluated again when the budget's lock is released.
  { util::MutexLock l(&budget_->mu); }
  for (auto& t : threads_) t.join();
}

void BulkReads::Run(std::function<void()> read) {
  util::MutexLock l(&mu_);
  queue_.push_back({std::move(read), /*helper=*/false});
}

void BulkReads::RunHelper(std::function<void()> task) {
  util::MutexLock l(&mu_);
  queue_.push_front({std::move(task), /*helper=*/true});
}

grpc::Slice BulkReads::HeldSlice(std::string bytes) {
  auto* part = new HeldPart{std::move(bytes), budget_};
  return grpc::Slice(
      part->bytes.data(), part->bytes.size(),
      [](void* arg) {
        auto* held = static_cast<HeldPart*>(arg);
        held->budget->Release(held->bytes.size());
        delete held;
      },
      part);
}

void BulkReads::Hold(std::vector<std::string> parts, grpc::ByteBuffer* out) {
  size_t total = 0;
  for (const auto& p : parts) total += p.size();
  budget_->Hold(total);
  std::vector<grpc::Slice> slices;
  slices.reserve(parts.size());
  for (auto& p : parts) {
    if (!p.empty()) slices.push_back(HeldSlice(std::move(p)));
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  out->Swap(&buffer);
}

std::unique_ptr<BulkReads::BlockSink> BulkReads::NewSink() {
  return std::make_unique<BlockSink>(budget_);
}

void BulkReads::Hold(std::string head, std::vector<std::unique_ptr<mvcc::ByteSink>> kvs,
                     std::string tail, grpc::ByteBuffer* out) {
  std::vector<grpc::Slice> slices;
  size_t total = head.size() + tail.size();
  for (const auto& sink : kvs) total += static_cast<const BlockSink&>(*sink).size();
  auto add_string = [&](std::string&& s) {
    if (!s.empty()) slices.push_back(HeldSlice(std::move(s)));
  };
  budget_->Hold(total);
  add_string(std::move(head));
  for (auto& base : kvs) {
    auto& sink = static_cast<BlockSink&>(*base);
    for (size_t i = 0; i < sink.blocks_.size(); ++i) {
      const bool last = i + 1 == sink.blocks_.size();
      auto* sent = new SentBlock{std::move(sink.blocks_[i]),
                                 last ? sink.last_used_ : kBlockBytes, budget_};
      slices.emplace_back(
          sent->block.get(), sent->size,
          [](void* arg) {
            auto* s = static_cast<SentBlock*>(arg);
            s->budget->Return(std::move(s->block), s->size);
            delete s;
          },
          sent);
    }
    sink.blocks_.clear();
  }
  add_string(std::move(tail));
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  out->Swap(&buffer);
}

size_t BulkReads::held_bytes() const {
  util::MutexLock l(&budget_->mu);
  return budget_->held;
}

size_t BulkReads::kept_block_bytes() const {
  util::MutexLock l(&budget_->mu);
  return budget_->kept.size() * kBlockBytes;
}

void BulkReads::Loop() {
  // Batch scheduling, then a lower priority, for this thread only (on Linux
  // both are per thread). Failing either only loses the preference.
  sched_param param{};
  pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), options_.nice);
  for (;;) {
    Task task;
    mu_.Lock();
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !queue_.empty(); };
    while (!mu_.AwaitWithTimeout(absl::Condition(&ready), absl::FromChrono(options_.keep_idle_blocks))) {
      mu_.Unlock();
      budget_->DropIdle(options_.keep_idle_blocks);
      mu_.Lock();
    }
    if (queue_.empty()) {  // stopping, and every queued read has run
      mu_.Unlock();
      return;
    }
    task = std::move(queue_.front());
    queue_.pop_front();
    mu_.Unlock();
    if (!task.helper) {
      // Wait while earlier responses hold the budget (a read starts whenever
      // less than the bound is held, so one read always may run).
      util::MutexLock l(&budget_->mu);
      auto room = [this]() ABSL_SHARED_LOCKS_REQUIRED(budget_->mu) {
        return budget_->held < options_.max_held_bytes || stopping_.load();
      };
      budget_->mu.Await(absl::Condition(&room));
    }
    task.fn();
  }
}

}  // namespace capstan::server
