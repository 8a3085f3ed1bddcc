// GoRaftEngine: etcd's raft through the shim, driven by explicit ticks and
// in-memory message routing (no sleeps, no network).

#include "replication/goraft/go_raft_engine.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "replication/goraft/memory_raft_storage_for_test.h"
#include "util/coding.h"

namespace capstan::replication {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// raftpb.ConfChange{Type, NodeID}, marshaled.
std::string ConfChange(uint64_t type, uint64_t node_id) {
  std::string out;
  util::AppendVarintField(2, type, &out);
  util::AppendVarintField(3, node_id, &out);
  return out;
}
constexpr uint64_t kAddLearnerNode = 3;  // raftpb.ConfChangeAddLearnerNode

// One member: its engine, its log, and its state machine (the data of the
// normal entries it applied, in order).
struct Member {
  uint64_t id = 0;
  MemoryRaftStorage storage;
  std::unique_ptr<RaftEngine> engine;
  std::vector<std::string> applied;
  uint64_t applied_index = 0;
  uint64_t commit = 0;
  ConfState conf_state;
  SoftState soft;
  std::vector<ReadState> read_states;
  std::vector<std::string> log_lines;
};

struct Envelope {
  uint64_t from = 0;
  RaftMessage message;
};

// Members in one process; messages between them go through a queue, and
// members in `isolated` neither send nor receive.
class Cluster {
 public:
  explicit Cluster(GoRaftEngineFactory* factory) : factory_(factory) {}

  // Adds a member; bootstrap_voters as etcd's StartNode peers (empty: a
  // member joining with an empty log).
  Member* Add(uint64_t id, std::vector<uint64_t> bootstrap_voters) {
    auto m = std::make_unique<Member>();
    m->id = id;
    RaftConfig config;
    config.id = id;
    config.bootstrap_voters = std::move(bootstrap_voters);
    config.storage = &m->storage;
    Member* raw = m.get();
    config.log = [raw](int level, std::string_view line) { raw->log_lines.emplace_back(line); };
    auto engine = factory_->NewEngine(config);
    CHECK(engine.ok()) << engine.status();
    m->engine = *std::move(engine);
    members_[id] = std::move(m);
    return raw;
  }

  Member* Get(uint64_t id) { return members_.at(id).get(); }
  std::vector<Member*> All() {
    std::vector<Member*> out;
    for (auto& [id, m] : members_) out.push_back(m.get());
    return out;
  }

  void Isolate(uint64_t id) { isolated_.insert(id); }
  void Heal() { isolated_.clear(); }

  // Persists, sends and applies one Ready of m, in etcd's order.
  void HandleReady(Member* m) {
    Ready rd = m->engine->GetReady();
    if (rd.soft_state) m->soft = *rd.soft_state;
    if (rd.snapshot) {
      m->storage.ApplySnapshot(*rd.snapshot);
      // The snapshot's data comes beside the message: the sender's applied
      // state up to the snapshot index.
      Member* source = snapshot_sources_.at(m->id);
      m->applied.assign(source->applied.begin(),
                        source->applied.begin() + applied_at_.at({source->id, rd.snapshot->index}));
      m->applied_index = rd.snapshot->index;
      m->conf_state = rd.snapshot->conf_state;
    }
    if (rd.hard_state) {
      m->storage.SetHardState(*rd.hard_state);
      m->commit = rd.hard_state->commit;
    }
    m->storage.Append(rd.entries);
    for (RaftMessage& msg : rd.messages) {
      if (msg.type == static_cast<uint32_t>(MessageType::kSnapshot)) snapshot_sources_[msg.to] = m;
      queue_.push_back(Envelope{m->id, std::move(msg)});
    }
    for (const RaftEntry& e : rd.committed) {
      if (e.type == EntryType::kNormal) {
        if (!e.data.empty()) m->applied.push_back(e.data);
      } else {
        m->conf_state = m->engine->ApplyConfChange(e.type, e.data);
      }
      m->applied_index = e.index;
      applied_at_[{m->id, e.index}] = m->applied.size();
    }
    for (ReadState& rs : rd.read_states) m->read_states.push_back(std::move(rs));
    m->engine->Advance();
  }

