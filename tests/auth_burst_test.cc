// A burst of Authenticate calls against a real capstan process with auth on.
//
// Every Authenticate is a bcrypt check, CPU-heavy by design. Capstan runs
// them on the auth service's fixed pool of a few threads (queued when the
// pool is busy), not on a thread per call: 10,000 calls in flight must leave
// the server's thread count (sampled from /proc/<pid>/status) bounded, and
// each call must still be answered as etcd answers it: a token for the right
// password, InvalidArgument "etcdserver: authentication failed, invalid user
// ID or password" for a wrong one (checked against real etcd when it is
// installed). A server stopped in the middle of a burst drains its queue:
// it exits cleanly and promptly, and no call is left without an answer.
//
// Run against another binary (e.g. an older build) with CAPSTAN_BINARY=...

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpc_reply.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "process_fixture.h"

namespace capstan::testing {
namespace {

using etcdserverpb::Auth;
using Clock = std::chrono::steady_clock;

constexpr char kRootPassword[] = "rootpw";
const Reply kOk{grpc::OK, ""};
// etcd's ErrGRPCAuthFailed (etcdserver/api/v3rpc/rpctypes).
const Reply kAuthFailed{grpc::INVALID_ARGUMENT,
                        "etcdserver: authentication failed, invalid user ID or password"};

// The "Threads:" line of /proc/<pid>/status; -1 once the process is gone.
int ThreadCount(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Threads:", 0) != 0) continue;
    int n = -1;
    return absl::SimpleAtoi(line.substr(8), &n) ? n : -1;
  }
  return -1;
}

// Samples a process's thread count every millisecond on a thread of its own
// until destroyed; keeps the peak.
class ThreadSampler {
 public:
  explicit ThreadSampler(pid_t pid) : pid_(pid), thread_([this] { Loop(); }) {}
  ~ThreadSampler() {
    stop_ = true;
    thread_.join();
  }
  int peak() const { return peak_.load(); }
  int samples() const { return samples_.load(); }

 private:
  void Loop() {
    while (!stop_) {
      const int n = ThreadCount(pid_);
      if (n > 0) {
        samples_.fetch_add(1);
        int seen = peak_.load();
        while (n > seen && !peak_.compare_exchange_weak(seen, n)) {
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  const pid_t pid_;
  std::atomic<bool> stop_{false};
  std::atomic<int> peak_{0};
  std::atomic<int> samples_{0};
  std::thread thread_;
};

// A unary Auth call with a deadline; its status as a Reply.
template <typename Req, typename Resp>
Reply Unary(Auth::Stub* stub,
            grpc::Status (Auth::Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
            const Req& req, Resp* resp) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  return ReplyOf((stub->*method)(&ctx, req, resp));
}

// etcdctl's `user add root` + `auth enable` over gRPC: the root user with
// kRootPassword, the root role granted to it, auth on.
void EnableAuth(const ServerProcess& server) {
  auto stub = Auth::NewStub(server.NewChannel());
  {
    etcdserverpb::AuthUserAddRequest req;
    req.set_name("root");
    req.set_password(kRootPassword);
    etcdserverpb::AuthUserAddResponse resp;
    ASSERT_EQ(Unary(stub.get(), &Auth::Stub::UserAdd, req, &resp), kOk);
  }
  {
    etcdserverpb::AuthRoleAddRequest req;
    req.set_name("root");
    etcdserverpb::AuthRoleAddResponse resp;
    ASSERT_EQ(Unary(stub.get(), &Auth::Stub::RoleAdd, req, &resp), kOk);
  }
  {
    etcdserverpb::AuthUserGrantRoleRequest req;
    req.set_user("root");
    req.set_role("root");
    etcdserverpb::AuthUserGrantRoleResponse resp;
    ASSERT_EQ(Unary(stub.get(), &Auth::Stub::UserGrantRole, req, &resp), kOk);
  }
  {
    etcdserverpb::AuthEnableRequest req;
    etcdserverpb::AuthEnableResponse resp;
    ASSERT_EQ(Unary(stub.get(), &Auth::Stub::AuthEnable, req, &resp), kOk);
  }
}

// A burst of asynchronous Authenticate calls for root: call i has the wrong
// password when i % 3 == 0 (a third of them), the right one otherwise. The
// calls are spread over a few connections.
class Burst {
 public:
  static bool RightPassword(int i) { return i % 3 != 0; }

  Burst(const ServerProcess& server, int calls, std::chrono::seconds deadline) {
    calls_.reserve(calls);
    for (int c = 0; c < kChannels; ++c) stubs_.push_back(Auth::NewStub(server.NewChannel()));
    const auto at = std::chrono::system_clock::now() + deadline;
    for (int i = 0; i < calls; ++i) {
      auto call = std::make_unique<Call>();
      call->ctx.set_deadline(at);
      call->req.set_name("root");
      call->req.set_password(RightPassword(i) ? kRootPassword : "wrong");
      calls_.push_back(std::move(call));
    }
  }

  // Cancels the calls still in flight (a test that failed half-way) and
  // waits for their answers.
  ~Burst() {
    if (!fired_) return;
    for (auto& call : calls_) call->ctx.TryCancel();
    WaitAll();
  }

  // Starts every call; returns at once.
  void Fire() {
    fired_ = true;
    for (size_t i = 0; i < calls_.size(); ++i) {
      Call* call = calls_[i].get();
      stubs_[i % stubs_.size()]->async()->Authenticate(&call->ctx, &call->req, &call->resp,
                                                       [this, call](grpc::Status s) {
                                                         call->status = std::move(s);
                                                         std::lock_guard<std::mutex> l(mu_);
                                                         ++answered_;
                                                         cv_.notify_all();
                                                       });
    }
  }

  int answered() {
    std::lock_guard<std::mutex> l(mu_);
    return answered_;
  }

  // Waits until every call has its answer (each has a deadline, so this
  // returns).
  void WaitAll() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return answered_ == static_cast<int>(calls_.size()); });
  }

  // Call i's answer. REQUIRES: WaitAll returned.
  const grpc::Status& status(int i) const { return calls_[i]->status; }
  const std::string& token(int i) const { return calls_[i]->resp.token(); }

 private:
  static constexpr int kChannels = 4;
  struct Call {
    grpc::ClientContext ctx;
    etcdserverpb::AuthenticateRequest req;
    etcdserverpb::AuthenticateResponse resp;
    grpc::Status status;
  };

  std::vector<std::unique_ptr<Auth::Stub>> stubs_;
  std::vector<std::unique_ptr<Call>> calls_;
  bool fired_ = false;
  std::mutex mu_;
  std::condition_variable cv_;
  int answered_ = 0;
};

class AuthBurstTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CAPSTAN_REQUIRE_REFERENCE("capstan", CapstanBinary());
  }

