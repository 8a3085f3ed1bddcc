// etcd's corruption checks between the members of a 3-member cluster:
// --experimental-initial-corrupt-check (kubeadm sets it) and
// --experimental-corrupt-check-time.
//
// - On etcd 3.5 and on Capstan, members holding the same data pass both: a
//   restarted member logs the initial check passed (a member started for the
//   first time skips it), the leader logs its periodic checks with both
//   peers checked, and no alarm is raised.
// - On Capstan, a member whose data differs (CAPSTAN_FAILPOINTS=corrupt-values
//   stores every put's value altered: etcd has no such hook in its release
//   builds) makes the leader's periodic check raise the CORRUPT alarm naming
//   it, after which every member refuses writes with etcd's "corrupt
//   cluster"; and restarted with the initial check, it refuses to start:
//   "found data inconsistency with peers".

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
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

grpc::Status Put(const Cluster& c, int i, const std::string& key, const std::string& value) {
  auto stub = etcdserverpb::KV::NewStub(c.NewChannel(i));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  etcdserverpb::PutResponse resp;
  return stub->Put(&ctx, req, &resp);
}

absl::StatusOr<etcdserverpb::AlarmResponse> Alarms(const Cluster& c, int i) {
  auto stub = etcdserverpb::Maintenance::NewStub(c.NewChannel(i));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  etcdserverpb::AlarmRequest req;
  req.set_action(etcdserverpb::AlarmRequest::GET);
  etcdserverpb::AlarmResponse resp;
  grpc::Status s = stub->Alarm(&ctx, req, &resp);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  return resp;
}

// How many times `line` is in member i's log.
int CountInLog(const Cluster& c, int i, const std::string& line) {
  const std::string log = c.ReadLog(i);
  int n = 0;
  for (size_t at = log.find(line); at != std::string::npos; at = log.find(line, at + 1)) ++n;
  return n;
}

class CorruptionCheckTest : public ::testing::TestWithParam<ServerFlavor> {
 protected:
  void SetUp() override {
    if (GetParam() == ServerFlavor::kEtcd) CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
  }
  ClusterOptions Options() const {
    return GetParam() == ServerFlavor::kEtcd ? ClusterOptions::Etcd(3) : ClusterOptions::Capstan(3);
  }
};

TEST_P(CorruptionCheckTest, MembersHoldingTheSameDataPassBothChecks) {
  ClusterOptions o = Options();
  o.extra_args = {"--experimental-initial-corrupt-check=true",
                  "--experimental-corrupt-check-time=1s"};
  auto cluster = Cluster::Start(o);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  // A member started for the first time has nothing to compare (etcd's
  // "newly started member does not need corruption check").
  for (int i = 0; i < c.size(); ++i) {
    EXPECT_EQ(CountInLog(c, i, "initial corruption checking passed"), 0) << c.LogTails(4000);
  }
  for (int n = 0; n < 30; ++n) {
    ASSERT_TRUE(Put(c, n % c.size(), absl::StrCat("k", n), "v").ok());
  }
  auto leader = c.WaitForLeader(seconds(10));
  ASSERT_TRUE(leader.ok()) << leader.status();
  // A follower restarted compares its data with both peers before serving.
  const int follower = (*leader + 1) % c.size();
  ASSERT_TRUE(c.WaitForConvergence(0, seconds(10)).ok());
  c.Stop(follower);
  ASSERT_TRUE(c.Restart(follower).ok());
  EXPECT_EQ(CountInLog(c, follower, "initial corruption checking passed; no corruption"), 1)
      << c.LogTails(4000);
  leader = c.WaitForLeader(seconds(10));
  ASSERT_TRUE(leader.ok()) << leader.status();
  // Two periodic checks on the leader after the writes, each hearing from
  // both peers (etcd's zap field and Capstan's line say it alike).
  const int before = CountInLog(c, *leader, "finished peer corruption check");
  const auto deadline = Clock::now() + seconds(20);
  while (CountInLog(c, *leader, "finished peer corruption check") < before + 2 &&
         Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(100));  // polling the log, with a deadline
  }
  EXPECT_GE(CountInLog(c, *leader, "finished peer corruption check"), before + 2)
      << c.LogTails(4000);
  const std::string log = c.ReadLog(*leader);
  EXPECT_NE(log.find("number-of-peers-checked"), std::string::npos);
  EXPECT_EQ(log.find("found hash mismatch"), std::string::npos);
  for (int i = 0; i < c.size(); ++i) {
    auto alarms = Alarms(c, i);
    ASSERT_TRUE(alarms.ok()) << alarms.status();
    EXPECT_EQ(alarms->alarms_size(), 0) << "member " << i << ": " << alarms->DebugString();
  }
  EXPECT_TRUE(Put(c, 0, "after", "v").ok());
}

INSTANTIATE_TEST_SUITE_P(Servers, CorruptionCheckTest,
                         ::testing::Values(ServerFlavor::kEtcd, ServerFlavor::kCapstan),
                         FlavorTestName());

