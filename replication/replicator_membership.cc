// The membership half of the Replicator: the member table it publishes,
// raft's configuration history, and membership changes from the request
// to the applied entry (etcd's AddMember, RemoveMember, UpdateMember,
// PromoteMember and --force-new-cluster). Runs on the raft loop, except
// Members and ChangeMembership (any thread). docs/REPLICATION.md,
// "Membership", has the rules these follow.

#include "replication/replicator.h"

#include <algorithm>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "mvcc/errors.h"
#include "raftpb/raft.pb.h"
#include "spdlog/spdlog.h"
#include "util/check.h"

namespace capstan::replication {

using mvcc::Error;
using mvcc::MakeError;
using Done = absl::AnyInvocable<void(absl::Status)>;

std::vector<membership::ClusterMember> Replicator::Members() const {
  util::MutexLock l(&members_mu_);
  return members_;
}

std::string Replicator::ClusterVersion() const {
  util::MutexLock l(&members_mu_);
  return cluster_version_;
}

void Replicator::ChangeMembership(const membership::MemberChange& change, absl::Time deadline,
                                  MembersDone done) {
  deadline = std::min(deadline, absl::Now() + options_.request_timeout);
  {
    util::MutexLock l(&inbox_mu_);
    if (!stopping_) {
      inbox_.conf_changes.push_back({change, deadline, std::move(done)});
      return;
    }
  }
  done(MakeError(Error::kStopped));
}

void Replicator::PublishMembers() {
  std::vector<membership::ClusterMember> members = table_.Members();
  if (members.empty()) {
    // Until the bootstrap entries (or a joining member's first snapshot)
    // fill the table, the members it was started with.
    members = options_.initial_members;
  }
  // A joining member replaying the log from its start has a table without
  // itself until it applies its own addition: until then it is what the
  // cluster listed it as.
  bool learner = false, found = false;
  for (const auto& m : members) {
    if (m.id == options_.member_id) {
      learner = m.is_learner;
      found = true;
    }
  }
  if (!found) {
    for (const auto& m : options_.initial_members) {
      if (m.id == options_.member_id) learner = m.is_learner;
    }
  }
  learner_.store(learner, std::memory_order_release);
  util::MutexLock l(&members_mu_);
  members_ = std::move(members);
  cluster_version_ = table_.cluster_version();
}

void Replicator::SyncPeers() {
  for (const auto& m : table_.Members()) {
    if (m.id != options_.member_id) transport_->AddPeer(m.id, m.peer_urls);
  }
}

void Replicator::RecordConfState(uint64_t index, ConfState conf_state) {
  conf_history_[index] = conf_state;
  // Configurations a compaction can no longer ask for (below the log's
  // snapshot) are dropped, the one in force there kept.
  const uint64_t first = log_first_.load(std::memory_order_relaxed);
  while (conf_history_.size() > 1 && std::next(conf_history_.begin())->first < first) {
    conf_history_.erase(conf_history_.begin());
  }
  SetConfState(std::move(conf_state));
}

ConfState Replicator::ConfStateAt(uint64_t index) const {
  auto it = conf_history_.upper_bound(index);
  if (it == conf_history_.begin()) return log_->snapshot_meta().conf_state;
  return std::prev(it)->second;
}

void Replicator::SetConfState(ConfState conf_state) {
  conf_state_ = std::move(conf_state);
  sole_voter_.store(conf_state_.voters.size() == 1 && conf_state_.voters[0] == options_.member_id,
                    std::memory_order_release);
}

void Replicator::ProposeConfChanges(absl::Time now) {
  while (!pending_conf_.empty()) {
    PendingConfChange& p = pending_conf_.front();
    if (now >= p.deadline) {
      // etcd's PromoteMember waits for a leader to forward to, and fails
      // with "no leader" when none came.
      p.done(MakeError(Leader() != 0           ? Error::kTimeout
                       : p.change.is_promote ? Error::kNoLeader
                                             : Error::kTimeoutLeaderFail));
      pending_conf_.pop_front();
      continue;
    }
    // etcd checks an addition or a removal where it arrives, before it
    // proposes it (mayAddMember, mayRemoveMember): a member cut off from
    // its peers refuses at once ("unhealthy cluster"), leader or not.
    if (!p.change.is_promote) {
      if (absl::Status s = CheckBeforeProposing(p.change); !s.ok()) {
        p.done(std::move(s));
        pending_conf_.pop_front();
        continue;
      }
    }
    // etcd proposes without a leader and times out; here the change waits
    // for one, until its deadline.
    const uint64_t leader = Leader();
    if (leader == 0) return;
    if (p.change.is_promote && role_ != RaftRole::kLeader) {
      // Only the leader knows whether the learner caught up: etcd forwards
      // the promotion to it.
      auto done = std::make_shared<MembersDone>(std::move(p.done));
      const int64_t ms = absl::ToInt64Milliseconds(p.deadline - now);
      forward_queue_->Run([this, leader, id = p.change.id, ms, done] {
        (*done)(transport_->PromoteMember(leader, id, ms));
      });
      pending_conf_.pop_front();
      continue;
    }
    if (p.change.is_promote) {
      // Handled here, as leader: etcd counts how it ends.
      p.done = [this, done = std::move(p.done)](
                   absl::StatusOr<std::vector<membership::ClusterMember>> members) mutable {
        CountPromotion(members.status());
        done(std::move(members));
      };
      if (absl::Status s = CheckBeforeProposing(p.change); !s.ok()) {
        p.done(std::move(s));
        pending_conf_.pop_front();
        continue;
      }
    }
    if (HandOffBeforeRemovingLeader(p, now)) return;
    raftpb::ConfChange cc;
    const uint64_t id = NextRequestId();
    cc.set_id(id);
    cc.set_type(static_cast<raftpb::ConfChangeType>(p.change.type));
    cc.set_nodeid(p.change.id);
    if (p.change.type != membership::ChangeType::kRemoveNode) {
      cc.set_context(membership::ChangeContextJson(p.change));
    }
    std::string entry = cc.SerializeAsString();
    // Not taken (raft would drop it, no leader, a leader transfer): tried
    // again next pass.
    if (!ProposeConfEntry(entry)) return;
    conf_waiters_.emplace(
        id, ConfWaiter{std::move(p.done), p.deadline, std::move(entry), now + ElectionTimeout()});
    pending_conf_.pop_front();
  }
}

void Replicator::CountPromotion(const absl::Status& s) {
  util::MutexLock l(&promotions_mu_);
  if (s.ok()) {
    ++promotions_.successes;
    return;
  }
  for (auto& [error, count] : promotions_.failures) {
    if (error == s) {
      ++count;
      return;
    }
  }
  promotions_.failures.emplace_back(s, 1);
}

membership::RaftView::Promotions Replicator::LearnerPromotions() const {
  util::MutexLock l(&promotions_mu_);
  return promotions_;
}

bool Replicator::ProposeConfEntry(const std::string& entry) {
  EndDirectWrites();
  const bool leads = role_ == RaftRole::kLeader;
  if (leads && conf_pending_index_ > handed_through_) return false;
  if (!engine_->ProposeConfChange(false, entry).ok()) return false;
  // The entry's index is known once its Ready is handled: until then, no
  // other change.
  if (leads) conf_pending_index_ = std::max(conf_pending_index_, handed_through_ + 1);
  return true;
}

void Replicator::NoteConfEntries(const std::vector<RaftEntry>& entries) {
  if (entries.empty()) return;
  for (auto& [id, w] : conf_waiters_) {
    if (w.in_log_at >= entries.front().index) w.in_log_at = 0;  // replaced by these
  }
  for (const RaftEntry& e : entries) {
    if (e.type != EntryType::kConfChange) continue;
    if (role_ == RaftRole::kLeader) conf_pending_index_ = std::max(conf_pending_index_, e.index);
    raftpb::ConfChange cc;
    if (conf_waiters_.empty() || !cc.ParseFromString(e.data)) continue;
    if (auto it = conf_waiters_.find(cc.id()); it != conf_waiters_.end()) {
      it->second.in_log_at = e.index;
    }
  }
}

void Replicator::ProposeConfAgain(absl::Time now) {
  for (auto& [id, w] : conf_waiters_) {
    if (w.in_log_at != 0 || now < w.retry_at) continue;
    if (Leader() == 0 || !ProposeConfEntry(w.entry)) return;
    SPDLOG_INFO("member {:x}: membership change {:x} not in the log after {}, proposed again",
                options_.member_id, id, absl::FormatDuration(ElectionTimeout()));
    w.retry_at = now + ElectionTimeout();
  }
}

bool Replicator::HandOffBeforeRemovingLeader(PendingConfChange& p, absl::Time now) {
  if (p.change.type != membership::ChangeType::kRemoveNode || p.change.id != Leader()) {
    return false;
  }
  if (p.handoff_until != absl::InfinitePast()) return now < p.handoff_until;
  // etcd's leader goes on leading until it applies its own removal; the
  // rest of the cluster then waits an election timeout for a new leader.
  // Handing over first leaves no such gap: the removal is then proposed
  // through the new leader. The leader hands over to its most caught-up
  // active voter; a follower (a voter) asks the leader for leadership
  // itself (raft forwards its transfer request to the leader).
  uint64_t to = 0;
  if (role_ == RaftRole::kLeader) {
    const RaftStatus status = engine_->Status();
    uint64_t best = 0;
    for (const auto& pr : status.progress) {
      if (pr.id == options_.member_id || pr.learner || !pr.recent_active) continue;
      if (to == 0 || pr.match > best) {
        to = pr.id;
        best = pr.match;
      }
    }
  } else if (!IsLearner()) {
    to = options_.member_id;
  }
  p.handoff_until = now + ElectionTimeout();
  if (to == 0) return false;  // no voter to hand over to
  SPDLOG_INFO("member {:x}: leader {:x} hands leadership to {:x} before its removal",
              options_.member_id, p.change.id, to);
  SetLeadershipConfirmation({});  // the transferee may lead at any moment
  engine_->TransferLeader(to);
  return true;
}

// etcd's HealthInterval: how long a peer connection must have been up for
// the member to count the peer as connected in its membership checks.
constexpr absl::Duration kHealthInterval = absl::Seconds(5);

absl::Status Replicator::CheckBeforeProposing(const membership::MemberChange& change) const {
  using membership::ChangeType;
  const membership::ClusterMember* target = table_.Find(change.id);
  if (change.is_promote) {
    // Only the leader knows how far a learner got (etcd forwards a
    // follower's promotion to it).
    if (role_ != RaftRole::kLeader) return MakeError(Error::kNotLeader);
    RaftStatus status = engine_->Status();
    uint64_t leader_match = 0;
    const PeerProgress* learner = nullptr;
    for (const auto& p : status.progress) {
      if (p.id == options_.member_id) leader_match = p.match;
      if (p.id == change.id) learner = &p;
    }
    if (learner == nullptr) return membership::MakeError(membership::Error::kIdNotFound);
    // etcd's isLearnerReady: the learner has 90% of the leader's log.
    if (static_cast<double>(learner->match) < static_cast<double>(leader_match) * 0.9) {
      return membership::MakeError(membership::Error::kLearnerNotReady);
    }
  }
  if (!options_.strict_reconfig_check) return absl::OkStatus();
  // etcd's --strict-reconfig-check: a change that could leave the voters
  // without a quorum of started members (members that published their
  // attributes) is refused.
  size_t voters = 0, started = 0;
  for (const auto& m : table_.Members()) {
    if (m.is_learner) continue;
    if (change.type == ChangeType::kRemoveNode && m.id == change.id) continue;
    ++voters;
    if (!m.name.empty()) ++started;
  }
  const auto not_enough = [] { return membership::MakeError(membership::Error::kNotEnoughStarted); };
  switch (change.type) {
    case ChangeType::kAddNode:
      // A new voter, or a promoted learner (started, as it caught up):
      // etcd's IsReadyToAddVotingMember and IsReadyToPromoteMember.
      if (change.is_promote) {
        if (started + 1 < (voters + 1) / 2 + 1) return not_enough();
      } else if (!(started == 1 && voters + 1 == 2) && started < (voters + 1) / 2 + 1) {
        return not_enough();
      }
      break;
    case ChangeType::kRemoveNode:
      if (target != nullptr && target->is_learner) return absl::OkStatus();
      if (started < voters / 2 + 1) return not_enough();
      break;
    default:
      break;
  }
  // etcd's mayAddMember / mayRemoveMember: this member's connections to
  // the voters, each up for at least the health interval (5 s).
  const absl::Time since = absl::Now() - kHealthInterval;
  const auto connected = [&](uint64_t id) {
    return id == options_.member_id || transport_->ActiveSince(id) < since;
  };
  const auto unhealthy = [] { return membership::MakeError(membership::Error::kUnhealthy); };
  if ((change.type == ChangeType::kAddNode && !change.is_promote) ||
      change.type == ChangeType::kAddLearnerNode) {
    // Every voter connected (isConnectedFullySince).
    for (const auto& m : table_.Members()) {
      if (!m.is_learner && !connected(m.id)) return unhealthy();
    }
  } else if (change.type == ChangeType::kRemoveNode && target != nullptr && !target->is_learner) {
    // A member this one has no connection to is down: removing it loses
    // nothing. Else a quorum of the voters left must be connected
    // (numConnectedSince, the removed one counted out).
    if (change.id != options_.member_id &&
        transport_->ActiveSince(change.id) == absl::InfiniteFuture()) {
      return absl::OkStatus();
    }
    int64_t all = 0, active = 0;
    for (const auto& m : table_.Members()) {
      if (m.is_learner) continue;
      ++all;
      if (connected(m.id)) ++active;
    }
    if (active - 1 < 1 + (all - 1) / 2) return unhealthy();
  }
  return absl::OkStatus();
}

absl::Status Replicator::ForceNewCluster() {
  const SnapshotMeta snap = log_->snapshot_meta();
  HardState hard_state = log_->hard_state();
  // Entries the store applied were committed, even where the log's commit
  // index is behind (a crash between the store's write and the log's).
  const uint64_t base = std::max({hard_state.commit, snap.index,
                                  std::min(store_->AppliedIndex(), log_->LastIndex())});
  // The members raft knows at `base` (etcd's getIDs): the snapshot's, then
  // each committed configuration change.
  std::set<uint64_t> ids(snap.conf_state.voters.begin(), snap.conf_state.voters.end());
  ids.insert(snap.conf_state.learners.begin(), snap.conf_state.learners.end());
  std::vector<RaftEntry> committed;
  if (base > snap.index) {
    if (LogError e = log_->Entries(snap.index + 1, base + 1, UINT64_MAX, &committed);
        e != LogError::kOk) {
      return absl::DataLossError(absl::StrCat("--force-new-cluster: reading the raft log from ",
                                              snap.index + 1, " to ", base, " failed"));
    }
  }
  for (const RaftEntry& e : committed) {
    if (e.type != EntryType::kConfChange) continue;
    raftpb::ConfChange cc;
    if (!cc.ParseFromString(e.data)) {
      return absl::DataLossError(
          absl::StrCat("--force-new-cluster: the entry at ", e.index, " is not a ConfChange"));
    }
    switch (cc.type()) {
      case raftpb::ConfChangeAddNode:
      case raftpb::ConfChangeAddLearnerNode:
        ids.insert(cc.nodeid());
        break;
      case raftpb::ConfChangeRemoveNode:
        ids.erase(cc.nodeid());
        break;
      default:
        break;
    }
  }
  uint64_t term = 0;
  if (LogError e = log_->Term(base, &term); e != LogError::kOk) {
    return absl::DataLossError(absl::StrCat("--force-new-cluster: no term for index ", base));
  }
  // etcd's createConfigChangeEnts: this member first (raft refuses an empty
  // set of voters), then every other member removed.
  std::vector<RaftEntry> forced;
  auto append = [&](const raftpb::ConfChange& cc) {
    RaftEntry e;
    e.index = base + forced.size() + 1;
    e.term = term;
    e.type = EntryType::kConfChange;
    e.data = cc.SerializeAsString();
    forced.push_back(std::move(e));
  };
  if (!ids.count(options_.member_id)) {
    membership::MemberChange self;
    self.type = membership::ChangeType::kAddNode;
    self.id = options_.member_id;
    self.member.id = options_.member_id;
    if (const membership::ClusterMember* m = table_.Find(options_.member_id); m != nullptr) {
      self.member = *m;
    } else {
      for (const auto& m : options_.initial_members) {
        if (m.id == options_.member_id) self.member = m;
      }
    }
    self.member.is_learner = false;
    raftpb::ConfChange cc;
    cc.set_type(raftpb::ConfChangeAddNode);
    cc.set_nodeid(options_.member_id);
    cc.set_context(membership::ChangeContextJson(self));
    append(cc);
  }
  for (uint64_t id : ids) {
    if (id == options_.member_id) continue;
    raftpb::ConfChange cc;
    cc.set_type(raftpb::ConfChangeRemoveNode);
    cc.set_nodeid(id);
    append(cc);
  }
  const uint64_t dropped = log_->LastIndex() > base ? log_->LastIndex() - base : 0;
  hard_state.commit = base + forced.size();
  if (absl::Status s = log_->Save(hard_state, forced, std::nullopt, /*sync=*/true); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("--force-new-cluster: ", s.message()));
  }
  // With nothing appended (this member is already the only one), entries
  // past the commit index stay: the sole voter commits them itself.
  commit_.store(hard_state.commit, std::memory_order_release);
  replay_through_ = hard_state.commit;
  SPDLOG_WARN("forcing restart member {:x} as the only member of its cluster: commit index {}, "
              "{} members removed, {} uncommitted entries dropped",
              options_.member_id, hard_state.commit, ids.size() - ids.count(options_.member_id),
              forced.empty() ? 0 : dropped);
  return absl::OkStatus();
}