  // Handles Readies and delivers messages until the cluster is quiet.
  void Process() {
    for (int round = 0; round < 100000; ++round) {
      bool busy = false;
      for (auto& [id, m] : members_) {
        while (m->engine->HasReady()) {
          HandleReady(m.get());
          busy = true;
        }
      }
      std::deque<Envelope> queue;
      queue.swap(queue_);
      for (Envelope& env : queue) {
        busy = true;
        auto it = members_.find(env.message.to);
        if (it == members_.end() || isolated_.count(env.from) || isolated_.count(env.message.to)) {
          continue;  // dropped
        }
        absl::Status s = it->second->engine->Step(env.message.bytes);
        EXPECT_TRUE(s.ok() || absl::IsFailedPrecondition(s)) << s;
        if (env.message.type == static_cast<uint32_t>(MessageType::kSnapshot)) {
          Get(env.from)->engine->ReportSnapshot(env.message.to, /*failure=*/false);
        }
      }
      if (!busy) return;
    }
    ADD_FAILURE() << "the cluster did not settle";
  }

  void TickAll() {
    for (auto& [id, m] : members_) m->engine->Tick();
    Process();
  }

  // The members that believe they lead.
  std::vector<uint64_t> Leaders() {
    std::vector<uint64_t> out;
    for (auto& [id, m] : members_) {
      if (m->soft.role == RaftRole::kLeader) out.push_back(id);
    }
    return out;
  }

  // Ticks until exactly one member leads and every other knows it.
  uint64_t ElectLeader() {
    for (int tick = 0; tick < 1000; ++tick) {
      TickAll();
      std::vector<uint64_t> leaders = Leaders();
      if (leaders.size() != 1) continue;
      bool agreed = true;
      for (auto& [id, m] : members_) agreed &= isolated_.count(id) || m->soft.lead == leaders[0];
      if (agreed) return leaders[0];
    }
    ADD_FAILURE() << "no leader";
    return 0;
  }

 private:
  GoRaftEngineFactory* factory_;
  std::map<uint64_t, std::unique_ptr<Member>> members_;
  std::deque<Envelope> queue_;
  std::set<uint64_t> isolated_;
  // Who sent the last snapshot to a member, and how many entries a member
  // had applied at an index: the stand-in for streaming a snapshot's data.
  std::map<uint64_t, Member*> snapshot_sources_;
  std::map<std::pair<uint64_t, uint64_t>, size_t> applied_at_;
};

class GoRaftEngineTest : public ::testing::Test {
 protected:
  // Runs body on the factory's raft loop.
  void InLoop(absl::AnyInvocable<void()> body) { factory_.RunLoop(std::move(body)); }

