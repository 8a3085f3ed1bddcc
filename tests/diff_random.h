// DiffRandomTest: the fixture of the seeded differential tests
// (diff_random_test.cc describes them): one seed per test, its requests
// sent to both servers and every answer compared, restarts of both servers,
// the lease normalizations. The KV, auth and watch suites derive from it.
// Test code only.

#ifndef CAPSTAN_TESTS_DIFF_RANDOM_H_
#define CAPSTAN_TESTS_DIFF_RANDOM_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "diff_fixture.h"
#include "diff_random_generator.h"
#include "diff_watch.h"
#include "google/protobuf/util/message_differencer.h"

namespace capstan::testing::diff_random {

class DiffRandomTest : public DiffTest, public ::testing::WithParamInterface<uint64_t> {
 protected:
  uint64_t seed() const { return GetParam(); }
  // Where a failure happened, for its message: "seed N, step M".
  std::string At() const { return absl::StrCat("seed ", seed(), ", step ", step_); }
  // Where the seed's keys live: the test's own prefix, unless a suite
  // places them elsewhere.
  virtual std::string Root() const { return prefix(); }
  std::string RootKey(std::string_view suffix) const { return Root() + std::string(suffix); }

  // Puts the seed's first key and compacts at its revision, so that the
  // seed's revisions and compaction state don't depend on earlier seeds.
  bool BeginSeed() {
    // From the test's prefix, as DiffKvTest::LeaseId: leases outlive their test.
    const auto lease_base =
        static_cast<int64_t>((std::hash<std::string>()(Root()) & 0xffffffffffULL) << 4);
    for (int i = 1; i <= kLeasePool; ++i) lease_pool_.push_back(lease_base + i);
    gen_ = std::make_unique<RequestGenerator>(seed(), Root(), lease_pool_, &model_);
    PutRequest put;
    put.set_key(RootKey("begin"));
    if (!Step(put)) return false;
    model_.base = model_.rev;
    CompactionRequest compact;
    compact.set_revision(model_.base);
    return Step(compact);
  }

  // Sends `req` to both servers and compares the answers. On a difference,
  // reports the seed, the step and the request and returns false.
  template <typename Req>
  bool Step(const Req& req) {
    ++step_;
    auto p = Both(req);
    DropNondeterminism(&p);
    if (auto same = Same(p); !same) {
      ADD_FAILURE() << At() << ": "
                    << req.GetDescriptor()->name() << AfterRestart() << acting_as_ << "\n"
                    << Describe(req) << same.message();
      return false;
    }
    last_ok_ = p.etcd.status.ok();
    if (last_ok_) {
      model_.rev = p.etcd.resp.header().revision();
      Learn(req);
    }
    return true;
  }

  // The KV tests: the seed's steps of the KV and lease kinds.
  void RunKvSteps() {
    if (!BeginSeed()) return;
    for (int i = 0; i < Steps(); ++i) {
      if (!KvStep(gen_->Kind(kKvMix))) return;
    }
  }

  // One step of the KV and lease kinds.
  bool KvStep(StepKind kind) {
    switch (kind) {
      case StepKind::kPut:
        return Step(gen_->Put());
      case StepKind::kDelete:
        return Step(gen_->Delete());
      case StepKind::kRange:
        return Step(gen_->Range());
      case StepKind::kTxn:
        return Step(gen_->Txn());
      case StepKind::kCompact:
        return Step(gen_->Compact());
      case StepKind::kGrant:
        return Step(gen_->Grant());
      case StepKind::kRevoke:
        return Step(gen_->Revoke());
      case StepKind::kTimeToLive:
        return Step(gen_->TimeToLive());
      case StepKind::kLeases:
        return Step(LeaseLeasesRequest());
      case StepKind::kHashKv: {
        // The whole key history: once an earlier test left the servers
        // apart, it differs in every later one.
        const HashKVRequest r = gen_->HashKv();
        return Resynced() || Step(r);
      }
      case StepKind::kRestart:
        return Restart();
      case StepKind::kWatch:
      case StepKind::kCancelWatch:
      case StepKind::kProgress:
      case StepKind::kAuthAdmin:
      case StepKind::kAuthenticate:
        break;
    }
    ADD_FAILURE() << "not a KV step";
    return false;
  }

