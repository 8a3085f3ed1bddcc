#include "cluster/campaign.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "cluster/checker.h"
#include "cluster/cluster_fixture.h"
#include "cluster/fault_proxy.h"
#include "cluster/history.h"
#include "cluster/kv_client.h"
#include "cluster/lease_client.h"
#include "cluster/watch_checker.h"
#include "cluster/watch_client.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "test_certificates.h"

namespace capstan::testing::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

const char kPrefix[] = "/campaign/";

struct FaultInfo {
  Fault fault;
  const char* name;
};
constexpr FaultInfo kFaults[] = {
    {Fault::kKillMember, "kill-member"},
    {Fault::kKillLeader, "kill-leader"},
    {Fault::kPauseMember, "pause-member"},
    {Fault::kPauseLeader, "pause-leader"},
    {Fault::kIsolateLeader, "isolate-leader"},
    {Fault::kIsolateFollower, "isolate-follower"},
    {Fault::kSplitMajority, "split-majority"},
    {Fault::kOneWayFromLeader, "one-way-from-leader"},
    {Fault::kOneWayToLeader, "one-way-to-leader"},
    {Fault::kFlappingLink, "flapping-link"},
    {Fault::kSlowFollower, "slow-follower"},
    {Fault::kDiskFailure, "disk-failure"},
    {Fault::kLaggingLearner, "lagging-learner"},
};

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// One campaign's state: the cluster, its proxy, the recorders.
class Campaign {
 public:
  explicit Campaign(const CampaignOptions& o) : o_(o), rng_(o.seed) {
    result_.flavor = FlavorName(o.flavor);
    result_.seed = o.seed;
  }

  CampaignResult Run();

 private:
  bool StartCluster();
  void StartTraffic();
  void StopTraffic();
  void Inject(Fault f);
  // Waits until `n` more operations than now are acknowledged; the seconds
  // it took, or -1 after `timeout`.
  double WaitForProgress(int64_t n, milliseconds timeout);
  int Leader();
  int OtherThan(int member);
  milliseconds DrawHold();
  bool AddLaggingLearner(int leader, milliseconds hold, InjectedFault* rec);
  absl::StatusOr<std::string> Etcdctl(int via, const std::vector<std::string>& args);
  // The file member i's disk faults follow (Capstan's test hook).
  std::string DiskFaultFile(int i) const {
    return absl::StrCat(dir_, "/m", i, ".disk-fault");
  }
  void SetDiskFault(int i, const std::string& fault) {
    std::ofstream(DiskFaultFile(i), std::ios::trunc) << fault << "\n";
  }
  void Check();
  // The log recorder's events up to `revision`.
  absl::StatusOr<std::vector<Event>> RecordedLog(int64_t revision);
  void Violation(const std::string& checker, const std::string& what) {
    result_.violations.push_back(absl::StrCat(checker, ": ", what));
  }
  void Log(const std::string& line) {
    // The wall clock too, to match the members' logs (UTC timestamps).
    if (o_.verbose) {
      std::printf("[%6.1f s %s] %s\n", SecondsSince(start_),
                  absl::FormatTime("%H:%M:%E3S", absl::Now(), absl::UTCTimeZone()).c_str(),
                  line.c_str());
    }
    std::fflush(stdout);
  }

  const CampaignOptions o_;
  std::mt19937_64 rng_;
  CampaignResult result_;
  Clock::time_point start_ = Clock::now();
  int64_t start_ns_ = NowNs();  // start_ on NowNs()'s clock
  TempDir dir_holder_{"capstan-campaign"};
  const std::string dir_ = dir_holder_.path();
  FaultProxy proxy_;
  std::unique_ptr<Cluster> cluster_;
  History history_;
  std::atomic<bool> stop_{false};
  std::vector<std::unique_ptr<KvClient>> clients_;
  std::vector<std::thread> threads_;
  std::vector<std::unique_ptr<WatchClient>> watchers_;
  // With compaction: the event log, recorded from revision 1 as it happens.
  std::unique_ptr<WatchClient> log_recorder_;
  std::atomic<int64_t> compactions_{0};
  std::vector<std::unique_ptr<LeaseClient>> lease_clients_;
};

