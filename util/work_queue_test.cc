#include "util/work_queue.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace capstan::util {
namespace {

// Blocks the closures that wait on it until Open.
class Gate {
 public:
  void Wait() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return open_; });
  }
  void Open() {
    std::lock_guard<std::mutex> l(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

void WaitUntil(const std::function<bool()>& cond) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!cond()) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up) << "condition never held";
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// Destroys q on a thread of its own once `release` runs: the destructor has
// begun (q->stopping()) when the gate opens.
std::thread DestroyThenOpen(std::unique_ptr<WorkQueue>* q, Gate* gate) {
  WorkQueue* raw = q->get();
  std::thread destroyer([q] { q->reset(); });
  WaitUntil([raw] { return raw->stopping(); });
  gate->Open();
  return destroyer;
}

TEST(WorkQueueTest, RunsEveryClosureOnNoMoreThanItsThreads) {
  constexpr int kThreads = 3;
  constexpr int kClosures = 10000;
  std::atomic<int> running{0}, peak{0}, ran{0};
  std::mutex ids_mu;
  std::set<std::thread::id> ids;
  {
    WorkQueue q(kThreads, "wq-test");
    EXPECT_EQ(q.threads(), kThreads);
    for (int i = 0; i < kClosures; ++i) {
      auto work = [&] {
        const int now = running.fetch_add(1) + 1;
        int seen = peak.load();
        while (now > seen && !peak.compare_exchange_weak(seen, now)) {
        }
        {
          std::lock_guard<std::mutex> l(ids_mu);
          ids.insert(std::this_thread::get_id());
        }
        running.fetch_sub(1);
        ran.fetch_add(1);
      };
      if (i % 2 == 0) {
        q.Run(work);
      } else {
        q.RunOrCancel([work](bool run) {
          EXPECT_TRUE(run);  // queued before any shutdown
          work();
        });
      }
    }
    WaitUntil([&] { return ran.load() == kClosures; });
    EXPECT_FALSE(q.stopping());
  }
  EXPECT_EQ(ran.load(), kClosures);
  EXPECT_LE(peak.load(), kThreads);
  EXPECT_LE(ids.size(), static_cast<size_t>(kThreads));
  EXPECT_EQ(ids.count(std::this_thread::get_id()), 0u);
}

TEST(WorkQueueTest, OneThreadRunsInQueueOrder) {
  std::vector<int> order;
  {
    WorkQueue q(1, "wq-test");
    for (int i = 0; i < 100; ++i) q.Run([&order, i] { order.push_back(i); });
  }
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

// Shutdown with a queue full of calls: the one running finishes its work,
// every queued cancellable call is answered (called with false) instead of
// run or dropped, and plain closures still run, in queue order.
TEST(WorkQueueTest, DestructorAnswersEveryQueuedCall) {
  constexpr int kCalls = 1000;
  Gate gate;
  std::mutex mu;
  std::vector<int> answered;  // call index, negative when called off
  std::atomic<int> plain_ran{0};
  auto q = std::make_unique<WorkQueue>(1, "wq-test");
  std::atomic<bool> started{false};
  q->RunOrCancel([&](bool run) {
    started = true;
    gate.Wait();  // the pool's only thread is busy until shutdown began
    std::lock_guard<std::mutex> l(mu);
    answered.push_back(run ? 0 : -1);
  });
  for (int i = 1; i <= kCalls; ++i) {
    q->RunOrCancel([&, i](bool run) {
      std::lock_guard<std::mutex> l(mu);
      answered.push_back(run ? i : -i);
    });
    if (i % 100 == 0) q->Run([&] { plain_ran.fetch_add(1); });
  }
  WaitUntil([&] { return started.load(); });
  std::thread destroyer = DestroyThenOpen(&q, &gate);
  destroyer.join();

  ASSERT_EQ(answered.size(), static_cast<size_t>(kCalls + 1));
  EXPECT_EQ(answered[0], 0) << "the call already running does its work";
  for (int i = 1; i <= kCalls; ++i) EXPECT_EQ(answered[i], -i) << "queued call " << i;
  EXPECT_EQ(plain_ran.load(), kCalls / 100);
}

// What closures queue while the queue drains is drained too: plain work
// runs, cancellable work is called off; nothing is lost.
TEST(WorkQueueTest, WorkQueuedWhileDrainingIsDrained) {
  Gate gate;
  std::atomic<int> ran{0}, called_off{0};
  auto q = std::make_unique<WorkQueue>(2, "wq-test");
  WorkQueue* raw = q.get();
  for (int t = 0; t < 2; ++t) {
    q->Run([&, raw] {
      gate.Wait();
      for (int i = 0; i < 50; ++i) {
        raw->Run([&, raw] {
          ran.fetch_add(1);
          raw->RunOrCancel([&](bool run) { (run ? ran : called_off).fetch_add(1); });
        });
        raw->RunOrCancel([&](bool run) { (run ? ran : called_off).fetch_add(1); });
      }
    });
  }
  std::thread destroyer = DestroyThenOpen(&q, &gate);
  destroyer.join();
  EXPECT_EQ(ran.load(), 2 * 50);         // the plain closures
  EXPECT_EQ(called_off.load(), 2 * 100);  // both kinds of cancellable ones
}

// A burst far larger than the pool, then shutdown in the middle: every call
// is called exactly once, some with their work done, the rest called off.
TEST(WorkQueueTest, BurstThenShutdownCallsEachOnce) {
  constexpr int kCalls = 10000;
  std::vector<std::atomic<int>> calls(kCalls);
  std::atomic<int> ran{0}, called_off{0};
  {
    WorkQueue q(2, "wq-test");
    for (int i = 0; i < kCalls; ++i) {
      q.RunOrCancel([&, i](bool run) {
        calls[i].fetch_add(1);
        if (run) {
          std::this_thread::sleep_for(std::chrono::microseconds(50));
          ran.fetch_add(1);
        } else {
          called_off.fetch_add(1);
        }
      });
    }
    WaitUntil([&] { return ran.load() >= 10; });
  }
  for (int i = 0; i < kCalls; ++i) ASSERT_EQ(calls[i].load(), 1) << "call " << i;
  EXPECT_EQ(ran.load() + called_off.load(), kCalls);
  EXPECT_GT(called_off.load(), 0);
}

}  // namespace
}  // namespace capstan::util
