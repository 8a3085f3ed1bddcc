// etcd's Cluster API (MemberAdd/Remove/Update/Promote/List) and members that
// join a running cluster (--initial-cluster-state existing), on etcd 3.5 and
// on Capstan:
//   - kubeadm's flow: a 1-member cluster grows to 3 by `etcdctl member add
//     --learner`, a start with the ETCD_* block etcdctl prints, and
//     `etcdctl member promote` retried until the learner is in sync; then
//     the first member is removed. A client writing and reading all along
//     never goes two election timeouts without a successful answer; the members
//     agree on the member list and the key space; the removed member exits
//     by itself, with status 0;
//   - the Cluster RPCs' refusals carry etcd's codes and texts;
//   - a learner answers Status and serializable reads only;
//   - members that joined a running cluster survive kill -9 and restart.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cluster/availability_probe.h"
#include "cluster/cluster_fixture.h"
#include "membership/member.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "gtest/gtest.h"
#include "process_fixture.h"
#include "reference.h"

namespace capstan::testing::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr auto kPollInterval = milliseconds(50);
constexpr int kElectionTimeoutMs = 1000;  // the fixture's --election-timeout

// etcd 3.5's answers (api/v3rpc/rpctypes/error.go), as the tests expect
// them from both flavors.
constexpr char kPeerUrlExists[] = "etcdserver: Peer URLs already exists";
constexpr char kBadUrls[] = "etcdserver: given member URLs are invalid";
constexpr char kMemberNotFound[] = "etcdserver: member not found";
constexpr char kNotLearner[] = "etcdserver: can only promote a learner member";
constexpr char kTooManyLearners[] = "etcdserver: too many learner members in cluster";
constexpr char kLearnerNotInSync[] =
    "etcdserver: can only promote a learner member which is in sync with leader";
constexpr char kNotForLearner[] = "etcdserver: rpc not supported for learner";
// etcd refuses a membership change until its peers have been connected for
// 5 s (etcdserver.HealthInterval, under --strict-reconfig-check, its
// default): an operator, and kubeadm, retry.
constexpr char kUnhealthy[] = "etcdserver: unhealthy cluster";

// etcd's types.ID text: lower-case hex, no leading zeros.
std::string IdText(uint64_t id) { return absl::StrCat(absl::Hex(id)); }

// One RPC's outcome: the gRPC code and message.
struct Answer {
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string message;
  bool ok() const { return code == grpc::StatusCode::OK; }
};

Answer ToAnswer(const grpc::Status& s) { return {s.error_code(), s.error_message()}; }
std::string Describe(const Answer& a) {
  return absl::StrCat("code ", a.code, " \"", a.message, "\"");
}

std::string Describe(const CommandResult& r) {
  return absl::StrCat(r.exit.ToString(), r.timed_out ? " (timed out)" : "", "\nstdout:\n", r.out,
                      "stderr:\n", r.err);
}
bool Succeeded(const CommandResult& r) { return r.exit.exited && r.exit.exit_code == 0; }

// One member as a MemberList answer shows it (client URLs left out: a member
// publishes them after it starts).
struct MemberView {
  uint64_t id = 0;
  std::string name;
  std::vector<std::string> peer_urls;
  bool learner = false;
  bool operator==(const MemberView& o) const {
    return id == o.id && name == o.name && peer_urls == o.peer_urls && learner == o.learner;
  }
};

std::string Describe(const std::vector<MemberView>& members) {
  std::vector<std::string> parts;
  for (const MemberView& m : members) {
    parts.push_back(absl::StrCat(IdText(m.id), " \"", m.name, "\" [",
                                 absl::StrJoin(m.peer_urls, ","), "]",
                                 m.learner ? " learner" : ""));
  }
  return absl::StrCat("{", absl::StrJoin(parts, "; "), "}");
}

class MembershipTest : public ::testing::TestWithParam<ServerFlavor> {
 protected:
  void SetUp() override {
    if (GetParam() == ServerFlavor::kEtcd) CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
    CAPSTAN_REQUIRE_REFERENCE("etcdctl", EtcdctlBinary());
  }

  bool capstan() const { return GetParam() == ServerFlavor::kCapstan; }

  void Start(int members) {
    ClusterOptions o = capstan() ? ClusterOptions::Capstan(members) : ClusterOptions::Etcd(members);
    o.election_timeout_ms = kElectionTimeoutMs;
    auto started = Cluster::Start(o);
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = std::move(*started);
  }