bool Campaign::StartCluster() {
  ClusterOptions co = o_.flavor == ServerFlavor::kEtcd ? ClusterOptions::Etcd(o_.members)
                                                       : ClusterOptions::Capstan(o_.members);
  co.heartbeat_interval_ms = o_.heartbeat_interval_ms;
  co.election_timeout_ms = o_.election_timeout_ms;
  co.snapshot_count = o_.snapshot_count;
  // etcd serves a joining member's clients only once it has applied its
  // own publish entry, which a learner behind links slowed by 100 ms
  // reaches after catching up with the traffic: 8.5 s on a quiet machine,
  // over 30 s on two loaded cores.
  co.start_timeout = seconds(90);
  if (o_.flavor == ServerFlavor::kCapstan) {
    co.extra_args.push_back("--experimental-snapshot-catchup-entries=500");
  }
  // The leader compares the members' hashes every second through every
  // fault: a false CORRUPT alarm (one at all) is a violation.
  co.extra_args.push_back("--experimental-corrupt-check-time=1s");
  if (o_.peer_tls) {
    // One certificate (CN "peer", for 127.0.0.1) that every member serves
    // and dials with, client certificates required: kubeadm's peer flags.
    // The proxy passes the TLS bytes through untouched.
    const std::string certs = absl::StrCat(dir_, "/peer-certs");
    std::error_code ec;
    std::filesystem::create_directories(certs, ec);
    TestCertificates tc;
    tc.leaves = {{.name = "peer", .common_name = "peer"}};
    if (absl::Status made = ec ? absl::InternalError(ec.message()) : MakeTestCertificates(certs, tc);
        !made.ok()) {
      result_.error = absl::StrCat("peer certificates: ", made.ToString());
      return false;
    }
    co.peer_scheme = "https";
    co.extra_args.insert(co.extra_args.end(),
                         {"--peer-cert-file", certs + "/peer.pem", "--peer-key-file",
                          certs + "/peer.key", "--peer-trusted-ca-file", certs + "/ca.pem",
                          "--peer-client-cert-auth"});
  }
  if (o_.flavor == ServerFlavor::kCapstan) {
    co.member_env = [this](const Cluster& c, int i) {
      return std::vector<std::string>{absl::StrCat("CAPSTAN_TEST_DISK_FAULT_FILE=", DiskFaultFile(i))};
    };
  }
  if (o_.proxy) {
    co.peer_front = [this](const Cluster& c, int i, int port) {
      return proxy_.Front(i, c.data_dir(i), port);
    };
  }
  auto started = Cluster::Start(std::move(co));
  if (!started.ok()) {
    result_.error = absl::StrCat("the cluster did not start: ", started.status().ToString());
    return false;
  }
  cluster_ = std::move(*started);
  return true;
}

void Campaign::StartTraffic() {
  const int n = o_.etcd_clients + o_.kubernetes_clients;
  for (int c = 0; c < n; ++c) {
    clients_.push_back(std::make_unique<KvClient>(c, cluster_->endpoints(), c, &history_));
  }
  for (int c = 0; c < n; ++c) {
    const uint32_t seed = static_cast<uint32_t>(o_.seed * 1000 + c);
    if (c < o_.etcd_clients) {
      threads_.emplace_back(RunEtcdTraffic, clients_[c].get(), absl::StrCat(kPrefix, "etcd/"),
                            o_.keys, seed, &stop_);
    } else {
      threads_.emplace_back(RunKubernetesTraffic, clients_[c].get(),
                            absl::StrCat(kPrefix, "pods/"), o_.keys, seed, &stop_,
                            o_.list_page);
    }
  }
  for (int l = 0; l < o_.lease_clients; ++l) {
    lease_clients_.push_back(std::make_unique<LeaseClient>(
        l, cluster_->endpoints(), l + 1, "/campaign-leases/",
        static_cast<uint32_t>(o_.seed * 1000 + 500 + l)));
    threads_.emplace_back([c = lease_clients_.back().get(), this] { c->Run(&stop_); });
  }
  for (int w = 0; w < o_.watchers; ++w) {
    watchers_.push_back(std::make_unique<WatchClient>(w, cluster_->endpoints(), w, kPrefix,
                                                      /*start_revision=*/1));
    watchers_.back()->Start();
  }
  if (o_.compaction_interval.count() > 0) {
    log_recorder_ = std::make_unique<WatchClient>(o_.watchers, cluster_->endpoints(), 0, kPrefix,
                                                  /*start_revision=*/1);
    log_recorder_->Start();
    // Nothing at or above the lowest revision a watcher or the log has
    // reached is compacted: each resumes above it.
    auto safe = [this] {
      int64_t low = log_recorder_->last_revision();
      for (const auto& w : watchers_) low = std::min(low, w->last_revision());
      return low;
    };
    threads_.emplace_back(RunCompactor, cluster_->endpoints(), o_.compaction_interval, safe,
                          &stop_, &compactions_);
  }
}

