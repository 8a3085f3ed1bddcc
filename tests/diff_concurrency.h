// Shared by the differential tests of etcd's Lock and Election services
// (diff_concurrency_test.cc: locks, random recipe sequences, shutdown;
// diff_concurrency_election_test.cc: elections and Observe; one binary,
// diff_concurrency_test): calls left waiting on their own thread, an Observe
// reader, request builders and the fixture.

#ifndef CAPSTAN_TESTS_DIFF_CONCURRENCY_H_
#define CAPSTAN_TESTS_DIFF_CONCURRENCY_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "diff_fixture.h"

namespace capstan::testing {

using v3electionpb::CampaignRequest;
using v3electionpb::CampaignResponse;
using v3electionpb::LeaderKey;
using v3electionpb::LeaderRequest;
using v3electionpb::LeaderResponse;
using v3electionpb::ProclaimRequest;
using v3electionpb::ResignRequest;
using v3lockpb::LockRequest;
using v3lockpb::LockResponse;
using v3lockpb::UnlockRequest;

// A lease ID as Go's %x prints it, as etcd names a lock's or a candidate's
// key: lower-case hex, a minus sign before negative ones.
inline std::string GoHex(int64_t id) {
  char buf[32];
  uint64_t magnitude = id < 0 ? 0 - static_cast<uint64_t>(id) : static_cast<uint64_t>(id);
  std::snprintf(buf, sizeof(buf), "%s%llx", id < 0 ? "-" : "",
                static_cast<unsigned long long>(magnitude));
  return buf;
}

// A unary call left waiting on its own thread (a contended Lock, a Campaign
// behind a leader) until it is answered or cancelled.
template <typename Resp>
class Waiting {
 public:
  template <typename Stub, typename Req>
  Waiting(Stub* stub, grpc::Status (Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
          const Req& req, std::chrono::seconds deadline = std::chrono::seconds(30)) {
    ctx_.set_deadline(std::chrono::system_clock::now() + deadline);
    thread_ = std::thread([this, stub, method, req] {
      answer_.status = (stub->*method)(&ctx_, req, &answer_.resp);
      done_.store(true);
    });
  }
  ~Waiting() {
    if (thread_.joinable()) {
      ctx_.TryCancel();
      thread_.join();
    }
  }
  bool done() const { return done_.load(); }
  void Cancel() { ctx_.TryCancel(); }
  Answer<Resp> Wait() {
    thread_.join();
    return answer_;
  }

 private:
  grpc::ClientContext ctx_;
  Answer<Resp> answer_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};
// Reads an Observe stream on its own thread.
class Observer {
 public:
  Observer(v3electionpb::Election::Stub* stub, const std::string& name) {
    ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    LeaderRequest r;
    r.set_name(name);
    reader_ = stub->Observe(&ctx_, r);
    thread_ = std::thread([this] {
      LeaderResponse resp;
      while (reader_->Read(&resp)) {
        std::lock_guard<std::mutex> l(mu_);
        got_.push_back(resp);
      }
    });
  }
  ~Observer() {
    ctx_.TryCancel();
    thread_.join();
  }
  size_t size() {
    std::lock_guard<std::mutex> l(mu_);
    return got_.size();
  }
  std::vector<LeaderResponse> got() {
    std::lock_guard<std::mutex> l(mu_);
    return got_;
  }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReader<LeaderResponse>> reader_;
  std::mutex mu_;
  std::vector<LeaderResponse> got_;
  std::thread thread_;
};
// An observer on Capstan that reads nothing while the leader proclaims
// (ProclaimToAnObserverThatDoesNotRead).
struct HeldBackObserver {
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReader<LeaderResponse>> reader;
  LeaderKey leader;
  int64_t last_rev = 0;  // of the last proclamation
};

class DiffConcurrencyTest : public DiffTest {
 protected:
  static LockRequest LockR(const std::string& name, int64_t lease) {
    LockRequest r;
    r.set_name(name);
    r.set_lease(lease);
    return r;
  }
  static UnlockRequest UnlockR(const std::string& key) {
    UnlockRequest r;
    r.set_key(key);
    return r;
  }
  static CampaignRequest CampaignR(const std::string& name, int64_t lease,
                                   const std::string& value) {
    CampaignRequest r;
    r.set_name(name);
    r.set_lease(lease);
    r.set_value(value);
    return r;
  }
  static LeaderRequest LeaderR(const std::string& name) {
    LeaderRequest r;
    r.set_name(name);
    return r;
  }
  static ProclaimRequest ProclaimR(const LeaderKey& leader, const std::string& value) {
    ProclaimRequest r;
    *r.mutable_leader() = leader;
    r.set_value(value);
    return r;
  }
  static ResignRequest ResignR(const LeaderKey& leader) {
    ResignRequest r;
    *r.mutable_leader() = leader;
    return r;
  }
  static etcdserverpb::RangeRequest PrefixR(const std::string& prefix) {
    etcdserverpb::RangeRequest r;
    r.set_key(prefix);
    r.set_range_end(PrefixEnd(prefix));
    return r;
  }

