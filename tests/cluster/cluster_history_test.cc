// A 3-member cluster under load and faults, its history checked, run on
// etcd 3.5 (which keeps the checker honest) and on Capstan:
//   - 8 clients (endpoints spread over the members) put, get, CAS and delete
//     on a few keys for ~15 s while the leader and then a follower are
//     SIGKILLed and restarted; the history has no violation and every
//     member's HashKV at the final revision is the same.
//   - serializable reads at a follower that was paused while a write
//     committed, and a recorded answer corrupted on purpose, are caught.

#include <algorithm>
#include <cstdlib>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cluster/checker.h"
#include "cluster/cluster_fixture.h"
#include "cluster/history.h"
#include "cluster/kv_client.h"
#include "gtest/gtest.h"
#include "process_fixture.h"
#include "reference.h"

namespace capstan::testing::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

const char kPrefix[] = "/lin/";

std::string Key(int i) { return absl::StrCat(kPrefix, "k", i); }

// Polls until the history has `n` more ok operations than `from`, or fails.
::testing::AssertionResult WaitForProgress(const History& h, int64_t from, int64_t n,
                                           milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (h.ok_count() < from + n) {
    if (Clock::now() >= deadline) {
      return ::testing::AssertionFailure()
             << "only " << (h.ok_count() - from) << " of " << n << " operations completed in "
             << timeout.count() << " ms";
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  return ::testing::AssertionSuccess();
}

// The event log of the key space up to the cluster's converged revision,
// read from member `at`.
std::vector<Event> FinalEventLog(const Cluster& cluster, int at, int64_t* final_rev) {
  auto rev = cluster.WaitForConvergence(0, seconds(20));
  EXPECT_TRUE(rev.ok()) << rev.status();
  if (!rev.ok()) return {};
  *final_rev = *rev;
  auto events = ReadEventLog(cluster.endpoint(at), kPrefix, *rev, seconds(20));
  EXPECT_TRUE(events.ok()) << events.status();
  return events.ok() ? *events : std::vector<Event>{};
}

class ClusterTest : public ::testing::TestWithParam<ServerFlavor> {
 protected:
  void SetUp() override {
    if (GetParam() == ServerFlavor::kEtcd) CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
  }
  ClusterOptions Options(int members) const {
    return GetParam() == ServerFlavor::kEtcd ? ClusterOptions::Etcd(members)
                                             : ClusterOptions::Capstan(members);
  }
};

void ExpectHashesEqual(const Cluster& cluster, int64_t rev) {
  std::vector<uint32_t> hashes;
  for (int i = 0; i < cluster.size(); ++i) {
    auto h = cluster.HashKV(i, rev);
    ASSERT_TRUE(h.ok()) << h.status();
    hashes.push_back(h->hash());
    std::printf("member %s HashKV at %lld: hash %u compact_revision %lld\n",
                cluster.name(i).c_str(), static_cast<long long>(rev), h->hash(),
                static_cast<long long>(h->compact_revision()));
  }
  for (size_t i = 1; i < hashes.size(); ++i) {
    EXPECT_EQ(hashes[i], hashes[0]) << "member " << cluster.name(i) << " differs at " << rev;
  }
}

TEST_P(ClusterTest, HistoryUnderLeaderAndFollowerCrashesIsLinearizable) {
  auto started = Cluster::Start(Options(3));
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& cluster = **started;

  constexpr int kClients = 8;
  constexpr int kKeys = 8;
  const auto kRunFor = seconds(15);
  History history;
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<KvClient>> clients;
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    clients.push_back(std::make_unique<KvClient>(c, cluster.endpoints(), c, &history));
  }
  const auto start = Clock::now();
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back(RunEtcdTraffic, clients[c].get(), kPrefix, kKeys, 1000 + c, &stop);
  }
  auto join = [&] {
    stop = true;
    for (auto& t : threads) t.join();
    threads.clear();
  };

  // Faults spread over the run (a timeline), each after the cluster has
  // shown progress.
  auto run_until = [&](std::chrono::milliseconds at) {
    while (Clock::now() - start < at) {
      ASSERT_TRUE(WaitForProgress(history, history.ok_count(), 1, seconds(20)));
      std::this_thread::sleep_for(milliseconds(50));
    }
  };
  ASSERT_TRUE(WaitForProgress(history, 0, 300, seconds(20)));
  run_until(seconds(3));
  auto leader = cluster.WaitForLeader(seconds(10));
  ASSERT_TRUE(leader.ok()) << leader.status();
  std::printf("killing leader %s at %.1f s\n", cluster.name(*leader).c_str(),
              std::chrono::duration<double>(Clock::now() - start).count());
  cluster.Kill(*leader);
  auto new_leader = cluster.WaitForLeader(seconds(15));
  ASSERT_TRUE(new_leader.ok()) << new_leader.status();
  ASSERT_TRUE(WaitForProgress(history, history.ok_count(), 300, seconds(20)));
  ASSERT_TRUE(cluster.Restart(*leader).ok());

  ASSERT_TRUE(WaitForProgress(history, history.ok_count(), 300, seconds(20)));
  run_until(seconds(8));
  auto now_leader = cluster.WaitForLeader(seconds(15));
  ASSERT_TRUE(now_leader.ok()) << now_leader.status();
  // A follower other than the member killed first, when there is one.
  int follower = (*now_leader + 1) % cluster.size();
  for (int i = 0; i < cluster.size(); ++i) {
    if (i != *now_leader && i != *leader) follower = i;
  }
  std::printf("killing follower %s at %.1f s\n", cluster.name(follower).c_str(),
              std::chrono::duration<double>(Clock::now() - start).count());
  cluster.Kill(follower);
  ASSERT_TRUE(WaitForProgress(history, history.ok_count(), 300, seconds(20)));
  // What the leader could not send to the member down is counted, as
  // etcd's alert on unreachable members reads it.
  const std::string down = absl::StrFormat("To=\"%x\"", cluster.member_id(follower));
  EXPECT_GT(cluster.Metric(*now_leader, "etcd_network_peer_sent_failures_total{", down, 0), 0);
  ASSERT_TRUE(cluster.Restart(follower).ok());

  run_until(kRunFor);
  join();
  const double run_seconds = std::chrono::duration<double>(Clock::now() - start).count();

  // Final linearizable reads of every key, recorded like the others.
  KvClient reader(kClients, cluster.endpoints(), 0, &history);
  for (int k = 0; k < kKeys; ++k) {
    Operation op = reader.Get(Key(k));
    if (op.outcome != Outcome::kOk) op = reader.Get(Key(k));
    EXPECT_EQ(op.outcome, Outcome::kOk) << op.ToString();
  }

  int64_t final_rev = 0;
  std::vector<Event> events = FinalEventLog(cluster, 0, &final_rev);
  ASSERT_FALSE(events.empty());
  const std::vector<Operation> ops = history.Operations();
  CheckResult result = CheckHistory(ops, events);
  std::printf("run: %.1f s, %lld ok operations, %.0f ops/s; final revision %lld\n", run_seconds,
              static_cast<long long>(result.stats.ok), result.stats.ok / run_seconds,
              static_cast<long long>(final_rev));
  std::printf("checker: %s\n", result.Report(0).c_str());
  EXPECT_TRUE(result.ok()) << result.Report();
  EXPECT_GT(result.stats.ok, 1000);
  ExpectHashesEqual(cluster, final_rev);
}