void Replicator::ApplyConfEntry(const RaftEntry& entry) {
  raftpb::ConfChange cc;
  CHECK(cc.ParseFromString(entry.data))
      << "the raft log entry at index " << entry.index << " is not a ConfChange";
  absl::StatusOr<membership::MemberChange> change =
      membership::ParseChange(cc.type(), cc.nodeid(), cc.context());
  if (change.ok() && cc.context().empty() && change->type != membership::ChangeType::kRemoveNode) {
    // A bootstrap entry of a log written before they carried the member:
    // the member comes from --initial-cluster.
    for (const auto& m : options_.initial_members) {
      if (m.id == cc.nodeid()) change->member = m;
    }
  }
  if (entry.index <= skip_through_) {
    // The store holds this entry's outcome, and a table that is newer:
    // raft takes the change exactly if it was accepted then.
    if (change.ok() && !table_.WasRejected(entry.index)) {
      RecordConfState(entry.index, engine_->ApplyConfChange(entry.type, entry.data));
    }
    if (auto it = conf_waiters_.find(cc.id()); it != conf_waiters_.end()) {
      it->second.done(MakeError(Error::kTimeout));
      conf_waiters_.erase(it);
    }
    return;
  }
  absl::Status valid = change.status();
  if (valid.ok()) valid = table_.Validate(*change, options_.max_learners);
  bool removed_self = false;
  if (valid.ok()) {
    RecordConfState(entry.index, engine_->ApplyConfChange(entry.type, entry.data));
    table_.Apply(*change);
    PublishMembers();
    if (change->type == membership::ChangeType::kRemoveNode) {
      if (change->id == options_.member_id) {
        removed_self = true;
      } else {
        transport_->RemovePeer(change->id);
      }
    } else {
      SyncPeers();
    }
    SPDLOG_INFO("applied a membership change at index {}: {} member {:x}", entry.index,
                membership::MemberJson(change->member), change->id);
  } else {
    table_.MarkRejected(entry.index);
    SPDLOG_WARN("refused a membership change at index {} (member {:x}): {}", entry.index,
                cc.nodeid(), valid.ToString());
  }
  MembersDone done;
  if (auto it = conf_waiters_.find(cc.id()); cc.id() != 0 && it != conf_waiters_.end()) {
    done = std::move(it->second.done);
    conf_waiters_.erase(it);
  }
  // The store writes the outcome with the entry's index: the member's
  // record, or the refusal.
  mvcc::WriteRequest w;
  w.raft_index = entry.index;
  w.raft_term = entry.term;
  auto table = std::make_shared<const membership::MemberTable>(table_);
  const uint64_t changed = change.ok() ? change->id : 0;
  const uint64_t index = entry.index;
  const bool accepted = valid.ok();
  w.op = mvcc::CustomOp{[table, changed, index, accepted](storage::WriteBatch* batch) {
    if (accepted) {
      table->WriteRecord(changed, batch);
    } else {
      membership::MemberTable::WriteRejection(index, batch);
    }
    return absl::OkStatus();
  }};
  w.done = [this, table, valid, removed_self, done = std::move(done)](absl::Status s) mutable {
    if (removed_self && s.ok() && options_.on_removed) options_.on_removed();
    if (!done) return;
    if (!s.ok()) {
      done(std::move(s));
    } else if (!valid.ok()) {
      done(valid);
    } else {
      done(table->Members());
    }
  };
  store_->SubmitCommitted(std::move(w));
}

