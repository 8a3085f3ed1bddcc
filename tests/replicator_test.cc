// Three members in one process: each a KvStore with its own RaftLog and
// Replicator on etcd's Raft (the Go engine), joined by an in-memory
// transport that a test can cut. Writes go to any member's store, as the
// services submit them; every member applies the same entries.

#include "replication/replicator.h"

#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "mvcc/errors.h"
#include "replication/goraft/go_raft_engine.h"
#include "util/mutex.h"

namespace capstan::replication {
namespace {

// Routes messages between the members' handlers; a member that is down (or
// cut off) neither sends nor receives.
class MemoryNetwork {
 public:
  void Attach(uint64_t id, TransportHandler h) {
    util::MutexLock l(&mu_);
    handlers_[id] = std::move(h);
  }
  void SetDown(uint64_t id, bool down) {
    util::MutexLock l(&mu_);
    if (down) {
      down_.insert(id);
    } else {
      down_.erase(id);
    }
  }
  void Deliver(uint64_t from, std::vector<RaftMessage> messages) {
    for (auto& m : messages) {
      std::function<void(uint64_t, std::string)> on_message;
      std::function<void(uint64_t)> on_unreachable;
      {
        util::MutexLock l(&mu_);
        auto from_handler = handlers_.find(from);
        if (from_handler != handlers_.end()) on_unreachable = from_handler->second.on_unreachable;
        auto it = handlers_.find(m.to);
        if (it != handlers_.end() && !down_.count(m.to) && !down_.count(from)) {
          on_message = it->second.on_message;
        }
      }
      if (on_message) {
        on_message(from, std::move(m.bytes));
      } else if (on_unreachable) {
        on_unreachable(m.to);
      }
    }
  }
  std::function<absl::Status(const etcdserverpb::LeaseKeepAliveRequest&,
                             etcdserverpb::LeaseKeepAliveResponse*)>
  RenewAt(uint64_t id) {
    util::MutexLock l(&mu_);
    return handlers_[id].on_lease_renew;
  }

 private:
  util::Mutex mu_;
  std::map<uint64_t, TransportHandler> handlers_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> down_ ABSL_GUARDED_BY(mu_);
};

class MemoryTransport final : public Transport {
 public:
  MemoryTransport(uint64_t id, MemoryNetwork* net) : id_(id), net_(net) {}
  absl::Status Start(TransportHandler handler) override {
    net_->Attach(id_, std::move(handler));
    return absl::OkStatus();
  }
  void Stop() override { net_->Attach(id_, {}); }
  void AddPeer(uint64_t, const std::vector<std::string>&) override {}
  void RemovePeer(uint64_t) override {}
  void Send(std::vector<RaftMessage> messages) override { net_->Deliver(id_, std::move(messages)); }
  absl::Status LeaseRenew(uint64_t leader, const etcdserverpb::LeaseKeepAliveRequest& request,
                          etcdserverpb::LeaseKeepAliveResponse* response, int64_t) override {
    auto renew = net_->RenewAt(leader);
    if (!renew) return absl::UnavailableError("leader unreachable");
    return renew(request, response);
  }
  absl::Status LeaseTimeToLive(uint64_t, const etcdserverpb::LeaseTimeToLiveRequest&,
                               etcdserverpb::LeaseTimeToLiveResponse*, int64_t) override {
    return absl::UnimplementedError("not in this test");
  }

 private:
  const uint64_t id_;
  MemoryNetwork* const net_;
};

class ReplicatorTest : public ::testing::Test {
 protected:
  static constexpr int kMembers = 3;

  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           absl::StrCat("capstan_replicator_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    for (int i = 0; i < kMembers; ++i) {
      membership::ClusterMember m;
      m.id = 0x1000 + i;
      m.name = absl::StrCat("m", i);
      m.peer_urls = {absl::StrCat("http://127.0.0.1:", 20000 + i)};
      members_.push_back(m);
    }
    for (int i = 0; i < kMembers; ++i) StartMember(i);
  }

  void TearDown() override {
    for (int i = 0; i < kMembers; ++i) StopMember(i);
    std::filesystem::remove_all(dir_);
  }

