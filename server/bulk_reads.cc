#include "server/bulk_reads.h"

#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <utility>

namespace capstan::server {

// Bytes of responses handed to gRPC and not yet released. Shared with the
// slices, which may outlive a BulkReads destroyed before gRPC frees them.
struct BulkReads::Budget {
  std::mutex mu;
  std::condition_variable released;
  size_t held = 0;

  void Release(size_t n) {
    {
      std::lock_guard<std::mutex> l(mu);
      held -= n;
    }
    released.notify_all();
  }
};

// One part of a held response: owns the bytes and returns them to the
// budget when gRPC drops the slice.
struct BulkReads::HeldPart {
  std::string bytes;
  std::shared_ptr<Budget> budget;
};

BulkReads::BulkReads(Options options)
    : options_(options), budget_(std::make_shared<Budget>()) {
  const int n = options_.threads > 0 ? options_.threads : 1;
  for (int i = 0; i < n; ++i) threads_.emplace_back([this] { Loop(); });
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
    queue_.push_back(std::move(read));
  }
  cv_.notify_one();
}

void BulkReads::Hold(std::vector<std::string> parts, grpc::ByteBuffer* out) {
  std::vector<grpc::Slice> slices;
  slices.reserve(parts.size());
  size_t total = 0;
  for (auto& p : parts) {
    if (p.empty()) continue;
    total += p.size();
    auto* part = new HeldPart{std::move(p), budget_};
    slices.emplace_back(
        part->bytes.data(), part->bytes.size(),
        [](void* arg) {
          auto* held = static_cast<HeldPart*>(arg);
          held->budget->Release(held->bytes.size());
          delete held;
        },
        part);
  }
  {
    std::lock_guard<std::mutex> l(budget_->mu);
    budget_->held += total;
  }
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  out->Swap(&buffer);
}

size_t BulkReads::held_bytes() const {
  std::lock_guard<std::mutex> l(budget_->mu);
  return budget_->held;
}

void BulkReads::Loop() {
  // Batch scheduling, then a lower priority, for this thread only (on Linux
  // both are per thread). Failing either only loses the preference.
  sched_param param{};
  pthread_setschedparam(pthread_self(), SCHED_BATCH, &param);
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), options_.nice);
  for (;;) {
    std::function<void()> read;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      read = std::move(queue_.front());
      queue_.pop_front();
    }
    {
      // Wait while earlier responses hold the budget (a read starts whenever
      // less than the bound is held, so one read always may run).
      std::unique_lock<std::mutex> l(budget_->mu);
      budget_->released.wait(l, [this] {
        return budget_->held < options_.max_held_bytes || stopping_.load();
      });
    }
    read();
  }
}

}  // namespace capstan::server
