// Maintenance.MoveLeader (etcdctl move-leader) in a 3-member cluster, on
// etcd 3.5 and on Capstan:
//   - etcdctl against the leader moves the leadership to the transferee:
//     every member then names it; asked again (the transferee now leads) it
//     answers at once; writes through every member go on;
//   - a follower answers "etcdserver: not leader" (etcdctl finds no leader
//     endpoint among the ones it is given), an ID that is not a member
//     "etcdserver: bad leader transferee"; a move to the leader itself is
//     answered at once, with etcd's empty response (no header);
//   - a transfer to a member that does not answer (SIGSTOPped) ends with the
//     client's deadline, the leader unchanged;
//   - writes submitted to the leader while a transfer runs (its transferee
//     paused until then) are answered once the new leader leads, on
//     Capstan; etcd 3.5 refuses them at once ("raft proposal dropped");
//   - a leader held up (SIGSTOP) for less than an election timeout keeps
//     the leadership and counts its late heartbeats
//     (etcd_server_heartbeat_send_failures_total) and logs etcd's warning.

#include <chrono>
#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "cluster/cluster_fixture.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "gtest/gtest.h"
#include "process_fixture.h"
#include "reference.h"

namespace capstan::testing::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// etcd's types.ID text: lower-case hex, no leading zeros.
std::string IdText(uint64_t id) { return absl::StrCat(absl::Hex(id)); }

// One RPC's outcome: the gRPC code and message.
struct Answer {
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string message;
  bool ok() const { return code == grpc::StatusCode::OK; }
};

std::string Describe(const Answer& a) { return absl::StrCat(a.code, " ", a.message); }

class MoveLeaderTest : public ::testing::TestWithParam<ServerFlavor> {
 protected:
  void SetUp() override {
    if (GetParam() == ServerFlavor::kEtcd) CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
    CAPSTAN_REQUIRE_REFERENCE("etcdctl", EtcdctlBinary());
  }

  bool capstan() const { return GetParam() == ServerFlavor::kCapstan; }

  void Start(int election_timeout_ms = 1000) {
    ClusterOptions o = capstan() ? ClusterOptions::Capstan(3) : ClusterOptions::Etcd(3);
    o.election_timeout_ms = election_timeout_ms;
    auto started = Cluster::Start(o);
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = std::move(*started);
    auto leader = cluster_->WaitForLeader(seconds(10));
    ASSERT_TRUE(leader.ok()) << leader.status();
    leader_ = *leader;
    transferee_ = (leader_ + 1) % cluster_->size();
    other_ = (leader_ + 2) % cluster_->size();
  }

  // `etcdctl --endpoints=<members' client URLs> <args>`.
  CommandResult Etcdctl(const std::vector<int>& members, std::vector<std::string> args) const {
    std::vector<std::string> urls;
    for (int i : members) urls.push_back(cluster_->client_url(i));
    std::vector<std::string> argv = {EtcdctlBinary(), "--endpoints=" + absl::StrJoin(urls, ",")};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, "", seconds(30));
  }

  Answer MoveLeader(int i, uint64_t target, etcdserverpb::MoveLeaderResponse* response = nullptr,
                    milliseconds timeout = seconds(10)) const {
    auto stub = etcdserverpb::Maintenance::NewStub(cluster_->NewChannel(i));
    etcdserverpb::MoveLeaderRequest req;
    req.set_targetid(target);
    etcdserverpb::MoveLeaderResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    grpc::Status s = stub->MoveLeader(&ctx, req, &resp);
    if (response != nullptr) *response = resp;
    return {s.error_code(), s.error_message()};
  }

  Answer Put(int i, const std::string& key, milliseconds timeout = seconds(10)) const {
    auto stub = etcdserverpb::KV::NewStub(cluster_->NewChannel(i));
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value("v");
    etcdserverpb::PutResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    grpc::Status s = stub->Put(&ctx, req, &resp);
    return {s.error_code(), s.error_message()};
  }

  // The value of `key` as member i reads it (serializable: its own store).
  std::string LocalValue(int i, const std::string& key) const {
    auto got = cluster_->LocalGet(i, key);
    if (!got.ok() || got->kvs_size() == 0) return "";
    return got->kvs(0).value();
  }

  // Polls until member i's log has `text` (a line the member wrote).
  ::testing::AssertionResult WaitForLogLine(int i, const std::string& text,
                                            milliseconds timeout) const {
    const auto deadline = Clock::now() + timeout;
    while (!absl::StrContains(cluster_->ReadLog(i), text)) {
      if (Clock::now() >= deadline) {
        return ::testing::AssertionFailure() << "member " << i << " never logged \"" << text
                                             << "\"; its log ends:\n"
                                             << cluster_->ReadLog(i, 4000);
      }
      std::this_thread::sleep_for(milliseconds(10));  // polling a condition, with a deadline
    }
    return ::testing::AssertionSuccess();
  }

  // How many Put calls member i has started (its grpc_server_started_total),
  // or -1 when its /metrics does not answer.
  int64_t PutsStarted(int i) const {
    return Metric(i, "grpc_server_started_total{", "grpc_method=\"Put\"", 0);
  }
  int64_t Metric(int i, absl::string_view prefix, absl::string_view label,
                 int64_t missing) const {
    return cluster_->Metric(i, prefix, label, missing);
  }

  uint64_t id(int i) const { return cluster_->member_id(i); }

  std::unique_ptr<Cluster> cluster_;
  int leader_ = -1;
  int transferee_ = -1;
  int other_ = -1;
};