  // `etcdctl --endpoints=<members' client URLs> <args>`.
  CommandResult Etcdctl(const std::vector<int>& members, std::vector<std::string> args) const {
    std::vector<std::string> urls;
    for (int i : members) urls.push_back(cluster_->client_url(i));
    std::vector<std::string> argv = {EtcdctlBinary(), "--endpoints=" + absl::StrJoin(urls, ",")};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, "", seconds(30));
  }

  // Etcdctl, again while the answer is etcd's "unhealthy cluster" (a member
  // change within 5 s of the peers connecting), until `timeout`.
  CommandResult EtcdctlWhenHealthy(const std::vector<int>& members,
                                   const std::vector<std::string>& args,
                                   milliseconds timeout = seconds(30)) const {
    const auto deadline = Clock::now() + timeout;
    while (true) {
      CommandResult r = Etcdctl(members, args);
      if (Succeeded(r) || !absl::StrContains(r.err, kUnhealthy) || Clock::now() >= deadline) {
        return r;
      }
      std::this_thread::sleep_for(kPollInterval);  // polling a condition, with a deadline
    }
  }

  std::unique_ptr<etcdserverpb::Cluster::Stub> ClusterStub(int i) const {
    return etcdserverpb::Cluster::NewStub(cluster_->NewChannel(i));
  }

  // A Put of key=value through member i (a deadline of `timeout`).
  Answer Put(int i, const std::string& key, const std::string& value,
             etcdserverpb::PutResponse* response = nullptr,
             milliseconds timeout = seconds(10)) const {
    auto kv = etcdserverpb::KV::NewStub(cluster_->NewChannel(i));
    etcdserverpb::PutRequest req;
    req.set_key(key);
    req.set_value(value);
    etcdserverpb::PutResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + timeout);
    Answer a = ToAnswer(kv->Put(&ctx, req, &resp));
    if (response != nullptr) *response = resp;
    return a;
  }

  Answer MemberAdd(int i, const std::string& peer_url, bool learner,
                   etcdserverpb::MemberAddResponse* response = nullptr) const {
    etcdserverpb::MemberAddRequest req;
    req.add_peerurls(peer_url);
    req.set_islearner(learner);
    etcdserverpb::MemberAddResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    Answer a = ToAnswer(ClusterStub(i)->MemberAdd(&ctx, req, &resp));
    if (response != nullptr) *response = resp;
    return a;
  }

  // MemberAdd, again while etcd answers "unhealthy cluster" (see kUnhealthy).
  Answer MemberAddWhenHealthy(int i, const std::string& peer_url, bool learner,
                              etcdserverpb::MemberAddResponse* response = nullptr) const {
    const auto deadline = Clock::now() + seconds(30);
    while (true) {
      Answer a = MemberAdd(i, peer_url, learner, response);
      if (a.code != grpc::StatusCode::UNAVAILABLE || a.message != kUnhealthy ||
          Clock::now() >= deadline) {
        return a;
      }
      std::this_thread::sleep_for(kPollInterval);  // polling a condition, with a deadline
    }
  }

  Answer MemberRemove(int i, uint64_t id) const {
    etcdserverpb::MemberRemoveRequest req;
    req.set_id(id);
    etcdserverpb::MemberRemoveResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    return ToAnswer(ClusterStub(i)->MemberRemove(&ctx, req, &resp));
  }

  Answer MemberUpdate(int i, uint64_t id, const std::string& peer_url) const {
    etcdserverpb::MemberUpdateRequest req;
    req.set_id(id);
    req.add_peerurls(peer_url);
    etcdserverpb::MemberUpdateResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    return ToAnswer(ClusterStub(i)->MemberUpdate(&ctx, req, &resp));
  }

  Answer MemberPromote(int i, uint64_t id) const {
    etcdserverpb::MemberPromoteRequest req;
    req.set_id(id);
    etcdserverpb::MemberPromoteResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    return ToAnswer(ClusterStub(i)->MemberPromote(&ctx, req, &resp));
  }

  // Member i's MemberList (serializable: its own member table), sorted by ID.
  absl::StatusOr<std::vector<MemberView>> Members(int i) const {
    etcdserverpb::MemberListRequest req;
    etcdserverpb::MemberListResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    Answer a = ToAnswer(ClusterStub(i)->MemberList(&ctx, req, &resp));
    if (!a.ok()) {
      return absl::UnavailableError(absl::StrCat(cluster_->name(i), " MemberList: ", Describe(a)));
    }
    std::vector<MemberView> out;
    for (const auto& m : resp.members()) {
      MemberView v{m.id(), m.name(), {m.peerurls().begin(), m.peerurls().end()}, m.islearner()};
      std::sort(v.peer_urls.begin(), v.peer_urls.end());
      out.push_back(std::move(v));
    }
    std::sort(out.begin(), out.end(),
              [](const MemberView& a, const MemberView& b) { return a.id < b.id; });
    return out;
  }

  // The voters `members` as every one of them should list them.
  std::vector<MemberView> Voters(const std::vector<int>& members) const {
    std::vector<MemberView> want;
    for (int i : members) {
      want.push_back({cluster_->member_id(i), cluster_->name(i), {cluster_->peer_url(i)}, false});
    }
    std::sort(want.begin(), want.end(),
              [](const MemberView& a, const MemberView& b) { return a.id < b.id; });
    return want;
  }

  // Polls until every member in `at` lists exactly `want`.
  ::testing::AssertionResult MembersAgree(const std::vector<int>& at,
                                          const std::vector<MemberView>& want,
                                          milliseconds timeout = seconds(15)) const {
    const auto deadline = Clock::now() + timeout;
    std::string last;
    while (true) {
      last.clear();
      for (int i : at) {
        auto members = Members(i);
        if (!members.ok()) {
          absl::StrAppend(&last, "\n  ", members.status().ToString());
        } else if (!(*members == want)) {
          absl::StrAppend(&last, "\n  ", cluster_->name(i), " lists ", Describe(*members));
        }
      }
      if (last.empty()) return ::testing::AssertionSuccess();
      if (Clock::now() >= deadline) break;
      std::this_thread::sleep_for(kPollInterval);  // polling a condition, with a deadline
    }
    return ::testing::AssertionFailure()
           << "members disagree after " << timeout.count() << " ms; want " << Describe(want)
           << ", but:" << last;
  }

  // kubeadm's join: `etcdctl member add m<k> --learner --peer-urls=<its
  // peer URL>` through `via`, then a start with the ETCD_* lines etcdctl
  // printed. Sets *index to the new member's.
  void AddLearner(const std::vector<int>& via, int* index) {
    auto reserved = cluster_->ReserveMember();
    ASSERT_TRUE(reserved.ok()) << reserved.status();
    const int m = *reserved;
    CommandResult added = EtcdctlWhenHealthy(
        via, {"member", "add", cluster_->name(m), "--learner",
              "--peer-urls=" + cluster_->peer_url(m)});
    ASSERT_TRUE(Succeeded(added)) << "member add " << cluster_->name(m) << ": "
                                  << Describe(added);
    // (etcdctl 3.5 prints no "as learner" here: its printer of 3.5.16 does not.)
    EXPECT_TRUE(absl::StrContains(added.out, " added to cluster ")) << added.out;
    auto parsed = ParseMemberAdd(added.out);
    ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << added.out;
    // etcdctl's block names the new member and every member before it.
    EXPECT_EQ(parsed->vars["ETCD_NAME"], cluster_->name(m)) << added.out;
    EXPECT_EQ(parsed->vars["ETCD_INITIAL_ADVERTISE_PEER_URLS"], cluster_->peer_url(m))
        << added.out;
    EXPECT_EQ(parsed->vars["ETCD_INITIAL_CLUSTER_STATE"], "existing") << added.out;
    std::vector<absl::string_view> initial =
        absl::StrSplit(parsed->vars["ETCD_INITIAL_CLUSTER"], ',');
    for (int j = 0; j <= m; ++j) {
      if (!cluster_->running(j) && j != m) continue;
      const std::string entry = absl::StrCat(cluster_->name(j), "=", cluster_->peer_url(j));
      EXPECT_NE(std::find(initial.begin(), initial.end(), entry), initial.end())
          << "no " << entry << " in " << added.out;
    }
    absl::Status started = cluster_->StartJoining(m, parsed->env);
    ASSERT_TRUE(started.ok()) << started;
    EXPECT_EQ(cluster_->member_id(m), parsed->id)
        << "the member's Status names it " << IdText(cluster_->member_id(m))
        << ", etcdctl printed " << IdText(parsed->id);
    auto status = cluster_->Status(m);
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_TRUE(status->islearner()) << status->ShortDebugString();
    *index = m;
  }

  // `etcdctl member promote <id>` through `via`, again while the learner is
  // not in sync with the leader (as kubeadm does), until `timeout`; then
  // polls until the member's own Status says it votes.
  void Promote(const std::vector<int>& via, int m, milliseconds timeout = seconds(60)) {
    const auto deadline = Clock::now() + timeout;
    CommandResult promoted;
    int attempts = 0;
    while (true) {
      ++attempts;
      promoted = Etcdctl(via, {"member", "promote", IdText(cluster_->member_id(m))});
      if (Succeeded(promoted) || !absl::StrContains(promoted.err, kLearnerNotInSync) ||
          Clock::now() >= deadline) {
        break;
      }
      std::this_thread::sleep_for(milliseconds(200));  // kubeadm's retry, with a deadline
    }
    ASSERT_TRUE(Succeeded(promoted)) << "member promote " << cluster_->name(m) << " after "
                                     << attempts << " attempts: " << Describe(promoted);
    EXPECT_TRUE(absl::StrContains(promoted.out, " promoted in cluster ")) << promoted.out;
    const auto voted_deadline = Clock::now() + seconds(10);
    std::string last;
    while (true) {
      auto status = cluster_->Status(m);
      if (status.ok() && !status->islearner()) return;
      last = status.ok() ? status->ShortDebugString() : status.status().ToString();
      ASSERT_LT(Clock::now(), voted_deadline)
          << cluster_->name(m) << " still no voter after its promotion: " << last;
      std::this_thread::sleep_for(kPollInterval);  // polling a condition, with a deadline
    }
  }

  // From a 1-member cluster: m1 and m2 join as learners and are promoted.
  // `voters_changed` is called with the voters after each promotion.
  void GrowToThree(const std::function<void(const std::vector<int>&)>& voters_changed) {
    std::vector<int> voters = {0};
    for (int k = 0; k < 2; ++k) {
      int m = -1;
      Mark(absl::StrCat("member add m", k + 1));
      ASSERT_NO_FATAL_FAILURE(AddLearner({0}, &m));
      Mark(absl::StrCat("m", k + 1, " started"));
      ASSERT_NO_FATAL_FAILURE(Promote({0}, m));
      Mark(absl::StrCat("m", k + 1, " promoted"));
      voters.push_back(m);
      if (voters_changed) voters_changed(voters);
    }
  }

  void Mark(std::string step) { steps_.emplace_back(Clock::now(), std::move(step)); }

  std::string Steps(Clock::time_point origin) const {
    std::string s;
    for (const auto& [t, step] : steps_) {
      absl::StrAppend(&s, "\n  +",
                      std::chrono::duration_cast<milliseconds>(t - origin).count(), " ms ", step);
    }
    return s;
  }

  std::unique_ptr<Cluster> cluster_;
  std::vector<std::pair<Clock::time_point, std::string>> steps_;
};

