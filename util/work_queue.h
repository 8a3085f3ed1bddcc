// A fixed pool of named threads that run queued closures in the order they
// were queued, for service work that may wait (a read from storage, a step
// of a lock) and so must not run on a gRPC reactor thread or under a lock.

#ifndef CAPSTAN_UTIL_WORK_QUEUE_H_
#define CAPSTAN_UTIL_WORK_QUEUE_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace capstan::util {

// Thread-safe. With one thread, closures run one at a time in queue order,
// so state touched only from them needs no lock.
class WorkQueue {
 public:
  WorkQueue(int threads, const std::string& name);
  // Runs the work already queued (and whatever it queues), then joins.
  ~WorkQueue();

  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  void Run(std::function<void()> fn);

 private:
  void Worker();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> work_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace capstan::util

#endif  // CAPSTAN_UTIL_WORK_QUEUE_H_