TEST_P(ClusterTest, StaleAndCorruptedReadsAreCaught) {
  auto started = Cluster::Start(Options(3));
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& cluster = **started;
  auto leader = cluster.WaitForLeader(seconds(10));
  ASSERT_TRUE(leader.ok()) << leader.status();
  const int follower = (*leader + 1) % cluster.size();

  History history;
  KvClient writer(0, cluster.endpoints(), *leader, &history);
  writer.Pin(*leader);
  KvClient stale_reader(1, cluster.endpoints(), follower, &history);
  stale_reader.Pin(follower);
  KvClient reader(2, cluster.endpoints(), follower, &history);
  reader.Pin(follower);
  const std::string key = Key(0);
  ASSERT_EQ(writer.Put(key, writer.NextValue()).outcome, Outcome::kOk);
  ASSERT_EQ(stale_reader.Get(key, /*serializable=*/true).outcome, Outcome::kOk);  // connected

  // The follower lags: paused while a write commits on the other two, then
  // read locally (serializable) the moment it runs again. Repeated until a
  // read comes back stale (the first one almost always does).
  int attempts = 0;
  size_t stale = 0;
  const auto deadline = Clock::now() + seconds(30);
  while (stale == 0 && Clock::now() < deadline && attempts < 50) {
    ++attempts;
    ASSERT_TRUE(cluster.Pause(follower).ok());
    Operation w = writer.Put(key, writer.NextValue());
    ASSERT_EQ(w.outcome, Outcome::kOk) << w.ToString();
    ASSERT_TRUE(cluster.Resume(follower).ok());
    stale_reader.Get(key, /*serializable=*/true);
    // A linearizable read at the same follower is never stale.
    reader.Get(key);
    int64_t rev = 0;
    std::vector<Event> events = FinalEventLog(cluster, *leader, &rev);
    ASSERT_FALSE(events.empty());
    CheckResult r = CheckHistory(history.Operations(), events);
    stale = r.Count(Rule::kStaleRead);
    ASSERT_EQ(stale, r.violations.size()) << r.Report();
    for (const Violation& v : r.violations) {
      ASSERT_EQ(v.op_ids.size(), 2u);
      const Operation read = history.At(v.op_ids[1]);
      EXPECT_TRUE(read.serializable) << v.message;
      EXPECT_EQ(read.client, 1) << v.message;
    }
    if (stale > 0) std::printf("stale read caught: %s\n", r.Report(3).c_str());
  }
  EXPECT_GT(stale, 0u) << "no serializable read at the paused follower came back stale in "
                       << attempts << " attempts";

  // A recorded answer corrupted on purpose: a linearizable read whose value
  // is replaced by the one written before it.
  int64_t rev = 0;
  std::vector<Event> events = FinalEventLog(cluster, *leader, &rev);
  std::vector<Operation> ops = history.Operations();
  std::vector<Operation> linearizable_only;
  for (const Operation& op : ops) {
    if (!op.serializable) linearizable_only.push_back(op);
  }
  for (size_t i = 0; i < linearizable_only.size(); ++i) linearizable_only[i].id = i;
  CheckResult clean = CheckHistory(linearizable_only, events);
  EXPECT_TRUE(clean.ok()) << clean.Report();
  Operation* victim = nullptr;
  for (auto it = linearizable_only.rbegin(); it != linearizable_only.rend(); ++it) {
    if (it->kind == OpKind::kGet && it->outcome == Outcome::kOk && it->response.found) {
      victim = &*it;
      break;
    }
  }
  ASSERT_NE(victim, nullptr);
  victim->response.value = "c0-1";  // the first value written, long overwritten
  CheckResult corrupted = CheckHistory(linearizable_only, events);
  EXPECT_EQ(corrupted.Count(Rule::kWrongRead), 1u) << corrupted.Report();
  std::printf("corrupted answer caught: %s\n", corrupted.Report(3).c_str());
}

