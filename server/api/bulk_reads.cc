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

  std::mutex mu;
  std::condition_variable released;
  size_t held = 0;
  const size_t max_kept_blocks;
  std::vector<std::unique_ptr<char[]>> kept;
  Clock::time_point last_take = Clock::now();

  // Counts `n` bytes about to be handed to gRPC: before any slice of them
  // exists, so that a release never comes first.
  void Hold(size_t n) {
    std::lock_guard<std::mutex> l(mu);
    held += n;
  }

  void Release(size_t n) {
    {
      std::lock_guard<std::mutex> l(mu);
      held -= n;
    }
    released.notify_all();
  }

  // A kept block, or a new one (not zeroed: every byte sent is written).
  std::unique_ptr<char[]> Take() {
    {
      std::lock_guard<std::mutex> l(mu);
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
  void Return(std::unique_ptr<char[]> block, size_t sent) {
    {
      std::lock_guard<std::mutex> l(mu);
      held -= sent;
      if (kept.size() < max_kept_blocks) kept.push_back(std::move(block));
    }
    if (sent > 0) released.notify_all();
    // A block beyond the bound is freed here, outside the lock.
  }

  // Frees the kept blocks if none was taken for `idle`.
  void DropIdle(std::chrono::milliseconds idle) {
    std::vector<std::unique_ptr<char[]>> dropped;
    {
      std::lock_guard<std::mutex> l(mu);
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
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // Wake reads waiting for the budget so the drain finishes even if gRPC
  // never releases what it holds. Taking the budget's lock orders this
  // wake-up after any waiter's check of stopping_.
  { std::lock_guard<std::mutex> l(budget_->mu); }
  budget_->released.notify_all();
  for (auto& t : threads_) t.join();
}

void BulkReads::Run(std::function<void()> read) {
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back({std::move(read), /*helper=*/false});
  }
  cv_.notify_one();
}

void BulkReads::RunHelper(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_front({std::move(task), /*helper=*/true});
  }
  cv_.notify_one();
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
  std::lock_guard<std::mutex> l(budget_->mu);
  return budget_->held;
}

size_t BulkReads::kept_block_bytes() const {
  std::lock_guard<std::mutex> l(budget_->mu);
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
    {
      std::unique_lock<std::mutex> l(mu_);
      while (!stopping_ && queue_.empty()) {
        if (!cv_.wait_for(l, options_.keep_idle_blocks,
                          [this] { return stopping_ || !queue_.empty(); })) {
          l.unlock();
          budget_->DropIdle(options_.keep_idle_blocks);
          l.lock();
        }
      }
      if (queue_.empty()) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    if (!task.helper) {
      // Wait while earlier responses hold the budget (a read starts whenever
      // less than the bound is held, so one read always may run).
      std::unique_lock<std::mutex> l(budget_->mu);
      budget_->released.wait(l, [this] {
        return budget_->held < options_.max_held_bytes || stopping_.load();
      });
    }
    task.fn();
  }
}

}  // namespace capstan::server
