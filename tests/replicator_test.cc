// Three members in one process: each a KvStore with its own RaftLog and
// Replicator on etcd's Raft (the Go engine), joined by an in-memory
// transport that a test can cut. Writes go to any member's store, as the
// services submit them; every member applies the same entries.

#include "replication/replicator.h"

#include <atomic>
#include <filesystem>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "mvcc/errors.h"
#include "replication/goraft/go_raft_engine.h"
#include "storage/testing/fault_injection_fs.h"
#include "util/mutex.h"

namespace capstan::replication {
namespace {

// raftpb.MessageType values the tests look for.
constexpr uint32_t kMsgProp = 2;
constexpr uint32_t kMsgAppResp = 4;

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
  // Messages of raftpb type `type` delivered to member `to` so far.
  int Delivered(uint64_t to, uint32_t type) {
    util::MutexLock l(&mu_);
    return delivered_[{to, type}];
  }
  // The next `n` proposals a follower forwards to the leader are lost, as
  // a leader that transfers leadership drops them.
  void DropProposals(int n) {
    util::MutexLock l(&mu_);
    drop_proposals_ = n;
  }
  void Deliver(uint64_t from, std::vector<RaftMessage> messages) {
    for (auto& m : messages) {
      std::function<void(uint64_t, std::string)> on_message;
      std::function<void(uint64_t)> on_unreachable;
      {
        util::MutexLock l(&mu_);
        if (m.type == kMsgProp && drop_proposals_ > 0) {
          --drop_proposals_;
          continue;
        }
        auto from_handler = handlers_.find(from);
        if (from_handler != handlers_.end()) on_unreachable = from_handler->second.on_unreachable;
        auto it = handlers_.find(m.to);
        if (it != handlers_.end() && !down_.count(m.to) && !down_.count(from)) {
          on_message = it->second.on_message;
          ++delivered_[{m.to, m.type}];
        }
      }
      if (on_message) {
        on_message(from, std::move(m.bytes));
      } else if (on_unreachable) {
        on_unreachable(m.to);
      }
    }
  }
  // Copies the checkpoint's files into the receiver's snapshot dir, as the
  // peer transport does, then hands it the MsgSnap. With an interruption
  // armed, the copy stops halfway and the stream fails instead.
  absl::Status DeliverSnapshot(uint64_t from, uint64_t to, const std::string& dir,
                               const std::string& message) {
    TransportHandler h;
    bool interrupt = false;
    {
      util::MutexLock l(&mu_);
      auto it = handlers_.find(to);
      if (it == handlers_.end() || down_.count(to) || down_.count(from)) {
        return absl::UnavailableError("peer unreachable");
      }
      h = it->second;
      if (interrupted_snapshots_ > 0) {
        --interrupted_snapshots_;
        interrupt = true;
      }
      ++snapshots_;
    }
    if (h.snapshot_dir.empty() || !h.on_snapshot) return absl::UnimplementedError("no snapshots");
    std::filesystem::remove_all(h.snapshot_dir);
    std::filesystem::create_directories(h.snapshot_dir);
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
    for (size_t i = 0; i < files.size(); ++i) {
      if (interrupt && i >= files.size() / 2) return absl::UnavailableError("stream broken");
      std::filesystem::copy_file(files[i], std::filesystem::path(h.snapshot_dir) / files[i].filename());
    }
    return h.on_snapshot(from, message);
  }
  void InterruptSnapshots(int n) {
    util::MutexLock l(&mu_);
    interrupted_snapshots_ = n;
  }
  int Snapshots() {
    util::MutexLock l(&mu_);
    return snapshots_;
  }
  using RenewHandler =
      std::function<void(const etcdserverpb::LeaseKeepAliveRequest&,
                         etcdserverpb::LeaseKeepAliveResponse*, absl::AnyInvocable<void(absl::Status)>)>;
  // The leader's renewal handler, as member `from` reaches it: none when
  // either is down, or while renewals are set to fail; while renewals are
  // held, one that parks the renewal (HoldRenewals).
  RenewHandler RenewAt(uint64_t from, uint64_t id) {
    util::MutexLock l(&mu_);
    ++renewals_forwarded_;
    if (down_.count(from) || down_.count(id)) return {};
    if (failing_renewals_ > 0) {
      --failing_renewals_;
      return {};
    }
    RenewHandler renew = handlers_[id].on_lease_renew;
    if (hold_renewals_ == 0 || !renew) return renew;
    return [this, renew](const etcdserverpb::LeaseKeepAliveRequest& request,
                         etcdserverpb::LeaseKeepAliveResponse* response,
                         absl::AnyInvocable<void(absl::Status)> done) {
      auto held = std::make_shared<HeldRenewal>(HeldRenewal{renew, request, response, std::move(done)});
      bool release = false;
      {
        util::MutexLock l(&mu_);
        held_renewals_.push_back(std::move(held));
        release = static_cast<int>(held_renewals_.size()) >= hold_renewals_;
      }
      if (release) ReleaseRenewals();
    };
  }
  // Holds forwarded renewals at the leader until `n` of them are waiting
  // there, then lets them all through: a member that forwarded only a few
  // at a time, each waiting for its answer, never gets there.
  void HoldRenewals(int n) {
    util::MutexLock l(&mu_);
    hold_renewals_ = n;
  }
  // Lets every held renewal through, and holds no more.
  void ReleaseRenewals() {
    std::vector<std::shared_ptr<HeldRenewal>> held;
    {
      util::MutexLock l(&mu_);
      hold_renewals_ = 0;
      std::swap(held, held_renewals_);
    }
    for (auto& h : held) h->renew(h->request, h->response, std::move(h->done));
  }
  // The next `n` forwarded renewals find the leader unreachable.
  void FailRenewals(int n) {
    util::MutexLock l(&mu_);
    failing_renewals_ = n;
  }
  int RenewalsForwarded() {
    util::MutexLock l(&mu_);
    return renewals_forwarded_;
  }
  std::function<absl::Status(const etcdserverpb::LeaseTimeToLiveRequest&,
                             etcdserverpb::LeaseTimeToLiveResponse*)>
  TimeToLiveAt(uint64_t id) {
    util::MutexLock l(&mu_);
    return handlers_[id].on_lease_time_to_live;
  }