  // capstan with auth on (root / kRootPassword) and bcrypt at `cost`.
  static std::unique_ptr<ServerProcess> StartCapstan(int cost) {
    ServerOptions o = ServerOptions::Capstan();
    o.extra_args.push_back(absl::StrCat("--bcrypt-cost=", cost));
    o.stop_timeout = std::chrono::seconds(60);
    auto server = ServerProcess::Start(o);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return nullptr;
    EnableAuth(**server);
    return std::move(*server);
  }
};

// What real etcd answers an Authenticate with a wrong password, compared to
// the text the burst expects.
TEST_F(AuthBurstTest, WrongPasswordAnswerIsEtcds) {
  CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
  auto etcd = ServerProcess::Start(ServerOptions::Etcd());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  ASSERT_NO_FATAL_FAILURE(EnableAuth(**etcd));
  auto stub = Auth::NewStub((*etcd)->NewChannel());
  etcdserverpb::AuthenticateRequest req;
  req.set_name("root");
  req.set_password("wrong");
  etcdserverpb::AuthenticateResponse resp;
  EXPECT_EQ(Unary(stub.get(), &Auth::Stub::Authenticate, req, &resp), kAuthFailed);
  req.set_password(kRootPassword);
  EXPECT_EQ(Unary(stub.get(), &Auth::Stub::Authenticate, req, &resp), kOk);
  EXPECT_FALSE(resp.token().empty());
}