  GoRaftEngineFactory factory_;
};

TEST_F(GoRaftEngineTest, OneVoterElectsItselfAndCommits) {
  InLoop([&] {
    Cluster c(&factory_);
    Member* m = c.Add(1, {1});
    c.Process();
    EXPECT_THAT(m->conf_state.voters, ElementsAre(1));
    ASSERT_TRUE(m->engine->Campaign().ok());
    c.Process();
    EXPECT_EQ(m->soft.role, RaftRole::kLeader);
    EXPECT_EQ(m->soft.lead, 1u);
    ASSERT_TRUE(m->engine->Propose({"put foo=bar"}).ok());
    c.Process();
    // 1: the bootstrap ConfChange, 2: the leader's empty entry, 3: the put.
    EXPECT_EQ(m->commit, 3u);
    EXPECT_EQ(m->applied_index, 3u);
    EXPECT_THAT(m->applied, ElementsAre("put foo=bar"));
    RaftStatus st = m->engine->Status();
    EXPECT_EQ(st.id, 1u);
    EXPECT_EQ(st.soft_state.role, RaftRole::kLeader);
    EXPECT_EQ(st.hard_state.commit, 3u);
    EXPECT_EQ(st.hard_state.vote, 1u);
    EXPECT_EQ(st.applied, 3u);
    ASSERT_EQ(st.progress.size(), 1u);
    EXPECT_EQ(st.progress[0].id, 1u);
    EXPECT_EQ(st.progress[0].match, 3u);
    // The engine's log lines went to its own log function.
    bool became_leader = false;
    for (const std::string& line : m->log_lines) {
      became_leader |= line.find("became leader") != std::string::npos;
    }
    EXPECT_TRUE(became_leader);
  });
}

TEST_F(GoRaftEngineTest, ThreeVotersElectOneLeaderAndCommitInOrder) {
  InLoop([&] {
    Cluster c(&factory_);
    for (uint64_t id : {1, 2, 3}) c.Add(id, {1, 2, 3});
    uint64_t leader = c.ElectLeader();
    ASSERT_NE(leader, 0u);
    EXPECT_EQ(c.Leaders().size(), 1u);
    std::vector<std::string> proposed;
    // 2,000 proposals in groups of 1..8 entries, each group one MsgProp;
    // some groups go through followers, which forward them.
    for (int i = 0; proposed.size() < 2000; ++i) {
      size_t group = 1 + i % 8;
      std::vector<std::string> data;
      for (size_t j = 0; j < group && proposed.size() + data.size() < 2000; ++j) {
        data.push_back(absl::StrCat("put k", proposed.size() + data.size()));
      }
      std::vector<std::string_view> views(data.begin(), data.end());
      uint64_t via = i % 5 == 0 ? (leader % 3) + 1 : leader;
      ASSERT_TRUE(c.Get(via)->engine->Propose(views).ok()) << i;
      // Forwarded proposals reach the leader before the next direct one,
      // so the log order is the proposal order.
      c.Process();
      proposed.insert(proposed.end(), data.begin(), data.end());
    }
    c.Process();
    for (Member* m : c.All()) {
      EXPECT_EQ(m->applied, proposed) << "member " << m->id;
      EXPECT_EQ(m->applied_index, c.Get(leader)->commit);
    }
    RaftStatus st = c.Get(leader)->engine->Status();
    ASSERT_EQ(st.progress.size(), 3u);
    for (const PeerProgress& p : st.progress) EXPECT_EQ(p.match, st.hard_state.commit);
  });
}

TEST_F(GoRaftEngineTest, PartitionedFollowerCatchesUp) {
  InLoop([&] {
    Cluster c(&factory_);
    for (uint64_t id : {1, 2, 3}) c.Add(id, {1, 2, 3});
    uint64_t leader = c.ElectLeader();
    uint64_t follower = leader % 3 + 1;
    c.Isolate(follower);
    for (int i = 0; i < 100; ++i) {
      ASSERT_TRUE(c.Get(leader)->engine->Propose({absl::StrCat("v", i)}).ok());
      c.Process();
    }
    // The majority commits without the follower.
    EXPECT_EQ(c.Get(leader)->applied.size(), 100u);
    EXPECT_TRUE(c.Get(follower)->applied.empty());
    // Healed, the follower catches up on heartbeats (pre-vote and check
    // quorum keep it from disrupting the leader).
    c.Heal();
    for (int tick = 0; tick < 20 && c.Get(follower)->applied.size() < 100; ++tick) c.TickAll();
    EXPECT_EQ(c.Get(follower)->applied, c.Get(leader)->applied);
    EXPECT_THAT(c.Leaders(), ElementsAre(leader));
  });
}

TEST_F(GoRaftEngineTest, FollowerBehindCompactedLogGetsSnapshot) {
  InLoop([&] {
    Cluster c(&factory_);
    for (uint64_t id : {1, 2, 3}) c.Add(id, {1, 2, 3});
    uint64_t leader = c.ElectLeader();
    uint64_t follower = leader % 3 + 1;
    c.Isolate(follower);
    for (int i = 0; i < 50; ++i) {
      ASSERT_TRUE(c.Get(leader)->engine->Propose({absl::StrCat("v", i)}).ok());
      c.Process();
    }
    Member* l = c.Get(leader);
    l->storage.Compact(l->applied_index, l->conf_state);
    c.Heal();
    for (int tick = 0; tick < 20 && c.Get(follower)->applied.size() < 50; ++tick) c.TickAll();
    EXPECT_EQ(c.Get(follower)->applied, l->applied);
    EXPECT_EQ(c.Get(follower)->storage.FirstIndex(), l->storage.FirstIndex());
    EXPECT_THAT(c.Get(follower)->conf_state.voters, ElementsAre(1, 2, 3));
    // Replication continues after the snapshot.
    ASSERT_TRUE(l->engine->Propose({"after"}).ok());
    c.Process();
    EXPECT_EQ(c.Get(follower)->applied.back(), "after");
  });
}

TEST_F(GoRaftEngineTest, ReadIndexOnLeaderAndFollower) {
  InLoop([&] {
    Cluster c(&factory_);
    for (uint64_t id : {1, 2, 3}) c.Add(id, {1, 2, 3});
    uint64_t leader = c.ElectLeader();
    uint64_t follower = leader % 3 + 1;
    for (int i = 0; i < 10; ++i) {
      ASSERT_TRUE(c.Get(leader)->engine->Propose({absl::StrCat("v", i)}).ok());
    }
    c.Process();
    for (uint64_t id : {leader, follower}) {
      Member* m = c.Get(id);
      uint64_t committed = c.Get(leader)->commit;
      std::string ctx = absl::StrCat("read-", id);
      m->engine->ReadIndex(ctx);
      c.Process();
      ASSERT_EQ(m->read_states.size(), 1u) << "member " << id;
      EXPECT_EQ(m->read_states[0].context, ctx);
      EXPECT_GE(m->read_states[0].index, committed);
    }
  });
}

TEST_F(GoRaftEngineTest, TransferLeaderMovesLeadership) {
  InLoop([&] {
    Cluster c(&factory_);
    for (uint64_t id : {1, 2, 3}) c.Add(id, {1, 2, 3});
    uint64_t leader = c.ElectLeader();
    uint64_t target = leader % 3 + 1;
    c.Get(leader)->engine->TransferLeader(target);
    c.Process();
    EXPECT_THAT(c.Leaders(), ElementsAre(target));
    for (Member* m : c.All()) EXPECT_EQ(m->soft.lead, target) << "member " << m->id;
    EXPECT_EQ(c.Get(target)->engine->Status().soft_state.role, RaftRole::kLeader);
  });
}

TEST_F(GoRaftEngineTest, LearnerConfChangeAppliesOnAll) {
  InLoop([&] {
    Cluster c(&factory_);
    for (uint64_t id : {1, 2, 3}) c.Add(id, {1, 2, 3});
    uint64_t leader = c.ElectLeader();
    c.Add(4, {});  // joins with an empty log, as etcd's RestartNode of a new member
    ASSERT_TRUE(c.Get(leader)->engine->ProposeConfChange(false, ConfChange(kAddLearnerNode, 4)).ok());
    c.Process();
    ASSERT_TRUE(c.Get(leader)->engine->Propose({"after"}).ok());
    c.Process();
    for (Member* m : c.All()) {
      EXPECT_THAT(m->conf_state.voters, ElementsAre(1, 2, 3)) << "member " << m->id;
      EXPECT_THAT(m->conf_state.learners, ElementsAre(4)) << "member " << m->id;
      EXPECT_THAT(m->applied, ElementsAre("after")) << "member " << m->id;
    }
    RaftStatus st = c.Get(leader)->engine->Status();
    auto learner = std::find_if(st.progress.begin(), st.progress.end(),
                                [](const PeerProgress& p) { return p.id == 4; });
    ASSERT_NE(learner, st.progress.end());
    EXPECT_TRUE(learner->learner);
    EXPECT_EQ(learner->match, st.hard_state.commit);
  });
}

TEST_F(GoRaftEngineTest, BadInputIsAnErrorNotACrash) {
  InLoop([&] {
    Cluster c(&factory_);
    for (uint64_t id : {1, 2, 3}) c.Add(id, {1, 2, 3});
    c.Process();
    RaftEngine* e = c.Get(1)->engine.get();
    // Undecodable: field 1 as a length-delimited field longer than the input.
    EXPECT_TRUE(absl::IsInvalidArgument(e->Step(std::string("\x0a\xff\x01", 3))));
    EXPECT_TRUE(absl::IsInvalidArgument(e->Step(std::string("\xff\xff\xff\xff", 4))));
    // An empty message decodes as MsgHup, a local message.
    absl::Status local = e->Step("");
    EXPECT_TRUE(absl::IsFailedPrecondition(local)) << local;
    EXPECT_THAT(local.message(), HasSubstr("local message"));
    EXPECT_TRUE(absl::IsInvalidArgument(e->ProposeConfChange(false, std::string("\x0a\xff", 2))));
    EXPECT_TRUE(absl::IsInvalidArgument(e->Propose({})));
    // No leader yet: raft drops the proposal.
    absl::Status dropped = e->Propose({"x"});
    EXPECT_TRUE(absl::IsUnavailable(dropped)) << dropped;
    EXPECT_EQ(dropped.message(), "raft proposal dropped");
    // The engine still works.
    EXPECT_NE(c.ElectLeader(), 0u);
  });
}

TEST_F(GoRaftEngineTest, InvalidConfigIsRefused) {
  InLoop([&] {
    MemoryRaftStorage storage;
    RaftConfig config;
    config.id = 1;
    config.storage = &storage;
    config.election_tick = 1;
    config.heartbeat_tick = 1;
    auto engine = factory_.NewEngine(config);
    EXPECT_TRUE(absl::IsInvalidArgument(engine.status())) << engine.status();
    EXPECT_THAT(engine.status().message(), HasSubstr("election tick must be greater"));
    config.election_tick = 10;
    config.id = 0;
    EXPECT_TRUE(absl::IsInvalidArgument(factory_.NewEngine(config).status()));
    // Bootstrap voters for a log that already holds entries.
    config.id = 1;
    storage.Append({RaftEntry{.index = 1, .term = 1}});
    config.bootstrap_voters = {1};
    engine = factory_.NewEngine(config);
    EXPECT_THAT(engine.status().message(), HasSubstr("nonempty Storage"));
  });
}


// A storage whose LastIndex throws once armed.
class ThrowingStorage : public MemoryRaftStorage {
 public:
  uint64_t LastIndex() override {
    if (armed) throw std::runtime_error("disk on fire");
    return MemoryRaftStorage::LastIndex();
  }
  bool armed = false;
};

// raft panics on a failing storage; the shim logs the panic and aborts
// instead of unwinding through C++ (and the exception never reaches Go).
TEST_F(GoRaftEngineTest, StorageFailureAbortsWithTheReason) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(InLoop([&] {
                 ThrowingStorage storage;
                 RaftConfig config;
                 config.id = 1;
                 config.bootstrap_voters = {1};
                 config.storage = &storage;
                 config.log = [](int level, std::string_view line) {
                   if (level >= 3) fprintf(stderr, "log: %.*s\n", int(line.size()), line.data());
                 };
                 auto engine = factory_.NewEngine(config);
                 CHECK(engine.ok());
                 Ready rd = (*engine)->GetReady();  // the bootstrap entries, made stable
                 storage.Append(rd.entries);
                 (*engine)->Advance();
                 storage.armed = true;
                 (void)(*engine)->Campaign();
               }),
               "raft storage LastIndex threw an exception: disk on fire(.|\n)*"
               "Go panic in capstan_raft_campaign");
}


#ifndef NDEBUG
// Debug builds enforce the thread rules of go_raft_engine.h.
TEST_F(GoRaftEngineTest, DebugBuildsCheckTheLoopThread) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  MemoryRaftStorage storage;
  RaftConfig config;
  config.id = 1;
  config.bootstrap_voters = {1};
  config.storage = &storage;
  EXPECT_DEATH((void)factory_.NewEngine(config), "made inside GoRaftEngineFactory::RunLoop");
  std::unique_ptr<RaftEngine> engine;
  InLoop([&] { engine = *factory_.NewEngine(config); });
  EXPECT_DEATH(engine->Tick(), "used on one thread only");
  // Its loop has returned, so no thread may destroy it: leak it.
  (void)engine.release();
}
#endif

}  // namespace
}  // namespace capstan::replication