void Campaign::StopTraffic() {
  stop_ = true;
  for (auto& t : threads_) t.join();
  threads_.clear();
}

double Campaign::WaitForProgress(int64_t n, milliseconds timeout) {
  const auto from = Clock::now();
  const int64_t target = history_.ok_count() + n;
  while (history_.ok_count() < target) {
    if (Clock::now() - from >= timeout) return -1;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return SecondsSince(from);
}

int Campaign::Leader() {
  auto l = cluster_->WaitForLeader(seconds(15));
  return l.ok() ? *l : -1;
}

int Campaign::OtherThan(int member) {
  const int n = o_.members;  // the voters; learners come and go above them
  const int pick = static_cast<int>(rng_() % (n - 1));
  return pick >= member ? pick + 1 : pick;
}

milliseconds Campaign::DrawHold() {
  const int64_t lo = o_.hold_min.count(), hi = std::max(o_.hold_max.count(), lo);
  return milliseconds(lo + static_cast<int64_t>(rng_() % (hi - lo + 1)));
}

absl::StatusOr<std::string> Campaign::Etcdctl(int via, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {EtcdctlBinary(), "--endpoints=" + cluster_->endpoint(via),
                                   "--command-timeout=10s"};
  argv.insert(argv.end(), args.begin(), args.end());
  CommandResult r = RunCommand(argv, "", seconds(30));
  if (!r.exit.exited || r.exit.exit_code != 0) {
    return absl::UnavailableError(absl::StrCat("etcdctl ", absl::StrJoin(args, " "), ": ",
                                               r.exit.ToString(), ": ", r.err));
  }
  return r.out;
}

bool Campaign::AddLaggingLearner(int leader, milliseconds hold, InjectedFault* rec) {
  auto reserved = cluster_->ReserveMember();
  if (!reserved.ok()) {
    result_.error = absl::StrCat("reserving a learner: ", reserved.status().ToString());
    return false;
  }
  const int l = *reserved;
  rec->member = l;
  Log(absl::StrCat(FaultName(rec->fault), " ", cluster_->name(l), ", links slowed by 100 ms"));
  proxy_.Delay(l, milliseconds(100));
  // A cluster whose members have not all been up for 5 s refuses to grow
  // ("unhealthy cluster", --strict-reconfig-check): retried until they have.
  absl::StatusOr<std::string> added = absl::UnavailableError("not tried");
  const auto add_deadline = Clock::now() + seconds(20);
  while (Clock::now() < add_deadline) {
    added = Etcdctl(leader, {"member", "add", cluster_->name(l), "--learner",
                             "--peer-urls=" + cluster_->peer_url(l)});
    if (added.ok() || !absl::StrContains(added.status().message(), "unhealthy cluster")) break;
    std::this_thread::sleep_for(milliseconds(500));
  }
  absl::StatusOr<MemberAdded> parsed =
      added.ok() ? ParseMemberAdd(*added) : absl::StatusOr<MemberAdded>(added.status());
  if (!parsed.ok()) {
    result_.error = absl::StrCat("adding a learner: ", parsed.status().ToString());
    return false;
  }
  const auto joining = Clock::now();
  if (absl::Status s = cluster_->StartJoining(l, parsed->env); !s.ok()) {
    result_.error = absl::StrCat("starting learner ", cluster_->name(l), ": ", s.ToString());
    return false;
  }
  Log(absl::StrFormat("learner %s serving after %.1f s", cluster_->name(l),
                      SecondsSince(joining)));
  // SIGKILLed once while it catches up, then restarted on its data.
  std::this_thread::sleep_for(hold / 2);
  Log(absl::StrCat("killing learner ", cluster_->name(l), " while it catches up"));
  cluster_->Kill(l);
  const auto restarting = Clock::now();
  if (absl::Status s = cluster_->Restart(l); !s.ok()) {
    result_.error = absl::StrCat("restarting learner ", cluster_->name(l), ": ", s.ToString());
    return false;
  }
  Log(absl::StrFormat("learner %s serving again after %.1f s", cluster_->name(l),
                      SecondsSince(restarting)));
  std::this_thread::sleep_for(hold / 2);
  proxy_.HealAll();
  // Caught up: it has applied what the leader had committed by now.
  const int now_leader = Leader();
  auto target = now_leader >= 0 ? cluster_->Status(now_leader, seconds(5))
                                : absl::StatusOr<etcdserverpb::StatusResponse>(
                                      absl::UnavailableError("no leader"));
  bool caught_up = false;
  const auto deadline = Clock::now() + o_.recovery_timeout;
  while (target.ok() && Clock::now() < deadline) {
    auto st = cluster_->Status(l, seconds(2));
    if (st.ok() && st->raftappliedindex() >= target->raftindex()) {
      caught_up = true;
      break;
    }
    std::this_thread::sleep_for(milliseconds(50));
  }
  if (!caught_up) {
    Violation("learner", absl::StrFormat("%s did not catch up within %.0f s of its links healing",
                                         cluster_->name(l), o_.recovery_timeout.count() / 1000.0));
  }
  const uint64_t id = parsed->id;
  auto removed = Etcdctl(now_leader >= 0 ? now_leader : leader,
                         {"member", "remove", absl::StrFormat("%x", id)});
  if (!removed.ok()) {
    result_.error = absl::StrCat("removing learner ", cluster_->name(l), ": ",
                                 removed.status().ToString());
    return false;
  }
  // A removed member stops by itself.
  auto exited = cluster_->WaitForExit(l, seconds(20));
  if (!exited.ok()) cluster_->Kill(l);
  return true;
}

void Campaign::Inject(Fault f) {
  InjectedFault rec;
  rec.fault = f;
  rec.at_seconds = SecondsSince(start_);
  const int leader = Leader();
  if (leader < 0) {
    result_.error = absl::StrCat("no leader before ", FaultName(f));
    return;
  }
  const int n = o_.members;
  // Drawn whether used or not, so that a seed's faults hit the same roles.
  const int random_member = static_cast<int>(rng_() % n);
  const int follower = OtherThan(leader);
  milliseconds hold = DrawHold();
  if (f == Fault::kDiskFailure && o_.flavor != ServerFlavor::kCapstan) {
    Log(absl::StrCat(FaultName(f), ": skipped (etcd has no disk fault hook)"));
    return;
  }
  const auto began = Clock::now();
  rec.start_ns = NowNs();
  switch (f) {
    case Fault::kKillMember:
    case Fault::kKillLeader: {
      const int victim = f == Fault::kKillLeader ? leader : random_member;
      rec.member = victim;
      Log(absl::StrCat(FaultName(f), " ", cluster_->name(victim)));
      cluster_->Kill(victim);
      std::this_thread::sleep_for(hold);
      absl::Status st = cluster_->Restart(victim);
      if (!st.ok()) {
        result_.error = absl::StrCat(cluster_->name(victim), " did not restart: ", st.ToString());
        return;
      }
      break;
    }
    case Fault::kPauseMember:
    case Fault::kPauseLeader: {
      const int victim = f == Fault::kPauseLeader ? leader : random_member;
      rec.member = victim;
      hold = std::max(hold, milliseconds(o_.election_timeout_ms * 3 / 2));
      Log(absl::StrCat(FaultName(f), " ", cluster_->name(victim)));
      absl::Status st = cluster_->Pause(victim);
      std::this_thread::sleep_for(hold);
      if (st.ok()) st = cluster_->Resume(victim);
      if (!st.ok()) {
        result_.error = absl::StrCat("pause/resume ", cluster_->name(victim), ": ", st.ToString());
        return;
      }
      break;
    }
    case Fault::kIsolateLeader:
    case Fault::kIsolateFollower:
    case Fault::kSplitMajority: {
      std::vector<int> side;
      if (f == Fault::kIsolateFollower) {
        side = {follower};
      } else {
        side = {leader};
        // A minority with the leader: (n - 1) / 2 members.
        for (int i = 0; static_cast<int>(side.size()) < (n - 1) / 2 && i < n; ++i) {
          if (f == Fault::kSplitMajority && i != leader) side.push_back(i);
        }
      }
      rec.member = side.size() == 1 ? side[0] : -1;
      std::string names;
      for (int i : side) names += cluster_->name(i) + " ";
      Log(absl::StrCat(FaultName(f), ": ", names, "cut off"));
      proxy_.Partition(side);
      std::this_thread::sleep_for(hold);
      proxy_.HealAll();
      break;
    }
    case Fault::kOneWayFromLeader:
    case Fault::kOneWayToLeader: {
      rec.member = leader;
      Log(absl::StrCat(FaultName(f), " ", cluster_->name(leader)));
      for (int j = 0; j < n; ++j) {
        if (j == leader) continue;
        if (f == Fault::kOneWayFromLeader) proxy_.Hold(leader, j, true);
        if (f == Fault::kOneWayToLeader) proxy_.Hold(j, leader, true);
      }
      std::this_thread::sleep_for(hold);
      proxy_.HealAll();
      break;
    }
    case Fault::kFlappingLink: {
      rec.member = follower;
      Log(absl::StrCat(FaultName(f), " ", cluster_->name(leader), " <-> ",
                       cluster_->name(follower)));
      bool down = false;
      while (Clock::now() - began < hold) {
        down = !down;
        proxy_.Hold(leader, follower, down);
        proxy_.Hold(follower, leader, down);
        std::this_thread::sleep_for(milliseconds(100 + rng_() % 200));
      }
      proxy_.HealAll();
      break;
    }
    case Fault::kDiskFailure: {
      const int victim = random_member;
      const char* kind = rng_() % 2 == 0 ? "sync-error" : "no-space";
      rec.member = victim;
      Log(absl::StrCat(FaultName(f), " ", cluster_->name(victim), ": ", kind));
      SetDiskFault(victim, kind);
      std::this_thread::sleep_for(hold);
      SetDiskFault(victim, "none");
      // A member whose disk failed has stopped (its Raft log could not be
      // written) or refuses writes until restarted (its store fails stop):
      // a supervisor restarts it.
      if (cluster_->running(victim)) {
        cluster_->Kill(victim);
      } else {
        Log(absl::StrCat(cluster_->name(victim), " had stopped: ",
                         cluster_->exit_info(victim).ToString()));
      }
      absl::Status st = cluster_->Restart(victim);
      if (!st.ok()) {
        result_.error = absl::StrCat(cluster_->name(victim), " did not restart after its disk "
                                     "failed: ", st.ToString());
        return;
      }
      break;
    }
    case Fault::kLaggingLearner: {
      if (!AddLaggingLearner(leader, hold, &rec)) return;
      break;
    }
    case Fault::kSlowFollower: {
      rec.member = follower;
      Log(absl::StrCat(FaultName(f), " ", cluster_->name(follower)));
      proxy_.Delay(follower, milliseconds(150));
      std::this_thread::sleep_for(hold);
      proxy_.HealAll();
      break;
    }
  }
  rec.held_seconds = SecondsSince(began);
  rec.recovered_seconds = WaitForProgress(20, o_.recovery_timeout);
  rec.end_ns = NowNs();
  if (rec.recovered_seconds < 0) {
    Violation("progress", absl::StrFormat("no 20 operations acknowledged within %.1f s after "
                                          "healing %s at %.1f s",
                                          o_.recovery_timeout.count() / 1000.0, FaultName(f),
                                          rec.at_seconds + rec.held_seconds));
  }
  Log(absl::StrFormat("healed after %.1f s; serving again %.2f s later", rec.held_seconds,
                      rec.recovered_seconds));
  result_.faults.push_back(rec);
}

void Campaign::Check() {
  // Every key read once more, linearizably, through the recorders.
  KvClient reader(static_cast<int>(clients_.size()), cluster_->endpoints(), 0, &history_);
  for (const char* space : {"etcd/", "pods/"}) {
    for (int k = 0; k < o_.keys; ++k) {
      const std::string key = absl::StrCat(kPrefix, space, "k", k);
      if (reader.Get(key).outcome != Outcome::kOk) reader.Get(key);
    }
  }
  auto rev = cluster_->WaitForConvergence(0, seconds(30));
  if (!rev.ok()) {
    result_.error = absl::StrCat("members did not converge: ", rev.status().ToString());
    return;
  }
  result_.final_revision = *rev;
  absl::StatusOr<std::vector<Event>> events =
      log_recorder_ == nullptr ? ReadEventLog(cluster_->endpoint(0), kPrefix, *rev, seconds(30))
                               : RecordedLog(*rev);
  if (!events.ok()) {
    result_.error = absl::StrCat("reading the event log: ", events.status().ToString());
    return;
  }

  std::vector<Operation> ops = history_.Operations();
  for (InjectedFault& f : result_.faults) {
    int64_t first = 0;
    for (const Operation& op : ops) {
      if (op.IsWrite() && op.outcome == Outcome::kOk && op.invoke_ns >= f.start_ns &&
          (first == 0 || op.complete_ns < first)) {
        first = op.complete_ns;
      }
    }
    if (first != 0) f.first_write_seconds = static_cast<double>(first - f.start_ns) / 1e9;
  }
  CheckResult lin = CheckHistory(ops, *events);
  result_.compactions = compactions_.load();
  for (const Operation& op : ops) {
    result_.list_pages += op.kind == OpKind::kList && op.outcome == Outcome::kOk;
  }
  result_.operations = lin.stats.operations;
  result_.ok = lin.stats.ok;
  result_.unknown = lin.stats.unknown;
  for (const auto& v : lin.violations) {
    Violation("linearizability", absl::StrCat(RuleName(v.rule), ": ", v.message));
  }

  for (auto& w : watchers_) {
    if (!w->WaitUntil(*rev, seconds(30))) {
      Violation("watch", absl::StrCat("watcher ", w->id(), " stopped at revision ",
                                      w->last_revision(), " of ", *rev));
    }
    w->Stop();
    std::vector<WatchRecord> records = w->Records();
    WatchCheckResult wr = CheckWatch(records, 1, kPrefix, *events);
    if (o_.keep_history) result_.watch_records.push_back(std::move(records));
    result_.watch_events += wr.stats.events;
    result_.watch_progress += wr.stats.progress;
    result_.watch_reconnects += wr.stats.reconnects;
    for (const auto& v : wr.violations) {
      Violation("watch", absl::StrCat("watcher ", w->id(), ": ", WatchRuleName(v.rule), ": ",
                                      v.message));
    }
  }

  // Leases: each fault that overlaps a lease's window may have changed the
  // leader, and a new leader gives every lease its TTL again (plus an
  // election); expiry is checked every 500 ms.
  std::vector<LeaseRecord> leases;
  for (auto& c : lease_clients_) {
    std::vector<LeaseRecord> r = c->Records();
    leases.insert(leases.end(), r.begin(), r.end());
  }
  const int64_t election_ns = int64_t{o_.election_timeout_ms} * 1000000;
  const auto allowance = [this, election_ns](int64_t from, int64_t to) {
    int64_t allowed = 1500000000 + election_ns;
    for (int pass = 0; pass < 2; ++pass) {
      int64_t extra = 0;
      for (const InjectedFault& f : result_.faults) {
        if (f.start_ns <= to + allowed && f.end_ns >= from) {
          extra += 3000000000 + (f.end_ns - f.start_ns) + 2 * election_ns;
        }
      }
      allowed = 1500000000 + election_ns + extra;
    }
    return allowed;
  };
  // etcd 3.5 revokes leases early after a paused leader resumes: its
  // ensureLeadership skips the ReadIndex check when the raft loop ticked in
  // the last three ticks, which the resumed member's first tick satisfies, so
  // it proposes the revocation of the leases its own clock saw expire during
  // the pause; once it hears of the new term, the proposal is forwarded to the
  // new leader, which commits it although it has kept the leases alive
  // (etcd-io/etcd#15247, #16822). Capstan confirms its leadership by ReadIndex
  // before every revocation and is held to the rule.
  std::vector<ExcusedWindow> excused;
  if (o_.flavor == ServerFlavor::kEtcd) {
    for (const InjectedFault& f : result_.faults) {
      if (f.fault != Fault::kPauseLeader && f.fault != Fault::kPauseMember) continue;
      // From the pause to one lease check (500 ms), a proposal and an
      // election timeout after the member serves again.
      excused.push_back({f.start_ns, f.end_ns + 1000000000 + election_ns,
                         absl::StrFormat("within the resumption of the member paused at %.1f s "
                                         "(etcd's stale-leader revocation)",
                                         f.at_seconds)});
    }
  }
  LeaseCheckResult lr = CheckLeases(leases, allowance, start_ns_, excused);
  result_.leases = lr.leases;
  result_.leases_expired = lr.expired;
  result_.leases_revoked_early_excused = lr.excused;
  result_.excused = lr.excused_examples;
  for (const auto& v : lr.violations) {
    Violation("lease", absl::StrCat(LeaseRuleName(v.rule), ": ", v.message));
  }

  if (o_.keep_history) {
    result_.lease_records = std::move(leases);
    result_.history = std::move(ops);
    result_.log = std::move(*events);
  }

  std::vector<int> voters(o_.members);
  for (int i = 0; i < o_.members; ++i) voters[i] = i;
  if (absl::Status same = cluster_->SameHashKV(voters, *rev); !same.ok()) {
    Violation("hashkv", same.ToString());
  }
  // The members agree: no corruption check may have said otherwise. The
  // alarms are the cluster's: the first member that lists them speaks for
  // all.
  std::string unlisted = "no member listed its alarms";
  for (int i : voters) {
    auto stub = etcdserverpb::Maintenance::NewStub(cluster_->NewChannel(i));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    etcdserverpb::AlarmRequest get;
    get.set_action(etcdserverpb::AlarmRequest::GET);
    etcdserverpb::AlarmResponse alarms;
    if (grpc::Status s = stub->Alarm(&ctx, get, &alarms); !s.ok()) {
      absl::StrAppend(&unlisted, "; m", i, ": ", s.error_message());
      continue;
    }
    unlisted.clear();
    for (const auto& a : alarms.alarms()) {
      if (a.alarm() == etcdserverpb::CORRUPT) {
        Violation("corrupt-check", absl::StrCat("m", i, " lists a CORRUPT alarm for member ",
                                                absl::Hex(a.memberid())));
      }
    }
    break;
  }
  if (!unlisted.empty()) Violation("corrupt-check", unlisted);
}

absl::StatusOr<std::vector<Event>> Campaign::RecordedLog(int64_t revision) {
  if (!log_recorder_->WaitUntil(revision, seconds(30))) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the log recorder reached revision ", log_recorder_->last_revision(), " of ", revision,
        log_recorder_->failed() ? " and failed" : ""));
  }
  log_recorder_->Stop();
  std::vector<Event> events;
  for (const WatchRecord& r : log_recorder_->Records()) {
    if (r.kind == WatchRecord::kError) {
      return absl::DataLossError(absl::StrCat("the log recorder failed: ", r.ToString()));
    }
    if (r.kind != WatchRecord::kEvent) continue;
    events.push_back(Event{r.revision, r.key, r.is_delete, r.value});
  }
  return events;
}

