#include "replication/replicator.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "mvcc/errors.h"
#include "raftpb/raft.pb.h"
#include "spdlog/spdlog.h"
#include "util/check.h"
#include "util/coding.h"

namespace capstan::replication {
namespace {

using mvcc::Error;
using mvcc::MakeError;
using Done = absl::AnyInvocable<void(absl::Status)>;

// etcd retries a ReadIndex that got no answer this often (readIndexRetryTime).
constexpr absl::Duration kReadIndexRetry = absl::Milliseconds(500);
// The longest a loop pass waits for work inside its call from Go (see
// docs/REPLICATION.md, "The raft loop and Go's scheduler").
constexpr absl::Duration kLongestWait = absl::Milliseconds(5);
// Empty entries proposed at a time when raft's log catches up.
constexpr uint64_t kCatchUpChunk = 4096;
// How often a leader looks whether its cluster has a version yet (etcd's
// monitorVersionInterval).
constexpr absl::Duration kVersionCheckInterval = absl::Seconds(4);

// The entry data of an InternalRaftRequest's ReadIndex context: 8 bytes.
std::string ReadContext(uint64_t seq) {
  std::string out;
  util::AppendBigEndian64(seq, &out);
  return out;
}

// Owns a decoded entry and the response a member that did not propose it
// applies it into.
template <typename Response>
struct Owned {
  std::shared_ptr<etcdserverpb::InternalRaftRequest> request;
  Response response;
};

// A ClientOp over the decoded request, answering into the waiter's response
// when the waiter proposed this kind of write, else into one of its own,
// kept alive by the returned holder.
template <typename Op>
Op MakeOp(const std::shared_ptr<etcdserverpb::InternalRaftRequest>& request,
          const std::remove_pointer_t<decltype(Op::request)>& field, mvcc::WriteOp* waiter_op,
          std::shared_ptr<void>* holder) {
  using Response = std::remove_pointer_t<decltype(Op::response)>;
  Op op;
  op.request = &field;
  if (waiter_op != nullptr) {
    if (auto* w = std::get_if<Op>(waiter_op)) {
      op.response = w->response;
      *holder = request;
      return op;
    }
  }
  auto owned = std::make_shared<Owned<Response>>();
  owned->request = request;
  op.response = &owned->response;
  *holder = owned;
  return op;
}

void LogRaft(int level, std::string_view line) {
  switch (level) {
    case 0: SPDLOG_DEBUG("raft: {}", line); break;
    case 1: SPDLOG_INFO("raft: {}", line); break;
    case 2: SPDLOG_WARN("raft: {}", line); break;
    default: SPDLOG_ERROR("raft: {}", line); break;
  }
}

// Who made an entry's request, as every member applies it: the header's
// user and auth revision, both empty for a request made with no identity
// (while auth was off), which etcd's authApplierV3 checks as such.
mvcc::Caller CallerOf(const etcdserverpb::RequestHeader& header) {
  return mvcc::Caller{header.username(), header.auth_revision()};
}

}  // namespace

uint64_t Replicator::RequestIdOf(const etcdserverpb::InternalRaftRequest& r) {
  return r.header().id() != 0 ? r.header().id() : r.id();
}

Replicator::Replicator(const ReplicatorOptions& options, RaftEngineFactory* factory,
                       std::unique_ptr<RaftLog> log, mvcc::KvStore* store, Transport* transport,
                       EntryDecoder decode_other)
    : options_(options),
      factory_(factory),
      log_(std::move(log)),
      store_(store),
      transport_(transport),
      decode_other_(std::move(decode_other)),
      id_prefix_((options.member_id & 0xffff) << 48),
      id_suffix_((static_cast<uint64_t>(absl::ToUnixMillis(absl::Now())) & ((1ULL << 40) - 1))
                 << 8) {}

std::unique_ptr<Replicator> Replicator::Create(const ReplicatorOptions& options,
                                               RaftEngineFactory* factory,
                                               std::unique_ptr<RaftLog> log, mvcc::KvStore* store,
                                               Transport* transport, EntryDecoder decode_other) {
  std::unique_ptr<Replicator> r(new Replicator(options, factory, std::move(log), store, transport,
                                               std::move(decode_other)));
  r->applied_.store(store->AppliedIndex());
  r->commit_.store(r->log_->hard_state().commit);
  r->replay_through_ = r->log_->hard_state().commit;
  r->term_.store(r->log_->hard_state().term);
  r->read_queue_ = std::make_unique<util::WorkQueue>(1, "raft-reads");
  r->snapshot_queue_ = std::make_unique<util::WorkQueue>(2, "raft-snapshot");
  // The member table as the store holds it. A store that holds data from
  // before the table was kept starts from --initial-cluster; a new one fills
  // it from the bootstrap entries, a joining member from the leader's
  // snapshot or log.
  auto table = membership::MemberTable::Load(store->backend());
  CHECK(table.ok()) << "reading the member table: " << table.status().ToString();
  r->table_ = *std::move(table);
  if (r->table_.empty() && store->AppliedIndex() > 0) {
    for (const auto& m : options.initial_members) r->table_.Put(m);
  }
  r->PublishMembers();
  // raft's configuration at the log's snapshot; else --initial-cluster's
  // (a new log that starts at the store's data records it; a new cluster's
  // bootstrap entries say the same). A joining member learns it from the
  // leader.
  const SnapshotMeta& snap = r->log_->snapshot_meta();
  r->conf_state_ = snap.conf_state;
  if (r->conf_state_.voters.empty() && !options.join_existing) {
    for (const auto& m : options.initial_members) {
      if (m.is_learner) {
        r->conf_state_.learners.push_back(m.id);
      } else {
        r->conf_state_.voters.push_back(m.id);
      }
    }
  }
  r->SetConfState(r->conf_state_);
  r->conf_history_[snap.index] = r->conf_state_;
  r->compacted_at_ = snap.index;
  r->skip_through_ = store->AppliedIndex();
  r->log_first_.store(snap.index + 1);
  if (!options.data_dir.empty()) {
    // Snapshots of a previous run, sent or received, are of no use now.
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(options.data_dir, ec)) {
      const std::string name = e.path().filename().string();
      if (name == "snap.tmp" || name.rfind("snap.send.", 0) == 0 || name.rfind("snap.recv.", 0) == 0) {
        std::filesystem::remove_all(e.path(), ec);
      }
    }
  }
  r->forward_queue_ = std::make_unique<util::WorkQueue>(2, "lease-forward");
  r->hash_queue_ = std::make_unique<util::WorkQueue>(1, "peer-hashkv");
  // From now on every write of the store goes through the log, and the
  // replay of the log notifies Applied.
  store->SetWriteLog(r.get());
  return r;
}