 private:
  util::Mutex mu_;
  std::map<uint64_t, TransportHandler> handlers_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> down_ ABSL_GUARDED_BY(mu_);
  int interrupted_snapshots_ ABSL_GUARDED_BY(mu_) = 0;
  int snapshots_ ABSL_GUARDED_BY(mu_) = 0;
  struct HeldRenewal {
    RenewHandler renew;
    etcdserverpb::LeaseKeepAliveRequest request;
    etcdserverpb::LeaseKeepAliveResponse* response;
    absl::AnyInvocable<void(absl::Status)> done;
  };
  int hold_renewals_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::shared_ptr<HeldRenewal>> held_renewals_ ABSL_GUARDED_BY(mu_);
  int failing_renewals_ ABSL_GUARDED_BY(mu_) = 0;
  int renewals_forwarded_ ABSL_GUARDED_BY(mu_) = 0;
  int drop_proposals_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::pair<uint64_t, uint32_t>, int> delivered_ ABSL_GUARDED_BY(mu_);
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
  absl::Time ActiveSince(uint64_t) const override { return absl::InfinitePast(); }
  void Send(std::vector<RaftMessage> messages) override { net_->Deliver(id_, std::move(messages)); }
  void LeaseRenew(uint64_t leader, const etcdserverpb::LeaseKeepAliveRequest& request, int64_t,
                  LeaseRenewDone done) override {
    auto renew = net_->RenewAt(id_, leader);
    if (!renew) {
      done(absl::UnavailableError("leader unreachable"));
      return;
    }
    // The leader answers when it will, as over the wire.
    auto response = std::make_shared<etcdserverpb::LeaseKeepAliveResponse>();
    renew(request, response.get(), [response, done = std::move(done)](absl::Status s) mutable {
      if (s.ok()) {
        done(std::move(*response));
      } else {
        done(std::move(s));
      }
    });
  }
  absl::Status SendSnapshot(uint64_t to, const std::string& dir, const std::string& message,
                            int64_t) override {
    return net_->DeliverSnapshot(id_, to, dir, message);
  }
  absl::Status LeaseTimeToLive(uint64_t leader, const etcdserverpb::LeaseTimeToLiveRequest& request,
                               etcdserverpb::LeaseTimeToLiveResponse* response, int64_t) override {
    auto ttl = net_->TimeToLiveAt(leader);
    if (!ttl) return absl::UnavailableError("leader unreachable");
    return ttl(request, response);
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
    for (int i = 0; i < members_count_; ++i) {
      membership::ClusterMember m;
      m.id = 0x1000 + i;
      m.name = absl::StrCat("m", i);
      m.peer_urls = {absl::StrCat("http://127.0.0.1:", 20000 + i)};
      members_.push_back(m);
    }
    for (int i = 0; i < members_count_; ++i) StartMember(i);
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
    ko.inline_commit = direct_writes_;
    ko.member_id = members_[i].id;
    auto store = mvcc::KvStore::Open(ko, std::move(*backend));
    ASSERT_TRUE(store.ok()) << store.status();
    m.store = std::move(*store);
    RaftLogOptions lo;
    lo.dir = base + "/raft";
    lo.sync = log_fs_[i] != nullptr;
    lo.file_system = log_fs_[i];
    auto log = RaftLog::Open(lo);
    ASSERT_TRUE(log.ok()) << log.status();
    m.transport = std::make_unique<MemoryTransport>(members_[i].id, &net_);
    ReplicatorOptions ro;
    ro.member_id = members_[i].id;
    ro.cluster_id = 0xc1;
    ro.initial_members = members_;
    ro.name = members_[i].name;
    ro.tick = absl::Milliseconds(10);
    ro.election_ticks = election_ticks_;
    ro.snapshot_count = snapshot_count_;
    ro.snapshot_catchup_entries = snapshot_catchup_;
    ro.cluster_version = cluster_version_;
    ro.failpoint_lose_version_proposals = lose_version_proposals_;
    ro.request_timeout = request_timeout_;
    ro.data_dir = base;
    ro.direct_writes = direct_writes_;
    ro.direct_catch_up = direct_catch_up_;
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
  // A lease of `ttl` seconds granted at member `at` and applied at every
  // live member; 0 if the grant failed.
  int64_t GrantLease(int at, int64_t ttl) {
    etcdserverpb::LeaseGrantRequest grant;
    grant.set_ttl(ttl);
    auto granted = nodes_[at].store->LeaseGrant(grant);
    EXPECT_TRUE(granted.ok()) << granted.status();
    if (!granted.ok()) return 0;
    WaitApplied(ClusterCommit());
    return granted->id();
  }

  // A keep-alive of lease `id` at member `i`, its answer waited for.
  absl::StatusOr<int64_t> Renew(int i, int64_t id) {
    absl::Notification renewed;
    absl::StatusOr<int64_t> ttl;
    nodes_[i].store->RenewLease(id, [&](absl::StatusOr<int64_t> t) {
      ttl = t;
      renewed.Notify();
    });
    EXPECT_TRUE(renewed.WaitForNotificationWithTimeout(absl::Seconds(20)));
    return ttl;
  }

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

  // The highest commit index any live member knows (the leader's): a
  // follower learns a new commit index only with the leader's next message,
  // so its own may lag a write that another member has already answered.
  uint64_t ClusterCommit() {
    uint64_t commit = 0;
    for (int i = 0; i < kMembers; ++i) {
      if (nodes_[i].replicator && !down_.count(i)) {
        commit = std::max(commit, nodes_[i].replicator->CommittedIndex());
      }
    }
    return commit;
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

  // A linearizable read barrier at the member, waited for (DeadlineExceeded
  // after 10 s).
  absl::Status Barrier(int member) {
    absl::Notification ready;
    absl::Status barrier;
    nodes_[member].store->ReadBarrier([&](absl::Status s) {
      barrier = s;
      ready.Notify();
    });
    if (!ready.WaitForNotificationWithTimeout(absl::Seconds(10))) {
      // The callback still refers to this frame: wait for it.
      ready.WaitForNotification();
      return absl::DeadlineExceededError("read barrier unanswered after 10 s");
    }
    return barrier;
  }

  absl::StatusOr<etcdserverpb::PutResponse> Put(int member, const std::string& key,
                                                const std::string& value) {
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value(value);
    return nodes_[member].store->Put(req);
  }

  // A change of member `target`'s peer URL asked at member `at`, its
  // answer waited for.
  absl::StatusOr<std::vector<membership::ClusterMember>> UpdatePeerUrl(
      int at, int target, const std::string& url, absl::Duration timeout) {
    membership::MemberChange change;
    change.type = membership::ChangeType::kUpdateNode;
    change.id = members_[target].id;
    change.member.id = members_[target].id;
    change.member.peer_urls = {url};
    auto answer = std::make_shared<absl::StatusOr<std::vector<membership::ClusterMember>>>();
    auto answered = std::make_shared<absl::Notification>();
    nodes_[at].replicator->ChangeMembership(
        change, absl::Now() + timeout, [answer, answered](auto members) {
          *answer = std::move(members);
          answered->Notify();
        });
    answered->WaitForNotification();  // the change's deadline ends it
    return *answer;
  }

  struct Member {
    std::unique_ptr<mvcc::KvStore> store;
    std::unique_ptr<MemoryTransport> transport;
    std::unique_ptr<Replicator> replicator;
  };

  // A member with a file system here has its log on it, synced.
  std::shared_ptr<storage::FaultInjectionFs> log_fs_[kMembers];
  int election_ticks_ = 10;
  // The cluster's members (at most kMembers), and a sole voter's direct
  // writes (ReplicatorOptions::direct_writes, with inline commits).
  int members_count_ = kMembers;
  bool direct_writes_ = false;
  uint64_t direct_catch_up_ = ReplicatorOptions().direct_catch_up;
  std::string cluster_version_;  // none: the leader decides no version
  int lose_version_proposals_ = 0;
  absl::Duration request_timeout_ = absl::Seconds(5);
  uint64_t snapshot_count_ = 100000;
  uint64_t snapshot_catchup_ = 5000;
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
  WaitApplied(ClusterCommit());
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

// Records the caller of every write a member applies, by log index.
class RecordingGuard : public mvcc::WriteGuard {
 public:
  absl::Status CheckApply(const mvcc::WriteRequest& w) override {
    util::MutexLock l(&mu_);
    if (w.caller) seen_[w.raft_index] = *w.caller;
    return absl::OkStatus();
  }
  std::map<uint64_t, std::pair<std::string, uint64_t>> Seen() {
    util::MutexLock l(&mu_);
    std::map<uint64_t, std::pair<std::string, uint64_t>> out;
    for (const auto& [index, c] : seen_) out[index] = {c.user, c.auth_revision};
    return out;
  }

 private:
  util::Mutex mu_;
  std::map<uint64_t, mvcc::Caller> seen_ ABSL_GUARDED_BY(mu_);
};

TEST_F(ReplicatorTest, EveryMemberAppliesAWriteWithTheCallerItsEntryNames) {
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  RecordingGuard guards[kMembers];
  for (int i = 0; i < kMembers; ++i) nodes_[i].store->SetWriteGuard(&guards[i]);
  // A user's write, a write made with no identity (auth off), and one with
  // no caller at all, each at the leader and at a follower: the proposer
  // applies each as its entry names it, as the others decode it.
  const std::optional<mvcc::Caller> callers[] = {mvcc::Caller{"u", 7}, mvcc::Caller{},
                                                 std::nullopt};
  for (int at : {leader, (leader + 1) % kMembers}) {
    for (const auto& caller : callers) {
      etcdserverpb::PutRequest put;
      put.set_key("k");
      etcdserverpb::PutResponse resp;
      std::promise<absl::Status> done;
      mvcc::WriteRequest w{mvcc::PutOp{&put, &resp},
                           [&done](absl::Status s) { done.set_value(s); }};
      w.caller = caller;
      nodes_[at].store->Submit(std::move(w));
      ASSERT_TRUE(done.get_future().get().ok());
    }
  }
  WaitApplied(ClusterCommit());
  const auto first = guards[0].Seen();
  std::set<std::pair<std::string, uint64_t>> kinds;
  for (const auto& [index, c] : first) kinds.insert(c);
  EXPECT_EQ(kinds, (std::set<std::pair<std::string, uint64_t>>{{"u", 7}, {"", 0}}));
  EXPECT_GE(first.size(), 6u);
  for (int i = 1; i < kMembers; ++i) {
    EXPECT_EQ(guards[i].Seen(), first) << "member " << i;
  }
  for (int i = 0; i < kMembers; ++i) nodes_[i].store->SetWriteGuard(nullptr);
}

TEST_F(ReplicatorTest, LinearizableReadAtAFollowerSeesTheLatestWrite) {
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  const int follower = (leader + 1) % kMembers;
  for (int n = 0; n < 20; ++n) {
    auto put = Put(leader, "x", absl::StrCat(n));
    ASSERT_TRUE(put.ok()) << put.status();
    absl::Status barrier = Barrier(follower);
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
  absl::StatusOr<int64_t> ttl = Renew(follower, granted->id());
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_EQ(*ttl, 60);
  // Its TTLs at a follower are the leader's (etcd forwards LeaseTimeToLive).
  absl::Notification looked_up;
  absl::StatusOr<etcdserverpb::LeaseTimeToLiveResponse> ttl_info;
  etcdserverpb::LeaseTimeToLiveRequest ttl_request;
  ttl_request.set_id(granted->id());
  nodes_[follower].store->LeaseTimeToLive(
      ttl_request, [&](absl::StatusOr<etcdserverpb::LeaseTimeToLiveResponse> r) {
        ttl_info = std::move(r);
        looked_up.Notify();
      });
  ASSERT_TRUE(looked_up.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(ttl_info.ok()) << ttl_info.status();
  EXPECT_EQ(ttl_info->grantedttl(), 60);
  EXPECT_GT(ttl_info->ttl(), 0);
  // Only the leader expires leases.
  EXPECT_TRUE(nodes_[leader].store->Leads());
  EXPECT_FALSE(nodes_[follower].store->Leads());
}

// A lease a follower granted and answered may be in an entry the leader has
// committed and not yet applied: a keep-alive at the leader then waits for
// the leader's apply (etcd's waitAppliedIndex) instead of finding no lease.
TEST_F(ReplicatorTest, ARenewalAtALeaderBehindItsCommitWaitsForItsApply) {
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  const int follower = (leader + 1) % kMembers;
  absl::Notification held, release;
  std::atomic<bool> holding{true};
  nodes_[leader].store->TEST_SetBeforeApplyHook([&] {
    if (!holding.exchange(false)) return;
    held.Notify();
    release.WaitForNotification();
  });
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(60);
  auto granted = nodes_[follower].store->LeaseGrant(grant);  // answered once applied there
  ASSERT_TRUE(granted.ok()) << granted.status();
  ASSERT_TRUE(held.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_FALSE(nodes_[leader].store->lessor()->Exists(granted->id()));
  EXPECT_LT(nodes_[leader].replicator->AppliedIndex(), nodes_[leader].replicator->CommittedIndex());

  // The leader confirms its leadership with a read round (the read itself
  // waits for the apply), and renews within a tick of it, on the path that
  // needs no round of its own.
  absl::Notification read;
  nodes_[leader].store->ReadBarrier([&](absl::Status) { read.Notify(); });
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!nodes_[leader].replicator->RecentlyConfirmedLeader() && absl::Now() < deadline) {
    absl::SleepFor(absl::Microseconds(200));  // polling a condition, with a deadline
  }
  absl::Notification renewed;
  absl::StatusOr<int64_t> ttl;
  nodes_[leader].store->RenewLease(granted->id(), [&](absl::StatusOr<int64_t> t) {
    ttl = t;
    renewed.Notify();
  });
  release.Notify();
  // Both callbacks refer to this frame: wait for them.
  EXPECT_TRUE(renewed.WaitForNotificationWithTimeout(absl::Seconds(20)));
  renewed.WaitForNotification();
  read.WaitForNotification();
  nodes_[leader].store->TEST_SetBeforeApplyHook(nullptr);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_EQ(*ttl, 60);
}

// A revocation decided by the leader of a term (a lease its clock saw
// expire) is proposed only while that member leads in that term: at a
// follower, or after the term changed, it is refused, not forwarded to the
// leader, which may have kept the lease alive.
TEST_F(ReplicatorTest, ALeaderOnlyWriteIsRefusedOutsideItsTermNotForwarded) {
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  const int follower = (leader + 1) % kMembers;
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(60);
  auto granted = nodes_[leader].store->LeaseGrant(grant);
  ASSERT_TRUE(granted.ok()) << granted.status();
  const uint64_t term = nodes_[leader].replicator->LeaderTerm();
  ASSERT_NE(term, 0u);
  EXPECT_EQ(nodes_[follower].replicator->LeaderTerm(), 0u);

  auto revoke = [&](int member, uint64_t leader_term) {
    auto req = std::make_shared<etcdserverpb::LeaseRevokeRequest>();
    req->set_id(granted->id());
    auto resp = std::make_shared<etcdserverpb::LeaseRevokeResponse>();
    absl::Notification done;
    absl::Status status;
    mvcc::WriteRequest w{mvcc::LeaseRevokeOp{req.get(), resp.get()}, [&, req, resp](absl::Status s) {
                           status = s;
                           done.Notify();
                         }};
    w.leader_term = leader_term;
    nodes_[member].replicator->Submit(std::move(w));
    done.WaitForNotification();
    return status;
  };
  absl::Status at_follower = revoke(follower, term);
  EXPECT_TRUE(mvcc::Is(at_follower, mvcc::Error::kNotLeader)) << at_follower;
  absl::Status stale = revoke(leader, term - 1);
  EXPECT_TRUE(mvcc::Is(stale, mvcc::Error::kNotLeader)) << stale;
  WaitApplied(ClusterCommit());
  for (auto& m : nodes_) EXPECT_TRUE(m.store->lessor()->Exists(granted->id()));

  // The leader of the term revokes it, on every member.
  absl::Status own = revoke(leader, term);
  EXPECT_TRUE(own.ok()) << own;
  WaitApplied(ClusterCommit());
  for (auto& m : nodes_) EXPECT_FALSE(m.store->lessor()->Exists(granted->id()));
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

// A leader renews a lease without a ReadIndex round of its own only within
// a tick of the last round that confirmed it leads. Cut off, it renews
// nothing once another member leads: the new leader, which never sees such a
// renewal, would expire the lease before the TTL the client was given.
TEST_F(ReplicatorTest, ALeaderCutOffRenewsNoLeaseOnceReplaced) {
  const int old_leader = WaitForLeader();
  ASSERT_GE(old_leader, 0);
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_ttl(60);
  auto granted = nodes_[old_leader].store->LeaseGrant(grant);
  ASSERT_TRUE(granted.ok()) << granted.status();
  auto renew = [&](int member) { return Renew(member, granted->id()); };
  // Renewals in a row at the leader: one round, then reuse, or rounds.
  for (int i = 0; i < 20; ++i) {
    auto ttl = renew(old_leader);
    ASSERT_TRUE(ttl.ok()) << ttl.status();
    EXPECT_EQ(*ttl, 60);
  }
  net_.SetDown(members_[old_leader].id, true);
  down_.insert(old_leader);
  const int new_leader = WaitForLeader();
  ASSERT_GE(new_leader, 0);
  ASSERT_NE(new_leader, old_leader);
  // Whether or not it still takes itself for the leader, it renews nothing.
  auto ttl = renew(old_leader);
  EXPECT_FALSE(ttl.ok()) << "renewed by a replaced leader: TTL " << *ttl;
  // The new leader does.
  ttl = renew(new_leader);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  net_.SetDown(members_[old_leader].id, false);
  down_.erase(old_leader);
}

// A follower's renewal that the leader did not answer is forwarded again,
// as etcd's follower forwards it, until it succeeds.
TEST_F(ReplicatorTest, AFollowerForwardsARenewalAgainAfterAFailedTry) {
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  const int follower = (leader + 1) % kMembers;
  const int64_t lease = GrantLease(leader, 60);
  ASSERT_NE(lease, 0);
  const int before = net_.RenewalsForwarded();
  net_.FailRenewals(3);
  auto ttl = Renew(follower, lease);
  ASSERT_TRUE(ttl.ok()) << ttl.status();
  EXPECT_EQ(*ttl, 60);
  EXPECT_EQ(net_.RenewalsForwarded() - before, 4);
  // An unknown lease is the leader's answer, not tried again.
  auto unknown = Renew(follower, lease + 1);
  EXPECT_EQ(unknown.status(), mvcc::MakeError(mvcc::Error::kLeaseNotFound)) << unknown.status();
  EXPECT_EQ(net_.RenewalsForwarded() - before, 5);
}

// raft drops a follower's forwarded proposal without a word when the
// leader transfers leadership: a membership change whose entry does not
// reach the log is proposed again, well before its deadline.
TEST_F(ReplicatorTest, AMembershipChangeWhoseForwardedProposalIsLostIsProposedAgain) {
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  const int follower = (leader + 1) % kMembers;
  net_.DropProposals(1);
  auto members = UpdatePeerUrl(follower, leader, "http://127.0.0.1:21000", absl::Seconds(3));
  ASSERT_TRUE(members.ok()) << members.status();
  const std::vector<std::string> url = {"http://127.0.0.1:21000"};
  bool updated = false;
  for (const auto& m : *members) {
    if (m.id == members_[leader].id) updated = m.peer_urls == url;
  }
  EXPECT_TRUE(updated);
}

// raft turns a change that a leader proposes before it applied the one
// before into an empty entry: two changes asked at once both apply.
TEST_F(ReplicatorTest, TwoMembershipChangesAskedAtOnceBothApply) {
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  absl::StatusOr<std::vector<membership::ClusterMember>> first, second;
  std::thread other([&] {
    first = UpdatePeerUrl(leader, (leader + 1) % kMembers, "http://127.0.0.1:21001",
                          absl::Seconds(3));
  });
  second = UpdatePeerUrl(leader, (leader + 2) % kMembers, "http://127.0.0.1:21002",
                         absl::Seconds(3));
  other.join();
  EXPECT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(second.ok()) << second.status();
  for (const auto& m : nodes_[leader].replicator->Members()) {
    if (m.id == members_[(leader + 1) % kMembers].id) {
      EXPECT_EQ(m.peer_urls, std::vector<std::string>{"http://127.0.0.1:21001"});
    }
    if (m.id == members_[(leader + 2) % kMembers].id) {
      EXPECT_EQ(m.peer_urls, std::vector<std::string>{"http://127.0.0.1:21002"});
    }
  }
}

// Members that decide a cluster version, as the server's do.
class ReplicatorVersionTest : public ReplicatorTest {
 protected:
  void SetUp() override {
    cluster_version_ = "3.6.0";
    ReplicatorTest::SetUp();
  }

  // Whether every member reports the version, once they do or by `timeout`.
  bool AllDecide(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    auto decided = [&] {
      for (int i = 0; i < kMembers; ++i) {
        if (nodes_[i].replicator->ClusterVersion() != "3.6.0") return false;
      }
      return true;
    };
    while (!decided() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));  // polling a condition, with a deadline
    }
    return decided();
  }
};

// A new cluster has no version until its leader commits an entry of its
// term and proposes one (etcd's monitorClusterVersions); every member
// reports it once applied, and a restarted member from its store at once.
TEST_F(ReplicatorVersionTest, TheLeaderDecidesTheClusterVersionForEveryMember) {
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  ASSERT_TRUE(AllDecide(absl::Seconds(10)));
  const int follower = (leader + 1) % kMembers;
  StopMember(follower);
  StartMember(follower);
  EXPECT_EQ(nodes_[follower].replicator->ClusterVersion(), "3.6.0");
}

// A leader whose version proposal was lost looks again at its next version
// check (every 4 s, as etcd's) once the lost one had its request timeout
// (1 s here), and proposes it again: the cluster does not stay undecided
// until the next leader.
TEST_F(ReplicatorVersionTest, ALostVersionProposalIsMadeAgainByTheSameLeader) {
  for (int i = 0; i < kMembers; ++i) StopMember(i);
  std::filesystem::remove_all(dir_);
  lose_version_proposals_ = 1;
  request_timeout_ = absl::Seconds(1);
  for (int i = 0; i < kMembers; ++i) StartMember(i);
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  const uint64_t term = nodes_[leader].replicator->Term();
  EXPECT_FALSE(AllDecide(absl::Seconds(2)));
  ASSERT_TRUE(AllDecide(absl::Seconds(10)));
  EXPECT_EQ(nodes_[leader].replicator->Term(), term);
  EXPECT_TRUE(nodes_[leader].replicator->Leads());
}

// Members whose logs are synced through a file system that can hold syncs,
// and an election timeout (3 s) that a held sync of the leader's stays
// well within.
class ReplicatorSyncedLogTest : public ReplicatorTest {
 protected:
  void SetUp() override {
    for (auto& fs : log_fs_) fs = storage::FaultInjectionFs::Create();
    election_ticks_ = 300;
    ReplicatorTest::SetUp();
  }
  void TearDown() override {
    for (auto& fs : log_fs_) fs->HoldSyncs(false);
    ReplicatorTest::TearDown();
  }
};

// As etcd's raft loop, a member applies a Ready's committed entries while
// it writes the Ready's own: a write a quorum has is applied and answered
// while the leader's log still syncs the next one.
TEST_F(ReplicatorSyncedLogTest, ACommittedWriteIsAnsweredWhileTheLeaderSyncsTheNext) {
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  ASSERT_TRUE(Put(leader, "warm", "0").ok());
  WaitApplied(ClusterCommit());
  const int acks = net_.Delivered(members_[leader].id, kMsgAppResp);
  storage::FaultInjectionFs& fs = *log_fs_[leader];
  fs.HoldSyncs(true);

  struct Write {
    etcdserverpb::PutRequest req;
    etcdserverpb::PutResponse resp;
    absl::Notification answered;
    absl::Status status;
  };
  // Shared with the answer, which a failed assertion below leaves to
  // come after the test returned (its TearDown releases the syncs).
  auto submit = [&](const std::string& key) {
    auto w = std::make_shared<Write>();
    w->req.set_key(key);
    w->req.set_value("v");
    nodes_[leader].store->Submit({mvcc::PutOp{&w->req, &w->resp}, [w](absl::Status s) {
                                    w->status = s;
                                    w->answered.Notify();
                                  }});
    return w;
  };
  auto wait_for = [](auto condition) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!condition() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));  // polling a condition, with a deadline
    }
    return condition();
  };
  // The first write's entry: the leader sends it, then its loop waits in
  // the sync; both followers write it and answer.
  std::shared_ptr<Write> first = submit("first");
  ASSERT_TRUE(wait_for([&] { return fs.SyncsWaiting() == 1; }));
  ASSERT_TRUE(wait_for([&] {
    return net_.Delivered(members_[leader].id, kMsgAppResp) >= acks + 2;
  }));
  // The second write waits in the loop's inbox beside the answers. Once
  // the first sync is through, one Ready commits the first write and holds
  // the second's entry, whose sync is held.
  std::shared_ptr<Write> second = submit("second");
  fs.PassSyncs(1);
  EXPECT_TRUE(first->answered.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "the committed write waited for the next entry's sync";
  EXPECT_TRUE(wait_for([&] { return fs.SyncsWaiting() == 1; }));
  EXPECT_FALSE(second->answered.HasBeenNotified());
  fs.HoldSyncs(false);
  first->answered.WaitForNotification();
  second->answered.WaitForNotification();
  EXPECT_TRUE(first->status.ok()) << first->status;
  EXPECT_TRUE(second->status.ok()) << second->status;
  EXPECT_EQ(first->resp.header().revision() + 1, second->resp.header().revision());
}

// A follower forwards every keep-alive it takes at once, however long the
// leader takes to answer: none waits for another's answer.
TEST_F(ReplicatorTest, AFollowerHasEveryRenewalWaitingAtTheLeaderAtOnce) {
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  const int follower = (leader + 1) % kMembers;
  const int64_t lease = GrantLease(leader, 60);
  ASSERT_NE(lease, 0);
  constexpr int kRenewals = 64;
  net_.HoldRenewals(kRenewals);
  util::Mutex mu;
  int answered = 0, renewed = 0;
  absl::Notification all;
  for (int i = 0; i < kRenewals; ++i) {
    nodes_[follower].store->RenewLease(lease, [&](absl::StatusOr<int64_t> ttl) {
      util::MutexLock l(&mu);
      if (ttl.ok() && *ttl == 60) ++renewed;
      if (++answered == kRenewals) all.Notify();
    });
  }
  const bool together = all.WaitForNotificationWithTimeout(absl::Seconds(20));
  EXPECT_TRUE(together) << "the leader never had all " << kRenewals << " renewals waiting";
  if (!together) {
    net_.ReleaseRenewals();
    all.WaitForNotification();
  }
  util::MutexLock l(&mu);
  EXPECT_EQ(renewed, kRenewals);
}

// With no leader to reach, a renewal is tried until its request timeout,
// then fails with etcd's "no leader".
TEST_F(ReplicatorTest, ARenewalWithNoLeaderFailsAfterTheRequestTimeout) {
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  const int64_t lease = GrantLease(leader, 60);
  ASSERT_NE(lease, 0);
  const int alone = (leader + 1) % kMembers;
  for (int i = 0; i < kMembers; ++i) {
    if (i != alone) {
      net_.SetDown(members_[i].id, true);
      down_.insert(i);
    }
  }
  // The lone member loses its leader after an election timeout, and finds
  // none: the renewal waits for one, then answers at its deadline.
  const absl::Time start = absl::Now();
  auto ttl = Renew(alone, lease);
  EXPECT_FALSE(ttl.ok());
  if (!ttl.ok()) {
    EXPECT_TRUE(ttl.status() == mvcc::MakeError(mvcc::Error::kNoLeader) ||
                ttl.status() == mvcc::MakeError(mvcc::Error::kTimeout))
        << ttl.status();
  }
  EXPECT_GE(absl::Now() - start, absl::Seconds(5));  // the test's request timeout
  for (int i = 0; i < kMembers; ++i) {
    net_.SetDown(members_[i].id, false);
    down_.erase(i);
  }
}

// A linearizable read waiting at a follower for a leader that went away
// fails with etcd's retryable "leader changed" once a new leader is known,
// as etcd's read loop does, rather than waiting for its retry.
TEST_F(ReplicatorTest, AReadWaitingForALostLeaderFailsWhenANewOneLeads) {
  const int old_leader = WaitForLeader();
  ASSERT_GE(old_leader, 0);
  const int follower = (old_leader + 1) % kMembers;
  net_.SetDown(members_[old_leader].id, true);
  down_.insert(old_leader);
  absl::Status barrier = Barrier(follower);
  EXPECT_EQ(barrier, mvcc::MakeError(mvcc::Error::kLeaderChanged)) << barrier;
  const int new_leader = WaitForLeader();
  ASSERT_GE(new_leader, 0);
  EXPECT_NE(new_leader, old_leader);
  net_.SetDown(members_[old_leader].id, false);
  down_.erase(old_leader);
}

TEST_F(ReplicatorTest, AMemberRestartedReplaysItsLogIntoTheSameState) {
  ASSERT_GE(WaitForLeader(), 0);
  for (int n = 0; n < 30; ++n) ASSERT_TRUE(Put(n % kMembers, absl::StrCat("r", n), "v").ok());
  WaitApplied(ClusterCommit());
  const int64_t rev = nodes_[0].store->Rev();
  StopMember(2);
  StartMember(2);
  ASSERT_GE(WaitForLeader(), 0);
  ASSERT_TRUE(Put(0, "after", "restart").ok());
  WaitApplied(ClusterCommit());
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
  // Timed out after it was proposed, or never proposed: the leader steps
  // down once it misses its quorum (check-quorum).
  EXPECT_TRUE(mvcc::Is(r.status(), mvcc::Error::kTimeout) ||
              mvcc::Is(r.status(), mvcc::Error::kProposalDeadline))
      << r.status();
}

// A single member, as `capstan` runs one: the only voter, whose store
// commits client writes itself while raft has nothing else to append
// (ReplicatorOptions::direct_writes).
class ReplicatorSoleVoterTest : public ReplicatorTest {
 protected:
  void SetUp() override {
    members_count_ = 1;
    direct_writes_ = true;
    ReplicatorTest::SetUp();
  }