  // A Lock left waiting on each server, etcd's first.
  struct WaitingPair {
    std::unique_ptr<Waiting<LockResponse>> etcd, capstan;
  };
  WaitingPair LockInBackground(const LockRequest& r) {
    WaitingPair w;
    w.etcd = std::make_unique<Waiting<LockResponse>>(etcd_stubs().lock.get(),
                                                     &v3lockpb::Lock::Stub::Lock, r);
    w.capstan = std::make_unique<Waiting<LockResponse>>(capstan_stubs().lock.get(),
                                                        &v3lockpb::Lock::Stub::Lock, r);
    return w;
  }
  // Lock K("lock") held with lease a, and a second Lock with lease b
  // waiting behind it on both servers (its key is in).
  struct Contention {
    int64_t a = 0, b = 0;
    AnswerPair<LockResponse> first;
    WaitingPair second;
  };
  Contention LockBehindAHolder() {
    Contention c;
    c.a = GrantBoth(60);
    c.b = GrantBoth(60);
    c.first = Both(LockR(K("lock"), c.a));
    EXPECT_SAME(c.first);
    c.second = LockInBackground(LockR(K("lock"), c.b));
    AwaitKeyOnBoth(K("lock/") + GoHex(c.b));
    return c;
  }

  struct CampaignPair {
    std::unique_ptr<Waiting<CampaignResponse>> etcd, capstan;
  };
  CampaignPair CampaignInBackground(const CampaignRequest& r) {
    CampaignPair w;
    w.etcd = std::make_unique<Waiting<CampaignResponse>>(
        etcd_stubs().election.get(), &v3electionpb::Election::Stub::Campaign, r);
    w.capstan = std::make_unique<Waiting<CampaignResponse>>(
        capstan_stubs().election.get(), &v3electionpb::Election::Stub::Campaign, r);
    return w;
  }

  // A leader of K("election") (first value "v0") that proclaims `count`
  // values value(1..count) while an observer on Capstan, opened before,
  // reads nothing. Values of 32 KiB or more make that more than the
  // stream's flow-control window, so the server must hold them back.
  void ProclaimToAnObserverThatDoesNotRead(int count, const std::function<std::string(int)>& value,
                                           HeldBackObserver* out) {
    int64_t a = GrantBoth(60);
    auto leader = Both(CampaignR(K("election"), a, "v0"));
    ASSERT_SAME(leader);
    out->leader = leader.etcd.resp.leader();
    out->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    out->reader = capstan_stubs().election->Observe(&out->ctx, LeaderR(K("election")));
    for (int i = 1; i <= count; ++i) {
      auto p = Both(ProclaimR(out->leader, value(i)));
      ASSERT_SAME(p);
      out->last_rev = p.capstan.resp.header().revision();
    }
  }

  // Waits until `key` exists on both servers (a waiter's key is put before
  // it starts waiting). Both servers then have applied the same writes.
  void AwaitKeyOnBoth(const std::string& key) { AwaitOnBoth(key, true); }
  // Waits until `key` is gone from both servers.
  void AwaitNoKeyOnBoth(const std::string& key) { AwaitOnBoth(key, false); }

  // What shows that a call is waiting behind an older key under prefix (a
  // Lock behind its holder, a Campaign behind the leader), checked without
  // waiting for time to pass: its own key is under prefix on both servers
  // and is not the oldest there, both servers list the same keys, and,
  // after both have answered those reads, the call has returned on
  // neither. REQUIRES: key is in on both (AwaitKeyOnBoth).
  template <typename Resp>
  void ExpectWaitingOnBoth(const std::string& prefix, const std::string& key,
                           const Waiting<Resp>& on_etcd, const Waiting<Resp>& on_capstan) {
    auto keys = Both(PrefixR(prefix));
    EXPECT_SAME(keys);
    int64_t own = 0, oldest = INT64_MAX;
    for (const auto& kv : keys.capstan.resp.kvs()) {
      if (kv.key() == key) own = kv.create_revision();
      oldest = std::min(oldest, kv.create_revision());
    }
    EXPECT_NE(own, 0) << key << " is not under " << prefix;
    EXPECT_LT(oldest, own) << key << " is the oldest key under " << prefix;
    EXPECT_FALSE(on_etcd.done()) << "etcd answered a call that must wait";
    EXPECT_FALSE(on_capstan.done()) << "Capstan answered a call that must wait";
  }

 private:
  void AwaitOnBoth(const std::string& key, bool present) {
    etcdserverpb::RangeRequest r;
    r.set_key(key);
    const int want = present ? 1 : 0;
    for (int i = 0; i < 500; ++i) {
      auto p = Both(r);
      if (p.etcd.resp.kvs_size() == want && p.capstan.resp.kvs_size() == want) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ADD_FAILURE() << "key " << key << (present ? " did not appear on both servers"
                                               : " is still on a server");
  }
};

}  // namespace capstan::testing

#endif  // CAPSTAN_TESTS_DIFF_CONCURRENCY_H_
