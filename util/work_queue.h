// A fixed pool of named threads that run queued closures in the order they
// were queued, for service work that may wait (a read from storage, a step
// of a lock) or that is CPU-heavy (a bcrypt check, a backend compaction),
// and so must run neither on a gRPC reactor thread, nor under a lock, nor on
// a thread of its own per call.
//
// Bounded threads, unbounded queue. The constructor makes every thread the
// pool will ever have; work queued while they are all busy waits its turn
// (it costs the closure's memory, nothing else). Owners that serve RPCs
// queue each call rather than refuse it: gRPC already holds the call, and
// etcd answers each one eventually.
//
// Two kinds of work:
//   Run(fn)          fn runs, always, even while the queue is being
//                    destroyed.
//   RunOrCancel(fn)  fn(true) does the work. Once the destructor has begun,
//                    work that has not started is called off instead:
//                    fn(false), on a pool thread, which must answer whoever
//                    waits for the work (say, "server stopped") and touch
//                    nothing its owner is tearing down. So work offered or
//                    still queued after shutdown began is refused, never
//                    dropped.
//
// Shutdown is the destructor: it lets the closures running finish, drains
// the queue (Run closures run, RunOrCancel closures get false, in queue
// order, including what they queue meanwhile) and joins the threads. When it
// returns, every closure ever queued has been called exactly once. An owner
// declares its queue after everything the closures use, so that the queue
// is destroyed, and drained, first.

#ifndef CAPSTAN_UTIL_WORK_QUEUE_H_
#define CAPSTAN_UTIL_WORK_QUEUE_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "util/mutex.h"

namespace capstan::util {

// Thread-safe: Run and RunOrCancel may be called from any thread, the
// pool's own closures included (also while the destructor drains the
// queue). With one thread, closures run one at a time in queue order, so
// state touched only from them needs no lock.
class WorkQueue {
 public:
  // REQUIRES: threads >= 1. The threads are named `name` (first 15
  // characters).
  WorkQueue(int threads, const std::string& name);
  // Runs or calls off what is queued (see above), then joins the threads.
  // REQUIRES: no thread other than the pool's calls Run or RunOrCancel from
  // the moment the destructor begins.
  ~WorkQueue();

  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  // Queues fn; a pool thread runs it.
  void Run(std::function<void()> fn);
  // Queues fn; a pool thread calls it once: fn(true) to do the work, or
  // fn(false) if the destructor began before the work started.
  void RunOrCancel(std::function<void(bool run)> fn);

  int threads() const { return static_cast<int>(threads_.size()); }
  // True once the destructor has begun: long work may check it to end
  // early.
  bool stopping() const;

 private:
  struct Work {
    std::function<void(bool run)> fn;
    bool cancellable;
  };

  void Push(Work work);
  void Worker();

  // Never held while a closure runs.
  mutable Mutex mu_;
  std::deque<Work> work_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Written by the constructor only.
  std::vector<std::thread> threads_;
};

}  // namespace capstan::util

#endif  // CAPSTAN_UTIL_WORK_QUEUE_H_
