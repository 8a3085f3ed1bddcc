// KvStore::Restore: a member's store replaced by a checkpoint of another
// member's (a Raft snapshot installed on a follower behind the leader's log).
//
// The backend object stays (services, metrics and the auth store hold it);
// its data becomes the checkpoint's by Backend::ReplaceWith: the
// checkpoint's directory is synced and swapped with the backend's in one
// rename, and the backend reopens on it, so installing 8 GiB costs a sync
// and an open, not a rewrite of 8 GiB. A read that began before keeps the
// old database until it ends. Reads made afterwards through a view
// published before read the new data: records present in both are
// byte-identical for revisions both stores applied (apply is
// deterministic), so such a reader only ever loses revisions the
// checkpoint no longer holds (compacted away there), which it then reports
// as it reports a compacted revision.
//
// Crash safety (docs/REPLICATION.md): up to the rename the backend's
// directory holds the old data, after it the checkpoint's, each whole; the
// applied index stored in the data then tells the replicator which one a
// restarted member has.
//
// A backend that cannot swap (another file system, a read-only one) is
// made equal to the checkpoint family by family instead: a merge of both
// sorted families writes what differs and deletes what the checkpoint
// lacks, in bounded batches, then one synced flush.

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "mvcc/errors.h"
#include "mvcc/kv_store.h"
#include "mvcc/watch_hub.h"
#include "spdlog/spdlog.h"

namespace capstan::mvcc {

using storage::Cf;

namespace {

// Bytes staged per batch of the copy.
constexpr size_t kRestoreBatchBytes = 4 << 20;

// Makes family cf of dst equal to src's.
absl::Status CopyFamily(storage::Backend* src, storage::Backend* dst, Cf cf, uint64_t* written) {
  auto from = src->NewIterator(cf);
  auto to = dst->NewIterator(cf);
  storage::WriteBatch batch;
  batch.set_sync(false);
  auto flush = [&]() -> absl::Status {
    if (batch.Count() == 0) return absl::OkStatus();
    *written += batch.Count();
    absl::Status s = dst->Write(&batch);
    batch.Clear();
    batch.set_sync(false);
    return s;
  };
  from->SeekToFirst();
  to->SeekToFirst();
  while (from->Valid() || to->Valid()) {
    if (to->Valid() && (!from->Valid() || to->key() < from->key())) {
      batch.Delete(cf, to->key());
      to->Next();
    } else if (from->Valid() && (!to->Valid() || from->key() < to->key())) {
      batch.Put(cf, from->key(), from->value());
      from->Next();
    } else {
      if (from->value() != to->value()) batch.Put(cf, from->key(), from->value());
      from->Next();
      to->Next();
    }
    if (batch.ByteSize() >= kRestoreBatchBytes) {
      if (auto s = flush(); !s.ok()) return s;
    }
  }
  if (auto s = from->status(); !s.ok()) return s;
  if (auto s = to->status(); !s.ok()) return s;
  return flush();
}

}  // namespace

absl::Status KvStore::Restore(std::unique_ptr<storage::Backend> source,
                              std::function<absl::Status()> after) {
  // A physical compaction computed from the old index must not delete from
  // the new data: let the scheduled ones finish first. Nothing schedules a
  // new one meanwhile (the caller submits nothing).
  WaitCompactionDone();
  absl::Status result = MakeError(Error::kStopped);
  // Two steps on the committer: the first ends the group that holds every
  // write submitted before, the second then runs alone between groups.
  RunOnCommitter([] {});
  RunOnCommitter([this, &source, &after, &result] {
    result = RestoreOnCommitter(std::move(source));
    if (result.ok() && after) result = after();
  });
  return result;
}

absl::Status KvStore::RestoreOnCommitter(std::unique_ptr<storage::Backend> source) {
  if (failed_) return storage_error_;
  const int64_t old_rev = current_rev_;
  const absl::Time start = absl::Now();
  // The checkpoint's files change hands: nothing may hold them open.
  const storage::BackendOptions source_options = source->options();
  source.reset();
  std::string how = "swapped in";
  absl::Status swapped = backend_->ReplaceWith(source_options.dir);
  if (absl::IsUnimplemented(swapped)) {
    SPDLOG_INFO("copying the snapshot record by record: {}", swapped.ToString());
    auto reopened = storage::Backend::Open(source_options);
    if (!reopened.ok()) {
      FailStop(reopened.status(), "opening a snapshot");
      return reopened.status();
    }
    uint64_t written = 0;
    for (Cf cf : {Cf::kKey, Cf::kMeta, Cf::kLease, Cf::kAuth, Cf::kAlarm}) {
      if (auto s = CopyFamily(reopened->get(), backend_.get(), cf, &written); !s.ok()) {
        FailStop(s, "restoring a snapshot");
        return s;
      }
    }
    swapped = backend_->Flush();
    how = absl::StrCat("copied (", written, " records written)");
  }
  if (!swapped.ok()) {
    FailStop(swapped, "restoring a snapshot");
    return swapped;
  }
  const absl::Duration installed = absl::Now() - start;
  // The in-memory state, rebuilt from the new data as Open does.
  for (int64_t id : lessor_.List()) lessor_.Revoke(id);
  index_ = std::make_unique<index::TreeIndex>();
  current_rev_ = 1;
  compact_rev_ = 0;
  pending_.clear();
  {
    util::MutexLock l(&compact_mu_);
    compact_requested_ = -1;
    compact_finished_ = -1;
    compact_resumed_ = -1;
    compact_jobs_.clear();
    compaction_hashes_.clear();
  }
  if (auto s = Recover(); !s.ok()) {
    FailStop(s, "rebuilding the store from a snapshot");
    return s;
  }
  // Readers of older views keep the epoch they hold; a new one starts here.
  epoch_ = std::make_shared<Epoch>();
  backend_size_at_ = absl::InfinitePast();
  Publish();
  if (WatchHub* hub = hub_.load(std::memory_order_acquire)) {
    // Every watcher catches up from the new data, from the first revision
    // it had not seen (cancelled as compacted when that is gone).
    hub->Resync(old_rev + 1, current_rev_);
  }
  if (WriteLog* log = write_log_.load(std::memory_order_acquire)) log->Applied(AppliedIndex());
  SPDLOG_INFO("restored the store from a snapshot: data {} in {}, rebuilt in {}, revision {} -> "
              "{}, applied index {}",
              how, absl::FormatDuration(installed),
              absl::FormatDuration(absl::Now() - start - installed), old_rev, current_rev_,
              AppliedIndex());
  return absl::OkStatus();
}

}  // namespace capstan::mvcc