  // Called once both servers serve again after a restart, before what
  // survived is read back (as whoever this hook leaves the steps running as).
  virtual bool Restarted() { return true; }

  // Whether a user or role name belongs to this seed (or is root): lists of
  // users and roles are compared on those only.
  bool OwnName(const std::string& name) const {
    return name == "root" || absl::EndsWith(name, absl::StrCat(".", seed()));
  }

  Model model_;
  std::unique_ptr<RequestGenerator> gen_;
  int step_ = 0;
  // etcd's answer to the last step was OK.
  bool last_ok_ = false;
  // Who the steps run as, for failure messages (" as ..."; empty: no auth).
  std::string acting_as_;
  // The tokens of the last Authenticate step: etcd's, capstan's.
  std::string auth_tokens_[2];

 private:
  // The seed's last restart.
  struct RestartInfo {
    int step = 0;
    bool crash = false;
    Clock::time_point began;
  };

  // Restarts both servers, as a crash (SIGKILL) or cleanly (SIGTERM), and
  // reads back from both what must have survived. Every later step is
  // compared as before.
  bool Restart() {
    if (!LeaveEtcdNothingToReapply()) return false;
    ++step_;
    last_restart_ = RestartInfo{step_, gen_->OneIn(2), Clock::now()};
    if (absl::Status s = RestartBoth(last_restart_->crash); !s.ok()) {
      ADD_FAILURE() << At() << ": restart" << AfterRestart()
                    << ": " << s;
      return false;
    }
    restored_leases_ = model_.live_leases;
    return Restarted() && CheckRestored();
  }

  // etcd 3.4 saves the index of the last log entry it applied only along
  // with a change to the keys, and at start-up applies the entries after it
  // again, where some no longer fail as they did: a txn refused for a
  // range's revision (compacted or future) succeeds, since etcd drops the
  // ranges of a txn that no client waits for (etcd-io/etcd#18667), and so
  // does a put refused for a lease granted after it. Capstan keeps what it
  // answered. So before a restart a put moves etcd's saved index past every
  // entry, and a Hash (etcd's commits its backend first; Capstan's only
  // reads) makes that durable before a SIGKILL.
  bool LeaveEtcdNothingToReapply() {
    PutRequest put;
    put.set_key(RootKey("restart"));
    return Step(put) && Step(HashRequest());
  }

  // Every key of the seed with its revisions, at the same revision; the
  // whole key history (HashKV); the compaction (a read just below it
  // refused, one at it served); every lease with its keys.
  bool CheckRestored() {
    const int64_t rev = model_.rev;
    RangeRequest all;
    all.set_key(Root());
    all.set_range_end(PrefixEnd(Root()));
    if (!Step(all)) return false;
    if (model_.rev != rev) {
      ADD_FAILURE() << At() << AfterRestart()
                    << ": etcd's revision went from " << rev << " to " << model_.rev;
      return false;
    }
    RangeRequest below = all;
    below.set_revision(model_.compacted - 1);
    RangeRequest at = all;
    at.set_revision(model_.compacted);
    if ((!Resynced() && !Step(HashKVRequest())) || !Step(below) || !Step(at) ||
        !Step(LeaseLeasesRequest())) {
      return false;
    }
    for (int64_t id : model_.live_leases) {
      LeaseTimeToLiveRequest ttl;
      ttl.set_id(id);
      ttl.set_keys(true);
      if (!Step(ttl)) return false;
    }
    return true;
  }

  // For failure messages: the seed's last restart, if any.
  std::string AfterRestart() const {
    if (!last_restart_) return "";
    return absl::StrCat(" (after the restart with ", last_restart_->crash ? "SIGKILL" : "SIGTERM",
                        " at step ", last_restart_->step, ")");
  }

  // What etcd's successful answer changed (the revision aside).
  template <typename Req>
  void Learn(const Req&) {}
  void Learn(const LeaseGrantRequest& r) { model_.live_leases.insert(r.id()); }
  void Learn(const LeaseRevokeRequest& r) {
    model_.live_leases.erase(r.id());
    restored_leases_.erase(r.id());
  }
  void Learn(const CompactionRequest& r) { model_.compacted = r.revision(); }
  void Learn(const TxnRequest&) {
    if (gen_->LastTxnPutsAfterFromKeyDelete()) model_.no_compaction_at.insert(model_.rev);
  }