TEST_P(MembershipTest, KubeadmJoinFlow) {
  ASSERT_NO_FATAL_FAILURE(Start(1));
  AvailabilityProbe probe({cluster_->endpoint(0)}, milliseconds(100),
                          /*deadline=*/milliseconds(kElectionTimeoutMs));
  const Clock::time_point origin = Clock::now();

  ASSERT_NO_FATAL_FAILURE(GrowToThree([&](const std::vector<int>& voters) {
    std::vector<std::string> endpoints;
    for (int i : voters) endpoints.push_back(cluster_->endpoint(i));
    probe.SetEndpoints(endpoints);
  }));
  ASSERT_EQ(cluster_->size(), 3);
  ASSERT_TRUE(MembersAgree({0, 1, 2}, Voters({0, 1, 2})));

  // The first member goes: the client moves to the others first.
  probe.SetEndpoints({cluster_->endpoint(1), cluster_->endpoint(2)});
  Mark("member remove m0");
  CommandResult remove =
      EtcdctlWhenHealthy({1, 2}, {"member", "remove", IdText(cluster_->member_id(0))});
  Mark("member remove answered");
  const Clock::time_point removed = Clock::now();
  ASSERT_TRUE(Succeeded(remove)) << Describe(remove);
  EXPECT_TRUE(absl::StrContains(remove.out, absl::StrCat(IdText(cluster_->member_id(0)),
                                                         " removed from cluster ")))
      << remove.out;

  // The removed member stops by itself, as etcd does.
  auto exited = cluster_->WaitForExit(0, seconds(10));
  Mark("m0 exited");
  ASSERT_TRUE(exited.ok()) << exited.status();
  EXPECT_TRUE(exited->exited && exited->exit_code == 0) << exited->ToString();
  EXPECT_TRUE(absl::StrContains(cluster_->ReadLog(0),
                                "the member has been permanently removed from the cluster"))
      << cluster_->ReadLog(0, 4000);

  // The client is served again by the two left (operations started after
  // the removal was answered: the record must not end inside the outage).
  const auto served_deadline = Clock::now() + seconds(15);
  while (probe.SuccessesSince(removed) < 10 && Clock::now() < served_deadline) {
    std::this_thread::sleep_for(kPollInterval);  // polling a condition, with a deadline
  }
  probe.Stop();
  const std::vector<AvailabilityProbe::Op> ops = probe.ops();
  EXPECT_GE(probe.SuccessesSince(removed), 10) << "the client is not served after the removal";
  for (const std::string& v : probe.violations()) ADD_FAILURE() << v;

  ASSERT_TRUE(MembersAgree({1, 2}, Voters({1, 2})));
  auto revision = cluster_->WaitForConvergence(0, seconds(10));
  ASSERT_TRUE(revision.ok()) << revision.status();
  auto h1 = cluster_->HashKV(1, *revision);
  auto h2 = cluster_->HashKV(2, *revision);
  ASSERT_TRUE(h1.ok()) << h1.status();
  ASSERT_TRUE(h2.ok()) << h2.status();
  EXPECT_EQ(h1->hash(), h2->hash()) << "at revision " << *revision;
  EXPECT_EQ(h1->compact_revision(), h2->compact_revision());

  // No stretch in which no operation of the client succeeded longer than
  // one election timeout on Capstan, which hands leadership over before
  // the leader's removal; two on etcd, whose other members elect a leader
  // within one randomized election timeout ([1, 2) x --election-timeout)
  // of the removed leader's last heartbeat.
  ASSERT_FALSE(ops.empty());
  const AvailabilityProbe::Outage outage = AvailabilityProbe::LongestOutage(ops);
  int failed = 0;
  for (const auto& op : ops) failed += op.ok ? 0 : 1;
  auto at = [origin](Clock::time_point t) {
    return std::chrono::duration_cast<milliseconds>(t - origin).count();
  };
  const std::string detail = absl::StrCat(
      " (from +", at(outage.from), " ms to +", at(outage.to), " ms; ", outage.failures,
      " operations started in it failed",
      outage.failures > 0
          ? absl::StrCat(": first ", outage.first_failure, "; last ", outage.last_failure)
          : "",
      "); ", ops.size(), " operations, ", failed, " failed; steps:", Steps(origin));
  EXPECT_LT(outage.length, milliseconds((capstan() ? 1 : 2) * kElectionTimeoutMs))
      << "no operation of the client succeeded for " << outage.length.count() << " ms"
      << detail;
  std::printf("capstan-test: %s: longest time without a successful answer %lld ms%s\n",
              FlavorName(GetParam()), static_cast<long long>(outage.length.count()),
              detail.c_str());
}

