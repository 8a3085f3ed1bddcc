#include "util/work_queue.h"

#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "util/check.h"
#include "util/thread_name.h"

namespace capstan::util {

WorkQueue::WorkQueue(int threads, const std::string& name) {
  CHECK(threads >= 1) << "a work queue needs a thread: " << name;
  threads_.reserve(threads);
  for (int i = 0; i < threads; ++i) threads_.push_back(NamedThread(name, [this] { Worker(); }));
}

WorkQueue::~WorkQueue() {
  {
    MutexLock l(&mu_);
    stopping_ = true;
  }
  for (auto& t : threads_) t.join();
}

void WorkQueue::Run(std::function<void()> fn) {
  Push(Work{[fn = std::move(fn)](bool) { fn(); }, /*cancellable=*/false});
}

void WorkQueue::RunOrCancel(std::function<void(bool run)> fn) {
  Push(Work{std::move(fn), /*cancellable=*/true});
}

bool WorkQueue::stopping() const {
  MutexLock l(&mu_);
  return stopping_;
}

void WorkQueue::Push(Work work) {
  MutexLock l(&mu_);
  work_.push_back(std::move(work));
}

void WorkQueue::Worker() {
  for (;;) {
    Work work;
    bool run;
    {
      MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !work_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::InfiniteDuration());
      // Stopping, and nothing left: a closure still running on another
      // thread may queue more, and that thread then runs it.
      if (work_.empty()) return;
      work = std::move(work_.front());
      work_.pop_front();
      run = !(stopping_ && work.cancellable);
    }
    work.fn(run);
  }
}

}  // namespace capstan::util
