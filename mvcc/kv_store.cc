#include "mvcc/kv_store.h"

#include <algorithm>
#include <future>
#include <utility>

#include "absl/strings/str_cat.h"
#include "mvcc/errors.h"
#include "mvcc/kv_codec.h"
#include "mvcc/kv_range.h"
#include "mvcc/meta_keys.h"
#include "mvcc/revision_key.h"
#include "mvcc/watch_hub.h"
#include "spdlog/spdlog.h"
#include "util/check.h"
#include "util/thread_name.h"

namespace capstan::mvcc {

using storage::Cf;

KvStore::KvStore(const KvStoreOptions& options, std::unique_ptr<storage::Backend> backend)
    : options_(options),
      backend_(std::move(backend)),
      epoch_(std::make_shared<Epoch>()),
      lessor_(options.lease_clock) {}

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::Open(const KvStoreOptions& options,
                                                       std::unique_ptr<storage::Backend> backend) {
  std::unique_ptr<KvStore> store(new KvStore(options, std::move(backend)));
  if (auto s = store->Recover(); !s.ok()) return s;
  store->Publish();
  store->answerer_ = NamedThread("answerer", [s = store.get()] { s->AnswerLoop(); });
  store->committer_ = NamedThread("committer", [s = store.get()] { s->CommitLoop(); });
  store->compactor_ = NamedThread("compactor", [s = store.get()] { s->CompactionLoop(); });
  store->lease_expiry_ =
      NamedThread("lease-expiry", [s = store.get()] { s->LeaseExpiryLoop(); });
  return store;
}

KvStore::~KvStore() {
  {
    util::MutexLock l(&queue_mu_);
    stopping_ = true;
  }
  if (lease_expiry_.joinable()) lease_expiry_.join();
  if (committer_.joinable()) committer_.join();
  {
    util::MutexLock l(&answer_mu_);
    answers_closed_ = true;
  }
  if (answerer_.joinable()) answerer_.join();
  {
    util::MutexLock l(&compact_mu_);
    compact_exit_ = true;
  }
  if (compactor_.joinable()) compactor_.join();
  // Physical compactions still waiting are answered, not dropped.
  FailCompactionWaiters(MakeError(Error::kStopped), /*stop=*/true);
}

absl::Status KvStore::Recover() {
  // Compaction state: the newest scheduled and newest finished compactions
  // (-1: none).
  std::string value;
  int64_t scheduled = -1;
  int64_t finished = -1;
  if (auto s = backend_->Get(Cf::kMeta, kScheduledCompactKey, &value); s.ok()) {
    scheduled = DecodeMetaRevision(value);
  } else if (!absl::IsNotFound(s)) {
    return s;
  }
  if (auto s = backend_->Get(Cf::kMeta, kFinishedCompactKey, &value); s.ok()) {
    finished = DecodeMetaRevision(value);
    compact_rev_ = finished;
  } else if (!absl::IsNotFound(s)) {
    return s;
  }
  compacted_ = scheduled >= 0 || finished >= 0;

  if (auto s = backend_->Get(Cf::kMeta, kConsistentIndexKey, &value); s.ok() && value.size() == 8) {
    applied_index_.store(util::ReadBigEndian64(value.data()));
  }
  if (auto s = backend_->Get(Cf::kMeta, kConsistentTermKey, &value); s.ok() && value.size() == 8) {
    applied_term_.store(util::ReadBigEndian64(value.data()));
  }

  // Rebuild the key index by replaying history in revision order, as etcd's
  // restore does: the first record of a key seen restores its generation
  // from the record's create revision and version (earlier history may have
  // been compacted away); later records are put or tombstoned on top.
  if (auto s = LoadAlarms(); !s.ok()) return s;

  // Leases: each gets its full TTL again (see Lessor::Restore).
  {
    auto lit = backend_->NewIterator(Cf::kLease);
    for (lit->SeekToFirst(); lit->Valid(); lit->Next()) {
      int64_t id, ttl;
      if (!lease::DecodeLeaseRecord(lit->value(), &id, &ttl)) {
        return absl::DataLossError("lease family holds a corrupt record");
      }
      lessor_.Restore(id, ttl);
    }
    if (auto s = lit->status(); !s.ok()) return s;
  }

  // The lease each live key holds, from its latest record.
  absl::flat_hash_map<std::string, int64_t> key_lease;
  auto it = backend_->NewIterator(Cf::kKey);
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    Revision rev;
    bool tombstone;
    if (!ParseRevisionKey(it->key(), &rev, &tombstone)) {
      return absl::DataLossError("key family holds a key that is not a revision");
    }
    KeyValueView kv;
    if (!DecodeKeyValue(it->value(), &kv)) {
      return absl::DataLossError(absl::StrCat("record at revision ", rev.main, " is corrupt"));
    }
    current_rev_ = rev.main;
    if (tombstone || kv.lease == 0) {
      // Most keys never had a lease: look up without building a string.
      if (!key_lease.empty()) key_lease.erase(absl::string_view(kv.key.data(), kv.key.size()));
    } else {
      key_lease[std::string(kv.key)] = kv.lease;
    }
    if (tombstone) {
      // A tombstone whose key history was compacted away has nothing to end.
      index_->Tombstone(kv.key, rev).IgnoreError();
    } else {
      index_->Restore(kv.key, Revision{kv.create_revision, 0}, rev, kv.version, kv.lease);
    }
  }
  if (auto s = it->status(); !s.ok()) return s;
  it.reset();
  for (const auto& [key, lease] : key_lease) lessor_.Attach(key, lease);
  // Every record may have been compacted away; the revision never goes back.
  if (current_rev_ < compact_rev_) current_rev_ = compact_rev_;
  if (current_rev_ < scheduled) current_rev_ = scheduled;
  const bool interrupted = scheduled > finished;
  // A compaction was interrupted: finish it.
  if (interrupted) compact_rev_ = scheduled;
  // An interrupted compaction leaves compact_finished_ behind
  // compact_requested_, so the compactor picks it up and WaitCompactionDone
  // waits for it.
  util::MutexLock l(&compact_mu_);  // no other thread runs yet; the lock states the contract
  compact_requested_ = std::max(scheduled, finished);
  compact_resumed_ = interrupted ? scheduled : -1;
  compact_finished_ = finished;
  return absl::OkStatus();
}