TEST_P(MoveLeaderTest, EtcdctlMovesTheLeadershipToTheTransferee) {
  ASSERT_NO_FATAL_FAILURE(Start());
  CommandResult moved = Etcdctl({leader_}, {"move-leader", IdText(id(transferee_))});
  ASSERT_TRUE(moved.exit.exited && moved.exit.exit_code == 0)
      << moved.exit.ToString() << ": " << moved.err;
  EXPECT_EQ(moved.out, absl::StrCat("Leadership transferred from ", IdText(id(leader_)), " to ",
                                    IdText(id(transferee_)), "\n"));
  // etcdctl returned once the old leader saw the transferee lead; the third
  // member learns it from the new leader's first message.
  auto now = cluster_->WaitForLeader(seconds(10));
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(*now, transferee_);
  for (int i = 0; i < cluster_->size(); ++i) {
    auto status = cluster_->Status(i);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->leader(), id(transferee_)) << "member " << i;
    // The metrics operators alert on say the same.
    EXPECT_EQ(Metric(i, "etcd_server_has_leader ", "", -2), 1) << "member " << i;
    EXPECT_EQ(Metric(i, "etcd_server_is_leader ", "", -2), i == transferee_ ? 1 : 0)
        << "member " << i;
    // Each member saw the first leader and the transferee.
    EXPECT_GE(Metric(i, "etcd_server_leader_changes_seen_total ", "", -2), 2) << "member " << i;
    EXPECT_EQ(Metric(i, "etcd_server_id{", absl::StrFormat("\"%x\"", id(i)), -2), 1)
        << "member " << i;
    // Every member synced its log (the WAL) for the entries it took.
    EXPECT_GT(Metric(i, "etcd_disk_wal_fsync_duration_seconds_count", "", -2), 0)
        << "member " << i;
    // The new leader and each follower talk, over an open connection.
    if (i != transferee_) {
      const std::string follower = absl::StrFormat("\"%x\"", id(i));
      const std::string leader = absl::StrFormat("\"%x\"", id(transferee_));
      EXPECT_GT(Metric(i, "etcd_network_peer_sent_bytes_total{", leader, 0), 0) << "member " << i;
      EXPECT_GT(Metric(i, "etcd_network_peer_received_bytes_total{", leader, 0), 0)
          << "member " << i;
      EXPECT_GT(Metric(transferee_, "etcd_network_peer_sent_bytes_total{", follower, 0), 0)
          << "member " << i;
      EXPECT_EQ(Metric(transferee_, "etcd_network_active_peers{", "Remote=" + follower, 0), 1)
          << "member " << i;
    }
  }
  // Each member's prober observes its first round trip to every peer 5 s
  // after it added the peer (etcd's statusErrorInterval), into etcd's
  // buckets; etcd's alert on slow member communication reads them.
  for (int i = 0; i < cluster_->size(); ++i) {
    for (int peer = 0; peer < cluster_->size(); ++peer) {
      if (peer == i) continue;
      const std::string to = absl::StrFormat("To=\"%x\"", id(peer));
      const auto deadline = Clock::now() + seconds(15);
      while (Metric(i, "etcd_network_peer_round_trip_time_seconds_count{", to, 0) == 0 &&
             Clock::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(100));  // polling a condition, with a deadline
      }
      EXPECT_GT(Metric(i, "etcd_network_peer_round_trip_time_seconds_count{", to, 0), 0)
          << "member " << i << " to " << peer;
      EXPECT_GE(Metric(i, "etcd_network_peer_round_trip_time_seconds_bucket{",
                       to + ",le=\"3.2768\"", -1),
                1)
          << "member " << i << " to " << peer;
    }
  }

  // Given every endpoint, etcdctl finds the new leader; moving the
  // leadership to it is done at once.
  CommandResult again = Etcdctl({0, 1, 2}, {"move-leader", IdText(id(transferee_))});
  ASSERT_TRUE(again.exit.exited && again.exit.exit_code == 0)
      << again.exit.ToString() << ": " << again.err;
  EXPECT_EQ(again.out, absl::StrCat("Leadership transferred from ", IdText(id(transferee_)),
                                    " to ", IdText(id(transferee_)), "\n"));
  now = cluster_->WaitForLeader(seconds(10));
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(*now, transferee_);

  // Writes go on, through every member, and every member applies them.
  for (int i = 0; i < cluster_->size(); ++i) {
    Answer put = Put(i, absl::StrCat("after-move/", i));
    EXPECT_TRUE(put.ok()) << "member " << i << ": " << Describe(put);
  }
  auto converged = cluster_->WaitForConvergence(4, seconds(10));
  EXPECT_TRUE(converged.ok()) << converged.status();
}