CampaignResult Campaign::Run() {
  start_ = Clock::now();
  start_ns_ = NowNs();
  if (!StartCluster()) return result_;
  StartTraffic();
  std::vector<Fault> faults;
  for (Fault f : o_.faults.empty() ? AllFaults() : o_.faults) {
    const bool on_process = f == Fault::kKillMember || f == Fault::kKillLeader ||
                            f == Fault::kPauseMember || f == Fault::kPauseLeader;
    // A disk failure stays in etcd's list (skipped when drawn), so that a
    // seed draws the same faults for both servers.
    if (o_.proxy || on_process || f == Fault::kDiskFailure) faults.push_back(f);
  }
  if (faults.empty()) {
    result_.error = "no fault to inject without the proxy";
    return result_;
  }
  if (WaitForProgress(100, seconds(30)) < 0) {
    result_.error = "no 100 operations acknowledged in the first 30 s";
  }
  while (result_.error.empty() && Clock::now() - start_ < o_.duration) {
    const size_t pick = rng_() % faults.size();
    Inject(faults[o_.cycle_faults ? result_.faults.size() % faults.size() : pick]);
    std::this_thread::sleep_for(milliseconds(300 + rng_() % 500));
  }
  StopTraffic();
  proxy_.HealAll();
  if (result_.error.empty()) Check();
  for (auto& w : watchers_) w->Stop();
  if (log_recorder_ != nullptr) log_recorder_->Stop();
  const FaultProxy::Stats proxy = proxy_.stats();
  result_.peer_connections = proxy.connections;
  result_.peer_unattributed = proxy.unattributed;
  result_.seconds = SecondsSince(start_);
  return result_;
}

}  // namespace