absl::Status Replicator::Run() {
  // The engine is made on the loop thread; Run returns once it exists.
  std::promise<absl::Status> made;
  auto made_future = made.get_future();
  loop_thread_ = std::thread([this, &made] {
    bool started = false;
    factory_->RunSteps([this, &made, &started]() -> bool {
      // The steps run on a thread of the engine's runtime, not always the
      // same one.
      thread_local bool named = false;
      if (!named) {
        pthread_setname_np(pthread_self(), "raft-loop");
        named = true;
      }
      if (started) {
        if (LoopOnce()) return true;
        FinishLoop();
        engine_.reset();
        return false;
      }
      started = true;
      // A store that holds data but has no log yet (a member that ran
      // without Raft, a restored snapshot, data migrated from etcd), or one
      // whose log ends below it (a sole voter's entries live only in the
      // store; a crash after a snapshot install): the log starts with a
      // snapshot at the store's applied index, as etcd's snapshot restore
      // writes its WAL.
      const bool behind = log_->IsNew() ? store_->AppliedIndex() > 0
                                        : store_->AppliedTerm() != 0 &&
                                              store_->AppliedIndex() > log_->LastIndex();
      if (behind) {
        if (absl::Status s = StartLogAtStore(); !s.ok()) {
          made.set_value(s);
          return false;
        }
      }
      if (options_.force_new_cluster && !log_->IsNew()) {
        if (absl::Status s = ForceNewCluster(); !s.ok()) {
          made.set_value(s);
          return false;
        }
      }
      RaftConfig config;
      config.id = options_.member_id;
      if (log_->IsNew() && !options_.join_existing) {
        // etcd's StartNode peers: each entry carries its member's JSON.
        for (const auto& m : options_.initial_members) {
          if (m.is_learner) continue;
          config.bootstrap_voters.push_back(m.id);
          config.bootstrap_contexts.push_back(membership::MemberJson(m));
        }
      }
      config.election_tick = options_.election_ticks;
      config.heartbeat_tick = 1;
      config.pre_vote = options_.pre_vote;
      config.check_quorum = true;
      // Raft hands back every committed entry after the log's snapshot, as
      // etcd replays its WAL: configuration changes are applied to raft
      // again (it learns its voters from them), while the entries the store
      // already holds are not applied to it again (skip_through_). The
      // store may even be ahead of the log's commit index (a crash before
      // the log took a snapshot the store installed).
      config.applied = log_->snapshot_meta().index;
      // etcd sends up to 1 MiB of entries per append. A follower that probes
      // (after a restart, a rejection) gets a whole window again for each
      // heartbeat it answers, and ReadIndex rounds send a heartbeat each:
      // every window crosses into the engine and is marshaled on this loop,
      // so a smaller one keeps a catching-up follower from stalling the
      // leader. A larger single entry still goes alone.
      config.max_size_per_msg = 256 << 10;
      config.max_inflight_msgs = 512;
      config.storage = &storage_;
      config.log = LogRaft;
      auto engine = factory_->NewEngine(config);
      if (!engine.ok()) {
        made.set_value(engine.status());
        return false;
      }
      engine_ = std::move(*engine);
      made.set_value(absl::OkStatus());
      // The log's replay and a sole voter's campaign need no tick.
      DrainReady();
      next_tick_ = absl::Now() + options_.tick;
      return true;
    });
  });
  absl::Status s = made_future.get();
  if (!s.ok()) Stop();
  return s;
}

absl::Status Replicator::AwaitReplay() { return AwaitApplied(replay_through_); }

absl::Status Replicator::AwaitApplied(uint64_t index) {
  if (AppliedIndex() >= index) return absl::OkStatus();
  std::promise<absl::Status> applied;
  auto future = applied.get_future();
  WhenApplied(index, [&applied](absl::Status s) { applied.set_value(std::move(s)); });
  return future.get();
}

void Replicator::WhenApplied(uint64_t index, Done done) {
  if (AppliedIndex() >= index) {
    done(absl::OkStatus());
    return;
  }
  std::vector<Done> one;
  one.push_back(std::move(done));
  ReleaseReads(index, std::move(one));
}

Replicator::~Replicator() {
  Stop();
  forward_queue_.reset();
  hash_queue_.reset();
  {
    // A forwarded keep-alive's caller may be answered up to a request timeout
    // later (when the transport stops, at once).
    ForwardedRenewals* renewals = forwarded_renewals_.get();
    util::MutexLock l(&renewals->mu);
    renewals->mu.Await(absl::Condition(renewals, &ForwardedRenewals::None));
  }
  read_queue_.reset();
}

void Replicator::Stop() {
  if (stopped_) return;
  stopped_ = true;
  {
    util::MutexLock l(&inbox_mu_);
    stopping_ = true;
  }
  if (loop_thread_.joinable()) loop_thread_.join();
  // Flushes and snapshot streams under way use the store and the
  // transport: they end before Stop returns.
  snapshot_queue_.reset();
  // The loop answered what it held; what arrived after it stopped:
  Inbox left;
  {
    util::MutexLock l(&inbox_mu_);
    std::swap(left, inbox_);
  }
  for (auto& p : left.writes) p.w.done(MakeError(Error::kStopped));
  for (auto& r : left.reads) r(MakeError(Error::kStopped));
  for (auto& t : left.transfers) t.done(MakeError(Error::kStopped));
  for (auto& c : left.conf_changes) c.done(MakeError(Error::kStopped));
  for (auto& r : left.renewal_retries) r.done(MakeError(Error::kStopped));
  std::multimap<uint64_t, Done> reads;
  {
    util::MutexLock l(&reads_mu_);
    std::swap(reads, apply_waiters_);
  }
  for (auto& [index, r] : reads) r(MakeError(Error::kStopped));
}