std::shared_ptr<const ReadView> KvStore::View() const {
  util::MutexLock l(&view_mu_);
  return view_;
}

void KvStore::Publish() {
  index_->Publish();
  auto view = std::make_shared<ReadView>();
  view->index = index_->Snapshot();
  view->rev = current_rev_;
  view->compact_rev = compact_rev_;
  view->compacted = compacted_;
  view->epoch = epoch_;
  std::shared_ptr<const ReadView> old;
  {
    util::MutexLock l(&view_mu_);
    old = std::move(view_);
    view_ = std::move(view);
  }
  // `old` is released here, outside the lock.
}

absl::Status KvStore::ReadRecords(const std::vector<Revision>& revs, std::vector<std::string>* out,
                                  bool include_pending) const {
  out->clear();
  out->resize(revs.size());
  std::vector<Revision> stored;
  std::vector<size_t> slots;  // stored[j] is revs[slots[j]]
  for (size_t i = 0; i < revs.size(); ++i) {
    if (include_pending) {
      if (auto p = pending_.find(revs[i]); p != pending_.end()) {
        (*out)[i] = p->second;
        continue;
      }
    }
    stored.push_back(revs[i]);
    slots.push_back(i);
  }
  if (stored.empty()) return absl::OkStatus();
  return VisitRecords(stored, [&](size_t j, std::string_view record) {
    (*out)[slots[j]].assign(record);
  });
}

absl::Status KvStore::VisitRecords(
    const std::vector<Revision>& revs,
    absl::FunctionRef<void(size_t i, std::string_view record)> visit) const {
  if (revs.empty()) return absl::OkStatus();
  std::vector<std::string> keys;
  keys.reserve(revs.size());
  for (const auto& r : revs) keys.push_back(RevisionKey(r));
  std::vector<std::string_view> views(keys.begin(), keys.end());
  // Records written together lie together in the key column family: when
  // most revisions between the first and the last are asked for, one walk
  // through them costs less than a lookup each.
  constexpr int64_t kScanDensity = 4;  // at most this many revisions per record wanted
  auto [lo, hi] = std::minmax_element(revs.begin(), revs.end(),
                                      [](const Revision& a, const Revision& b) {
                                        return a.main < b.main;
                                      });
  const bool dense = revs.size() >= 2 && (hi->main - lo->main + 1) <=
                                            kScanDensity * static_cast<int64_t>(revs.size());
  auto s = dense ? backend_->ScanVisit(Cf::kKey, views, visit)
                 : backend_->MultiGetVisit(Cf::kKey, views, visit);
  if (!s.ok()) {
    // The index names a revision the backend does not hold: a broken
    // invariant unless a compaction raced this read, which the read epoch
    // rules out.
    return absl::InternalError(absl::StrCat("a record of revisions ", lo->main, " to ", hi->main,
                                            " is missing from storage: ", s.ToString()));
  }
  return absl::OkStatus();
}