// Puts a fresh value until one is acknowledged (a write during an election
// or at a member that just stopped may come back unknown; the client moves
// on to the next member, as clientv3 does).
::testing::AssertionResult PutUntilOk(KvClient* client, const std::string& key,
                                      milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (true) {
    Operation op = client->Put(key, client->NextValue());
    if (op.outcome == Outcome::kOk) return ::testing::AssertionSuccess();
    if (Clock::now() >= deadline) return ::testing::AssertionFailure() << op.ToString();
  }
}

// The fixture with 5 members: a paused leader is replaced, a stopped member
// restarts on its data, and every member ends with the same HashKV.
TEST_P(ClusterTest, FiveMembersSurvivePauseStopAndRestart) {
  auto started = Cluster::Start(Options(5));
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& cluster = **started;
  ASSERT_EQ(cluster.endpoints().size(), 5u);
  auto leader = cluster.WaitForLeader(seconds(10));
  ASSERT_TRUE(leader.ok()) << leader.status();

  History history;
  KvClient client(0, cluster.endpoints(), (*leader + 1) % 5, &history);
  ASSERT_TRUE(PutUntilOk(&client, Key(0), seconds(15)));

  ASSERT_TRUE(cluster.Pause(*leader).ok());
  EXPECT_TRUE(cluster.paused(*leader));
  auto next = cluster.WaitForLeader(seconds(15));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_NE(*next, *leader);
  ASSERT_TRUE(PutUntilOk(&client, Key(1), seconds(15)));
  ASSERT_TRUE(cluster.Resume(*leader).ok());

  const int stopped = (*next + 2) % 5;
  ExitInfo exit = cluster.Stop(stopped);
  EXPECT_FALSE(cluster.running(stopped)) << exit.ToString();
  ASSERT_TRUE(PutUntilOk(&client, Key(2), seconds(15)));
  ASSERT_TRUE(cluster.Restart(stopped).ok());
  ASSERT_TRUE(cluster.WaitForLeader(seconds(15)).ok());

  for (int k = 0; k < 3; ++k) {
    const auto deadline = Clock::now() + seconds(15);
    while (client.Get(Key(k)).outcome != Outcome::kOk && Clock::now() < deadline) {
    }
  }
  int64_t rev = 0;
  std::vector<Event> events = FinalEventLog(cluster, stopped, &rev);
  CheckResult r = CheckHistory(history.Operations(), events);
  EXPECT_TRUE(r.ok()) << r.Report();
  EXPECT_GE(r.stats.ok, 6);
  ExpectHashesEqual(cluster, rev);
}

