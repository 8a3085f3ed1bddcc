// Compaction: scheduling on the committer, then index compaction in batches
// and deletion of compacted revisions from the backend on the compactor
// thread. Neither step holds a lock while it traverses the index.

#include <algorithm>
#include <chrono>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "mvcc/errors.h"
#include "mvcc/kv_hash.h"
#include "mvcc/kv_store.h"
#include "mvcc/meta_keys.h"
#include "mvcc/revision_key.h"

namespace capstan::mvcc {

using storage::Cf;

absl::Status KvStore::ApplyCompact(const etcdserverpb::CompactionRequest& req,
                                   etcdserverpb::CompactionResponse* resp) {
  const int64_t rev = req.revision();
  // etcd's compactMainRev is -1 until the first compaction: a store never
  // compacted takes a compaction at 0, and refuses it from then on.
  if (rev < compact_rev_ || (rev == compact_rev_ && compacted_)) {
    return MakeError(Error::kCompacted);
  }
  if (rev > current_rev_) return MakeError(Error::kFutureRev);
  batch_.Put(Cf::kMeta, kScheduledCompactKey, EncodeMetaRevision(rev));
  {
    // etcd's Compact stores this compaction's hash unless the one before it
    // was interrupted (a restart cut it short: its hash would not cover
    // every revision from that compaction on). etcd tells by the one before
    // having finished (scheduled == finished) when this one is applied, so
    // that one still running counts as interrupted: whether a hash is stored
    // then depends on how fast the compactor was. Capstan's compactor runs
    // the jobs in order, so a job scheduled in this process has finished
    // before the next one hashes; only the one an Open resumed is skipped,
    // until it finishes.
    util::MutexLock l(&compact_mu_);
    const bool after_interrupted =
        compact_rev_ == compact_resumed_ && compact_finished_ < compact_rev_;
    compact_jobs_[rev] = CompactionJob{compacted_ ? compact_rev_ : -1, !after_interrupted};
  }
  compact_rev_ = rev;
  compacted_ = true;
  // Views published from now on belong to a new epoch; the compactor waits
  // for the readers of the old one.
  auto next = std::make_shared<Epoch>();
  epoch_->next = next;
  compaction_barrier_ = std::move(epoch_);
  epoch_ = std::move(next);
  resp->mutable_header()->set_revision(current_rev_);
  return absl::OkStatus();
}

void KvStore::RunOnCommitter(absl::AnyInvocable<void()> fn) {
  std::promise<void> ran;
  WriteRequest w{InternalOp{[&fn, &ran] {
    fn();
    ran.set_value();
  }}};
  {
    util::MutexLock l(&queue_mu_);
    if (stopping_) return;
    queue_.push_back(std::move(w));
  }
  ran.get_future().wait();
}

void KvStore::CompactionLoop() {
  while (RunNextCompaction()) {
  }
  TestSyncPoint("KvStore::CompactionLoop:Exit");
}

bool KvStore::RunNextCompaction() {
  int64_t rev;
  std::weak_ptr<Epoch> barrier;
  {
    util::MutexLock l(&compact_mu_);
    compact_mu_.AwaitWithTimeout(absl::Condition(this, &KvStore::CompactionWorkLocked),
                                 absl::InfiniteDuration());
    if (compact_exit_) return false;
    // Each scheduled compaction in turn, up to the newest.
    rev = compact_requested_;
    for (const auto& [job_rev, job] : compact_jobs_) {
      if (job_rev > compact_finished_ && job_rev < rev) {
        rev = job_rev;
        break;
      }
    }
    barrier = compact_epoch_;
  }
  // Readers that began before the compaction was scheduled may still read
  // revisions it removes; wait for them to finish.
  while (!barrier.expired()) {
    {
      util::MutexLock l(&compact_mu_);
      if (compact_exit_) return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // A compaction cut short by the store's stop is not run again here: the
  // committer takes no more index batches, and a second pass would start
  // from an index compacted in part. The next Open resumes it.
  return RunCompaction(rev);
}

bool KvStore::RunCompaction(int64_t rev) {
  TestSyncPoint("KvStore::RunCompaction:Start");
  // The job the committer scheduled; a compaction resumed at start-up has
  // none and stores no hash (etcd: the one before it had not finished).
  CompactionJob job;
  {
    util::MutexLock l(&compact_mu_);
    if (auto it = compact_jobs_.find(rev); it != compact_jobs_.end()) job = it->second;
    compact_jobs_.erase(compact_jobs_.begin(), compact_jobs_.upper_bound(rev));
  }

  // 1. What the backend keeps: etcd's treeIndex.Compact's `available`, the
  // revision each key keeps, a tombstone at rev included, from the view
  // published after the compaction was scheduled (later writes add only
  // revisions above rev, which change none of it). Retained gives the same
  // answer on a key compacted at rev as on one not yet compacted; Keep would
  // leave out such a key's tombstone at rev, and the backend would lose it.
  using Clock = std::chrono::steady_clock;
  auto whole_ms = [](Clock::duration d) {
    return static_cast<double>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
  };
  index::RevisionSet keep;
  const std::shared_ptr<const ReadView> before = View();
  before->index.Retained(rev, &keep);
  // Then the key index, in batches on the committer between write groups.
  const std::vector<std::string> keys = before->index.KeysToCompact(rev);
  const size_t step = static_cast<size_t>(std::max(1, options_.compaction_batch_limit));
  // The writes' pause: the batches' time on the committer.
  Clock::duration index_pause{};
  for (size_t i = 0; i < keys.size(); i += step) {
    std::span<const std::string> batch(keys.data() + i, std::min(step, keys.size() - i));
    RunOnCommitter([this, batch, rev, &index_pause] {
      const Clock::time_point start = Clock::now();
      index_->CompactKeys(batch, rev, nullptr);
      index_pause += Clock::now() - start;
    });
    TestSyncPoint("KvStore::RunCompaction:AfterIndexBatch");
    {
      util::MutexLock l(&queue_mu_);
      if (stopping_) return false;
    }
  }

  maintenance_timings_.index_compaction_pause_ms.Record(whole_ms(index_pause));
  // etcd times the backend's part alone, and a pause for each full batch
  // (not the last, which also records the compaction as finished).
  const Clock::time_point backend_start = Clock::now();

  // 2. The backend: every revision at or below rev that the index no longer
  // keeps, in batches with a pause between them so writes keep flowing. On
  // the way, etcd's kvHasher over what the compaction reads, from the
  // previous compaction on (kv_hash.h).
  KvHasher hasher;
  const std::string end = RevisionKey(Revision{rev + 1, 0});
  auto it = backend_->NewIterator(Cf::kKey);
  storage::WriteBatch batch;
  // As the committer's batches (kv_store_apply.cc): a store that replays a
  // write log after a crash keeps its whole state to one flushed prefix.
  batch.set_wal(SelfDurable());
  int64_t deleted = 0;
  absl::Status status;
  for (it->SeekToFirst(); it->Valid() && it->key() < end; it->Next()) {
    Revision r;
    bool tombstone;
    if (!ParseRevisionKey(it->key(), &r, &tombstone)) continue;
    if (job.store_hash && HashCovers(r, tombstone, job.prev_rev, keep)) {
      hasher.Add(it->key(), it->value());
    }
    if (keep.contains(r)) continue;
    batch.Delete(Cf::kKey, it->key());
    if (batch.Count() >= options_.compaction_batch_limit) {
      deleted += batch.Count();
      const Clock::time_point start = Clock::now();
      status = backend_->Write(&batch);
      maintenance_timings_.db_compaction_pause_ms.Record(whole_ms(Clock::now() - start));
      batch.Clear();
      if (!status.ok()) break;
      std::this_thread::sleep_for(absl::ToChronoNanoseconds(options_.compaction_sleep_interval));
    }
  }
  if (status.ok()) status = it->status();
  it.reset();
  if (status.ok()) {
    deleted += batch.Count();
    batch.Put(Cf::kMeta, kFinishedCompactKey, EncodeMetaRevision(rev));
    status = backend_->Write(&batch);
  }
  maintenance_timings_.db_compaction_keys.fetch_add(static_cast<uint64_t>(deleted),
                                                    std::memory_order_relaxed);
  maintenance_timings_.db_compaction_total_ms.Record(whole_ms(Clock::now() - backend_start));
  maintenance_timings_.db_compaction_last.store(absl::ToUnixSeconds(absl::Now()),
                                                std::memory_order_relaxed);
  if (!status.ok()) {
    // A backend that failed a write is failed: stop accepting writes, answer
    // whoever waits for this compaction, and do not retry.
    RunOnCommitter([this, status, rev] {
      FailStop(status, absl::StrCat("compaction at revision ", rev, " failed"));
    });
    FailCompactionWaiters(MakeError(Error::kStorageFailed), /*stop=*/true);
    return true;  // no compaction runs any more (compact_stopped_)
  }
  std::vector<absl::AnyInvocable<void(absl::Status)>> done;
  {
    util::MutexLock l(&compact_mu_);
    // Stored before the compaction is answered, as etcd does. A compaction
    // at 0 (a store never compacted) stores the hash of no revision, which
    // etcd's HashKV at 0 answers, compact_revision -1, until a restart.
    if (job.store_hash) StoreCompactionHashLocked(CompactionHash{hasher.hash(), job.prev_rev, rev});
    compact_finished_ = std::max(compact_finished_, rev);
    for (auto it2 = compact_waiters_.begin(); it2 != compact_waiters_.end();) {
      if (it2->first <= compact_finished_) {
        done.push_back(std::move(it2->second));
        it2 = compact_waiters_.erase(it2);
      } else {
        ++it2;
      }
    }
  }
  for (auto& d : done) d(absl::OkStatus());
  return true;
}

void KvStore::TEST_SetCompactionSyncPoint(std::function<void(std::string_view point)> hook) {
  util::MutexLock l(&test_mu_);
  has_test_sync_point_.store(hook != nullptr, std::memory_order_relaxed);
  test_sync_point_ = std::move(hook);
}

void KvStore::TestSyncPoint(std::string_view point) {
  if (!has_test_sync_point_.load(std::memory_order_relaxed)) return;
  std::function<void(std::string_view)> hook;
  {
    util::MutexLock l(&test_mu_);
    hook = test_sync_point_;
  }
  if (hook) hook(point);
}

void KvStore::FailCompactionWaiters(const absl::Status& status, bool stop) {
  std::vector<absl::AnyInvocable<void(absl::Status)>> waiters;
  {
    util::MutexLock l(&compact_mu_);
    if (stop) compact_stopped_ = true;
    for (auto& [rev, done] : compact_waiters_) waiters.push_back(std::move(done));
    compact_waiters_.clear();
  }
  for (auto& d : waiters) d(status);
}

void KvStore::StoreCompactionHashLocked(const CompactionHash& hash) {
  compaction_hashes_.push_back(hash);
  std::sort(compaction_hashes_.begin(), compaction_hashes_.end(),
            [](const CompactionHash& a, const CompactionHash& b) { return a.rev < b.rev; });
  if (compaction_hashes_.size() > kStoredCompactionHashes) {
    compaction_hashes_.erase(compaction_hashes_.begin(),
                             compaction_hashes_.end() - kStoredCompactionHashes);
  }
}

bool KvStore::CompactionWorkLocked() const {
  return compact_exit_ || (!compact_stopped_ && compact_requested_ > compact_finished_);
}

void KvStore::WaitCompactionDone() {
  util::MutexLock l(&compact_mu_);
  compact_mu_.AwaitWithTimeout(absl::Condition(this, &KvStore::CompactionDoneLocked),
                               absl::InfiniteDuration());
}

bool KvStore::CompactionDoneLocked() const {
  return compact_exit_ || compact_stopped_ || compact_finished_ >= compact_requested_;
}

}  // namespace capstan::mvcc