TEST_P(MembershipTest, ErrorsMatchEtcd) {
  ASSERT_NO_FATAL_FAILURE(Start(3));
  auto leader = cluster_->WaitForLeader(seconds(10));
  ASSERT_TRUE(leader.ok()) << leader.status();
  const int l = *leader;
  const uint64_t kUnknown = 0x1234;
  const std::string fresh1 = absl::StrCat("http://127.0.0.1:", PickFreePort());
  const std::string fresh2 = absl::StrCat("http://127.0.0.1:", PickFreePort());
  const std::string fresh3 = absl::StrCat("http://127.0.0.1:", PickFreePort());

  // A peer URL a member has.
  Answer a = MemberAddWhenHealthy(l, cluster_->peer_url((l + 1) % 3), false);
  EXPECT_EQ(a.code, grpc::StatusCode::FAILED_PRECONDITION) << Describe(a);
  EXPECT_EQ(a.message, kPeerUrlExists);
  a = MemberAddWhenHealthy(l, cluster_->peer_url((l + 1) % 3), true);
  EXPECT_EQ(a.code, grpc::StatusCode::FAILED_PRECONDITION) << "as learner: " << Describe(a);
  EXPECT_EQ(a.message, kPeerUrlExists);

  // Not a URL.
  a = MemberAdd(l, "foo", false);
  EXPECT_EQ(a.code, grpc::StatusCode::INVALID_ARGUMENT) << Describe(a);
  EXPECT_EQ(a.message, kBadUrls);

  // No such member.
  a = MemberRemove(l, kUnknown);
  EXPECT_EQ(a.code, grpc::StatusCode::NOT_FOUND) << "remove: " << Describe(a);
  EXPECT_EQ(a.message, kMemberNotFound);
  a = MemberUpdate(l, kUnknown, fresh3);
  EXPECT_EQ(a.code, grpc::StatusCode::NOT_FOUND) << "update: " << Describe(a);
  EXPECT_EQ(a.message, kMemberNotFound);
  a = MemberPromote(l, kUnknown);
  EXPECT_EQ(a.code, grpc::StatusCode::NOT_FOUND) << "promote: " << Describe(a);
  EXPECT_EQ(a.message, kMemberNotFound);

  // A voter is no learner.
  a = MemberPromote(l, cluster_->member_id((l + 1) % 3));
  EXPECT_EQ(a.code, grpc::StatusCode::FAILED_PRECONDITION) << Describe(a);
  EXPECT_EQ(a.message, kNotLearner);

  // One learner (never started) is allowed (--max-learners 1), a second is
  // not.
  etcdserverpb::MemberAddResponse added;
  a = MemberAddWhenHealthy(l, fresh1, true, &added);
  ASSERT_TRUE(a.ok()) << Describe(a);
  const uint64_t learner = added.member().id();
  EXPECT_NE(learner, 0u);
  EXPECT_TRUE(added.member().islearner()) << added.ShortDebugString();
  EXPECT_EQ(added.members_size(), 4) << added.ShortDebugString();
  a = MemberAddWhenHealthy(l, fresh2, true);
  EXPECT_EQ(a.code, grpc::StatusCode::FAILED_PRECONDITION) << Describe(a);
  EXPECT_EQ(a.message, kTooManyLearners);

  // A learner that never started has nothing of the leader's log.
  a = MemberPromote(l, learner);
  EXPECT_EQ(a.code, grpc::StatusCode::FAILED_PRECONDITION) << Describe(a);
  EXPECT_EQ(a.message, kLearnerNotInSync);

  // The leader counted each refused promotion by its reason, as etcd's
  // server words it (etcd_server_learner_promote_failures{Reason}).
  int64_t failures = 0;
  for (const char* reason :
       {"membership: ID not found", "membership: can only promote a learner member\"",
        "etcdserver: can only promote a learner member which is in sync with leader"}) {
    int64_t n = 0;
    for (int i = 0; i < 3; ++i) {
      n += cluster_->Metric(i, "etcd_server_learner_promote_failures{",
                            absl::StrCat("Reason=\"", reason), 0);
    }
    EXPECT_EQ(n, 1) << reason;
    failures += n;
  }
  EXPECT_EQ(failures, 3);

  // It goes again; every member lists the three it started with.
  a = MemberRemove(l, learner);
  EXPECT_TRUE(a.ok()) << Describe(a);
  EXPECT_TRUE(MembersAgree({0, 1, 2}, Voters({0, 1, 2})));
}