TEST_P(MoveLeaderTest, AFollowerAndANonMemberAreRefusedWithEtcdsErrors) {
  ASSERT_NO_FATAL_FAILURE(Start());
  // Only the leader takes it, whatever the target.
  for (uint64_t target : {id(transferee_), id(leader_), uint64_t{0x1234}}) {
    Answer a = MoveLeader(transferee_, target);
    EXPECT_EQ(a.code, grpc::StatusCode::FAILED_PRECONDITION) << Describe(a);
    EXPECT_EQ(a.message, "etcdserver: not leader");
  }
  // The transferee must be a member.
  for (uint64_t target : {uint64_t{0x1234}, uint64_t{0}}) {
    Answer a = MoveLeader(leader_, target);
    EXPECT_EQ(a.code, grpc::StatusCode::FAILED_PRECONDITION) << Describe(a);
    EXPECT_EQ(a.message, "etcdserver: bad leader transferee");
  }
  // To the leader itself: done, with an empty response.
  etcdserverpb::MoveLeaderResponse response;
  response.mutable_header()->set_member_id(1);  // must be overwritten by the answer
  Answer self = MoveLeader(leader_, id(leader_), &response);
  EXPECT_TRUE(self.ok()) << Describe(self);
  EXPECT_FALSE(response.has_header());

  // etcdctl asks the leader among its endpoints: a follower alone is none.
  CommandResult follower = Etcdctl({transferee_}, {"move-leader", IdText(id(other_))});
  EXPECT_TRUE(follower.exit.exited && follower.exit.exit_code != 0) << follower.exit.ToString();
  EXPECT_TRUE(absl::StrContains(follower.err,
                                absl::StrCat("Error: no leader endpoint given at [",
                                             cluster_->client_url(transferee_), "]")))
      << follower.err;
  CommandResult bad = Etcdctl({leader_}, {"move-leader", "1234"});
  EXPECT_TRUE(bad.exit.exited && bad.exit.exit_code != 0) << bad.exit.ToString();
  EXPECT_TRUE(absl::StrContains(bad.err, "Error: etcdserver: bad leader transferee")) << bad.err;

  // None of it moved the leadership.
  auto now = cluster_->WaitForLeader(seconds(10));
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(*now, leader_);
}