  // Waits until the member leads and its store takes direct writes.
  void AwaitDirectWrites() {
    ASSERT_EQ(WaitForLeader(), 0);
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (!nodes_[0].store->DirectWrites() && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(2));  // polling a condition, with a deadline
    }
    ASSERT_TRUE(nodes_[0].store->DirectWrites());
  }

  // n puts from `threads` threads at once, each answered OK.
  void PutConcurrently(int n, int threads, const std::string& prefix) {
    std::vector<std::thread> writers;
    for (int t = 0; t < threads; ++t) {
      writers.emplace_back([&, t] {
        for (int i = t; i < n; i += threads) {
          auto r = Put(0, absl::StrCat(prefix, i), "v");
          ASSERT_TRUE(r.ok()) << r.status();
        }
      });
    }
    for (auto& w : writers) w.join();
  }
};

// Direct writes take the indexes after raft's last entry without raft
// seeing them: its log stays where it was while the commit and applied
// indexes go on. A membership change first brings raft's log up to the
// store (empty entries), so the change's entry comes right after the last
// direct write, and writes then go through the log again (a learner needs
// it).
TEST_F(ReplicatorSoleVoterTest, WritesSkipRaftWhoseLogCatchesUpBeforeAMembershipChange) {
  AwaitDirectWrites();
  Replicator& r = *nodes_[0].replicator;
  const uint64_t start = r.CommittedIndex();
  ASSERT_EQ(r.LogFirstIndex(), start + 1);  // the log is held by the store up to here
  PutConcurrently(200, 4, "/direct/");
  EXPECT_EQ(r.CommittedIndex(), start + 200);
  EXPECT_EQ(r.AppliedIndex(), start + 200);
  EXPECT_EQ(nodes_[0].store->AppliedIndex(), start + 200);
  EXPECT_EQ(r.LogFirstIndex(), start + 1) << "raft's log moved: a write went through it";

  membership::MemberChange add;
  add.type = membership::ChangeType::kAddLearnerNode;
  add.id = 0x2000;
  add.member.id = 0x2000;
  add.member.peer_urls = {"http://127.0.0.1:20999"};
  add.member.is_learner = true;
  absl::Notification changed;
  absl::Status change_status;
  r.ChangeMembership(add, absl::Now() + absl::Seconds(10), [&](auto members) {
    change_status = members.status();
    changed.Notify();
  });
  changed.WaitForNotification();  // the change's deadline ends it
  ASSERT_TRUE(change_status.ok()) << change_status;
  EXPECT_EQ(r.CommittedIndex(), start + 201) << "the change's entry is not the next index";
  EXPECT_FALSE(nodes_[0].store->DirectWrites());
  ASSERT_TRUE(Put(0, "/after/change", "v").ok());
  EXPECT_EQ(r.CommittedIndex(), start + 202);
  EXPECT_EQ(nodes_[0].store->Rev(), 202);
}

// Every direct_catch_up writes the loop brings raft's log up to the store
// and takes direct writes again.
TEST_F(ReplicatorSoleVoterTest, RaftsLogCatchesUpWhileWritesGoOn) {
  StopMember(0);
  direct_catch_up_ = 50;
  StartMember(0);
  AwaitDirectWrites();
  Replicator& r = *nodes_[0].replicator;
  const uint64_t start = r.CommittedIndex();
  PutConcurrently(600, 4, "/catch-up/");
  EXPECT_EQ(r.CommittedIndex(), start + 600);
  // The loop looks at every pass (at least every 5 ms).
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (r.LogFirstIndex() <= start + 600 - 50 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(2));  // polling a condition, with a deadline
  }
  EXPECT_GT(r.LogFirstIndex(), start + 600 - 50) << "raft's log did not catch up";
  EXPECT_TRUE(nodes_[0].store->DirectWrites());
  EXPECT_EQ(r.CommittedIndex(), start + 600);
  // A read after the writes sees them all (a sole voter reads at its commit
  // index, which the direct writes moved).
  ASSERT_TRUE(Barrier(0).ok());
  EXPECT_EQ(nodes_[0].store->Rev(), 601);
}