void Replicator::ApplyAttributes(const RaftEntry& entry,
                                 std::shared_ptr<etcdserverpb::InternalRaftRequest> request) {
  const auto& set = request->cluster_member_attr_set();
  const uint64_t member = set.member_id();
  table_.SetAttributes(member, set.member_attributes().name(),
                       {set.member_attributes().client_urls().begin(),
                        set.member_attributes().client_urls().end()});
  PublishMembers();
  auto table = std::make_shared<const membership::MemberTable>(table_);
  SubmitTableRecord(entry, *request, [table, member](storage::WriteBatch* batch) {
    // An unknown or removed member gets no record (etcd ignores its
    // attributes).
    if (table->Find(member) != nullptr) table->WriteRecord(member, batch);
    return absl::OkStatus();
  });
}

void Replicator::ApplyClusterVersion(const RaftEntry& entry,
                                     std::shared_ptr<etcdserverpb::InternalRaftRequest> request) {
  table_.SetClusterVersion(request->cluster_version_set().ver());
  PublishMembers();
  SubmitTableRecord(entry, *request, [version = table_.cluster_version()](storage::WriteBatch* batch) {
    membership::MemberTable::WriteClusterVersion(version, batch);
    return absl::OkStatus();
  });
}

void Replicator::SubmitTableRecord(
    const RaftEntry& entry, const etcdserverpb::InternalRaftRequest& request,
    absl::AnyInvocable<absl::Status(storage::WriteBatch* batch)> write) {
  Done done = [](absl::Status) {};
  if (auto it = waiters_.find(RequestIdOf(request)); it != waiters_.end()) {
    done = std::move(it->second.done);
    waiters_.erase(it);
  }
  mvcc::WriteRequest w;
  w.raft_index = entry.index;
  w.raft_term = entry.term;
  w.op = mvcc::CustomOp{std::move(write)};
  w.done = std::move(done);
  store_->SubmitCommitted(std::move(w));
}

}  // namespace capstan::replication