TransportHandler Replicator::handler() {
  TransportHandler h;
  h.on_message = [this](uint64_t, std::string message) {
    util::MutexLock l(&inbox_mu_);
    inbox_.messages.push_back(std::move(message));
  };
  h.on_unreachable = [this](uint64_t to) {
    util::MutexLock l(&inbox_mu_);
    inbox_.unreachable.push_back(to);
  };
  if (!options_.data_dir.empty()) {
    h.snapshot_dir = (std::filesystem::path(options_.data_dir) / "snap.tmp").string();
    h.on_snapshot = [this, tmp = h.snapshot_dir](uint64_t from, std::string message) -> absl::Status {
      const std::string dir = (std::filesystem::path(options_.data_dir) /
                               absl::StrCat("snap.recv.", received_snapshots_.fetch_add(1) + 1))
                                  .string();
      std::error_code ec;
      std::filesystem::rename(tmp, dir, ec);
      if (ec) return absl::InternalError(absl::StrCat("taking the snapshot: ", ec.message()));
      {
        util::MutexLock l(&inbox_mu_);
        if (!stopping_) {
          inbox_.snapshots.emplace_back(std::move(message), dir);
          return absl::OkStatus();
        }
      }
      std::filesystem::remove_all(dir, ec);
      return MakeError(Error::kStopped);
    };
  }
  h.on_lease_renew = [this](const etcdserverpb::LeaseKeepAliveRequest& request,
                            etcdserverpb::LeaseKeepAliveResponse* response,
                            absl::AnyInvocable<void(absl::Status)> done) {
    if (!Leads()) {
      done(MakeError(Error::kNoLeader));
      return;
    }
    const int64_t id = request.id();
    RenewAsLeader(id, [id, response, done = std::move(done)](absl::StatusOr<int64_t> ttl) mutable {
      if (!ttl.ok()) {
        done(ttl.status());
        return;
      }
      response->set_id(id);
      response->set_ttl(*ttl);
      done(absl::OkStatus());
    });
  };
  h.on_members = [this] { return Members(); };
  h.on_member_promote = [this](uint64_t id, MembersDone done) {
    membership::MemberChange change;
    change.type = membership::ChangeType::kAddNode;
    change.is_promote = true;
    change.id = id;
    change.member.id = id;
    ChangeMembership(change, absl::Now() + options_.request_timeout, std::move(done));
  };
  h.on_hash_kv = [this](const etcdserverpb::HashKVRequest& request,
                         etcdserverpb::HashKVResponse* response,
                         absl::AnyInvocable<void(absl::Status)> done) {
    // etcd's hashKVHandler: the hash at the revision asked, the header's
    // revision the store's current one. Off the transport's threads: the
    // hash reads every revision.
    auto answer = std::make_shared<absl::AnyInvocable<void(absl::Status)>>(std::move(done));
    hash_queue_->RunOrCancel([this, rev = request.revision(), response, answer](bool run) {
      if (!run) {
        (*answer)(MakeError(Error::kStopped));
        return;
      }
      uint32_t hash = 0;
      int64_t compact_rev = 0, hash_rev = 0;
      absl::Status s = store_->HashKV(rev, &hash, &compact_rev, &hash_rev);
      if (s.ok()) {
        response->mutable_header()->set_cluster_id(options_.cluster_id);
        response->mutable_header()->set_member_id(options_.member_id);
        response->mutable_header()->set_revision(store_->Rev());
        response->set_hash(hash);
        response->set_compact_revision(compact_rev);
        response->set_hash_revision(hash_rev);
      }
      (*answer)(s);
    });
  };
  h.on_lease_time_to_live = [this](const etcdserverpb::LeaseTimeToLiveRequest& request,
                                   etcdserverpb::LeaseTimeToLiveResponse* response) -> absl::Status {
    if (!Leads()) return MakeError(Error::kNoLeader);
    auto info = store_->lessor()->Get(request.id(), request.keys());
    if (!info) return MakeError(Error::kLeaseNotFound);
    response->set_id(info->id);
    response->set_ttl(info->remaining_ttl);
    response->set_grantedttl(info->granted_ttl);
    for (auto& k : info->keys) response->add_keys(std::move(k));
    return absl::OkStatus();
  };
  return h;
}

bool Replicator::Leads() const { return leader_.load(std::memory_order_acquire); }

void Replicator::TransferLeadership(uint64_t to, absl::Time deadline, Done done) {
  const absl::Time now = absl::Now();
  // etcd bounds a transfer by its request timeout whatever the caller's
  // deadline, so none stays queued after its caller went away.
  deadline = std::min(deadline, now + options_.request_timeout);
  {
    util::MutexLock l(&inbox_mu_);
    if (!stopping_) {
      inbox_.transfers.push_back({to, deadline, now, std::move(done)});
      return;
    }
  }
  done(MakeError(Error::kStopped));
}

void Replicator::Submit(mvcc::WriteRequest w) {
  if (CommittedIndex() > AppliedIndex() + options_.max_apply_lag) {
    w.done(MakeError(Error::kTooManyRequests));
    return;
  }
  {
    util::MutexLock l(&inbox_mu_);
    if (!stopping_) {
      inbox_.writes.push_back({std::move(w), absl::Now() + options_.request_timeout});
      return;
    }
  }
  w.done(MakeError(Error::kStopped));
}

void Replicator::ReadBarrier(Done ready) {
  if (sole_voter_.load(std::memory_order_acquire) && Leads()) {
    // The only voter leads: nothing can be committed without it, and every
    // acknowledged write is committed at or below commit_ (stored before
    // any entry under it is applied). So the read index is commit_, as
    // raft's ReadIndex would answer for a single voter, without the trip
    // through the raft loop.
    WhenApplied(CommittedIndex(), std::move(ready));
    return;
  }
  {
    util::MutexLock l(&inbox_mu_);
    if (!stopping_) {
      inbox_.reads.push_back(std::move(ready));
      return;
    }
  }
  ready(MakeError(Error::kStopped));
}

void Replicator::DrainReady() {
  for (bool campaigned = false;;) {
    while (engine_->HasReady()) {
      HandleReady(engine_->GetReady());
      engine_->Advance();
    }
    // A sole voter need not wait an election timeout for votes it cannot
    // get (etcd fast-forwards its ticks likewise): it campaigns once its
    // configuration is applied, and leads at once.
    if (campaigned || !sole_voter_.load(std::memory_order_relaxed) ||
        role_ != RaftRole::kFollower || !engine_->Campaign().ok()) {
      return;
    }
    campaigned = true;
  }
}

bool Replicator::LoopOnce() {
  Inbox in;
  {
    util::MutexLock l(&inbox_mu_);
    read_round_open_ = read_in_flight_.has_value();
    inbox_mu_.AwaitWithTimeout(absl::Condition(this, &Replicator::InboxReadyLocked),
                               std::min(next_tick_ - absl::Now(), kLongestWait));
    if (stopping_) return false;
    std::swap(in, inbox_);
  }
  if (direct_ && (!in.messages.empty() || !in.snapshots.empty() ||
                  store_->AppliedIndex() >= handed_through_ + options_.direct_catch_up)) {
    EndDirectWrites();
  }
  for (auto& m : in.messages) {
    if (absl::Status s = engine_->Step(m); !s.ok()) {
      SPDLOG_DEBUG("raft: a peer's message was refused: {}", s.ToString());
    }
  }
  for (auto& [message, dir] : in.snapshots) {
    std::error_code ec;
    if (!incoming_snapshot_dir_.empty()) std::filesystem::remove_all(incoming_snapshot_dir_, ec);
    incoming_snapshot_dir_ = std::move(dir);
    if (absl::Status s = engine_->Step(message); !s.ok()) {
      SPDLOG_WARN("raft: a snapshot from a peer was refused: {}", s.ToString());
    }
  }
  for (uint64_t id : in.unreachable) engine_->ReportUnreachable(id);
  for (auto [id, failed] : in.snapshot_reports) {
    snapshots_out_.erase(id);
    engine_->ReportSnapshot(id, failed);
  }
  if (in.flushed) CompactAfterFlush(std::move(*in.flushed));
  for (auto& t : in.transfers) StartLeaderTransfer(std::move(t));
  const absl::Time now = absl::Now();
  FinishLeaderTransfers(now);
  if (now >= next_tick_) {
    engine_->Tick();
    next_tick_ += options_.tick;
    // A loop that fell far behind (a stalled disk) does not tick in a
    // burst: that would start an election at once.
    if (next_tick_ < now) next_tick_ = now + options_.tick;
  }
  if (now >= next_version_check_) {
    next_version_check_ = now + kVersionCheckInterval;
    version_due_ = true;
  }
  for (auto& c : in.conf_changes) pending_conf_.push_back(std::move(c));
  for (auto& r : in.renewal_retries) renewal_retries_.push_back(std::move(r));
  for (auto& w : in.writes) pending_.push_back(std::move(w));
  for (auto& r : in.reads) pending_reads_.push_back(std::move(r));
  Propose();
  ProposeConfChanges(now);
  ProposeConfAgain(now);
  SendReadIndex(now);
  ExpireWaiters(now);
  DrainReady();
  RetryRenewals(now);
  if (!read_in_flight_ && !pending_reads_.empty()) {
    // A round ended in this pass: the reads that waited for it go at once.
    SendReadIndex(now);
    DrainReady();
  }
  proposals_pending_.store(static_cast<int64_t>(waiters_.size()), std::memory_order_relaxed);
  if (!incoming_snapshot_dir_.empty()) {
    // Raft did not take the snapshot (an older one than it has).
    std::error_code ec;
    std::filesystem::remove_all(incoming_snapshot_dir_, ec);
    incoming_snapshot_dir_.clear();
  }
  MaybeCompact();
  MaybeStartDirectWrites();
  return true;
}