TEST_P(MembershipTest, LearnerServesOnlyWhatEtcdLets) {
  ASSERT_NO_FATAL_FAILURE(Start(1));
  int m = -1;
  ASSERT_NO_FATAL_FAILURE(AddLearner({0}, &m));
  // Something to read: put through the voter, seen by the learner.
  {
    etcdserverpb::PutResponse resp;
    Answer put = Put(0, "k", "v", &resp);
    ASSERT_TRUE(put.ok()) << Describe(put);
    auto converged = cluster_->WaitForConvergence(resp.header().revision(), seconds(10));
    ASSERT_TRUE(converged.ok()) << converged.status();
  }

  auto status = cluster_->Status(m);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_TRUE(status->islearner()) << status->ShortDebugString();
  EXPECT_EQ(status->header().member_id(), cluster_->member_id(m));
  EXPECT_EQ(status->leader(), cluster_->member_id(0));

  auto kv = etcdserverpb::KV::NewStub(cluster_->NewChannel(m));
  {
    etcdserverpb::RangeRequest req;
    req.set_key("k");
    req.set_serializable(true);
    etcdserverpb::RangeResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    Answer a = ToAnswer(kv->Range(&ctx, req, &resp));
    EXPECT_TRUE(a.ok()) << "serializable Range: " << Describe(a);
    ASSERT_EQ(resp.kvs_size(), 1) << resp.ShortDebugString();
    EXPECT_EQ(resp.kvs(0).value(), "v");
  }
  {
    Answer a = Put(m, "k", "w", nullptr, seconds(5));
    EXPECT_EQ(a.code, grpc::StatusCode::UNAVAILABLE) << "Put: " << Describe(a);
    EXPECT_EQ(a.message, kNotForLearner);
  }
  {
    etcdserverpb::RangeRequest req;
    req.set_key("k");
    etcdserverpb::RangeResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    Answer a = ToAnswer(kv->Range(&ctx, req, &resp));
    EXPECT_EQ(a.code, grpc::StatusCode::UNAVAILABLE) << "linearizable Range: " << Describe(a);
    EXPECT_EQ(a.message, kNotForLearner);
  }
  {
    etcdserverpb::MemberListRequest req;
    etcdserverpb::MemberListResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    Answer a = ToAnswer(ClusterStub(m)->MemberList(&ctx, req, &resp));
    EXPECT_EQ(a.code, grpc::StatusCode::UNAVAILABLE) << "MemberList: " << Describe(a);
    EXPECT_EQ(a.message, kNotForLearner);
  }
  {
    // A keep-alive stream (on Capstan's completion queues) is refused too.
    bool answered = true;
    Answer a = ToAnswer(cluster_->KeepAliveOnce(m, 1, /*require_leader=*/false, &answered));
    EXPECT_FALSE(answered) << "a learner renewed a lease";
    EXPECT_EQ(a.code, grpc::StatusCode::UNAVAILABLE) << "LeaseKeepAlive: " << Describe(a);
    EXPECT_EQ(a.message, kNotForLearner);
  }
  // The refused put changed nothing (HashKV is refused on a learner too:
  // its serializable read is what there is to compare).
  auto converged = cluster_->WaitForConvergence(0, seconds(10));
  ASSERT_TRUE(converged.ok()) << converged.status();
  for (int i : {0, m}) {
    etcdserverpb::RangeRequest req;
    req.set_key("k");
    req.set_serializable(true);
    etcdserverpb::RangeResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(5));
    auto stub = etcdserverpb::KV::NewStub(cluster_->NewChannel(i));
    Answer a = ToAnswer(stub->Range(&ctx, req, &resp));
    ASSERT_TRUE(a.ok()) << cluster_->name(i) << ": " << Describe(a);
    ASSERT_EQ(resp.kvs_size(), 1) << resp.ShortDebugString();
    EXPECT_EQ(resp.kvs(0).value(), "v") << cluster_->name(i);
    EXPECT_EQ(resp.header().revision(), *converged) << cluster_->name(i);
  }
}

TEST_P(MembershipTest, MembersSurviveRestart) {
  ASSERT_NO_FATAL_FAILURE(Start(1));
  ASSERT_NO_FATAL_FAILURE(GrowToThree(nullptr));
  ASSERT_EQ(cluster_->size(), 3);
  ASSERT_TRUE(MembersAgree({0, 1, 2}, Voters({0, 1, 2})));
  // Both promotions were handled by the leader that made them (etcd's
  // etcd_server_learner_promote_successes), m0 throughout.
  EXPECT_EQ(cluster_->Metric(0, "etcd_server_learner_promote_successes ", "", -2), 2);

  for (int i = 0; i < 3; ++i) {
    SCOPED_TRACE(absl::StrCat("restarting ", cluster_->name(i)));
    ExitInfo killed = cluster_->Kill(i);
    EXPECT_FALSE(killed.exited) << killed.ToString();
    auto leader = cluster_->WaitForLeader(seconds(15));
    ASSERT_TRUE(leader.ok()) << leader.status();
    absl::Status restarted = cluster_->Restart(i);
    ASSERT_TRUE(restarted.ok()) << restarted;
    leader = cluster_->WaitForLeader(seconds(15));
    ASSERT_TRUE(leader.ok()) << leader.status();
  }

  EXPECT_TRUE(MembersAgree({0, 1, 2}, Voters({0, 1, 2})));
  // etcdctl's --cluster reaches every member through the member list's
  // client URLs.
  for (const char* what : {"status", "health", "hashkv"}) {
    CommandResult r = Etcdctl({0}, {"endpoint", what, "--cluster"});
    ASSERT_TRUE(Succeeded(r)) << "endpoint " << what << " --cluster: " << Describe(r);
    for (int i = 0; i < 3; ++i) {
      EXPECT_TRUE(absl::StrContains(r.out, cluster_->client_url(i)))
          << "endpoint " << what << " --cluster names no " << cluster_->client_url(i) << ":\n"
          << r.out;
    }
  }
  int64_t last = 0;
  for (int i = 0; i < 3; ++i) {
    etcdserverpb::PutResponse resp;
    Answer put = Put(i, absl::StrCat("after-restart/", i), "v", &resp);
    EXPECT_TRUE(put.ok()) << "through " << cluster_->name(i) << ": " << Describe(put);
    last = std::max(last, resp.header().revision());
  }
  auto converged = cluster_->WaitForConvergence(last, seconds(10));
  ASSERT_TRUE(converged.ok()) << converged.status();
  absl::Status same = cluster_->SameHashKV({0, 1, 2}, *converged);
  EXPECT_TRUE(same.ok()) << same;
}

