#include "server/api/completion_queues.h"

#include <pthread.h>

#include <string>

#include "absl/strings/str_cat.h"
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
    threads_.emplace_back([cq = raw_[i], i] {
      pthread_setname_np(pthread_self(), absl::StrCat("grpc-cq-", i).c_str());
      void* tag = nullptr;
      bool ok = false;
      while (cq->Next(&tag, &ok)) static_cast<AsyncCall*>(tag)->Proceed(ok);
    });
  }
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
    for (auto* cq : raw_) {
      void* tag = nullptr;
      bool ok = false;
      while (cq->Next(&tag, &ok)) static_cast<AsyncCall*>(tag)->Proceed(ok);
    }
  }
  for (auto& t : threads_) t.join();
}

}  // namespace capstan::server