const char* FaultName(Fault f) {
  for (const FaultInfo& i : kFaults) {
    if (i.fault == f) return i.name;
  }
  return "?";
}

bool ParseFault(const std::string& name, Fault* f) {
  for (const FaultInfo& i : kFaults) {
    if (name == i.name) {
      *f = i.fault;
      return true;
    }
  }
  return false;
}

std::vector<Fault> AllFaults() {
  std::vector<Fault> all;
  for (const FaultInfo& i : kFaults) all.push_back(i.fault);
  return all;
}

std::string CampaignResult::Report() const {
  std::string out = absl::StrFormat(
      "%s seed %d: %.1f s, %d operations (%d ok, %d unknown), %d faults, final revision %d\n"
      "  watch: %d events, %d progress notifications, %d reconnections; leases: %d (%d seen to "
      "expire%s); list pages: %d; compactions: %d; peer connections: %d (%d not from a member)\n",
      flavor, seed, seconds, operations, ok, unknown, faults.size(), final_revision, watch_events,
      watch_progress, watch_reconnects, leases, leases_expired,
      leases_revoked_early_excused == 0
          ? ""
          : absl::StrFormat(", %d revoked early by a resumed etcd leader, excused",
                            leases_revoked_early_excused),
      list_pages, compactions, peer_connections, peer_unattributed);
  for (const std::string& e : excused) absl::StrAppend(&out, "  excused: ", e, "\n");
  for (const InjectedFault& f : faults) {
    absl::StrAppendFormat(&out,
                          "  %6.1f s  %-20s member %2d  first write %.3f s after; held %.1f s, "
                          "serving %.2f s after the heal\n",
                          f.at_seconds, FaultName(f.fault), f.member, f.first_write_seconds,
                          f.held_seconds, f.recovered_seconds);
  }
  if (!error.empty()) absl::StrAppend(&out, "  ERROR: ", error, "\n");
  absl::StrAppend(&out, "  violations: ", violations.size(), "\n");
  for (size_t i = 0; i < violations.size() && i < 20; ++i) {
    absl::StrAppend(&out, "    ", violations[i], "\n");
  }
  return out;
}

CampaignResult RunCampaign(const CampaignOptions& options) {
  Campaign c(options);
  return c.Run();
}

}  // namespace capstan::testing::cluster
