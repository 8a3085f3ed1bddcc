#include "server/api/completion_queues.h"

#include <pthread.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "grpc/support/time.h"
#include "spdlog/spdlog.h"

namespace capstan::server {

CompletionQueues::CompletionQueues(grpc::ServerBuilder* builder, int count) {
  for (int i = 0; i < count; ++i) {
    queues_.push_back(builder->AddCompletionQueue(/*is_frequently_polled=*/true));
    raw_.push_back(queues_.back().get());
  }
}

CompletionQueues::~CompletionQueues() { Stop(); }

void CompletionQueues::Start() {
  for (size_t i = 0; i < raw_.size(); ++i) {
    threads_.emplace_back([this, cq = raw_[i], i] {
      pthread_setname_np(pthread_self(), absl::StrCat("grpc-cq-", i).c_str());
      Serve(cq);
    });
  }
}

void CompletionQueues::Serve(grpc::ServerCompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  auto linger = [] {
    return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC),
                        gpr_time_from_millis(kLingerMs, GPR_TIMESPAN));
  };
  gpr_timespec busy_until = linger();
  for (;;) {
    // Busy: wait in gRPC, taking part in its polling, until the queue has
    // had nothing for kLingerMs.
    switch (cq->AsyncNext(&tag, &ok, busy_until)) {
      case grpc::CompletionQueue::SHUTDOWN:
        return;
      case grpc::CompletionQueue::GOT_EVENT:
        static_cast<AsyncCall*>(tag)->Proceed(ok);
        busy_until = linger();
        continue;
      case grpc::CompletionQueue::TIMEOUT:
        break;
    }
    // Idle: look at the queue every kIdleLook without waiting in gRPC,
    // until it has something again or the queues stop.
    if (!ServeIdle(cq)) break;
    busy_until = linger();
  }
  // Stopping: every call's operations end, and the shutdown drains the queue.
  Drain(cq);
}

void CompletionQueues::Drain(grpc::ServerCompletionQueue* cq) {
  void* tag = nullptr;
  bool ok = false;
  while (cq->Next(&tag, &ok)) static_cast<AsyncCall*>(tag)->Proceed(ok);
}

bool CompletionQueues::ServeIdle(grpc::ServerCompletionQueue* cq) {
  {
    util::MutexLock l(&mu_);
    ++idle_threads_;
  }
  enum { kIdle, kBusy, kEnded } state = kIdle;
  while (state == kIdle) {
    {
      util::MutexLock l(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), kIdleLook)) state = kEnded;
    }
    if (state == kEnded) break;
    void* tag = nullptr;
    bool ok = false;
    switch (cq->AsyncNext(&tag, &ok, gpr_time_0(GPR_CLOCK_MONOTONIC))) {
      case grpc::CompletionQueue::SHUTDOWN:
        state = kEnded;  // the drain after it returns at once
        break;
      case grpc::CompletionQueue::GOT_EVENT:
        static_cast<AsyncCall*>(tag)->Proceed(ok);
        state = kBusy;
        break;
      case grpc::CompletionQueue::TIMEOUT:
        break;
    }
  }
  util::MutexLock l(&mu_);
  --idle_threads_;
  return state == kBusy;
}

bool CompletionQueues::TEST_AwaitIdle(absl::Duration timeout) const {
  util::MutexLock l(&mu_);
  auto all_idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return idle_threads_ == static_cast<int>(threads_.size());
  };
  return mu_.AwaitWithTimeout(absl::Condition(&all_idle), timeout);
}

bool CompletionQueues::Enter() {
  util::MutexLock l(&mu_);
  if (stopping_) return false;
  ++calls_;
  return true;
}

void CompletionQueues::Leave() {
  util::MutexLock l(&mu_);
  --calls_;
}

void CompletionQueues::BeginStop() {
  util::MutexLock l(&mu_);
  stopping_ = true;
}

void CompletionQueues::Stop(absl::Duration wait) {
  if (stopped_) return;
  stopped_ = true;
  BeginStop();
  if (!threads_.empty()) {
    // The server is shut down: every call's operations fail, and each call
    // ends once the work it waits for (a renewal at the leader) answers.
    util::MutexLock l(&mu_);
    auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return calls_ == 0; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&none), wait)) {
      // A call still running may start an operation: the queues stay up,
      // polled, and are left to the process's exit.
      SPDLOG_ERROR("{} gRPC calls on the completion queues did not end within {}; their "
                   "queues are left running",
                   calls_, absl::FormatDuration(wait));
      for (auto& q : queues_) q.release();
      for (auto& t : threads_) t.detach();
      threads_.clear();
      return;
    }
  }
  for (auto* cq : raw_) cq->Shutdown();
  if (threads_.empty()) {
    // Never started: drain here.
    for (auto* cq : raw_) Drain(cq);
  }
  for (auto& t : threads_) t.join();
}

}  // namespace capstan::server