  void StartMember(int i) {
    Member& m = nodes_[i];
    const std::string base = (dir_ / absl::StrCat("m", i)).string();
    std::filesystem::create_directories(base);
    storage::BackendOptions bo;
    bo.dir = base + "/db";
    bo.sync = false;
    auto backend = storage::Backend::Open(bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    mvcc::KvStoreOptions ko;
    ko.requires_write_log = true;
    ko.member_id = members_[i].id;
    auto store = mvcc::KvStore::Open(ko, std::move(*backend));
    ASSERT_TRUE(store.ok()) << store.status();
    m.store = std::move(*store);
    RaftLogOptions lo;
    lo.dir = base + "/raft";
    lo.sync = false;
    auto log = RaftLog::Open(lo);
    ASSERT_TRUE(log.ok()) << log.status();
    m.transport = std::make_unique<MemoryTransport>(members_[i].id, &net_);
    ReplicatorOptions ro;
    ro.member_id = members_[i].id;
    ro.cluster_id = 0xc1;
    ro.initial_members = members_;
    ro.name = members_[i].name;
    ro.tick = absl::Milliseconds(10);
    ro.election_ticks = 10;
    ro.request_timeout = absl::Seconds(5);
    m.replicator = Replicator::Create(ro, &factory_, std::move(*log), m.store.get(),
                                      m.transport.get(), nullptr);
    ASSERT_TRUE(m.transport->Start(m.replicator->handler()).ok());
    ASSERT_TRUE(m.replicator->Run().ok());
  }

  void StopMember(int i) {
    Member& m = nodes_[i];
    if (!m.replicator) return;
    m.replicator->Stop();
    m.transport->Stop();
    m.store.reset();
    m.replicator.reset();
    m.transport.reset();
  }

  // The index of the member that leads, once all live members agree.
  int WaitForLeader(absl::Duration timeout = absl::Seconds(20)) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      uint64_t lead = 0;
      bool agreed = true;
      int leader = -1;
      for (int i = 0; i < kMembers; ++i) {
        if (!nodes_[i].replicator || down_.count(i)) continue;
        const uint64_t l = nodes_[i].replicator->Leader();
        if (l == 0 || (lead != 0 && l != lead)) agreed = false;
        lead = l;
        if (nodes_[i].replicator->Leads()) leader = i;
      }
      if (agreed && leader >= 0) return leader;
      absl::SleepFor(absl::Milliseconds(5));  // polling a condition, with a deadline
    }
    return -1;
  }

  void WaitApplied(uint64_t index, absl::Duration timeout = absl::Seconds(20)) {
    const absl::Time deadline = absl::Now() + timeout;
    for (int i = 0; i < kMembers; ++i) {
      if (!nodes_[i].replicator || down_.count(i)) continue;
      while (nodes_[i].replicator->AppliedIndex() < index && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(2));
      }
      ASSERT_GE(nodes_[i].replicator->AppliedIndex(), index) << "member " << i;
    }
  }

  absl::StatusOr<etcdserverpb::PutResponse> Put(int member, const std::string& key,
                                                const std::string& value) {
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value(value);
    return nodes_[member].store->Put(req);
  }

  struct Member {
    std::unique_ptr<mvcc::KvStore> store;
    std::unique_ptr<MemoryTransport> transport;
    std::unique_ptr<Replicator> replicator;
  };

  std::filesystem::path dir_;
  std::vector<membership::ClusterMember> members_;
  GoRaftEngineFactory factory_;
  MemoryNetwork net_;
  Member nodes_[kMembers];
  std::set<int> down_;
};

TEST_F(ReplicatorTest, WritesAtAnyMemberApplyEverywhereInOneOrder) {
  ASSERT_GE(WaitForLeader(), 0);
  int64_t last_rev = 0;
  for (int n = 0; n < 60; ++n) {
    auto resp = Put(n % kMembers, absl::StrCat("k", n % 7), absl::StrCat("v", n));
    ASSERT_TRUE(resp.ok()) << resp.status();
    // Writes through any member take increasing revisions: one order.
    EXPECT_GT(resp->header().revision(), last_rev);
    last_rev = resp->header().revision();
  }
  uint64_t commit = 0;
  for (auto& m : nodes_) commit = std::max(commit, m.replicator->CommittedIndex());
  WaitApplied(commit);
  uint32_t first_hash = 0;
  for (int i = 0; i < kMembers; ++i) {
    EXPECT_EQ(nodes_[i].store->Rev(), last_rev) << "member " << i;
    uint32_t hash = 0;
    int64_t compact_rev = 0, hash_rev = 0;
    ASSERT_TRUE(nodes_[i].store->HashKV(last_rev, &hash, &compact_rev, &hash_rev).ok());
    if (i == 0) first_hash = hash;
    EXPECT_EQ(hash, first_hash) << "member " << i;
  }
}

TEST_F(ReplicatorTest, LinearizableReadAtAFollowerSeesTheLatestWrite) {
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  const int follower = (leader + 1) % kMembers;
  for (int n = 0; n < 20; ++n) {
    auto put = Put(leader, "x", absl::StrCat(n));
    ASSERT_TRUE(put.ok()) << put.status();
    absl::Notification ready;
    absl::Status barrier;
    nodes_[follower].store->ReadBarrier([&](absl::Status s) {
      barrier = s;
      ready.Notify();
    });
    ASSERT_TRUE(ready.WaitForNotificationWithTimeout(absl::Seconds(10)));
    ASSERT_TRUE(barrier.ok()) << barrier;
    EXPECT_GE(nodes_[follower].store->Rev(), put->header().revision());
  }
}