// A member's Raft log holds the entries etcd's does, so Status's raftIndex
// is the one etcd reports after the same steps: a new cluster's ConfChange
// entries, its first leader's empty entry, each member's attributes and the
// cluster version the leader decides once (etcd's ClusterVersionSet); each
// write; a restarted member's attributes again; a new leader's empty entry.
TEST_P(MembershipTest, RaftIndexesAreEtcds) {
  // Every member applies `want` and holds no entry beyond it.
  auto all_at = [this](int64_t want) {
    const auto deadline = Clock::now() + seconds(15);
    for (int i = 0; i < cluster_->size(); ++i) {
      while (true) {
        auto st = cluster_->Status(i);
        if (st.ok() && st->raftappliedindex() >= static_cast<uint64_t>(want)) {
          EXPECT_EQ(st->raftindex(), static_cast<uint64_t>(want)) << cluster_->name(i);
          EXPECT_EQ(st->raftappliedindex(), static_cast<uint64_t>(want)) << cluster_->name(i);
          break;
        }
        if (Clock::now() >= deadline) {
          ADD_FAILURE() << cluster_->name(i) << " did not apply index " << want << ": "
                        << (st.ok() ? absl::StrCat("at ", st->raftappliedindex())
                                    : st.status().ToString());
          return;
        }
        std::this_thread::sleep_for(kPollInterval);  // polling a condition, with a deadline
      }
    }
  };

  {
    SCOPED_TRACE("one member");
    ASSERT_NO_FATAL_FAILURE(Start(1));
    all_at(4);  // its ConfChange, its empty entry, its attributes, the version
    Answer put = Put(0, "raft-index", "v");
    EXPECT_TRUE(put.ok()) << Describe(put);
    all_at(5);
    cluster_->Kill(0);
    ASSERT_TRUE(cluster_->Restart(0).ok());
    all_at(7);  // a new term's empty entry, its attributes again
  }
  cluster_.reset();
  {
    SCOPED_TRACE("three members");
    ASSERT_NO_FATAL_FAILURE(Start(3));
    all_at(8);
    Answer put = Put(0, "raft-index", "v");
    EXPECT_TRUE(put.ok()) << Describe(put);
    all_at(9);
    auto leader = cluster_->WaitForLeader(seconds(15));
    ASSERT_TRUE(leader.ok()) << leader.status();
    const int follower = (*leader + 1) % 3;
    cluster_->Kill(follower);
    ASSERT_TRUE(cluster_->Restart(follower).ok());
    all_at(10);  // the follower's attributes again; the leader stays
  }
}

// --strict-reconfig-check's health rules (etcd's mayAddMember and
// mayRemoveMember), judged by the member that takes the call from its own
// peer connections: with a voter down, no member may be added and no live
// voter removed ("unhealthy cluster"), while the member that is down may be.
TEST_P(MembershipTest, UnhealthyClusterRefusals) {
  ASSERT_NO_FATAL_FAILURE(Start(3));
  auto leader = cluster_->WaitForLeader(seconds(10));
  ASSERT_TRUE(leader.ok()) << leader.status();
  const int via = *leader, live = (via + 1) % 3, down = (via + 2) % 3;
  cluster_->Kill(down);

  Answer a = MemberAdd(via, absl::StrCat("http://127.0.0.1:", PickFreePort()), true);
  EXPECT_EQ(a.code, grpc::StatusCode::UNAVAILABLE) << "add with a voter down: " << Describe(a);
  EXPECT_EQ(a.message, kUnhealthy);
  a = MemberRemove(via, cluster_->member_id(live));
  EXPECT_EQ(a.code, grpc::StatusCode::UNAVAILABLE) << "remove a live voter: " << Describe(a);
  EXPECT_EQ(a.message, kUnhealthy);

  // The member that is down goes (once the caller's stream to it broke).
  const auto deadline = Clock::now() + seconds(10);
  do {
    a = MemberRemove(via, cluster_->member_id(down));
    if (a.ok() || a.message != kUnhealthy) break;
    std::this_thread::sleep_for(kPollInterval);  // polling a condition, with a deadline
  } while (Clock::now() < deadline);
  EXPECT_TRUE(a.ok()) << "remove the member that is down: " << Describe(a);
  EXPECT_TRUE(MembersAgree({via, live}, Voters({via, live})));
}

// Five members: two lost at once leave a quorum that serves; both are
// removed (members this one has no stream to count as down), and a new
// learner is added and promoted into the four left.
TEST_P(MembershipTest, FiveMembersLoseTwoAndRepair) {
  ASSERT_NO_FATAL_FAILURE(Start(5));
  auto leader = cluster_->WaitForLeader(seconds(10));
  ASSERT_TRUE(leader.ok()) << leader.status();
  std::vector<int> lost, left;
  for (int i = 0; i < 5; ++i) {
    if (i != *leader && lost.size() < 2) {
      lost.push_back(i);
    } else {
      left.push_back(i);
    }
  }
  for (int i : lost) cluster_->Kill(i);
  CommandResult put = Etcdctl(left, {"put", "five", "still"});
  ASSERT_TRUE(Succeeded(put)) << Describe(put);
  for (int i : lost) {
    const auto deadline = Clock::now() + seconds(10);
    Answer a;
    do {
      a = MemberRemove(*leader, cluster_->member_id(i));
      if (a.ok() || a.message != kUnhealthy) break;
      std::this_thread::sleep_for(kPollInterval);  // polling a condition, with a deadline
    } while (Clock::now() < deadline);
    ASSERT_TRUE(a.ok()) << "remove " << cluster_->name(i) << ": " << Describe(a);
  }
  ASSERT_TRUE(MembersAgree(left, Voters(left)));
  int m = -1;
  ASSERT_NO_FATAL_FAILURE(AddLearner(left, &m));
  ASSERT_NO_FATAL_FAILURE(Promote(left, m));
  std::vector<int> now = left;
  now.push_back(m);
  EXPECT_TRUE(MembersAgree(now, Voters(now)));
  CommandResult got = Etcdctl({m}, {"get", "five", "--print-value-only"});
  ASSERT_TRUE(Succeeded(got)) << Describe(got);
  EXPECT_EQ(got.out, "still\n");
}

// Only the leader knows whether a learner caught up: a promotion asked of a
// follower is forwarded to the leader (etcd: POST /members/promote/<id>),
// and answered as there, "not in sync" included.
TEST_P(MembershipTest, PromotionThroughAFollower) {
  ASSERT_NO_FATAL_FAILURE(Start(3));
  auto leader = cluster_->WaitForLeader(seconds(10));
  ASSERT_TRUE(leader.ok()) << leader.status();
  const int follower = (*leader + 1) % 3;
  int m = -1;
  ASSERT_NO_FATAL_FAILURE(AddLearner({*leader}, &m));
  ASSERT_NO_FATAL_FAILURE(Promote({follower}, m));
  EXPECT_TRUE(MembersAgree({0, 1, 2, m}, Voters({0, 1, 2, m})));
}