void Replicator::FinishLoop() {
  // Later writes come here, to be refused; raft's log need not catch up
  // with the direct writes (a restart starts it at the store).
  if (direct_) {
    direct_ = false;
    store_->StopDirectWrites();
  }
  // Stopping: answer everything still held.
  for (auto& p : pending_) p.w.done(MakeError(Error::kStopped));
  pending_.clear();
  for (auto& [id, w] : waiters_) w.done(MakeError(Error::kStopped));
  waiters_.clear();
  for (auto& r : pending_reads_) r(MakeError(Error::kStopped));
  pending_reads_.clear();
  if (read_in_flight_) {
    for (auto& r : read_in_flight_->waiters) r(MakeError(Error::kStopped));
    read_in_flight_.reset();
  }
  for (auto& t : transfers_) t.done(MakeError(Error::kStopped));
  transfers_.clear();
  for (auto& c : pending_conf_) c.done(MakeError(Error::kStopped));
  pending_conf_.clear();
  for (auto& [id, w] : conf_waiters_) w.done(MakeError(Error::kStopped));
  conf_waiters_.clear();
  for (auto& r : renewal_retries_) r.done(MakeError(Error::kStopped));
  renewal_retries_.clear();
}

Replicator::PendingWrite Replicator::MembershipProposal(
    std::shared_ptr<etcdserverpb::InternalRaftRequest> request, std::string what) const {
  mvcc::WriteRequest w;
  // Applied as the entry it is (ApplyCommitted), not as this op.
  w.op = mvcc::CustomOp{[](storage::WriteBatch*) { return absl::OkStatus(); }};
  w.raft_request = std::move(request);
  w.done = [what = std::move(what)](absl::Status s) {
    if (!s.ok()) SPDLOG_WARN("{} failed: {}", what, s.ToString());
  };
  return {std::move(w), absl::Now() + options_.request_timeout};
}

void Replicator::Propose() {
  if (!published_ && Leader() != 0) {
    // etcd's publishV3: this member's name and client URLs, through the log.
    auto attrs = std::make_shared<etcdserverpb::InternalRaftRequest>();
    auto* set = attrs->mutable_cluster_member_attr_set();
    set->set_member_id(options_.member_id);
    set->mutable_member_attributes()->set_name(options_.name);
    for (const auto& u : options_.client_urls) set->mutable_member_attributes()->add_client_urls(u);
    pending_.push_front(MembershipProposal(std::move(attrs), "publishing this member's attributes"));
    published_ = true;
  }
  if (version_due_) {
    version_due_ = false;
    const absl::Time now = absl::Now();
    if (Leads() && table_.cluster_version().empty() && !options_.cluster_version.empty() &&
        (version_term_ != Term() || now >= version_proposed_ + options_.request_timeout)) {
      // etcd's monitorClusterVersions: a leader whose cluster has no version
      // yet decides one once an entry of its term is committed, and looks
      // again every few seconds (a proposal can be dropped or time out).
      if (version_proposals_lost_ < options_.failpoint_lose_version_proposals) {
        ++version_proposals_lost_;
      } else {
        auto set = std::make_shared<etcdserverpb::InternalRaftRequest>();
        set->mutable_cluster_version_set()->set_ver(options_.cluster_version);
        pending_.push_back(MembershipProposal(std::move(set), "setting the cluster version"));
      }
      version_proposed_ = now;
      version_term_ = Term();
    }
  }
  if (pending_.empty() || Leader() == 0) return;
  EndDirectWrites();
  std::vector<std::string> entries;
  std::vector<uint64_t> ids;
  std::vector<PendingWrite> proposed;
  int64_t bytes = 0;
  while (!pending_.empty()) {
    PendingWrite& p = pending_.front();
    if (p.w.leader_term != 0 && (!Leads() || Term() != p.w.leader_term)) {
      // Decided by the leader of a term that is over (mvcc::WriteRequest::
      // leader_term): raft would forward it to the new leader.
      p.w.done(MakeError(Error::kNotLeader));
      pending_.pop_front();
      proposals_failed_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    etcdserverpb::InternalRaftRequest r;
    if (!mvcc::ToInternalRaftRequest(p.w.op, &r)) {
      if (p.w.raft_request == nullptr) {
        // Only what the log can carry may be replicated.
        p.w.done(absl::InternalError("a write that cannot be replicated was submitted"));
        pending_.pop_front();
        continue;
      }
      r = *p.w.raft_request;
    }
    const uint64_t id = NextRequestId();
    r.mutable_header()->set_id(id);
    r.set_id(id);
    if (p.w.caller) {
      // etcd's processInternalRaftRequestOnce: who made the request, which
      // every member's apply re-checks (mvcc::WriteGuard).
      r.mutable_header()->set_username(p.w.caller->user);
      r.mutable_header()->set_auth_revision(p.w.caller->auth_revision);
    }
    // This member applies its own write with the caller its entry names,
    // as every other member decodes it (CallerOf), so that all decide alike.
    p.w.caller = CallerOf(r.header());
    if (r.has_lease_grant() && r.lease_grant().id() == 0) {
      // etcd picks a new lease's id where the request arrives, before
      // proposing it, so every member grants the same one.
      r.mutable_lease_grant()->set_id(static_cast<int64_t>(NextRequestId() & ((1ULL << 63) - 1)));
    }
    std::string data = r.SerializeAsString();
    if (!entries.empty() && bytes + static_cast<int64_t>(data.size()) > options_.max_proposal_bytes) {
      break;
    }
    bytes += static_cast<int64_t>(data.size());
    entries.push_back(std::move(data));
    ids.push_back(id);
    proposed.push_back(std::move(p));
    pending_.pop_front();
  }
  if (entries.empty()) return;
  std::vector<std::string_view> views(entries.begin(), entries.end());
  if (absl::Status s = engine_->Propose(views); !s.ok()) {
    // Dropped (no leader after all, a transfer): retried until the deadline.
    for (auto it = proposed.rbegin(); it != proposed.rend(); ++it) pending_.push_front(std::move(*it));
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    waiters_.emplace(ids[i], Waiter{std::move(proposed[i].w.op), std::move(proposed[i].w.done),
                                    proposed[i].deadline});
  }
  if (options_.failpoint_answer_before_commit) {
    // A deliberately broken member (tests only): it applies and answers its
    // own writes as soon as they are proposed, before any quorum has them,
    // and skips them when they commit. The history checker must catch it.
    for (size_t i = 0; i < ids.size(); ++i) {
      auto request = std::make_shared<etcdserverpb::InternalRaftRequest>();
      CHECK(request->ParseFromString(entries[i]));
      store_->SubmitCommitted(DecodeEntry(std::move(request)));
      applied_early_.insert(ids[i]);
    }
  }
}

void Replicator::SendReadIndex(absl::Time now) {
  if (read_in_flight_) {
    if (now >= read_in_flight_->deadline) {
      SPDLOG_WARN("timed out waiting for read index response (local node might have slow network) "
                  "(timeout {})",
                  absl::FormatDuration(options_.request_timeout));
      for (auto& r : read_in_flight_->waiters) r(MakeError(Error::kTimeout));
      read_in_flight_.reset();
      slow_read_indexes_.fetch_add(1, std::memory_order_relaxed);
    } else if (now - read_in_flight_->sent >= kReadIndexRetry && Leader() != 0) {
      engine_->ReadIndex(ReadContext(read_in_flight_->context));
      read_in_flight_->sent = now;
    }
  }
  if (read_in_flight_ || pending_reads_.empty()) return;
  ReadBatch batch;
  // Unique in the cluster, as etcd draws it from its request ids: raft keeps
  // one pending read per context, so two members sending the same one would
  // leave one of them waiting for its retry.
  batch.context = NextRequestId();
  batch.waiters = std::move(pending_reads_);
  pending_reads_.clear();
  batch.sent = now;
  batch.first_sent = std::chrono::steady_clock::now();
  batch.deadline = now + options_.request_timeout;
  read_in_flight_ = std::move(batch);
  engine_->ReadIndex(ReadContext(read_in_flight_->context));
}

void Replicator::ExpireWaiters(absl::Time now) {
  while (!pending_.empty() && pending_.front().deadline <= now) {
    // Never proposed: etcd's Propose blocks until a leader is known, and
    // the request's deadline ends it with the context's own error.
    pending_.front().w.done(MakeError(Leader() == 0 ? Error::kProposalDeadline : Error::kTimeout));
    pending_.pop_front();
    proposals_failed_.fetch_add(1, std::memory_order_relaxed);
  }
  // Proposed writes wait seconds: a walk over them once per tick answers
  // each within a tick of its deadline, rather than a walk per pass.
  if (now < next_waiter_walk_) return;
  next_waiter_walk_ = now + options_.tick;
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (it->second.deadline <= now) {
      it->second.done(MakeError(Error::kTimeout));
      waiters_.erase(it++);
      proposals_failed_.fetch_add(1, std::memory_order_relaxed);
    } else {
      ++it;
    }
  }
  for (auto it = conf_waiters_.begin(); it != conf_waiters_.end();) {
    if (it->second.deadline <= now) {
      it->second.done(MakeError(Error::kTimeout));
      conf_waiters_.erase(it++);
    } else {
      ++it;
    }
  }
}