// A member restarted after direct writes starts its log at the store's
// applied index and term and goes on from there.
TEST_F(ReplicatorSoleVoterTest, DirectWritesOutliveARestart) {
  AwaitDirectWrites();
  const uint64_t start = nodes_[0].replicator->CommittedIndex();
  const uint64_t term = nodes_[0].replicator->Term();
  PutConcurrently(100, 2, "/restart/");
  StopMember(0);
  StartMember(0);
  AwaitDirectWrites();
  Replicator& r = *nodes_[0].replicator;
  EXPECT_EQ(nodes_[0].store->Rev(), 101);
  EXPECT_GT(r.Term(), term);
  // The new leader's empty entry and this member's attributes follow the
  // writes the store holds.
  EXPECT_EQ(r.CommittedIndex(), start + 100 + 2);
  ASSERT_TRUE(Put(0, "/restart/after", "v").ok());
  EXPECT_EQ(r.CommittedIndex(), start + 100 + 3);
  EXPECT_EQ(nodes_[0].store->Rev(), 102);
}

// Members whose logs are compacted every 50 applied entries, keeping 10.
class ReplicatorSnapshotTest : public ReplicatorTest {
 protected:
  void SetUp() override {
    snapshot_count_ = 50;
    snapshot_catchup_ = 10;
    ReplicatorTest::SetUp();
  }

