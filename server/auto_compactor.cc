#include "server/auto_compactor.h"

#include <algorithm>
#include <utility>

#include "spdlog/spdlog.h"
#include "util/thread_name.h"

namespace capstan::server {

PeriodicCompactionSchedule::PeriodicCompactionSchedule(absl::Duration period, absl::Time start)
    : check_interval_(std::max(std::min(period, absl::Hours(1)) / 10, absl::Nanoseconds(1))),
      compact_interval_(std::min(period, absl::Hours(1))),
      retained_(static_cast<size_t>(period / check_interval_) + 1),
      last_success_(start),
      wait_(period) {}

void PeriodicCompactionSchedule::Sample(int64_t rev) {
  revs_.push_back(rev);
  if (revs_.size() > retained_) revs_.pop_front();
}

std::optional<int64_t> PeriodicCompactionSchedule::Due(absl::Time now) {
  if (revs_.empty() || now - last_success_ < wait_) return std::nullopt;
  // After the first compaction (due `period` after start), one every
  // compact_interval, retried each check until one succeeds.
  wait_ = compact_interval_;
  return revs_.front();
}

void PeriodicCompactionSchedule::Compacted(absl::Time now) { last_success_ = now; }

AutoCompactor::AutoCompactor(mvcc::KvStore* store, absl::Duration period, int64_t revisions,
                             absl::Duration revision_check_interval)
    : store_(store),
      period_(period),
      revisions_(revisions),
      revision_check_interval_(revision_check_interval) {
  thread_ = NamedThread("auto-compact", [this] { Run(); });
}

AutoCompactor::~AutoCompactor() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool AutoCompactor::Compact(int64_t rev) {
  if (rev <= store_->CompactRev()) return true;
  // In a cluster only the leader compacts (etcd pauses the compactor of a
  // follower); the compaction is an entry of the log, applied everywhere.
  if (!store_->Leads()) return false;
  etcdserverpb::CompactionRequest req;
  req.set_revision(rev);
  auto resp = store_->Compact(req);
  if (resp.ok()) {
    SPDLOG_INFO("auto compaction: compacted to revision {}", rev);
    return true;
  }
  if (rev <= store_->CompactRev()) return true;  // compacted meanwhile
  SPDLOG_WARN("auto compaction to revision {} failed: {}", rev,
               std::string(resp.status().message()));
  return false;
}

bool AutoCompactor::Wait(absl::Duration d) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait_for(l, absl::ToChronoNanoseconds(d), [this] { return stopping_; });
  return !stopping_;
}

void AutoCompactor::Run() {
  if (period_ > absl::ZeroDuration()) {
    RunPeriodic();
  } else {
    RunRevision();
  }
}

void AutoCompactor::RunPeriodic() {
  PeriodicCompactionSchedule schedule(period_, absl::Now());
  for (;;) {
    schedule.Sample(store_->Rev());
    if (!Wait(schedule.check_interval())) return;
    const std::optional<int64_t> target = schedule.Due(absl::Now());
    if (target && Compact(*target)) schedule.Compacted(absl::Now());
  }
}

void AutoCompactor::RunRevision() {
  while (Wait(revision_check_interval_)) {
    const int64_t target = store_->Rev() - revisions_;
    if (target > 0) Compact(target);
  }
}

}  // namespace capstan::server
