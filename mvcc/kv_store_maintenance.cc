// Maintenance on the KV store: HashKV and Hash, alarms and the backend quota.

#include <algorithm>
#include <chrono>

#include "absl/cleanup/cleanup.h"

#include "mvcc/errors.h"
#include "mvcc/kv_hash.h"
#include "mvcc/kv_store.h"
#include "mvcc/revision_key.h"
#include "util/crc32c.h"

namespace capstan::mvcc {

using etcdserverpb::AlarmMember;
using etcdserverpb::AlarmRequest;
using etcdserverpb::AlarmType;
using storage::Cf;

absl::Status KvStore::HashKV(int64_t rev, uint32_t* hash, int64_t* compact_rev,
                             int64_t* hash_rev) const {
  // A compaction at exactly rev that stored its hash answers it, whatever
  // compactions came after (etcd's hashStorage.HashByRev; rev 0 too, which
  // only a compaction at 0 stores).
  {
    util::MutexLock l(&compact_mu_);
    for (const CompactionHash& h : compaction_hashes_) {
      if (h.rev != rev) continue;
      *hash = h.hash;
      *compact_rev = h.compact_rev;
      *hash_rev = h.rev;
      return absl::OkStatus();
    }
  }
  const auto start = std::chrono::steady_clock::now();
  auto observe = absl::MakeCleanup([this, start] {
    maintenance_timings_.hash_rev_seconds.Record(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  });
  // The view pins the revisions it can see against physical compaction.
  auto view = View();
  if (rev > 0 && rev < view->compact_rev) return MakeError(Error::kCompacted);
  if (rev > view->rev) return MakeError(Error::kFutureRev);
  if (rev == 0) rev = view->rev;
  // etcd's compaction revision is -1 until the first compaction.
  *compact_rev = view->compacted ? view->compact_rev : -1;
  *hash_rev = rev;
  KvHasher hasher;
  // etcd hashes no record below a negative revision.
  if (rev < 0) {
    *hash = hasher.hash();
    return absl::OkStatus();
  }
  index::RevisionSet keep;
  // As etcd's hashByRev: the revisions a compaction at `rev` would keep.
  if (view->compact_rev > 0) view->index.Keep(rev, &keep);

  const std::string upper = RevisionKey(Revision{rev + 1, 0});
  auto it = backend_->NewIterator(Cf::kKey);
  for (it->SeekToFirst(); it->Valid() && it->key() < upper; it->Next()) {
    Revision r;
    bool tombstone;
    if (!ParseRevisionKey(it->key(), &r, &tombstone)) continue;
    if (HashCovers(r, tombstone, view->compact_rev, keep)) hasher.Add(it->key(), it->value());
  }
  if (auto s = it->status(); !s.ok()) return s;
  *hash = hasher.hash();
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> KvStore::Hash() const {
  const auto start = std::chrono::steady_clock::now();
  auto observe = absl::MakeCleanup([this, start] {
    maintenance_timings_.hash_seconds.Record(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  });
  auto view = View();
  uint32_t h = 0;
  for (Cf cf : {Cf::kKey, Cf::kMeta, Cf::kLease, Cf::kAuth, Cf::kAlarm}) {
    auto it = backend_->NewIterator(cf);
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      h = util::Crc32cExtend(h, it->key());
      h = util::Crc32cExtend(h, it->value());
    }
    if (auto s = it->status(); !s.ok()) return s;
  }
  return h;
}

absl::Status KvStore::Defragment() {
  maintenance_timings_.defrags_running.fetch_add(1, std::memory_order_relaxed);
  const auto start = std::chrono::steady_clock::now();
  absl::Status s = backend_->CompactAll();
  maintenance_timings_.defrag_seconds.Record(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  maintenance_timings_.defrags_running.fetch_sub(1, std::memory_order_relaxed);
  return s;
}

std::vector<AlarmMember> KvStore::Alarms() const {
  util::MutexLock l(&alarm_mu_);
  return alarms_;
}

bool KvStore::Corrupt() const { return corrupt_alarm_.load(std::memory_order_acquire); }

bool KvStore::NoSpace() const { return no_space_alarm_.load(std::memory_order_acquire); }

void KvStore::AlarmsChangedLocked() {
  bool no_space = false, corrupt = false;
  for (const AlarmMember& a : alarms_) {
    no_space = no_space || a.alarm() == etcdserverpb::NOSPACE;
    corrupt = corrupt || a.alarm() == etcdserverpb::CORRUPT;
  }
  no_space_alarm_.store(no_space, std::memory_order_release);
  corrupt_alarm_.store(corrupt, std::memory_order_release);
}

absl::Status KvStore::LoadAlarms() {
  std::vector<AlarmMember> loaded;
  auto it = backend_->NewIterator(Cf::kAlarm);
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    AlarmMember m;
    if (!m.ParseFromArray(it->key().data(), static_cast<int>(it->key().size()))) {
      return absl::DataLossError("alarm family holds a corrupt record");
    }
    loaded.push_back(m);
  }
  if (auto s = it->status(); !s.ok()) return s;
  util::MutexLock l(&alarm_mu_);
  alarms_ = std::move(loaded);
  AlarmsChangedLocked();
  return absl::OkStatus();
}

absl::Status KvStore::ApplyAlarm(const AlarmRequest& req, etcdserverpb::AlarmResponse* resp) {
  resp->mutable_header()->set_revision(current_rev_);
  util::MutexLock l(&alarm_mu_);
  auto match = [&req](const AlarmMember& a) {
    return a.memberid() == req.memberid() && a.alarm() == req.alarm();
  };
  switch (req.action()) {
    case AlarmRequest::GET:
      for (const auto& a : alarms_) {
        if (req.alarm() == etcdserverpb::NONE || a.alarm() == req.alarm()) *resp->add_alarms() = a;
      }
      break;
    case AlarmRequest::ACTIVATE: {
      // etcd 3.5 raises no alarm of type NONE (3.4 stored it).
      if (req.alarm() == etcdserverpb::NONE) break;
      // An alarm already active is answered as it stands (etcd's
      // AlarmStore.Activate returns the existing member).
      if (auto it = std::find_if(alarms_.begin(), alarms_.end(), match); it != alarms_.end()) {
        *resp->add_alarms() = *it;
        break;
      }
      AlarmMember m;
      m.set_memberid(req.memberid());
      m.set_alarm(req.alarm());
      batch_.Put(Cf::kAlarm, m.SerializeAsString(), "");
      alarms_.push_back(m);
      AlarmsChangedLocked();
      *resp->add_alarms() = m;
      break;
    }
    case AlarmRequest::DEACTIVATE: {
      auto it = std::find_if(alarms_.begin(), alarms_.end(), match);
      if (it == alarms_.end()) break;
      batch_.Delete(Cf::kAlarm, it->SerializeAsString());
      *resp->add_alarms() = *it;
      alarms_.erase(it);
      AlarmsChangedLocked();
      break;
    }
    default:
      break;
  }
  return absl::OkStatus();
}

namespace {

// What a write adds to the backend, roughly; 0 for writes that only
// delete. Mirrors etcd's quota cost: the request plus per-key overhead.
constexpr int64_t kKeyOverhead = 256;

int64_t TxnCost(const etcdserverpb::TxnRequest& txn) {
  int64_t cost = 0;
  for (const auto* ops : {&txn.success(), &txn.failure()}) {
    for (const auto& op : *ops) {
      if (op.has_request_put()) cost += op.request_put().ByteSizeLong() + kKeyOverhead;
      if (op.has_request_txn()) cost += TxnCost(op.request_txn());
    }
  }
  return cost;
}

int64_t WriteCost(const WriteOp& op) {
  if (const auto* put = std::get_if<PutOp>(&op)) {
    return static_cast<int64_t>(put->request->ByteSizeLong()) + kKeyOverhead;
  }
  if (std::holds_alternative<LeaseGrantOp>(op)) return 64;
  if (const auto* txn = std::get_if<TxnOp>(&op)) return TxnCost(*txn->request);
  return 0;
}

}  // namespace

absl::Status KvStore::CheckQuota(const WriteRequest& w, int64_t backend_size,
                                 int64_t* group_cost) {
  const int64_t cost = WriteCost(w.op);
  if (cost == 0) return absl::OkStatus();
  if (NoSpace()) return MakeError(Error::kNoSpace);
  // A committed entry is refused only by the replicated alarm: backend
  // sizes differ between members, so the size was checked where the write
  // arrived (RefusedOverQuota).
  if (w.raft_index != 0 || options_.quota_bytes <= 0) return absl::OkStatus();
  if (backend_size + *group_cost + cost <= options_.quota_bytes) {
    *group_cost += cost;
    return absl::OkStatus();
  }
  AlarmRequest raise;
  raise.set_action(AlarmRequest::ACTIVATE);
  raise.set_memberid(options_.member_id);
  raise.set_alarm(etcdserverpb::NOSPACE);
  etcdserverpb::AlarmResponse unused;
  ApplyAlarm(raise, &unused).IgnoreError();
  return MakeError(Error::kNoSpace);
}

bool KvStore::RefusedOverQuota(WriteRequest* w, WriteLog* log) {
  if (options_.quota_bytes <= 0) return false;
  const int64_t cost = WriteCost(w->op);
  if (cost == 0 || backend_size_.load(std::memory_order_relaxed) + cost <= options_.quota_bytes) {
    return false;
  }
  if (!NoSpace()) {
    // etcd's quotaKVServer: the alarm goes through the log, so that every
    // member refuses the same writes from its commit on.
    auto raise = std::make_shared<AlarmRequest>();
    raise->set_action(AlarmRequest::ACTIVATE);
    raise->set_memberid(options_.member_id);
    raise->set_alarm(etcdserverpb::NOSPACE);
    auto unused = std::make_shared<etcdserverpb::AlarmResponse>();
    log->Submit({AlarmOp{raise.get(), unused.get()}, [raise, unused](absl::Status) {}});
  }
  w->done(MakeError(Error::kNoSpace));
  return true;
}

}  // namespace capstan::mvcc