// Removing the leader. etcd's leader leads until it applies its own
// removal, and the others elect a new one an election timeout later.
// Capstan hands leadership over first: when the removal is answered the
// others already follow a new leader, and the client hardly notices.
TEST_P(MembershipTest, RemovingTheLeader) {
  ASSERT_NO_FATAL_FAILURE(Start(3));
  auto leader = cluster_->WaitForLeader(seconds(10));
  ASSERT_TRUE(leader.ok()) << leader.status();
  std::vector<int> others;
  for (int i = 0; i < 3; ++i) {
    if (i != *leader) others.push_back(i);
  }
  std::vector<std::string> endpoints;
  for (int i : others) endpoints.push_back(cluster_->endpoint(i));
  AvailabilityProbe probe(endpoints, milliseconds(100),
                          /*deadline=*/milliseconds(kElectionTimeoutMs));
  CommandResult remove = EtcdctlWhenHealthy(
      others, {"member", "remove", IdText(cluster_->member_id(*leader))});
  ASSERT_TRUE(Succeeded(remove)) << Describe(remove);
  // Whom the others follow when the removal is answered.
  std::string followed;
  bool new_leader = true;
  for (int i : others) {
    auto status = cluster_->Status(i);
    ASSERT_TRUE(status.ok()) << status.status();
    const uint64_t lead = status->leader();
    absl::StrAppend(&followed, " ", cluster_->name(i), " follows ", IdText(lead), ";");
    new_leader = new_leader && (lead == cluster_->member_id(others[0]) ||
                                lead == cluster_->member_id(others[1]));
  }
  auto exited = cluster_->WaitForExit(*leader, seconds(10));
  ASSERT_TRUE(exited.ok()) << exited.status();
  auto after = cluster_->WaitForLeader(seconds(10));
  ASSERT_TRUE(after.ok()) << after.status();
  // Operations started after the new leader leads, so that the record
  // holds the whole outage.
  const Clock::time_point led = Clock::now();
  const auto served_deadline = led + seconds(15);
  while (probe.SuccessesSince(led) < 5 && Clock::now() < served_deadline) {
    std::this_thread::sleep_for(kPollInterval);  // polling a condition, with a deadline
  }
  probe.Stop();
  for (const std::string& v : probe.violations()) ADD_FAILURE() << v;
  const AvailabilityProbe::Outage outage = AvailabilityProbe::LongestOutage(probe.ops());
  std::printf("capstan-test: %s: at the answer%s longest time without a successful answer %lld ms\n",
              FlavorName(GetParam()), followed.c_str(),
              static_cast<long long>(outage.length.count()));
  ASSERT_TRUE(MembersAgree(others, Voters(others)));
  if (capstan()) {
    EXPECT_TRUE(new_leader) << "at the answer:" << followed;
    EXPECT_LT(outage.length, milliseconds(kElectionTimeoutMs))
        << "no operation of the client succeeded for " << outage.length.count() << " ms";
  }
}

// Replacing every member of a 3-member cluster, one at a time (a new one
// added as a learner, promoted, then an old one removed), under a client
// that writes and reads all along: every acknowledged write is on every
// final member, and their data agree.
TEST_P(MembershipTest, RollingReplacement) {
  ASSERT_NO_FATAL_FAILURE(Start(3));
  std::vector<int> voters = {0, 1, 2};
  auto endpoints = [this](const std::vector<int>& members) {
    std::vector<std::string> out;
    for (int i : members) out.push_back(cluster_->endpoint(i));
    return out;
  };
  AvailabilityProbe probe(endpoints(voters), milliseconds(100),
                          /*deadline=*/milliseconds(kElectionTimeoutMs));
  for (int old = 0; old < 3; ++old) {
    SCOPED_TRACE(absl::StrCat("replacing m", old));
    int m = -1;
    ASSERT_NO_FATAL_FAILURE(AddLearner(voters, &m));
    ASSERT_NO_FATAL_FAILURE(Promote(voters, m));
    std::vector<int> next;
    for (int v : voters) {
      if (v != old) next.push_back(v);
    }
    next.push_back(m);
    probe.SetEndpoints(endpoints(next));
    CommandResult remove =
        EtcdctlWhenHealthy(next, {"member", "remove", IdText(cluster_->member_id(old))});
    ASSERT_TRUE(Succeeded(remove)) << Describe(remove) << cluster_->LogTails(4000);
    auto exited = cluster_->WaitForExit(old, seconds(10));
    ASSERT_TRUE(exited.ok()) << exited.status();
    voters = next;
  }
  probe.Stop();
  for (const std::string& v : probe.violations()) ADD_FAILURE() << v;
  ASSERT_TRUE(MembersAgree(voters, Voters(voters)));

  auto revision = cluster_->WaitForConvergence(0, seconds(10));
  ASSERT_TRUE(revision.ok()) << revision.status();
  absl::Status same = cluster_->SameHashKV(voters, *revision);
  EXPECT_TRUE(same.ok()) << same;
  // Every put the cluster acknowledged, on every final member.
  std::vector<std::string> acked;
  for (const auto& op : probe.ops()) {
    if (!op.ok || !absl::StartsWith(op.what, "put ")) continue;
    // "put <key> @<endpoint>"
    const size_t at = op.what.find(" @");
    acked.push_back(op.what.substr(4, at - 4));
  }
  ASSERT_FALSE(acked.empty());
  for (int i : voters) {
    for (const std::string& key : acked) {
      auto got = cluster_->LocalGet(i, key);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->kvs_size(), 1) << "acknowledged " << key << " is not on "
                                    << cluster_->name(i);
    }
  }
  std::printf("capstan-test: %s: %zu acknowledged writes through three replacements\n",
              FlavorName(GetParam()), acked.size());
}