TEST_F(ReplicatorTest, LeaseIdsAndKeepAlivesAreTheCluster) {
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  const int follower = (leader + 1) % kMembers;
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(60);
  auto granted = nodes_[follower].store->LeaseGrant(grant);
  ASSERT_TRUE(granted.ok()) << granted.status();
  ASSERT_NE(granted->id(), 0);
  WaitApplied(nodes_[follower].replicator->CommittedIndex());
  for (auto& m : nodes_) EXPECT_TRUE(m.store->lessor()->Exists(granted->id()));
  // A keep-alive at a follower reaches the leader.
  absl::Notification renewed;
  absl::StatusOr<int64_t> ttl;
  nodes_[follower].store->RenewLease(granted->id(), [&](absl::StatusOr<int64_t> t) {
    ttl = t;
    renewed.Notify();
  });
  ASSERT_TRUE(renewed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_EQ(*ttl, 60);
  // Only the leader expires leases.
  EXPECT_TRUE(nodes_[leader].store->Leads());
  EXPECT_FALSE(nodes_[follower].store->Leads());
}

TEST_F(ReplicatorTest, ALeaderCutOffIsReplacedAndNoAcknowledgedWriteIsLost) {
  const int old_leader = WaitForLeader();
  ASSERT_GE(old_leader, 0);
  std::vector<int64_t> acked;
  for (int n = 0; n < 10; ++n) {
    auto r = Put(n % kMembers, absl::StrCat("a", n), "1");
    ASSERT_TRUE(r.ok()) << r.status();
    acked.push_back(r->header().revision());
  }
  net_.SetDown(members_[old_leader].id, true);
  down_.insert(old_leader);
  const int new_leader = WaitForLeader();
  ASSERT_GE(new_leader, 0);
  ASSERT_NE(new_leader, old_leader);
  for (int n = 0; n < 10; ++n) {
    auto r = Put(new_leader, absl::StrCat("b", n), "2");
    ASSERT_TRUE(r.ok()) << r.status();
  }
  // Healed, the old leader catches up and agrees.
  net_.SetDown(members_[old_leader].id, false);
  down_.erase(old_leader);
  ASSERT_GE(WaitForLeader(), 0);
  WaitApplied(nodes_[new_leader].replicator->CommittedIndex());
  const int64_t rev = nodes_[new_leader].store->Rev();
  uint32_t expect = 0;
  for (int i = 0; i < kMembers; ++i) {
    etcdserverpb::RangeRequest range;
    range.set_key("a");
    range.set_range_end("c");
    mvcc::RangeResult result;
    ASSERT_TRUE(nodes_[i].store->Range(range, &result).ok());
    EXPECT_EQ(result.count, 20) << "member " << i;
    uint32_t hash = 0;
    int64_t compact_rev = 0, hash_rev = 0;
    ASSERT_TRUE(nodes_[i].store->HashKV(rev, &hash, &compact_rev, &hash_rev).ok());
    if (i == 0) expect = hash;
    EXPECT_EQ(hash, expect) << "member " << i;
  }
}

TEST_F(ReplicatorTest, AMemberRestartedReplaysItsLogIntoTheSameState) {
  ASSERT_GE(WaitForLeader(), 0);
  for (int n = 0; n < 30; ++n) ASSERT_TRUE(Put(n % kMembers, absl::StrCat("r", n), "v").ok());
  WaitApplied(nodes_[0].replicator->CommittedIndex());
  const int64_t rev = nodes_[0].store->Rev();
  StopMember(2);
  StartMember(2);
  ASSERT_GE(WaitForLeader(), 0);
  ASSERT_TRUE(Put(0, "after", "restart").ok());
  WaitApplied(nodes_[0].replicator->CommittedIndex());
  EXPECT_EQ(nodes_[2].store->Rev(), rev + 1);
}

TEST_F(ReplicatorTest, WritesWithoutAQuorumTimeOutWithEtcdsError) {
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  for (int i = 0; i < kMembers; ++i) {
    if (i != leader) net_.SetDown(members_[i].id, true);
  }
  etcdserverpb::PutRequest req;
  req.set_key("lost");
  // The request timeout of this test's members is 5 s.
  auto r = nodes_[leader].store->Put(req);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(mvcc::Is(r.status(), mvcc::Error::kTimeout) ||
              mvcc::Is(r.status(), mvcc::Error::kTimeoutLeaderFail))
      << r.status();
}

}  // namespace
}  // namespace capstan::replication