void Replicator::ObserveHeartbeats(const std::vector<RaftMessage>& messages, absl::Time now) {
  // etcd's raft loop: a heartbeat to a peer more than two heartbeat
  // intervals after the last one means the loop was held up.
  const absl::Duration max = 2 * options_.tick;
  for (const RaftMessage& m : messages) {
    if (m.type != static_cast<uint32_t>(MessageType::kHeartbeat)) continue;
    auto [it, first] = heartbeat_sent_.emplace(m.to, now);
    if (!first) {
      const absl::Duration exceeded = now - it->second - max;
      if (exceeded > absl::ZeroDuration()) {
        heartbeat_send_failures_.fetch_add(1, std::memory_order_relaxed);
        SPDLOG_WARN(
            "leader failed to send out heartbeat on time; took too long, leader is overloaded "
            "likely from slow disk (to {:x}, heartbeat-interval {}, expected-duration {}, "
            "exceeded-duration {})",
            m.to, absl::FormatDuration(options_.tick), absl::FormatDuration(max),
            absl::FormatDuration(exceeded));
      }
      it->second = now;
    }
  }
}

void Replicator::HandleReady(Ready rd) {
  if (rd.soft_state) {
    const uint64_t old_lead = lead_.load(std::memory_order_relaxed);
    lead_.store(rd.soft_state->lead, std::memory_order_release);
    if (rd.soft_state->lead != 0 && rd.soft_state->lead != old_lead) {
      leader_changes_.fetch_add(1, std::memory_order_relaxed);
    }
    if (rd.soft_state->lead != 0 && rd.soft_state->lead != old_lead && read_in_flight_) {
      // etcd's linearizable read loop: a new leader fails the read index in
      // flight with a retryable error rather than waiting for its retry.
      for (auto& r : read_in_flight_->waiters) r(MakeError(Error::kLeaderChanged));
      read_in_flight_.reset();
      read_indexes_failed_.fetch_add(1, std::memory_order_relaxed);
    }
    const bool was_leader = role_ == RaftRole::kLeader;
    role_ = rd.soft_state->role;
    const bool leads = role_ == RaftRole::kLeader;
    if (leads && !was_leader) {
      // raft's becomeLeader: no change until the member applied its log
      // (this Ready holds the new term's first entry).
      conf_pending_index_ = rd.entries.empty() ? log_->LastIndex() : rd.entries.back().index;
      heartbeat_sent_.clear();  // etcd resets its timeout detector
      // etcd's Lessor.Promote: the followers never saw the old leader's
      // keep-alives, so every lease gets its TTL again (plus an election).
      store_->lessor()->Promote(std::chrono::milliseconds(
          absl::ToInt64Milliseconds(ElectionTimeout())));
    }
    leader_.store(leads, std::memory_order_release);
  }
  // The leader sends before its own write (etcd does: its entries count for
  // the quorum only once this Ready is durable, since committed entries
  // reach apply in a later Ready); a follower's answers wait for it.
  const bool leads = role_ == RaftRole::kLeader;
  // A MsgSnap goes with the store's data, on the snapshot sender.
  for (auto it = rd.messages.begin(); it != rd.messages.end();) {
    if (it->type == static_cast<uint32_t>(MessageType::kSnapshot)) {
      SendSnapshot(std::move(*it));
      it = rd.messages.erase(it);
    } else {
      ++it;
    }
  }
  if (leads) ObserveHeartbeats(rd.messages, absl::Now());
  if (leads && !rd.messages.empty()) transport_->Send(std::move(rd.messages));
  // A snapshot replaces the store first: were the member to crash before
  // the log takes it, the store is ahead of the log, which restarting
  // handles (the entries it holds are skipped); the other order would leave
  // a store behind a log that no longer holds the entries it lacks.
  if (rd.snapshot) InstallSnapshot(*rd.snapshot);
  const bool hold = StoreCanHold(rd) && (store_holds_ || !rd.entries.empty());
  // etcd's raft loop hands a Ready's committed entries to its applier
  // before it writes the Ready's own entries, so that applying (and
  // answering) overlaps the log's sync: raft's contract allows it. Entries
  // that an earlier Ready wrote are durable here, and committed means
  // durable on a quorum; those this Ready writes (a follower learns of an
  // entry and of its commit in one message) wait for the write, so that
  // the store never holds an entry the log could lose. A sole voter
  // commits what it writes in the same Ready, and a store that holds the
  // log applies in order with it: both keep the order.
  size_t applied_early = 0;
  if (!hold && !store_holds_ && !rd.snapshot && !sole_voter_.load(std::memory_order_relaxed)) {
    const uint64_t written = rd.entries.empty() ? UINT64_MAX : rd.entries.front().index;
    while (applied_early < rd.committed.size() && rd.committed[applied_early].index < written) {
      ++applied_early;
    }
    if (applied_early > 0 && rd.hard_state) {
      // As etcd updates its committed index before it applies.
      RaiseCommit(rd.hard_state->commit);
    }
    for (size_t i = 0; i < applied_early; ++i) ApplyCommitted(rd.committed[i]);
  }
  if (hold) {
    if (!store_holds_) StartHoldingInStore();
  } else if (rd.hard_state || !rd.entries.empty() || rd.snapshot) {
    if (store_holds_) StopHoldingInStore();
    const absl::Time started = absl::Now();
    absl::Status s = log_->Save(rd.hard_state, rd.entries, rd.snapshot, rd.must_sync);
    if (rd.must_sync && log_->options().sync) {
      log_sync_latency_.Record(absl::ToDoubleSeconds(absl::Now() - started));
    }
    // A log that cannot be written loses the member's promises: stop, as
    // etcd's WAL does.
    CHECK(s.ok()) << "the raft log write failed: " << s.ToString();
  }
  if (rd.hard_state) {
    term_.store(rd.hard_state->term, std::memory_order_release);
    RaiseCommit(rd.hard_state->commit);
  }
  if (rd.snapshot) log_first_.store(log_->snapshot_meta().index + 1, std::memory_order_release);
  NoteConfEntries(rd.entries);
  if (!leads && !rd.messages.empty()) transport_->Send(std::move(rd.messages));
  for (const ReadState& rs : rd.read_states) {
    if (!read_in_flight_ || rs.context != ReadContext(read_in_flight_->context)) {
      // The answer to a round given up on (timed out, or failed by a leader
      // change): etcd counts it as a slow read index.
      slow_read_indexes_.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    if (leads) SetLeadershipConfirmation({read_in_flight_->first_sent, Term()});
    ReleaseReads(rs.index, std::move(read_in_flight_->waiters));
    read_in_flight_.reset();
  }
  for (size_t i = applied_early; i < rd.committed.size(); ++i) ApplyCommitted(rd.committed[i]);
  if (hold && !rd.entries.empty()) {
    log_->HoldInStore(rd.entries.back().index, rd.entries.back().term, conf_state_);
    log_first_.store(rd.entries.back().index + 1, std::memory_order_release);
  }
}

bool Replicator::StoreCanHold(const Ready& rd) const {
  // A learner needs the entries from the log, as a second voter does.
  if (!sole_voter_.load(std::memory_order_relaxed) || !conf_state_.learners.empty() ||
      role_ != RaftRole::kLeader || rd.snapshot || options_.failpoint_answer_before_commit) {
    return false;
  }
  if (rd.hard_state) {
    const HardState logged = log_->hard_state();
    if (rd.hard_state->term != logged.term || rd.hard_state->vote != logged.vote) return false;
  }
  if (rd.entries.empty()) return true;
  // Every entry is committed in this very Ready.
  return !rd.committed.empty() && rd.committed.back().index >= rd.entries.back().index &&
         rd.committed.front().index <= rd.entries.front().index;
}

void Replicator::StartHoldingInStore() {
  // What the store applied without its WAL must be flushed before its WAL
  // holds anything: a crash would otherwise replay the WAL's groups over a
  // flushed state that lacks the ones between.
  absl::Status s = AwaitApplied(handed_through_);
  if (s.ok()) s = store_->backend()->Flush();
  CHECK(s.ok()) << "flushing the store before it holds the log's entries failed: " << s.ToString();
  store_->SetSelfDurable(true);
  store_holds_ = true;
  SPDLOG_INFO("raft: the only voter; its store makes each write durable, its log keeps none");
}

void Replicator::MaybeStartDirectWrites() {
  if (!options_.direct_writes || direct_ || !store_holds_ || role_ != RaftRole::kLeader ||
      !sole_voter_.load(std::memory_order_relaxed) || !conf_state_.learners.empty() ||
      !published_ || !pending_.empty() || !waiters_.empty() || !pending_conf_.empty() ||
      !conf_waiters_.empty() || !transfers_.empty() || engine_->HasReady() ||
      handed_through_ != commit_.load(std::memory_order_relaxed) ||
      (table_.cluster_version().empty() && !options_.cluster_version.empty())) {
    return;
  }
  direct_ = true;
  store_->StartDirectWrites();
}

void Replicator::EndDirectWrites() {
  if (!direct_) return;
  direct_ = false;
  const uint64_t through = store_->StopDirectWrites();
  // The store applied the direct writes at the indexes after the log's
  // last entry: empty entries take those indexes in raft's log, committed
  // at once (the only voter) and held by the store, which has them.
  skip_through_ = std::max(skip_through_, through);
  std::vector<std::string_view> empty;
  while (handed_through_ < through) {
    empty.assign(std::min(through - handed_through_, kCatchUpChunk), std::string_view());
    const uint64_t before = handed_through_;
    CHECK(engine_->Propose(empty).ok()) << "raft refused its only voter's entries";
    DrainReady();
    CHECK(handed_through_ > before) << "raft did not commit its only voter's entries";
  }
}

void Replicator::StopHoldingInStore() {
  // The log's next write records the held entries as its snapshot: they
  // must be durable in the store first.
  absl::Status s = AwaitApplied(log_->snapshot_meta().index);
  CHECK(s.ok()) << "waiting for the store to apply the entries it holds failed: " << s.ToString();
  store_->SetSelfDurable(false);
  store_holds_ = false;
  SPDLOG_INFO("raft: entries go to the log again (from index {})", log_->snapshot_meta().index + 1);
}

void Replicator::ApplyCommitted(const RaftEntry& entry) {
  handed_through_ = std::max(handed_through_, entry.index);
  auto noop = [&entry, this] {
    mvcc::WriteRequest w;
    w.op = mvcc::InternalOp{[] {}};
    w.raft_index = entry.index;
    w.raft_term = entry.term;
    w.done = [](absl::Status) {};
    store_->SubmitCommitted(std::move(w));
  };
  if (entry.type == EntryType::kConfChange) {
    ApplyConfEntry(entry);
    return;
  }
  if (entry.type != EntryType::kNormal) {  // ConfChangeV2: Capstan proposes none
    RecordConfState(entry.index, engine_->ApplyConfChange(entry.type, entry.data));
    if (entry.index > skip_through_) noop();
    return;
  }
  if (entry.data.empty()) {  // a new leader's entry
    if (entry.index > skip_through_) noop();
    if (entry.term == Term() && Leads()) version_due_ = true;
    return;
  }
  auto request = std::make_shared<etcdserverpb::InternalRaftRequest>();
  CHECK(request->ParseFromString(entry.data))
      << "the raft log entry at index " << entry.index << " is not an InternalRaftRequest";
  if (request->has_cluster_member_attr_set() && entry.index > skip_through_) {
    ApplyAttributes(entry, std::move(request));
    return;
  }
  if (request->has_cluster_version_set() && entry.index > skip_through_) {
    ApplyClusterVersion(entry, std::move(request));
    return;
  }
  if (entry.index <= skip_through_) {
    // The store holds it already (an installed snapshot covered it). A
    // write this member proposed is in the store, but its response cannot
    // be rebuilt: it is answered "request timed out" now, the outcome a
    // client must already treat as unknown, rather than at its deadline.
    const uint64_t id = RequestIdOf(*request);
    if (auto it = waiters_.find(id); it != waiters_.end()) {
      Done done = std::move(it->second.done);
      waiters_.erase(it);
      done(MakeError(Error::kTimeout));
    }
    return;
  }
  if (!applied_early_.empty() && applied_early_.erase(request->header().id()) > 0) {
    noop();  // the failpoint applied it at proposal
    return;
  }
  mvcc::Caller caller = CallerOf(request->header());
  mvcc::WriteRequest w = DecodeEntry(std::move(request));
  w.raft_index = entry.index;
  w.raft_term = entry.term;
  w.caller = std::move(caller);
  store_->SubmitCommitted(std::move(w));
}

mvcc::WriteRequest Replicator::DecodeEntry(std::shared_ptr<etcdserverpb::InternalRaftRequest> request) {
  const uint64_t id = RequestIdOf(*request);
  std::optional<Waiter> waiter;
  if (auto it = waiters_.find(id); it != waiters_.end()) {
    waiter = std::move(it->second);
    waiters_.erase(it);
  }
  mvcc::WriteOp* waiter_op = waiter ? &waiter->op : nullptr;
  Done done = waiter ? std::move(waiter->done) : Done([](absl::Status) {});
  std::shared_ptr<void> holder;
  mvcc::WriteRequest w;
  const etcdserverpb::InternalRaftRequest& r = *request;
  if (r.has_put()) {
    w.op = MakeOp<mvcc::PutOp>(request, r.put(), waiter_op, &holder);
  } else if (r.has_delete_range()) {
    w.op = MakeOp<mvcc::DeleteRangeOp>(request, r.delete_range(), waiter_op, &holder);
  } else if (r.has_txn()) {
    w.op = MakeOp<mvcc::TxnOp>(request, r.txn(), waiter_op, &holder);
  } else if (r.has_compaction()) {
    w.op = MakeOp<mvcc::CompactOp>(request, r.compaction(), waiter_op, &holder);
  } else if (r.has_lease_grant()) {
    w.op = MakeOp<mvcc::LeaseGrantOp>(request, r.lease_grant(), waiter_op, &holder);
  } else if (r.has_lease_revoke()) {
    w.op = MakeOp<mvcc::LeaseRevokeOp>(request, r.lease_revoke(), waiter_op, &holder);
  } else if (r.has_alarm()) {
    w.op = MakeOp<mvcc::AlarmOp>(request, r.alarm(), waiter_op, &holder);
  } else {
    // Not a client write: its owner rebuilds it (auth), or it changes
    // nothing the store keeps (a member's attributes).
    if (decode_other_) {
      std::optional<mvcc::WriteRequest> other = decode_other_(request, &done);
      if (other) return std::move(*other);
    }
    w.op = mvcc::CustomOp{[](storage::WriteBatch*) { return absl::OkStatus(); }};
    w.done = std::move(done);
    return w;
  }
  w.done = [holder = std::move(holder), done = std::move(done)](absl::Status s) mutable {
    done(std::move(s));
  };
  w.unawaited = !waiter.has_value();
  return w;
}

void Replicator::RaiseCommit(uint64_t index) {
  for (uint64_t c = commit_.load(std::memory_order_acquire);
       c < index && !commit_.compare_exchange_weak(c, index, std::memory_order_acq_rel);) {
  }
}

void Replicator::Applied(uint64_t applied) {
  // What is applied is committed: a sole voter's direct writes reach the
  // commit index only this way (and raft's, while its log catches up with
  // them, is behind it).
  RaiseCommit(applied);
  applied_.store(applied, std::memory_order_release);
  std::vector<Done> ready;
  {
    util::MutexLock l(&reads_mu_);
    auto end = apply_waiters_.upper_bound(applied);
    for (auto it = apply_waiters_.begin(); it != end; ++it) ready.push_back(std::move(it->second));
    apply_waiters_.erase(apply_waiters_.begin(), end);
  }
  if (ready.empty()) return;
  RunReads(std::move(ready));
}

void Replicator::RunReads(std::vector<Done> ready) {
  auto batch = std::make_shared<std::vector<Done>>(std::move(ready));
  read_queue_->Run([batch] {
    for (auto& r : *batch) r(absl::OkStatus());
  });
}

void Replicator::ReleaseReads(uint64_t index, std::vector<Done> waiters) {
  {
    util::MutexLock l(&reads_mu_);
    if (AppliedIndex() < index) {
      for (auto& w : waiters) apply_waiters_.emplace(index, std::move(w));
      return;
    }
  }
  RunReads(std::move(waiters));
}

}  // namespace capstan::replication