absl::Status KvStore::Range(const etcdserverpb::RangeRequest& req, RangeResult* result) const {
  stat_ranges_.fetch_add(1, std::memory_order_relaxed);
  if (auto s = ValidateRange(req); !s.ok()) return s;
  auto view = View();
  int64_t rev;
  if (auto s = ResolveReadRevision(req.revision(), view->rev, view->compact_rev, &rev); !s.ok()) {
    return s;
  }
  const RecordVisitor stream = [this](const std::vector<Revision>& revs,
                                     absl::FunctionRef<void(std::string_view)> visit) {
    return VisitRecords(revs, [&visit](size_t, std::string_view record) { visit(record); });
  };
  return RangeAt(
      view->index, req, rev, view->rev,
      [this](const std::vector<Revision>& revs, std::vector<std::string>* out) {
        return ReadRecords(revs, out, /*include_pending=*/false);
      },
      result, &stream);
}

void KvStore::Submit(WriteRequest write) { Route(std::move(write), /*caller_waits=*/false); }

void KvStore::Route(WriteRequest write, bool caller_waits) {
  // A cluster orders what the services submit through its Raft log, which
  // hands each committed write back through SubmitCommitted. The store's
  // own steps never leave the member.
  if (write.raft_index == 0 && !std::holds_alternative<InternalOp>(write.op)) {
    if (WriteLog* log = write_log_.load(std::memory_order_acquire)) {
      // A sole voter's direct writes skip the log (StartDirectWrites).
      if (direct_hint_.load(std::memory_order_acquire) && DirectEligible(write) &&
          Enqueue(write, /*direct=*/true, caller_waits)) {
        return;
      }
      if (RefusedOverQuota(&write, log)) return;
      log->Submit(std::move(write));
      return;
    }
    if (options_.requires_write_log) {
      write.done(MakeError(Error::kNoLeader));
      return;
    }
    Enqueue(write, /*direct=*/false, caller_waits);
    return;
  }
  SubmitCommitted(std::move(write));
}

bool KvStore::DirectEligible(const WriteRequest& w) {
  // What the log carries for another owner (auth, a member's attributes)
  // is applied as its entry decodes; the store's own steps never leave it.
  return w.raft_request == nullptr && !std::holds_alternative<InternalOp>(w.op) &&
         !std::holds_alternative<CustomOp>(w.op);
}

void KvStore::StartDirectWrites() {
  util::MutexLock l(&queue_mu_);
  direct_ = true;
  direct_hint_.store(true, std::memory_order_release);
}

uint64_t KvStore::StopDirectWrites() {
  util::MutexLock l(&queue_mu_);
  direct_ = false;
  direct_hint_.store(false, std::memory_order_release);
  // Every direct write is queued under queue_mu_ while direct_ is set, so
  // once the queue is empty and nobody commits, each has its index.
  queue_mu_.AwaitWithTimeout(absl::Condition(this, &KvStore::QueueIdleLocked),
                             absl::InfiniteDuration());
  return applied_index_.load(std::memory_order_acquire);
}

void KvStore::ReadBarrier(absl::AnyInvocable<void(absl::Status)> ready) {
  if (WriteLog* log = write_log_.load(std::memory_order_acquire)) {
    log->ReadBarrier(std::move(ready));
    return;
  }
  ready(options_.requires_write_log ? MakeError(Error::kNoLeader) : absl::OkStatus());
}

void KvStore::RenewLease(int64_t id, absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) {
  if (WriteLog* log = write_log_.load(std::memory_order_acquire)) {
    log->RenewLease(id, std::move(done));
    return;
  }
  if (options_.requires_write_log) {
    done(MakeError(Error::kNoLeader));
    return;
  }
  std::optional<int64_t> ttl = lessor_.Renew(id);
  if (!ttl) {
    done(MakeError(Error::kLeaseNotFound));
    return;
  }
  done(*ttl);
}