// Disaster recovery: one snapshot restored into each member of a new
// cluster (etcdctl snapshot restore for etcd, capstan snapshot restore for
// Capstan, with the same flags), which starts with the data, its own member
// IDs and the new members only.
TEST_P(MembershipTest, RestoreANewClusterFromOneSnapshot) {
  ASSERT_NO_FATAL_FAILURE(Start(3));
  for (int k = 0; k < 20; ++k) {
    CommandResult put = Etcdctl({0, 1, 2}, {"put", absl::StrCat("restored/", k), "v"});
    ASSERT_TRUE(Succeeded(put)) << Describe(put);
  }
  // Outside the cluster's directory, which goes with it.
  TempDir backup("capstan-membership-backup");
  const std::string snapshot = backup.path() + "/backup.db";
  CommandResult saved = Etcdctl({0}, {"snapshot", "save", snapshot});
  ASSERT_TRUE(Succeeded(saved)) << Describe(saved);
  cluster_.reset();

  // Each member of a new cluster of `flavor` restored from the snapshot by
  // that flavor's tool, with the same flags.
  auto restore_into = [&](ServerFlavor flavor) {
    ClusterOptions o = flavor == ServerFlavor::kCapstan ? ClusterOptions::Capstan(3) : ClusterOptions::Etcd(3);
    o.election_timeout_ms = kElectionTimeoutMs;
    o.cluster_token = "restored-cluster";
    o.prepare = [flavor, snapshot](const Cluster& c, int i) -> absl::Status {
      std::vector<std::string> argv;
      if (flavor == ServerFlavor::kCapstan) {
        argv = {c.options().binary, "snapshot", "restore", snapshot};
      } else {
        argv = {EtcdctlBinary(), "snapshot", "restore", snapshot};
      }
      for (const std::string& a :
           {std::string("--data-dir"), c.data_dir(i), std::string("--name"), c.name(i),
            std::string("--initial-cluster"), c.initial_cluster(),
            std::string("--initial-cluster-token"), c.options().cluster_token,
            std::string("--initial-advertise-peer-urls"), c.peer_url(i)}) {
        argv.push_back(a);
      }
      CommandResult r = RunCommand(argv, "", seconds(60));
      if (!Succeeded(r)) return absl::InternalError(absl::StrCat("restore: ", Describe(r)));
      return absl::OkStatus();
    };
    auto restored = Cluster::Start(o);
    ASSERT_TRUE(restored.ok()) << restored.status();
    cluster_ = std::move(*restored);
    // The new members, by the IDs the flags give them, and the data.
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(cluster_->member_id(i),
                membership::EtcdMemberId({cluster_->peer_url(i)}, o.cluster_token))
          << cluster_->name(i);
    }
    EXPECT_TRUE(MembersAgree({0, 1, 2}, Voters({0, 1, 2})));
    CommandResult got = Etcdctl({2}, {"get", "restored/", "--prefix", "--keys-only"});
    ASSERT_TRUE(Succeeded(got)) << Describe(got);
    for (int k = 0; k < 20; ++k) {
      EXPECT_TRUE(absl::StrContains(got.out, absl::StrCat("restored/", k, "\n"))) << got.out;
    }
    CommandResult put = Etcdctl({0, 1, 2}, {"put", "after-restore", "v"});
    ASSERT_TRUE(Succeeded(put)) << Describe(put);
    auto status = cluster_->Status(0);
    ASSERT_TRUE(status.ok()) << status.status();
    auto converged = cluster_->WaitForConvergence(status->header().revision(), seconds(10));
    ASSERT_TRUE(converged.ok()) << converged.status();
    absl::Status same = cluster_->SameHashKV({0, 1, 2}, *converged);
    EXPECT_TRUE(same.ok()) << same;
  };
  ASSERT_NO_FATAL_FAILURE(restore_into(GetParam()));
  if (capstan()) {
    // etcdctl snapshot restore of Capstan's snapshot still makes the data
    // dirs of a cluster of etcd members.
    SCOPED_TRACE("etcdctl snapshot restore of Capstan's snapshot into etcd members");
    cluster_.reset();
    ASSERT_NO_FATAL_FAILURE(restore_into(ServerFlavor::kEtcd));
    std::printf("capstan-test: 3 etcd members serve Capstan's snapshot (etcdctl snapshot restore)\n");
  }
}

// Disaster recovery after a permanent loss of quorum: two of three members
// are gone for good; the third restarts once with --force-new-cluster, as
// the only member of its cluster, with its data, and the cluster grows
// again from it.
TEST_P(MembershipTest, ForceNewClusterAfterLosingQuorum) {
  ASSERT_NO_FATAL_FAILURE(Start(3));
  for (int k = 0; k < 20; ++k) {
    CommandResult put = Etcdctl({0, 1, 2}, {"put", absl::StrCat("kept/", k), "v"});
    ASSERT_TRUE(Succeeded(put)) << Describe(put);
  }
  auto before = cluster_->Status(0);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_TRUE(cluster_->WaitForConvergence(before->header().revision(), seconds(10)).ok());
  const uint64_t id0 = cluster_->member_id(0);
  cluster_->Kill(1);
  cluster_->Kill(2);
  // etcd's WAL does not sync a hard state whose commit index alone moved,
  // so a crashed etcd member forced into a new cluster drops the entries it
  // applied after its last synced commit index (acknowledged writes among
  // them). Capstan keeps every entry its store applied: it may crash.
  if (capstan()) {
    cluster_->Kill(0);
  } else {
    cluster_->Stop(0);
  }

  ASSERT_TRUE(cluster_->Restart(0, {"--force-new-cluster"}).ok()) << cluster_->ReadLog(0, 4000);
  auto status = cluster_->Status(0);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->leader(), id0);
  EXPECT_EQ(status->header().member_id(), id0);
  EXPECT_TRUE(MembersAgree({0}, Voters({0})));
  // The data, by a linearizable read and a write that needs the new quorum.
  CommandResult got = Etcdctl({0}, {"get", "kept/", "--prefix", "--keys-only"});
  ASSERT_TRUE(Succeeded(got)) << Describe(got);
  for (int k = 0; k < 20; ++k) {
    EXPECT_TRUE(absl::StrContains(got.out, absl::StrCat("kept/", k, "\n"))) << got.out;
  }
  CommandResult put = Etcdctl({0}, {"put", "after-force", "v"});
  ASSERT_TRUE(Succeeded(put)) << Describe(put);

  // A later restart without the flag keeps the one-member cluster.
  cluster_->Stop(0);
  ASSERT_TRUE(cluster_->Restart(0).ok()) << cluster_->ReadLog(0, 4000);
  EXPECT_TRUE(MembersAgree({0}, Voters({0})));

  // The cluster grows again from it.
  int m = -1;
  ASSERT_NO_FATAL_FAILURE(AddLearner({0}, &m));
  ASSERT_NO_FATAL_FAILURE(Promote({0}, m));
  EXPECT_TRUE(MembersAgree({0, m}, Voters({0, m})));
  auto now = cluster_->Status(0);
  ASSERT_TRUE(now.ok()) << now.status();
  auto converged = cluster_->WaitForConvergence(now->header().revision(), seconds(10));
  ASSERT_TRUE(converged.ok()) << converged.status();
  auto h0 = cluster_->HashKV(0, *converged);
  auto hm = cluster_->HashKV(m, *converged);
  ASSERT_TRUE(h0.ok()) << h0.status();
  ASSERT_TRUE(hm.ok()) << hm.status();
  EXPECT_EQ(h0->hash(), hm->hash());
}

INSTANTIATE_TEST_SUITE_P(Servers, MembershipTest,
                         ::testing::Values(ServerFlavor::kEtcd, ServerFlavor::kCapstan),
                         FlavorTestName());

}  // namespace
}  // namespace capstan::testing::cluster