TEST_P(MoveLeaderTest, ATransferThatCannotFinishEndsWithTheClientsDeadline) {
  ASSERT_NO_FATAL_FAILURE(Start());
  // A transferee that answers nobody never takes over; raft gives the
  // transfer up after an election timeout, and the call waits on until its
  // client's deadline, as etcd's does.
  ASSERT_TRUE(cluster_->Pause(transferee_).ok());
  CommandResult moved = Etcdctl(
      {leader_}, {"--command-timeout=3s", "move-leader", IdText(id(transferee_))});
  EXPECT_TRUE(moved.exit.exited && moved.exit.exit_code != 0) << moved.exit.ToString();
  // The client's deadline passes on both sides at once: etcdctl reports its
  // own, or etcd's answer when the server's came first (etcd: either).
  EXPECT_TRUE(absl::StrContains(moved.err, "Error: context deadline exceeded") ||
              absl::StrContains(moved.err,
                                "Error: rpc error: code = Unknown desc = etcdserver: request "
                                "timed out, leader transfer took too long"))
      << moved.err;
  auto status = cluster_->Status(leader_);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->leader(), id(leader_));
  // The leader serves writes again (raft gave the transfer up).
  Answer put = Put(leader_, "after-timeout");
  EXPECT_TRUE(put.ok()) << Describe(put);
  ASSERT_TRUE(cluster_->Resume(transferee_).ok());
  // The transferee may still act on the transfer's message once it runs
  // again: a leader is agreed either way.
  auto now = cluster_->WaitForLeader(seconds(10));
  EXPECT_TRUE(now.ok()) << now.status();
}

TEST_P(MoveLeaderTest, WritesSubmittedDuringATransferAreAnsweredOnceTheNewLeaderLeads) {
  // A long election timeout: raft gives a transfer up after one, and this
  // one must outlast the steps below on a loaded machine.
  ASSERT_NO_FATAL_FAILURE(Start(/*election_timeout_ms=*/5000));
  // The transferee is paused: the transfer starts and stays under way.
  ASSERT_TRUE(cluster_->Pause(transferee_).ok());
  auto move = [this] { return MoveLeader(leader_, id(transferee_), nullptr, seconds(30)); };
  std::shared_future<Answer> moved = std::async(std::launch::async, move).share();
  ASSERT_TRUE(WaitForLogLine(leader_,
                             absl::StrCat("starts to transfer leadership to ",
                                          IdText(id(transferee_))),
                             seconds(10)));
  // Raft drops proposals while the transfer runs.
  constexpr int kWrites = 5;
  const int64_t puts_before = PutsStarted(leader_);
  ASSERT_GE(puts_before, 0);
  std::vector<std::shared_future<Answer>> writes;
  for (int w = 0; w < kWrites; ++w) {
    auto put = [this, w] { return Put(leader_, absl::StrCat("during-move/", w), seconds(20)); };
    writes.push_back(std::async(std::launch::async, put).share());
  }
  if (!capstan()) {
    // etcd 3.5 answers them at once: its proposal fails.
    for (const auto& f : writes) {
      const Answer& a = f.get();
      EXPECT_EQ(a.code, grpc::StatusCode::UNKNOWN) << Describe(a);
      EXPECT_EQ(a.message, "raft proposal dropped");
    }
  } else {
    // Capstan holds them: once the leader has them all, none is answered
    // while the transfer is under way.
    const auto deadline = Clock::now() + seconds(10);
    while (PutsStarted(leader_) < puts_before + kWrites && Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(10));  // polling a condition, with a deadline
    }
    ASSERT_GE(PutsStarted(leader_), puts_before + kWrites);
    for (int w = 0; w < kWrites; ++w) {
      EXPECT_EQ(writes[w].wait_for(milliseconds(0)), std::future_status::timeout)
          << "write " << w << " was answered during the transfer: " << Describe(writes[w].get());
    }
  }
  // The call waits for the transferee to lead.
  EXPECT_EQ(moved.wait_for(milliseconds(0)), std::future_status::timeout)
      << "MoveLeader was answered before the transferee could lead: " << Describe(moved.get());
  // The transferee runs again, takes the transfer's message and leads.
  ASSERT_TRUE(cluster_->Resume(transferee_).ok());
  Answer a = moved.get();
  EXPECT_TRUE(a.ok()) << Describe(a);
  auto now = cluster_->WaitForLeader(seconds(10));
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(*now, transferee_);
  if (capstan()) {
    // Capstan keeps them, and proposes them again until the new leader
    // takes them.
    for (int w = 0; w < kWrites; ++w) {
      Answer put = writes[w].get();
      EXPECT_TRUE(put.ok()) << "write " << w << ": " << Describe(put);
    }
    for (int i = 0; i < cluster_->size(); ++i) {
      for (int w = 0; w < kWrites; ++w) {
        const std::string key = absl::StrCat("during-move/", w);
        const auto deadline = Clock::now() + seconds(10);
        while (LocalValue(i, key) != "v" && Clock::now() < deadline) {
          std::this_thread::sleep_for(milliseconds(10));  // polling a condition, with a deadline
        }
        EXPECT_EQ(LocalValue(i, key), "v") << "member " << i << ", " << key;
      }
    }
  }
}