void KvStore::LeaseTimeToLive(const etcdserverpb::LeaseTimeToLiveRequest& request,
                              LeaseTimeToLiveDone done) {
  if (WriteLog* log = write_log_.load(std::memory_order_acquire)) {
    log->LeaseTimeToLive(request, std::move(done));
    return;
  }
  if (options_.requires_write_log) {
    done(MakeError(Error::kNoLeader));
    return;
  }
  std::optional<lease::Lessor::LeaseInfo> info = lessor_.Get(request.id(), request.keys());
  if (!info) {
    done(MakeError(Error::kLeaseNotFound));
    return;
  }
  etcdserverpb::LeaseTimeToLiveResponse response;
  response.set_id(info->id);
  response.set_ttl(info->remaining_ttl);
  response.set_grantedttl(info->granted_ttl);
  for (auto& k : info->keys) response.add_keys(std::move(k));
  done(std::move(response));
}

bool KvStore::Leads() const {
  if (WriteLog* log = write_log_.load(std::memory_order_acquire)) return log->Leads();
  return !options_.requires_write_log;
}

void KvStore::SubmitCommitted(WriteRequest write) {
  {
    util::MutexLock l(&queue_mu_);
    if (!stopping_) {
      // The committer's waits are conditions on the queue, checked when
      // queue_mu_ is released: it wakes for the first write of a group and
      // again when the group is full, whatever batch_interval is left.
      queue_.push_back(std::move(write));
      return;
    }
  }
  write.done(MakeError(Error::kStopped));
}

bool KvStore::Enqueue(WriteRequest& write, bool direct, bool caller_waits) {
  std::vector<WriteRequest> group;
  {
    util::MutexLock l(&queue_mu_);
    if (direct && !direct_) return false;
    if (!stopping_) {
      queue_.push_back(std::move(write));
      // The holder of the committer's part takes it with its next group;
      // without inline commits, the committer thread wakes for it.
      if (committing_ || !options_.inline_commit ||
          options_.batch_interval > absl::ZeroDuration()) {
        return true;
      }
      committing_ = true;
      TakeGroupLocked(&group);
    }
  }
  if (group.empty()) {
    write.done(MakeError(Error::kStopped));
    return true;
  }
  CommitHere(std::move(group), caller_waits);
  return true;
}

bool KvStore::QueueIdleLocked() const { return queue_.empty() && !committing_; }

bool KvStore::CommitterMayTakeLocked() const {
  return !committing_ && (stopping_ || !queue_.empty());
}

bool KvStore::GroupFullLocked() const {
  return stopping_ || static_cast<int>(queue_.size()) >= options_.batch_limit;
}

