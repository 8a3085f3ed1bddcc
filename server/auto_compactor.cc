#include "server/auto_compactor.h"

#include <utility>

#include "spdlog/spdlog.h"

namespace capstan::server {

AutoCompactor::AutoCompactor(mvcc::KvStore* store, absl::Duration period, int64_t revisions,
                             absl::Duration revision_check_interval)
    : store_(store),
      period_(period),
      revisions_(revisions),
      revision_check_interval_(revision_check_interval) {
  thread_ = std::thread([this] { Run(); });
}

AutoCompactor::~AutoCompactor() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void AutoCompactor::Compact(int64_t rev) {
  if (rev <= store_->CompactRev()) return;
  etcdserverpb::CompactionRequest req;
  req.set_revision(rev);
  auto resp = store_->Compact(req);
  if (resp.ok()) {
    spdlog::info("auto compaction: compacted to revision {}", rev);
  } else {
    spdlog::warn("auto compaction to revision {} failed: {}", rev,
                 std::string(resp.status().message()));
  }
}

void AutoCompactor::Run() {
  const bool periodic = period_ > absl::ZeroDuration();
  const absl::Duration tick = periodic ? period_ / 10 : revision_check_interval_;
  // Periodic mode: revisions sampled each tick; the oldest one leaves the
  // window once it is `period_` old.
  std::deque<std::pair<absl::Time, int64_t>> samples;
  for (;;) {
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, absl::ToChronoNanoseconds(tick), [this] { return stopping_; });
      if (stopping_) return;
    }
    const absl::Time now = absl::Now();
    const int64_t rev = store_->Rev();
    if (!periodic) {
      Compact(rev - revisions_);
      continue;
    }
    samples.emplace_back(now, rev);
    int64_t target = 0;
    while (!samples.empty() && now - samples.front().first >= period_) {
      target = samples.front().second;
      samples.pop_front();
    }
    if (target > 0) Compact(target);
  }
}

}  // namespace capstan::server