// The checker catches a broken build: members that answer their writes
// before a quorum has them (the answer-before-commit failpoint) make
// histories that no linearizable store could have produced.
TEST(CapstanFailpointTest, AnsweringBeforeCommitIsCaught) {
  ::setenv("CAPSTAN_FAILPOINTS", "answer-before-commit", 1);
  auto started = Cluster::Start(ClusterOptions::Capstan(3));
  ::unsetenv("CAPSTAN_FAILPOINTS");
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& cluster = **started;
  ASSERT_TRUE(cluster.WaitForLeader(seconds(10)).ok());

  constexpr int kClients = 6;
  constexpr int kKeys = 4;
  History history;
  std::atomic<bool> stop{false};
  std::vector<std::unique_ptr<KvClient>> clients;
  std::vector<std::thread> threads;
  for (int c = 0; c < kClients; ++c) {
    // Each client stays on one member, so every member proposes.
    clients.push_back(std::make_unique<KvClient>(c, cluster.endpoints(), c % 3, &history));
    clients.back()->Pin(c % 3);
  }
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back(RunEtcdTraffic, clients[c].get(), kPrefix, kKeys, 2000 + c, &stop);
  }
  ASSERT_TRUE(WaitForProgress(history, 0, 600, seconds(20)));
  stop = true;
  for (auto& t : threads) t.join();

  // The members no longer agree on revisions: read member 0's log at its
  // own revision.
  KvClient reader(kClients, cluster.endpoints(), 0, &history);
  reader.Pin(0);
  Operation last = reader.Get(Key(0), /*serializable=*/true);
  ASSERT_EQ(last.outcome, Outcome::kOk) << last.ToString();
  auto events = ReadEventLog(cluster.endpoint(0), kPrefix, last.response.revision, seconds(20));
  ASSERT_TRUE(events.ok()) << events.status();
  CheckResult r = CheckHistory(history.Operations(), *events);
  std::printf("answer-before-commit: %s\n", r.Report(3).c_str());
  EXPECT_FALSE(r.ok()) << "the checker found nothing wrong with a member that answers before "
                          "the quorum has its writes";
}

INSTANTIATE_TEST_SUITE_P(Servers, ClusterTest,
                         ::testing::Values(ServerFlavor::kEtcd, ServerFlavor::kCapstan),
                         FlavorTestName());

}  // namespace
}  // namespace capstan::testing::cluster