void KvStore::TakeGroupLocked(std::vector<WriteRequest>* group) {
  const size_t n = std::min(queue_.size(), static_cast<size_t>(options_.batch_limit));
  for (size_t i = 0; i < n; ++i) {
    group->push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
}

bool KvStore::NextGroup(std::vector<WriteRequest>* group) {
  util::MutexLock l(&queue_mu_);
  queue_mu_.AwaitWithTimeout(absl::Condition(this, &KvStore::CommitterMayTakeLocked),
                             absl::InfiniteDuration());
  if (queue_.empty() && stopping_) return false;
  committing_ = true;
  if (options_.batch_interval > absl::ZeroDuration() && !GroupFullLocked()) {
    // Let the group grow for at most batch_interval.
    if (group_wait_hook_) group_wait_hook_();
    queue_mu_.AwaitWithTimeout(absl::Condition(this, &KvStore::GroupFullLocked),
                               options_.batch_interval);
  }
  TakeGroupLocked(group);
  return true;
}

void KvStore::CommitHere(std::vector<WriteRequest> group, bool caller_waits) {
  std::vector<Answer> answers;
  for (;;) {
    RunGroup(&group, &answers);
    group.clear();
    bool more;
    {
      util::MutexLock l(&queue_mu_);
      // A caller waiting for its own write goes back to it once that is
      // answered: what is queued then wakes the committer thread.
      more = !queue_.empty() && !caller_waits;
      if (more) {
        TakeGroupLocked(&group);
      } else {
        // Handed back before answering: a write submitted by an answer
        // (or by anyone meanwhile) is committed by its own thread or the
        // committer thread, and the store may be gone once the part is
        // handed back and the queue is empty, so nothing below touches it.
        committing_ = false;
      }
    }
    for (auto& a : answers) a.done(std::move(a.status));
    answers.clear();
    if (!more) return;
  }
}

void KvStore::RunGroup(std::vector<WriteRequest>* group, std::vector<Answer>* answers) {
  if (has_before_apply_hook_.load(std::memory_order_acquire)) {
    std::function<void()> hook;
    {
      util::MutexLock l(&queue_mu_);
      hook = before_apply_hook_;
    }
    if (hook) hook();
  }
  CommitGroup(group, answers);
}

void KvStore::TEST_SetGroupWaitHook(std::function<void()> hook) {
  util::MutexLock l(&queue_mu_);
  group_wait_hook_ = std::move(hook);
}

void KvStore::TEST_SetBeforeApplyHook(std::function<void()> hook) {
  util::MutexLock l(&queue_mu_);
  has_before_apply_hook_.store(hook != nullptr, std::memory_order_release);
  before_apply_hook_ = std::move(hook);
}

void KvStore::CommitLoop() {
  std::vector<WriteRequest> group;
  while (NextGroup(&group)) {
    RunGroup(&group, nullptr);
    group.clear();
    util::MutexLock l(&queue_mu_);
    committing_ = false;
  }
}

void KvStore::DeliverAnswers(std::vector<Answer>* answers) {
  // A group this small is answered at once when nothing is queued before
  // it: a thread hand-off would cost more than the answers.
  constexpr size_t kInlineAnswers = 2;
  {
    util::MutexLock l(&answer_mu_);
    if (answers->size() > kInlineAnswers || answering_ || !answers_.empty()) {
      for (auto& a : *answers) answers_.push_back(std::move(a));
      answers->clear();
      return;
    }
  }
  for (auto& a : *answers) a.done(std::move(a.status));
  answers->clear();
}

void KvStore::AnswerLoop() {
  std::vector<Answer> batch;
  for (;;) {
    {
      util::MutexLock l(&answer_mu_);
      answering_ = false;
      answer_mu_.AwaitWithTimeout(absl::Condition(this, &KvStore::AnswersReadyLocked),
                                  absl::InfiniteDuration());
      if (answers_.empty()) return;  // closed, and everything answered
      batch.swap(answers_);
      answering_ = true;
    }
    for (auto& a : batch) a.done(std::move(a.status));
    batch.clear();
  }
}

template <typename Op>
absl::StatusOr<std::remove_const_t<std::remove_pointer_t<decltype(Op::response)>>>
KvStore::SubmitAndWait(const std::remove_pointer_t<decltype(Op::request)>& req) {
  std::remove_pointer_t<decltype(Op::response)> resp;
  std::promise<absl::Status> done;
  Route({Op{&req, &resp}, [&done](absl::Status s) { done.set_value(s); }}, /*caller_waits=*/true);
  if (auto s = done.get_future().get(); !s.ok()) return s;
  return resp;
}

absl::StatusOr<etcdserverpb::PutResponse> KvStore::Put(const etcdserverpb::PutRequest& req) {
  return SubmitAndWait<PutOp>(req);
}

absl::StatusOr<etcdserverpb::DeleteRangeResponse> KvStore::DeleteRange(
    const etcdserverpb::DeleteRangeRequest& req) {
  return SubmitAndWait<DeleteRangeOp>(req);
}

absl::StatusOr<etcdserverpb::TxnResponse> KvStore::Txn(const etcdserverpb::TxnRequest& req) {
  return SubmitAndWait<TxnOp>(req);
}

absl::StatusOr<etcdserverpb::CompactionResponse> KvStore::Compact(
    const etcdserverpb::CompactionRequest& req) {
  return SubmitAndWait<CompactOp>(req);
}

absl::StatusOr<etcdserverpb::LeaseGrantResponse> KvStore::LeaseGrant(
    const etcdserverpb::LeaseGrantRequest& req) {
  return SubmitAndWait<LeaseGrantOp>(req);
}

absl::StatusOr<etcdserverpb::LeaseRevokeResponse> KvStore::LeaseRevoke(
    const etcdserverpb::LeaseRevokeRequest& req) {
  return SubmitAndWait<LeaseRevokeOp>(req);
}

absl::StatusOr<etcdserverpb::AlarmResponse> KvStore::Alarm(const etcdserverpb::AlarmRequest& req) {
  return SubmitAndWait<AlarmOp>(req);
}

void KvStore::LeaseExpiryLoop() {
  // Revocations allowed per check, from the per-second rate.
  const size_t per_check = static_cast<size_t>(std::max<int64_t>(
      1, options_.lease_revoke_rate * absl::ToInt64Milliseconds(options_.lease_check_interval) / 1000));
  for (;;) {
    {
      util::MutexLock l(&queue_mu_);
      queue_mu_.AwaitWithTimeout(absl::Condition(this, &KvStore::StoppingLocked),
                                 options_.lease_check_interval);
      if (stopping_) return;
    }
    WriteLog* log = write_log_.load(std::memory_order_acquire);
    if (log == nullptr && options_.requires_write_log) continue;
    if (log == nullptr) log = this;
    if (!log->Leads()) continue;
    std::vector<int64_t> expired = lessor_.Expired(per_check);
    if (expired.empty()) continue;
    // Only a member that still leads revokes (etcd's ensureLeadership): a
    // leader that was paused or cut off finds its leases expired by its own
    // clock, while the new leader has kept them alive; its revocation,
    // forwarded once it follows, would take a lease the client was told it
    // holds. A ReadIndex round confirms the leadership; the leases are read
    // again after it, since a renewal may have come meanwhile.
    // The revocations are proposed only by the leader of the term confirmed
    // (WriteRequest::leader_term), never forwarded.
    const uint64_t term = log->LeaderTerm();
    std::promise<absl::Status> confirmed;
    std::future<absl::Status> leads = confirmed.get_future();
    log->ReadBarrier([&confirmed](absl::Status s) { confirmed.set_value(std::move(s)); });
    if (!leads.get().ok() || !log->Leads() || log->LeaderTerm() != term) continue;
    for (int64_t id : lessor_.Expired(per_check)) {
      auto req = std::make_shared<etcdserverpb::LeaseRevokeRequest>();
      req->set_id(id);
      auto resp = std::make_shared<etcdserverpb::LeaseRevokeResponse>();
      WriteRequest w{LeaseRevokeOp{req.get(), resp.get()}, [this, req, resp](absl::Status s) {
                       if (s.ok()) stat_leases_expired_.fetch_add(1, std::memory_order_relaxed);
                     }};
      w.leader_term = term;
      // etcd revokes as root: permitted whoever's keys the lease holds.
      w.caller = RootCaller();
      log->Submit(std::move(w));
    }
  }
}

void KvStore::FailStop(const absl::Status& cause, std::string_view what) {
  if (failed_) return;
  failed_ = true;
  storage_error_ = cause;
  const bool no_space = absl::IsResourceExhausted(cause);
  SPDLOG_CRITICAL(
      "storage failure: {}: {}; the store stops accepting writes (fail-stop): every later write "
      "is refused{}, reads keep serving the last durable revision {}; restart to recover",
      what, cause.ToString(), no_space ? " with the NOSPACE alarm (disk full)" : "",
      View()->rev);
  util::MutexLock l(&alarm_mu_);
  storage_failure_ = cause;
  if (no_space && !std::any_of(alarms_.begin(), alarms_.end(), [](const auto& a) {
        return a.alarm() == etcdserverpb::NOSPACE;
      })) {
    etcdserverpb::AlarmMember m;
    m.set_memberid(options_.member_id);
    m.set_alarm(etcdserverpb::NOSPACE);
    alarms_.push_back(m);
    AlarmsChangedLocked();
  }
}

absl::Status KvStore::FailedWriteError() const {
  return absl::IsResourceExhausted(storage_error_) ? MakeError(Error::kNoSpace)
                                                   : MakeError(Error::kStorageFailed);
}

absl::Status KvStore::StorageFailure() const {
  util::MutexLock l(&alarm_mu_);
  return storage_failure_;
}

KvStore::Stats KvStore::GetStats() const {
  Stats s;
  s.puts = stat_puts_.load(std::memory_order_relaxed);
  s.deletes = stat_deletes_.load(std::memory_order_relaxed);
  s.txns = stat_txns_.load(std::memory_order_relaxed);
  s.ranges = stat_ranges_.load(std::memory_order_relaxed);
  s.groups = stat_groups_.load(std::memory_order_relaxed);
  s.group_writes = stat_group_writes_.load(std::memory_order_relaxed);
  s.lease_grants = stat_lease_grants_.load(std::memory_order_relaxed);
  s.lease_revokes = stat_lease_revokes_.load(std::memory_order_relaxed);
  s.lease_renewals = lessor_.renewed();
  s.leases_expired = stat_leases_expired_.load(std::memory_order_relaxed);
  s.keys = View()->index.live();
  return s;
}

}  // namespace capstan::mvcc