// 10,000 Authenticate calls in flight at once. The bound on the server's
// threads is what it runs idle (gRPC's pollers and executor, the committer,
// RocksDB's background threads, the services' pools, the auth pool's 2 to 8
// bcrypt threads among them: about 40 on two cores) plus 64 for what gRPC
// adds under a burst of calls (a thread or two here). A thread per call
// would be 10,000; before the pool, this burst peaked at 470 to 700 on two
// cores (calls arrive only as fast as gRPC hands them over).
TEST_F(AuthBurstTest, TenThousandCallsDoNotMakeTenThousandThreads) {
  constexpr int kCalls = 10000;
  constexpr int kMaxAddedThreads = 64;
  // Cost 4 (bcrypt's minimum, a millisecond or two a check) keeps the burst
  // to seconds on two cores; each check still takes long enough that a
  // thread per call piles up.
  auto server = StartCapstan(4);
  ASSERT_NE(server, nullptr);
  if (HasFatalFailure()) return;
  const pid_t pid = server->pid();
  const int idle = ThreadCount(pid);
  ASSERT_GT(idle, 0);

  Burst burst(*server, kCalls, std::chrono::seconds(240));
  const auto start = Clock::now();
  int peak = 0, samples = 0;
  {
    ThreadSampler sampler(pid);
    burst.Fire();
    burst.WaitAll();
    peak = sampler.peak();
    samples = sampler.samples();
  }
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  std::cout << "threads: idle " << idle << ", peak " << peak << " (" << samples
            << " samples) during " << kCalls << " Authenticate calls in " << took.count()
            << " ms\n";
  RecordProperty("idle_threads", idle);
  RecordProperty("peak_threads", peak);

  int tokens = 0, refused = 0, other = 0;
  std::string first_other;
  for (int i = 0; i < kCalls; ++i) {
    const Reply r = ReplyOf(burst.status(i));
    if (Burst::RightPassword(i) && r == kOk && !burst.token(i).empty()) {
      ++tokens;
    } else if (!Burst::RightPassword(i) && r == kAuthFailed) {
      ++refused;
    } else {
      if (other++ == 0) first_other = absl::StrCat("call ", i, ": ", r.ToString());
    }
  }
  EXPECT_EQ(other, 0) << "first unexpected answer: " << first_other;
  EXPECT_EQ(tokens + refused, kCalls);
  EXPECT_GT(samples, 0);
  EXPECT_LE(peak, idle + kMaxAddedThreads) << "idle " << idle;
  EXPECT_TRUE(server->running());
}

// SIGTERM while a burst is queued behind the pool: the server answers what
// it can, calls the rest off, and exits 0 within a few seconds; every call
// has an answer (a token, etcd's auth failure, or Unavailable as the server
// stops) well before its deadline.
TEST_F(AuthBurstTest, StopDuringBurstAnswersEveryCall) {
  constexpr int kCalls = 2000;
  // Cost 8 (~20 ms a check): the queue takes far longer than the stop.
  auto server = StartCapstan(8);
  ASSERT_NE(server, nullptr);
  if (HasFatalFailure()) return;
  Burst burst(*server, kCalls, std::chrono::seconds(120));
  burst.Fire();
  const auto wait_until = Clock::now() + std::chrono::seconds(30);
  while (burst.answered() < 10 && Clock::now() < wait_until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_GE(burst.answered(), 10);
  ASSERT_LT(burst.answered(), kCalls) << "the burst ended before the stop";

  const auto start = Clock::now();
  const ExitInfo exit = server->Stop();
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  burst.WaitAll();
  const auto all = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start);
  std::cout << "stopped in " << took.count() << " ms (" << exit.ToString()
            << "), every call answered " << all.count() << " ms after SIGTERM\n";
  EXPECT_TRUE(exit.exited && exit.exit_code == 0) << exit.ToString();
  // The server waits up to 5 s for unary calls in flight, then cancels them.
  EXPECT_LT(took, std::chrono::seconds(20));
  EXPECT_LT(all, std::chrono::seconds(30));

  int tokens = 0, refused = 0, stopped = 0, other = 0;
  std::map<std::string, int> stopped_answers;
  std::string first_other;
  for (int i = 0; i < kCalls; ++i) {
    const grpc::Status& s = burst.status(i);
    const Reply r = ReplyOf(s);
    if (Burst::RightPassword(i) && s.ok() && !burst.token(i).empty()) {
      ++tokens;
    } else if (!Burst::RightPassword(i) && r == kAuthFailed) {
      ++refused;
    } else if (s.error_code() == grpc::UNAVAILABLE || s.error_code() == grpc::CANCELLED) {
      if (stopped_answers[r.ToString()]++ == 0) std::cout << "stopped: " << r.ToString() << "\n";
      ++stopped;
    } else if (other++ == 0) {
      first_other = absl::StrCat("call ", i, ": ", r.ToString());
    }
  }
  std::cout << tokens << " tokens, " << refused << " refused, " << stopped
            << " stopped with the server\n";
  EXPECT_EQ(other, 0) << "first unexpected answer: " << first_other;
  EXPECT_GT(stopped, 0);
}

}  // namespace
}  // namespace capstan::testing