  // See the file comment.
  template <typename Resp>
  void DropNondeterminism(AnswerPair<Resp>*) {}
  void DropNondeterminism(AnswerPair<LeaseTimeToLiveResponse>* p) {
    for (auto* a : {&p->etcd, &p->capstan}) {
      auto* keys = a->resp.mutable_keys();
      std::sort(keys->begin(), keys->end());
    }
    // Only seconds left of a live lease (-1: not found; 0: expired).
    const int64_t etcd_ttl = p->etcd.resp.ttl();
    const int64_t capstan_ttl = p->capstan.resp.ttl();
    if (etcd_ttl <= 0 || capstan_ttl <= 0) return;
    const bool same = restored_leases_.contains(p->etcd.resp.id())
                          ? FitsRestart(p->etcd.resp) && FitsRestart(p->capstan.resp)
                          : std::abs(capstan_ttl - etcd_ttl) <= 1;
    if (same) p->capstan.resp.set_ttl(etcd_ttl);
  }
  // A lease that lived through a restart starts again with its full granted
  // TTL, on etcd and on Capstan (docs/RELIABILITY.md, "Leases after a restart";
  // etcd 3.4 adds its election timeout, 1 s, and counts from its election,
  // Capstan from its start). The servers come back at different moments, so
  // each TTL only has to fit that rule: at most the granted TTL, at least
  // that less the time since the restart began.
  bool FitsRestart(const LeaseTimeToLiveResponse& r) const {
    const int64_t since =
        std::chrono::ceil<std::chrono::seconds>(Clock::now() - last_restart_->began).count();
    return r.ttl() <= r.grantedttl() && r.ttl() >= r.grantedttl() - since;
  }
  // Tokens differ between servers: kept for the steps that follow.
  void DropNondeterminism(AnswerPair<AuthenticateResponse>* p) {
    auth_tokens_[0] = p->etcd.resp.token();
    auth_tokens_[1] = p->capstan.resp.token();
    p->etcd.resp.clear_token();
    p->capstan.resp.clear_token();
  }
  // Users and roles of earlier seeds: left out.
  void DropNondeterminism(AnswerPair<AuthUserListResponse>* p) {
    for (auto* a : {&p->etcd, &p->capstan}) OnlyOwnNames(a->resp.mutable_users());
  }
  void DropNondeterminism(AnswerPair<AuthRoleListResponse>* p) {
    for (auto* a : {&p->etcd, &p->capstan}) OnlyOwnNames(a->resp.mutable_roles());
  }
  void OnlyOwnNames(google::protobuf::RepeatedPtrField<std::string>* names) const {
    std::vector<std::string> own;
    for (const auto& n : *names) {
      if (OwnName(n)) own.push_back(n);
    }
    names->Clear();
    for (auto& n : own) names->Add(std::move(n));
  }
  void DropNondeterminism(AnswerPair<LeaseLeasesResponse>* p) {
    for (auto* a : {&p->etcd, &p->capstan}) {
      std::vector<int64_t> ids;
      for (const auto& l : a->resp.leases()) {
        if (std::find(lease_pool_.begin(), lease_pool_.end(), l.id()) != lease_pool_.end()) {
          ids.push_back(l.id());
        }
      }
      std::sort(ids.begin(), ids.end());
      a->resp.clear_leases();
      for (int64_t id : ids) a->resp.add_leases()->set_id(id);
    }
  }

  std::vector<int64_t> lease_pool_;
  std::optional<RestartInfo> last_restart_;
  // The leases that lived through the last restart, and live still.
  std::set<int64_t> restored_leases_;
};

// Names each seed's test: Run/Seed3.
inline const auto SeedName = [](const ::testing::TestParamInfo<uint64_t>& info) {
  return "Seed" + std::to_string(info.param);
};

}  // namespace capstan::testing::diff_random

#endif  // CAPSTAN_TESTS_DIFF_RANDOM_H_