  // Whether the members' stores timed at least `n` snapshots sent
  // (etcd_disk_backend_snapshot_duration_seconds) within 10 s: a sending is
  // timed once the transport has returned, just after the receiver has it.
  bool AwaitSnapshotsTimed(int n) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    for (;;) {
      uint64_t timed = 0;
      for (auto& m : nodes_) {
        if (m.store) timed += m.store->maintenance_timings().snapshot_seconds.Count();
      }
      if (timed >= static_cast<uint64_t>(n)) return true;
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(2));  // polling a condition, with a deadline
    }
  }

  // Cuts a follower off, writes past the leader's compaction, heals it and
  // checks it caught up by a snapshot into the same data.
  void CatchUpBySnapshot() {
    const int leader = WaitForLeader();
    ASSERT_GE(leader, 0);
    const int lagging = (leader + 1) % kMembers;
    const int other = (leader + 2) % kMembers;
    ASSERT_TRUE(Put(leader, "before", "cut").ok());
    net_.SetDown(members_[lagging].id, true);
    down_.insert(lagging);
    const uint64_t behind = nodes_[lagging].replicator->AppliedIndex();
    // Writes through both live members: puts, deletes, a lease and a
    // compaction, so the snapshot carries every family.
    etcdserverpb::LeaseGrantRequest grant;
    grant.set_ttl(600);
    auto lease = nodes_[other].store->LeaseGrant(grant);
    ASSERT_TRUE(lease.ok()) << lease.status();
    for (int n = 0; n < 300; ++n) {
      const int at = n % 2 == 0 ? leader : other;
      etcdserverpb::PutRequest put;
      put.set_key(absl::StrCat("k", n % 40));
      put.set_value(absl::StrCat("v", n));
      if (n % 10 == 0) put.set_lease(lease->id());
      ASSERT_TRUE(nodes_[at].store->Put(put).ok());
      if (n % 25 == 0) {
        etcdserverpb::DeleteRangeRequest del;
        del.set_key(absl::StrCat("k", (n + 3) % 40));
        ASSERT_TRUE(nodes_[at].store->DeleteRange(del).ok());
      }
    }
    etcdserverpb::CompactionRequest compact;
    compact.set_revision(nodes_[leader].store->Rev() - 50);
    ASSERT_TRUE(nodes_[leader].store->Compact(compact).ok());
    ASSERT_TRUE(Put(leader, "last", "write").ok());
    // The leader's log no longer holds what the cut-off member lacks.
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    while (nodes_[leader].replicator->LogFirstIndex() <= behind + 1 && absl::Now() < deadline) {
      ASSERT_TRUE(Put(leader, "more", "writes").ok());
    }
    ASSERT_GT(nodes_[leader].replicator->LogFirstIndex(), behind + 1);

    net_.SetDown(members_[lagging].id, false);
    down_.erase(lagging);
    ASSERT_GE(WaitForLeader(), 0);
    const absl::Time installed_by = absl::Now() + absl::Seconds(30);
    while (nodes_[lagging].replicator->SnapshotsInstalled() == 0 && absl::Now() < installed_by) {
      absl::SleepFor(absl::Milliseconds(5));  // polling a condition, with a deadline
    }
    ASSERT_GE(nodes_[lagging].replicator->SnapshotsInstalled(), 1u);
    const uint64_t commit = ClusterCommit();
    WaitApplied(commit, absl::Seconds(30));
    const int64_t rev = nodes_[leader].store->Rev();
    for (int i = 0; i < kMembers; ++i) {
      // Let every member apply up to rev before comparing.
      const absl::Time until = absl::Now() + absl::Seconds(10);
      while (nodes_[i].store->Rev() < rev && absl::Now() < until) absl::SleepFor(absl::Milliseconds(2));
      EXPECT_EQ(nodes_[i].store->Rev(), rev) << "member " << i;
      EXPECT_EQ(nodes_[i].store->CompactRev(), nodes_[leader].store->CompactRev()) << "member " << i;
    }
    uint32_t expect = 0;
    for (int i = 0; i < kMembers; ++i) {
      uint32_t hash = 0;
      int64_t compact_rev = 0, hash_rev = 0;
      ASSERT_TRUE(nodes_[i].store->HashKV(rev, &hash, &compact_rev, &hash_rev).ok());
      if (i == 0) expect = hash;
      EXPECT_EQ(hash, expect) << "member " << i;
      EXPECT_TRUE(nodes_[i].store->lessor()->Exists(lease->id())) << "member " << i;
      etcdserverpb::RangeRequest range;
      range.set_key("k");
      range.set_range_end("l");
      mvcc::RangeResult result;
      ASSERT_TRUE(nodes_[i].store->Range(range, &result).ok());
      mvcc::RangeResult at_leader;
      ASSERT_TRUE(nodes_[leader].store->Range(range, &at_leader).ok());
      EXPECT_EQ(result.count, at_leader.count) << "member " << i;
      EXPECT_EQ(result.kvs_wire, at_leader.kvs_wire) << "member " << i;
    }
    // The caught-up member takes part in later writes. A snapshot that
    // arrives meanwhile may cover the write's entry: then the write is
    // applied but answered "request timed out" (docs/REPLICATION.md).
    // A "request timed out" leaves the outcome unknown (etcd's meaning): the
    // entry may have been applied, or its proposal dropped; either way every
    // member must agree.
    auto after = Put(lagging, "after", "snapshot");
    if (!after.ok()) {
      EXPECT_EQ(after.status().message(), "request timed out") << after.status();
      // A write through the leader after it: once it is committed, so is
      // the timed-out entry if it is in the log at all.
      ASSERT_TRUE(Put(leader, "fence", "after").ok());
    }
    // The cluster's commit index, not the first leader's: leadership may
    // have moved when the member came back, and a follower learns that the
    // write committed only with the leader's next message.
    const uint64_t written = ClusterCommit();
    WaitApplied(written, absl::Seconds(30));
    for (int i = 0; i < kMembers; ++i) {
      etcdserverpb::RangeRequest range;
      range.set_key("after");
      mvcc::RangeResult result;
      ASSERT_TRUE(nodes_[i].store->Range(range, &result).ok());
      mvcc::RangeResult at_leader;
      ASSERT_TRUE(nodes_[leader].store->Range(range, &at_leader).ok());
      EXPECT_EQ(result.count, at_leader.count) << "member " << i;
      if (after.ok()) {
        EXPECT_EQ(result.count, 1) << "member " << i;
      }
    }
  }
};

