// Fault campaigns (campaign.h) in the test suite: a bounded set of seeds on
// 3 and 5 members (and 3 over peer TLS), each run on etcd 3.5 (which keeps
// the checkers honest) and on Capstan, every fault kind drawn; and each
// checker shown to fail when a campaign's real record is given the bug it
// exists to catch.
// `make robustness` runs the longer campaign with capstan-robustness.

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "cluster/campaign.h"
#include "gtest/gtest.h"
#include "process_fixture.h"
#include "reference.h"

namespace capstan::testing::cluster {
namespace {

using std::chrono::seconds;

class RobustnessTest : public ::testing::TestWithParam<ServerFlavor> {
 protected:
  void SetUp() override {
    if (GetParam() == ServerFlavor::kEtcd) CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
  }
  CampaignOptions Options(uint64_t seed, int members) const {
    CampaignOptions o;
    o.flavor = GetParam();
    o.seed = seed;
    o.members = members;
    o.duration = seconds(20);
    o.verbose = true;
    return o;
  }
};

TEST_P(RobustnessTest, ThreeMembersEveryFault) {
  CampaignResult r = RunCampaign(Options(1, 3));
  std::printf("%s", r.Report().c_str());
  EXPECT_TRUE(r.passed()) << r.Report();
  EXPECT_GE(r.faults.size(), 3u);
  EXPECT_GT(r.ok, 500);
  EXPECT_GT(r.watch_events, 0);
  EXPECT_GT(r.leases_expired, 0);
  EXPECT_GT(r.list_pages, 0);
  EXPECT_GT(r.compactions, 0);
}

TEST_P(RobustnessTest, FiveMembersPartitionsAndCrashes) {
  CampaignOptions o = Options(2, 5);
  o.faults = {Fault::kSplitMajority, Fault::kIsolateLeader, Fault::kKillLeader,
              Fault::kOneWayToLeader, Fault::kPauseLeader};
  CampaignResult r = RunCampaign(o);
  std::printf("%s", r.Report().c_str());
  EXPECT_TRUE(r.passed()) << r.Report();
  EXPECT_GE(r.faults.size(), 4u);
}

// Peer URLs over TLS with client certificates, as kubeadm sets them up: the
// Raft streams' TLS writes and reads through crashes, partitions and
// flapping links.
TEST_P(RobustnessTest, ThreeMembersOverPeerTls) {
  CampaignOptions o = Options(5, 3);
  o.peer_tls = true;
  o.duration = seconds(15);
  o.faults = {Fault::kKillLeader, Fault::kIsolateLeader, Fault::kFlappingLink,
              Fault::kOneWayFromLeader, Fault::kKillMember};
  o.cycle_faults = true;
  CampaignResult r = RunCampaign(o);
  std::printf("%s", r.Report().c_str());
  EXPECT_TRUE(r.passed()) << r.Report();
  EXPECT_GE(r.faults.size(), 3u);
  EXPECT_GT(r.ok, 300);
}

// A learner joining over slow links, SIGKILLed while it catches up (by
// snapshot: the leader compacts its log), then removed; and, on Capstan,
// members whose disk fails.
TEST_P(RobustnessTest, LaggingLearnerAndFailingDisks) {
  CampaignOptions o = Options(4, 3);
  o.faults = {Fault::kLaggingLearner, Fault::kDiskFailure};
  o.cycle_faults = true;
  CampaignResult r = RunCampaign(o);
  std::printf("%s", r.Report().c_str());
  EXPECT_TRUE(r.passed()) << r.Report();
  EXPECT_TRUE(std::any_of(r.faults.begin(), r.faults.end(), [](const InjectedFault& f) {
    return f.fault == Fault::kLaggingLearner;
  })) << "no learner was added";
}

// A real campaign's record, then the bugs the checkers exist for, each put
// into a copy of it: a write answered that never committed, a read answered
// from a stale state, a lease revoked early, a lease's key outliving it, a
// watch event dropped, one delivered twice, one with the wrong prev_kv, and
// a progress notification sent ahead of an event, a list page that misses
// a key.
TEST_P(RobustnessTest, InjectedBugsAreCaught) {
  CampaignOptions o = Options(3, 3);
  o.duration = seconds(8);
  o.faults = {Fault::kKillLeader, Fault::kIsolateLeader};
  o.keep_history = true;
  CampaignResult r = RunCampaign(o);
  ASSERT_TRUE(r.passed()) << r.Report();
  ASSERT_FALSE(r.watch_records.empty());

  // Answered before commit: an acknowledged put whose value never made it
  // into the log (the write is answered ok, with a revision, but the log
  // does not hold it).
  {
    std::vector<Operation> ops = r.history;
    auto it = std::find_if(ops.begin(), ops.end(), [](const Operation& op) {
      return op.kind == OpKind::kPut && op.outcome == Outcome::kFailed;
    });
    if (it == ops.end()) {
      it = std::find_if(ops.begin(), ops.end(), [](const Operation& op) {
        return op.kind == OpKind::kPut && op.outcome == Outcome::kOk;
      });
      ASSERT_NE(it, ops.end());
      it->value = "never-committed";  // acknowledged, but the log never saw it
    } else {
      it->outcome = Outcome::kOk;
    }
    CheckResult c = CheckHistory(ops, r.log);
    EXPECT_GT(c.Count(Rule::kLostWrite), 0u) << c.Report(3);
  }
  // A stale read: the last ok read of a key that was written before it
  // answers the key's first value.
  {
    std::vector<Operation> ops = r.history;
    for (auto it = ops.rbegin(); it != ops.rend(); ++it) {
      if (it->kind == OpKind::kGet && it->outcome == Outcome::kOk && it->response.found &&
          it->response.mod_revision > 2) {
        it->response.value = "c0-1";
        it->response.mod_revision = 1;
        break;
      }
    }
    CheckResult c = CheckHistory(ops, r.log);
    EXPECT_FALSE(c.ok()) << "a stale read went unnoticed";
  }
  // A list page at a revision that misses one of its keys.
  {
    std::vector<Operation> ops = r.history;
    auto it = std::find_if(ops.begin(), ops.end(), [](const Operation& op) {
      return op.kind == OpKind::kList && op.outcome == Outcome::kOk && op.list_revision != 0 &&
             !op.response.kvs.empty();
    });
    ASSERT_NE(it, ops.end()) << "no page was read at a revision";
    it->response.kvs.erase(it->response.kvs.begin());
    CheckResult c = CheckHistory(ops, r.log);
    EXPECT_GT(c.Count(Rule::kWrongRead), 0u) << c.Report(3);
  }
  // A lease revoked early: a read made while the lease was still kept
  // alive reports its key gone.
  {
    ASSERT_FALSE(r.lease_records.empty());
    EXPECT_TRUE(CheckLeases(r.lease_records, [](int64_t, int64_t) {
                  return int64_t{60} * 1000000000;
                }).ok());
    std::vector<LeaseRecord> leases = r.lease_records;
    bool injected = false;
    for (LeaseRecord& l : leases) {
      for (LeaseRecord::Read& read : l.reads) {
        if (!injected && !l.keepalives.empty() && read.found &&
            read.invoke_ns > l.put_complete_ns &&
            read.complete_ns < l.keepalives.back().invoke_ns) {
          read.found = false;
          injected = true;
        }
      }
    }
    ASSERT_TRUE(injected) << "no lease was kept alive while its key was read";
    const auto no_allowance = [](int64_t, int64_t) { return int64_t{0}; };
    EXPECT_GT(CheckLeases(leases, no_allowance).Count(LeaseRule::kRevokedEarly), 0u);
    // Excused inside a window that covers the revocation (etcd's resumed
    // leader), not outside it.
    const int64_t end = r.lease_records.back().grant.invoke_ns + int64_t{3600} * 1000000000;
    LeaseCheckResult covered = CheckLeases(leases, no_allowance, 0, {{0, end, "test"}});
    EXPECT_EQ(covered.Count(LeaseRule::kRevokedEarly), 0u) << covered.Report(3);
    EXPECT_GT(covered.excused, 0);
    LeaseCheckResult elsewhere = CheckLeases(leases, no_allowance, 0, {{end, end + 1, "test"}});
    EXPECT_GT(elsewhere.Count(LeaseRule::kRevokedEarly), 0u);
    EXPECT_EQ(elsewhere.excused, 0);
  }
  // A lease that outlived its expiry: its key read a minute after its last
  // keep-alive.
  {
    std::vector<LeaseRecord> leases = r.lease_records;
    LeaseRecord& l = leases.front();
    LeaseRecord::Read late;
    late.invoke_ns = l.grant.complete_ns + int64_t{60} * 1000000000;
    for (const auto& k : l.keepalives) {
      late.invoke_ns = std::max(late.invoke_ns, k.complete_ns + int64_t{60} * 1000000000);
    }
    late.complete_ns = late.invoke_ns + 1000000;
    late.found = true;
    l.reads.push_back(late);
    l.revoke_invoke_ns = l.revoke_complete_ns = 0;
    EXPECT_GT(CheckLeases(leases, [](int64_t, int64_t) { return int64_t{5} * 1000000000; })
                  .Count(LeaseRule::kOutlived),
              0u);
  }
  const std::vector<WatchRecord>& clean = r.watch_records[0];
  ASSERT_TRUE(CheckWatch(clean, 1, "/campaign/", r.log).ok());
  auto first_event = [](std::vector<WatchRecord>& recs, size_t skip) {
    size_t seen = 0;
    for (size_t i = 0; i < recs.size(); ++i) {
      if (recs[i].kind == WatchRecord::kEvent && seen++ == skip) return i;
    }
    return recs.size();
  };
  // A dropped event.
  {
    std::vector<WatchRecord> recs = clean;
    const size_t i = first_event(recs, 10);
    ASSERT_LT(i, recs.size());
    recs.erase(recs.begin() + static_cast<std::ptrdiff_t>(i));
    WatchCheckResult c = CheckWatch(recs, 1, "/campaign/", r.log);
    EXPECT_FALSE(c.ok()) << "a dropped event went unnoticed";
  }
  // An event delivered twice.
  {
    std::vector<WatchRecord> recs = clean;
    const size_t i = first_event(recs, 10);
    ASSERT_LT(i, recs.size());
    recs.insert(recs.begin() + static_cast<std::ptrdiff_t>(i) + 1, recs[i]);
    WatchCheckResult c = CheckWatch(recs, 1, "/campaign/", r.log);
    EXPECT_FALSE(c.ok()) << "a duplicate event went unnoticed";
  }
  // A wrong prev_kv.
  {
    std::vector<WatchRecord> recs = clean;
    size_t skip = 0;
    size_t i = first_event(recs, skip);
    while (i < recs.size() && !recs[i].has_prev) i = first_event(recs, ++skip);
    ASSERT_LT(i, recs.size());
    recs[i].prev_value += "-corrupt";
    WatchCheckResult c = CheckWatch(recs, 1, "/campaign/", r.log);
    EXPECT_FALSE(c.ok()) << "a wrong prev_kv went unnoticed";
  }
  // A progress notification ahead of an event it covers.
  {
    std::vector<WatchRecord> recs = clean;
    const size_t i = first_event(recs, 10);
    ASSERT_LT(i, recs.size());
    WatchRecord progress;
    progress.kind = WatchRecord::kProgress;
    progress.revision = recs[i].revision;
    recs.insert(recs.begin() + static_cast<std::ptrdiff_t>(i), progress);
    WatchCheckResult c = CheckWatch(recs, 1, "/campaign/", r.log);
    EXPECT_FALSE(c.ok()) << "a progress notification overtaking an event went unnoticed";
  }
}

INSTANTIATE_TEST_SUITE_P(Servers, RobustnessTest,
                         ::testing::Values(ServerFlavor::kEtcd, ServerFlavor::kCapstan),
                         FlavorTestName());

}  // namespace
}  // namespace capstan::testing::cluster