TEST_P(MoveLeaderTest, ALeaderHeldUpCountsItsLateHeartbeats) {
  ASSERT_NO_FATAL_FAILURE(Start(/*election_timeout_ms=*/3000));
  for (int i = 0; i < cluster_->size(); ++i) {
    EXPECT_EQ(Metric(i, "etcd_server_heartbeat_send_failures_total ", "", -1), 0) << "member " << i;
    EXPECT_EQ(Metric(i, "etcd_server_slow_read_indexes_total ", "", -1), 0) << "member " << i;
    EXPECT_EQ(Metric(i, "etcd_server_read_indexes_failed_total ", "", -1), 0) << "member " << i;
  }
  // The new leader's detector times heartbeats from its first ones: wait
  // until messages went to each follower after the first scrape (an idle
  // leader sends only heartbeats).
  for (int f : {transferee_, other_}) {
    const std::string to = absl::StrFormat("\"%x\"", id(f));
    const int64_t sent = Metric(leader_, "etcd_network_peer_sent_bytes_total{", to, 0);
    const auto deadline = Clock::now() + seconds(10);
    while (Metric(leader_, "etcd_network_peer_sent_bytes_total{", to, 0) <= sent &&
           Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(20));  // polling a condition, with a deadline
    }
  }
  // Held for 5 heartbeat intervals, under a third of the election timeout:
  // the followers keep it as leader, and its next heartbeats leave late.
  ASSERT_TRUE(cluster_->Pause(leader_).ok());
  std::this_thread::sleep_for(milliseconds(500));  // the fault's length, not a wait for an event
  ASSERT_TRUE(cluster_->Resume(leader_).ok());
  EXPECT_TRUE(WaitForLogLine(leader_, "leader failed to send out heartbeat on time", seconds(10)));
  const auto deadline = Clock::now() + seconds(10);
  while (Metric(leader_, "etcd_server_heartbeat_send_failures_total ", "", -1) < 1 &&
         Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(50));  // polling a condition, with a deadline
  }
  EXPECT_GE(Metric(leader_, "etcd_server_heartbeat_send_failures_total ", "", -1), 1);
  auto now = cluster_->WaitForLeader(seconds(10));
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(*now, leader_);
  // A follower sends no heartbeats.
  EXPECT_EQ(Metric(transferee_, "etcd_server_heartbeat_send_failures_total ", "", -1), 0);
}

INSTANTIATE_TEST_SUITE_P(Servers, MoveLeaderTest,
                         ::testing::Values(ServerFlavor::kEtcd, ServerFlavor::kCapstan),
                         FlavorTestName());

}  // namespace
}  // namespace capstan::testing::cluster
