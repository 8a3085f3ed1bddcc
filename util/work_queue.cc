#include "util/work_queue.h"

#include <utility>

#include "util/thread_name.h"

namespace capstan::util {

WorkQueue::WorkQueue(int threads, const std::string& name) {
  for (int i = 0; i < threads; ++i) threads_.push_back(NamedThread(name, [this] { Worker(); }));
}

WorkQueue::~WorkQueue() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void WorkQueue::Run(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> l(mu_);
    work_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

void WorkQueue::Worker() {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [this] { return stopping_ || !work_.empty(); });
      if (work_.empty()) return;  // stopping, and nothing left to run
      fn = std::move(work_.front());
      work_.pop_front();
    }
    fn();
  }
}

}  // namespace capstan::util