TEST_F(ReplicatorSnapshotTest, TheLogIsCompactedKeepingTheCatchUpEntries) {
  const int leader = WaitForLeader();
  ASSERT_GE(leader, 0);
  for (int n = 0; n < 200; ++n) ASSERT_TRUE(Put(n % kMembers, absl::StrCat("c", n), "v").ok());
  WaitApplied(nodes_[leader].replicator->CommittedIndex());
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (int i = 0; i < kMembers; ++i) {
    while (nodes_[i].replicator->LogFirstIndex() == 1 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    const uint64_t first = nodes_[i].replicator->LogFirstIndex();
    EXPECT_GT(first, 1u) << "member " << i;
    // Never closer than the catch-up margin to what the store applied.
    EXPECT_LE(first - 1 + snapshot_catchup_, nodes_[i].replicator->AppliedIndex()) << "member " << i;
  }
  // A restarted member starts from its compacted log and its store.
  StopMember(2);
  StartMember(2);
  ASSERT_GE(WaitForLeader(), 0);
  auto after = Put(0, "after", "restart");
  ASSERT_TRUE(after.ok()) << after.status();
  const absl::Time until = absl::Now() + absl::Seconds(20);
  while (nodes_[2].store->Rev() < after->header().revision() && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(2));  // polling a condition, with a deadline
  }
  EXPECT_EQ(nodes_[2].store->Rev(), after->header().revision());
  EXPECT_EQ(after->header().revision(), 202);  // 200 puts and this one, from revision 1
}

TEST_F(ReplicatorSnapshotTest, AMemberCutOffCatchesUpBySnapshot) {
  CatchUpBySnapshot();
  EXPECT_GE(net_.Snapshots(), 1);
}

TEST_F(ReplicatorSnapshotTest, AnInterruptedSnapshotStreamIsRetried) {
  net_.InterruptSnapshots(1);
  CatchUpBySnapshot();
  EXPECT_GE(net_.Snapshots(), 2);
}

}  // namespace
}  // namespace capstan::replication
