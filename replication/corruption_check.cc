#include "replication/corruption_check.h"

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "mvcc/errors.h"
#include "spdlog/spdlog.h"
#include "util/thread_name.h"

namespace capstan::replication {
namespace {

// A peer's answer to a hash request: its hash, or why there is none.
struct PeerHash {
  membership::ClusterMember member;
  absl::StatusOr<etcdserverpb::HashKVResponse> resp;
};

// A member ID as etcd logs it (types.ID's String: hex).
std::string Hex(uint64_t id) { return absl::StrCat(absl::Hex(id)); }

std::string Endpoints(const membership::ClusterMember& m) {
  return absl::StrCat("[", absl::StrJoin(m.peer_urls, " "), "]");
}

// This member's hash at its current revision.
struct OwnHash {
  uint32_t hash = 0;
  int64_t compact_rev = 0;
  int64_t rev = 0;  // the store's revision, hashed through
};

absl::StatusOr<OwnHash> HashNow(mvcc::KvStore* store) {
  OwnHash h;
  int64_t hash_rev = 0;
  absl::Status s = store->HashKV(0, &h.hash, &h.compact_rev, &hash_rev);
  if (!s.ok()) return s;
  h.rev = hash_rev;
  return h;
}

}  // namespace

CorruptionCheck::CorruptionCheck(const CorruptionCheckOptions& options, mvcc::KvStore* store,
                                 Replicator* replicator, Transport* transport)
    : options_(options), store_(store), replicator_(replicator), transport_(transport) {}

CorruptionCheck::~CorruptionCheck() { Stop(); }

namespace {

// Every other member's hash at revision rev (etcd's getPeerHashKVs),
// asked one after the other, each waited for up to timeout, until
// stopping() says to ask no more.
std::vector<PeerHash> PeerHashes(Replicator* replicator, Transport* transport, uint64_t self,
                                 int64_t rev, absl::Duration timeout,
                                 const std::function<bool()>& stopping) {
  std::vector<PeerHash> out;
  for (const auto& m : replicator->Members()) {
    if (m.id == self || m.peer_urls.empty()) continue;
    if (stopping()) break;
    PeerHash p{m, transport->PeerHashKV(m.id, rev, absl::ToInt64Milliseconds(timeout))};
    if (!p.resp.ok()) {
      SPDLOG_WARN(
          "failed hash kv request (local-member-id {}, requested-revision {}, "
          "remote-peer-endpoint {}, error {})",
          Hex(self), rev, Endpoints(m), std::string(p.resp.status().message()));
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace

absl::Status CorruptionCheck::CheckInitial() {
  SPDLOG_INFO("starting initial corruption check (local-member-id {}, timeout {})",
              Hex(options_.member_id), absl::FormatDuration(options_.timeout));
  absl::StatusOr<OwnHash> own = HashNow(store_);
  if (!own.ok()) return own.status();
  int mismatches = 0;
  for (const PeerHash& p :
       PeerHashes(replicator_, transport_, options_.member_id, own->rev, options_.timeout,
                  [this] { return Stopping(); })) {
    if (!p.resp.ok()) {
      const std::string why(p.resp.status().message());
      if (why == "mvcc: required revision is a future revision") {
        SPDLOG_WARN(
            "cannot fetch hash from slow remote peer (local-member-id {}, local-member-revision {}, "
            "remote-peer-id {}, remote-peer-endpoints {})",
            Hex(options_.member_id), own->rev, Hex(p.member.id), Endpoints(p.member));
      } else if (why == "mvcc: required revision has been compacted") {
        SPDLOG_WARN(
            "cannot fetch hash from remote peer; local member is behind (local-member-id {}, "
            "local-member-revision {}, remote-peer-id {}, remote-peer-endpoints {})",
            Hex(options_.member_id), own->rev, Hex(p.member.id), Endpoints(p.member));
      }
      continue;
    }
    if (p.resp->hash() == own->hash) continue;
    const std::string fields = absl::StrCat(
        "local-member-id ", Hex(options_.member_id), ", local-member-revision ", own->rev,
        ", local-member-compact-revision ", own->compact_rev, ", local-member-hash ", own->hash,
        ", remote-peer-id ", Hex(p.member.id), ", remote-peer-endpoints ", Endpoints(p.member),
        ", remote-peer-revision ", p.resp->header().revision(), ", remote-peer-compact-revision ",
        p.resp->compact_revision(), ", remote-peer-hash ", p.resp->hash());
    if (p.resp->compact_revision() == own->compact_rev) {
      SPDLOG_WARN("found different hash values from remote peer ({})", fields);
      ++mismatches;
    } else {
      SPDLOG_WARN("found different compact revision values from remote peer ({})", fields);
    }
  }
  if (mismatches > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(Hex(options_.member_id), " found data inconsistency with peers"));
  }
  SPDLOG_INFO("initial corruption checking passed; no corruption (local-member-id {})",
              Hex(options_.member_id));
  return absl::OkStatus();
}

absl::StatusOr<CorruptionCheckResult> CorruptionCheck::CheckOnce() {
  absl::StatusOr<OwnHash> h = HashNow(store_);
  if (!h.ok()) return h.status();
  std::vector<PeerHash> peers =
      PeerHashes(replicator_, transport_, options_.member_id, h->rev, options_.timeout,
                 [this] { return Stopping(); });
  // etcd's LinearizableReadNotify: the second hash is taken once this
  // member has applied everything committed when the peers answered.
  auto barrier = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> passed = barrier->get_future();
  replicator_->ReadBarrier([barrier](absl::Status s) { barrier->set_value(std::move(s)); });
  if (passed.wait_for(absl::ToChronoMilliseconds(options_.timeout)) != std::future_status::ready) {
    return absl::DeadlineExceededError("the corruption check's read barrier timed out");
  }
  if (absl::Status s = passed.get(); !s.ok()) return s;
  absl::StatusOr<OwnHash> h2 = HashNow(store_);
  if (!h2.ok()) return h2.status();

  CorruptionCheckResult result;
  auto mismatch = [&](uint64_t id) {
    if (result.alarmed != 0) return;
    result.alarmed = id;
    RaiseAlarm(id);
  };
  if (h2->hash != h->hash && h2->rev == h->rev && h2->compact_rev == h->compact_rev) {
    SPDLOG_WARN(
        "found hash mismatch (revision-1 {}, compact-revision-1 {}, hash-1 {}, revision-2 {}, "
        "compact-revision-2 {}, hash-2 {})",
        h->rev, h->compact_rev, h->hash, h2->rev, h2->compact_rev, h2->hash);
    mismatch(options_.member_id);
  }
  for (const PeerHash& p : peers) {
    if (!p.resp.ok()) continue;
    ++result.peers_checked;
    const int64_t peer_rev = p.resp->header().revision();
    if (peer_rev > h2->rev) {
      SPDLOG_WARN(
          "revision from follower must be less than or equal to leader's (leader-revision {}, "
          "follower-revision {}, follower-peer-id {})",
          h2->rev, peer_rev, Hex(p.member.id));
      mismatch(p.member.id);
    }
    if (p.resp->compact_revision() > h2->compact_rev) {
      SPDLOG_WARN(
          "compact revision from follower must be less than or equal to leader's "
          "(leader-compact-revision {}, follower-compact-revision {}, follower-peer-id {})",
          h2->compact_rev, p.resp->compact_revision(), Hex(p.member.id));
      mismatch(p.member.id);
    }
    if (p.resp->compact_revision() == h->compact_rev && p.resp->hash() != h->hash) {
      SPDLOG_WARN(
          "same compact revision then hashes must match (leader-compact-revision {}, "
          "leader-hash {}, follower-compact-revision {}, follower-hash {}, follower-peer-id {})",
          h2->compact_rev, h->hash, p.resp->compact_revision(), p.resp->hash(), Hex(p.member.id));
      mismatch(p.member.id);
    }
  }
  SPDLOG_INFO("finished peer corruption check (number-of-peers-checked {})", result.peers_checked);
  return result;
}

void CorruptionCheck::RaiseAlarm(uint64_t id) {
  auto raise = std::make_shared<etcdserverpb::AlarmRequest>();
  raise->set_action(etcdserverpb::AlarmRequest::ACTIVATE);
  raise->set_memberid(id);
  raise->set_alarm(etcdserverpb::CORRUPT);
  auto resp = std::make_shared<etcdserverpb::AlarmResponse>();
  store_->Submit({mvcc::AlarmOp{raise.get(), resp.get()}, [raise, resp, id](absl::Status s) {
                    if (!s.ok()) {
                      SPDLOG_WARN("failed to raise the CORRUPT alarm (member {}, error {})", Hex(id),
                                  s.ToString());
                    }
                  }});
}

void CorruptionCheck::Start() {
  if (options_.interval <= absl::ZeroDuration()) return;
  SPDLOG_INFO("enabled corruption checking (local-member-id {}, interval {})",
              Hex(options_.member_id), absl::FormatDuration(options_.interval));
  thread_ = NamedThread("corrupt-check", [this] { Loop(); });
}

void CorruptionCheck::Stop() {
  {
    util::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool CorruptionCheck::Stopping() {
  util::MutexLock l(&mu_);
  return stopping_;
}

void CorruptionCheck::Loop() {
  for (;;) {
    {
      util::MutexLock l(&mu_);
      // The interval is a timer, not a wait for another thread's work.
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.interval);
      if (stopping_) return;
    }
    if (!replicator_->Leads()) continue;
    if (auto r = CheckOnce(); !r.ok()) {
      SPDLOG_WARN("failed to check hash KV (error {})", r.status().ToString());
    }
  }
}

}  // namespace capstan::replication