namespace capstan::replication {

void Replicator::MaybeCompact() {
  if (compacting_ || options_.snapshot_count == 0) return;
  const uint64_t applied = store_->AppliedIndex();
  if (applied <= compacted_at_ + options_.snapshot_count) return;
  compacting_ = true;
  // The store's data is made durable through `applied` (its applied index
  // is written with it) before the log forgets anything: a flush of its
  // backend, off the loop.
  snapshot_queue_->Run([this, applied] {
    absl::Status s = store_->backend()->Flush();
    util::MutexLock l(&inbox_mu_);
    if (s.ok()) {
      inbox_.flushed = applied;
    } else {
      inbox_.flushed = s;
    }
  });
}

void Replicator::CompactAfterFlush(absl::StatusOr<uint64_t> flushed) {
  compacting_ = false;
  if (!flushed.ok()) {
    SPDLOG_WARN("log compaction: flushing the store failed: {}", flushed.status().ToString());
    return;
  }
  const uint64_t applied = *flushed;
  compacted_at_ = applied;
  if (applied <= options_.snapshot_catchup_entries) return;
  uint64_t index = applied - options_.snapshot_catchup_entries;
  index = std::min({index, log_->hard_state().commit, log_->LastIndex()});
  if (index <= log_->snapshot_meta().index) return;
  if (absl::Status s = log_->Compact(index, ConfStateAt(index)); !s.ok()) {
    SPDLOG_WARN("log compaction at index {} failed: {}", index, s.ToString());
    return;
  }
  log_first_.store(index + 1, std::memory_order_release);
  SPDLOG_INFO("compacted the raft log up to index {} (applied {})", index, applied);
}

void Replicator::StartLeaderTransfer(LeaderTransfer t) {
  SPDLOG_INFO("leadership transfer starting: member {:x}, leader {:x}, transferee {:x}",
              options_.member_id, Leader(), t.to);
  // Proposals are dropped while the transfer runs; Propose keeps them
  // pending, and retries them until the new leader takes them or their
  // deadline passes.
  SetLeadershipConfirmation({});  // the transferee may lead at any moment
  EndDirectWrites();
  engine_->TransferLeader(t.to);
  transfers_.push_back(std::move(t));
}

void Replicator::FinishLeaderTransfers(absl::Time now) {
  const uint64_t lead = Leader();
  for (auto it = transfers_.begin(); it != transfers_.end();) {
    absl::Status s;
    if (lead == it->to) {
      SPDLOG_INFO("leadership transfer finished: member {:x}, new leader {:x}, took {}",
                  options_.member_id, lead, absl::FormatDuration(now - it->asked));
    } else if (now >= it->deadline) {
      SPDLOG_WARN("leadership transfer to {:x} timed out: member {:x}, leader {:x}", it->to,
                  options_.member_id, lead);
      s = MakeError(Error::kTimeoutLeaderTransfer);
    } else {
      ++it;
      continue;
    }
    Done done = std::move(it->done);
    it = transfers_.erase(it);
    done(std::move(s));
  }
}

void Replicator::SendSnapshot(RaftMessage m) {
  const uint64_t to = m.to;
  if (options_.data_dir.empty() || snapshots_out_.count(to)) {
    engine_->ReportSnapshot(to, /*failure=*/true);
    return;
  }
  snapshots_out_.insert(to);
  const std::string dir =
      (std::filesystem::path(options_.data_dir) / absl::StrCat("snap.send.", absl::Hex(to))).string();
  snapshot_queue_->Run([this, to, dir, bytes = std::move(m.bytes)] {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    // A checkpoint: hard links to the store's files, nothing in memory. Its
    // applied index is at or above the snapshot's (the log is compacted
    // only below what the store holds), so the follower skips the entries
    // between them.
    absl::Status s = store_->backend()->Checkpoint(dir);
    if (s.ok()) s = transport_->SendSnapshot(to, dir, bytes, options_.snapshot_rate_bytes);
    std::filesystem::remove_all(dir, ec);
    if (s.ok()) {
      SPDLOG_INFO("sent a snapshot to member {:x}", to);
    } else {
      SPDLOG_WARN("sending a snapshot to member {:x} failed: {}", to, s.ToString());
    }
    util::MutexLock l(&inbox_mu_);
    inbox_.snapshot_reports.emplace_back(to, !s.ok());
  });
}

void Replicator::InstallSnapshot(const SnapshotMeta& meta) {
  CHECK(!incoming_snapshot_dir_.empty())
      << "raft has a snapshot at index " << meta.index << " to install but no data came with it";
  const std::string dir = std::move(incoming_snapshot_dir_);
  incoming_snapshot_dir_.clear();
  storage::BackendOptions bo;
  bo.dir = dir;
  bo.sync = true;
  bo.block_cache_bytes = 8 << 20;
  bo.write_buffer_bytes = 4 << 20;
  auto source = storage::Backend::Open(bo);
  CHECK(source.ok()) << "the snapshot at index " << meta.index
                     << " cannot be opened: " << source.status().ToString();
  // The checkpoint is the sender's store: it becomes this member's (its
  // IDs) before it replaces this member's data, so that no crash leaves
  // this member with another's identity.
  absl::Status s = membership::StampIdentity(source->get(), options_.cluster_id, options_.member_id);
  CHECK(s.ok()) << "stamping the snapshot at index " << meta.index << ": " << s.ToString();
  s = store_->Restore(*std::move(source), options_.on_restored);
  CHECK(s.ok()) << "installing the snapshot at index " << meta.index << " failed: " << s.ToString();
  const uint64_t applied = store_->AppliedIndex();
  CHECK(applied >= meta.index) << "the snapshot's store has applied " << applied
                               << ", below the snapshot index " << meta.index;
  skip_through_ = applied;
  compacted_at_ = applied;
  SetConfState(meta.conf_state);
  conf_history_.clear();
  conf_history_[meta.index] = meta.conf_state;
  // The member table after the snapshot's last entry; the conf changes
  // between the snapshot index and it are applied to raft as they come
  // (ApplyConfEntry: accepted or refused as they were).
  auto table = membership::MemberTable::Load(store_->backend());
  CHECK(table.ok()) << "reading the snapshot's member table: " << table.status().ToString();
  table_ = *std::move(table);
  PublishMembers();
  SyncPeers();
  applied_.store(applied, std::memory_order_release);
  installed_.fetch_add(1, std::memory_order_acq_rel);
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  SPDLOG_INFO("installed a snapshot at index {} (term {}); the store has applied {}", meta.index,
              meta.term, applied);
}

LogError Replicator::SnapshotAtStore::Snapshot(SnapshotMeta* meta) {
  // The store's applied index lies between the log's snapshot and its last
  // entry (the log is compacted only below what the store applied); its
  // data goes with the message (SendSnapshot).
  const uint64_t applied = std::min(r_->store_->AppliedIndex(), r_->log_->LastIndex());
  const SnapshotMeta& logged = r_->log_->snapshot_meta();
  if (applied <= logged.index) return r_->log_->Snapshot(meta);
  uint64_t term = 0;
  if (LogError e = r_->log_->Term(applied, &term); e != LogError::kOk) return r_->log_->Snapshot(meta);
  meta->index = applied;
  meta->term = term;
  meta->conf_state = r_->ConfStateAt(applied);
  return LogError::kOk;
}

absl::Status Replicator::StartLogAtStore() {
  // The store's term when it knows it (it applied entries of a log); else
  // term 1 under a new log, as etcd's snapshot restore writes.
  SnapshotMeta meta;
  meta.index = store_->AppliedIndex();
  meta.term = std::max<uint64_t>(store_->AppliedTerm(), 1);
  // raft's configuration at the store's applied index. Under a log that
  // ends below the store (a sole voter's last entries live in the store
  // only) it is the member table, written in the batch of each change the
  // store applied: the log's snapshot may predate changes the store holds.
  // A new log (restored or migrated data) takes the one Create chose.
  if (!log_->IsNew() && !table_.empty()) {
    ConfState conf;
    for (const auto& m : table_.Members()) {
      (m.is_learner ? conf.learners : conf.voters).push_back(m.id);
    }
    SetConfState(std::move(conf));
    conf_history_[meta.index] = conf_state_;
  }
  meta.conf_state = conf_state_;
  HardState hard_state = log_->hard_state();
  hard_state.term = std::max(hard_state.term, meta.term);
  hard_state.commit = std::max(hard_state.commit, meta.index);
  if (absl::Status s = log_->Save(hard_state, {}, meta, /*sync=*/true); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("starting the raft log at the store's applied index ",
                                               meta.index, ": ", s.message()));
  }
  compacted_at_ = meta.index;
  commit_.store(hard_state.commit, std::memory_order_release);
  term_.store(hard_state.term, std::memory_order_release);
  log_first_.store(meta.index + 1, std::memory_order_release);
  SPDLOG_INFO("started the raft log at index {} (term {}), the store's applied index", meta.index,
              meta.term);
  return absl::OkStatus();
}

}  // namespace capstan::replication