// A cluster whose member `corrupt` (when >= 0) applies puts with their values
// altered, from its next start.
struct CorruptibleCluster {
  explicit CorruptibleCluster(std::vector<std::string> extra_args) {
    ClusterOptions o = ClusterOptions::Capstan(3);
    o.extra_args = std::move(extra_args);
    o.member_env = [this](const Cluster&, int i) {
      return i == corrupt ? std::vector<std::string>{"CAPSTAN_FAILPOINTS=corrupt-values"}
                          : std::vector<std::string>{};
    };
    auto started = Cluster::Start(o);
    status = started.status();
    if (started.ok()) cluster = std::move(*started);
  }
  // Restarts follower f as the corrupt member and writes through the
  // leader; returns f.
  absl::StatusOr<int> CorruptAFollower() {
    auto leader = cluster->WaitForLeader(seconds(10));
    if (!leader.ok()) return leader.status();
    const int f = (*leader + 1) % cluster->size();
    cluster->Stop(f);
    corrupt = f;
    if (auto s = cluster->Restart(f); !s.ok()) return s;
    if (cluster->ReadLog(f).find("failpoint corrupt-values is active") == std::string::npos) {
      return absl::InternalError("the member did not take the failpoint");
    }
    for (int n = 0; n < 20; ++n) {
      grpc::Status s = Put(*cluster, *leader, absl::StrCat("k", n), "v");
      // A periodic check may catch the difference before the last write.
      if (n > 0 && s.error_message() == "etcdserver: corrupt cluster") break;
      if (!s.ok()) return absl::UnavailableError(s.error_message());
    }
    return f;
  }

  int corrupt = -1;
  absl::Status status;
  std::unique_ptr<Cluster> cluster;
};

TEST(CapstanCorruptionCheckTest, AFollowerWithDifferentDataRaisesTheCorruptAlarm) {
  CorruptibleCluster cc({"--corrupt-check-time=1s"});
  ASSERT_TRUE(cc.status.ok()) << cc.status;
  Cluster& c = *cc.cluster;
  auto f = cc.CorruptAFollower();
  ASSERT_TRUE(f.ok()) << f.status();

  // The leader's next check finds the follower's hash at the leader's
  // revision different, and raises CORRUPT for it; every member then
  // refuses writes.
  etcdserverpb::AlarmResponse alarms;
  const auto deadline = Clock::now() + seconds(20);
  while (Clock::now() < deadline) {
    auto a = Alarms(c, 0);
    ASSERT_TRUE(a.ok()) << a.status();
    alarms = *a;
    if (alarms.alarms_size() > 0) break;
    std::this_thread::sleep_for(milliseconds(100));  // polling, with a deadline
  }
  ASSERT_EQ(alarms.alarms_size(), 1) << c.LogTails(4000);
  EXPECT_EQ(alarms.alarms(0).alarm(), etcdserverpb::CORRUPT);
  EXPECT_EQ(alarms.alarms(0).memberid(), c.member_id(*f));
  for (int i = 0; i < c.size(); ++i) {
    grpc::Status put = grpc::Status::OK;
    const auto until = Clock::now() + seconds(10);
    while ((put = Put(c, i, "refused", "v")).ok() && Clock::now() < until) {
      std::this_thread::sleep_for(milliseconds(50));  // the alarm applies at each member
    }
    EXPECT_EQ(put.error_code(), grpc::StatusCode::DATA_LOSS) << "member " << i;
    EXPECT_EQ(put.error_message(), "etcdserver: corrupt cluster") << "member " << i;
  }
  auto leader = c.WaitForLeader(seconds(10));
  ASSERT_TRUE(leader.ok());
  EXPECT_NE(c.ReadLog(*leader).find("same compact revision then hashes must match"),
            std::string::npos);
}

TEST(CapstanCorruptionCheckTest, AMemberWithDifferentDataDoesNotStartWithTheInitialCheck) {
  CorruptibleCluster cc({});
  ASSERT_TRUE(cc.status.ok()) << cc.status;
  Cluster& c = *cc.cluster;
  auto f = cc.CorruptAFollower();
  ASSERT_TRUE(f.ok()) << f.status();
  // The follower has applied the writes (with its altered values).
  ASSERT_TRUE(c.WaitForConvergence(0, seconds(10)).ok());
  c.Stop(*f);
  cc.corrupt = -1;
  absl::Status restarted = c.Restart(*f, {"--experimental-initial-corrupt-check=true"});
  EXPECT_FALSE(restarted.ok());
  auto exit = c.WaitForExit(*f, seconds(20));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_TRUE(exit->exited && exit->exit_code != 0) << exit->ToString();
  const std::string log = c.ReadLog(*f);
  EXPECT_NE(log.find("found different hash values from remote peer"), std::string::npos) << log;
  EXPECT_NE(log.find(absl::StrCat(absl::Hex(c.member_id(*f)),
                                  " found data inconsistency with peers")),
            std::string::npos)
      << log;
  // The others, whose data agree, start with the check.
  const int other = (*f + 1) % c.size();
  c.Stop(other);
  ASSERT_TRUE(c.Restart(other, {"--experimental-initial-corrupt-check=true"}).ok());
  EXPECT_NE(c.ReadLog(other).find("initial corruption checking passed; no corruption"),
            std::string::npos);
}

}  // namespace
}  // namespace capstan::testing::cluster
