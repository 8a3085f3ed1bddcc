#include "lease/lessor.h"

#include <algorithm>
#include <chrono>

#include "util/check.h"
#include "util/coding.h"

namespace capstan::lease {

Lessor::Lessor(const Clock* clock) : clock_(clock) { CHECK(clock_ != nullptr); }

bool Lessor::Exists(int64_t id) const {
  util::ReaderMutexLock l(&mu_);
  return leases_.contains(id);
}

size_t Lessor::size() const {
  util::ReaderMutexLock l(&mu_);
  return leases_.size();
}

std::optional<Lessor::LeaseInfo> Lessor::Get(int64_t id, bool with_keys) const {
  util::ReaderMutexLock l(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) return std::nullopt;
  LeaseInfo info;
  info.id = id;
  info.granted_ttl = it->second.ttl;
  auto left = std::chrono::duration_cast<std::chrono::seconds>(it->second.deadline - clock_->Now());
  info.remaining_ttl = std::max<int64_t>(0, left.count());
  if (with_keys) {
    info.keys.assign(it->second.keys.begin(), it->second.keys.end());
    std::sort(info.keys.begin(), info.keys.end());
  }
  return info;
}

std::vector<int64_t> Lessor::List() const {
  util::ReaderMutexLock l(&mu_);
  std::vector<int64_t> ids;
  ids.reserve(leases_.size());
  for (const auto& [id, lease] : leases_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

void Lessor::PushLocked(int64_t id, Clock::TimePoint deadline) {
  heap_.push(HeapEntry{deadline, id});
}

std::optional<int64_t> Lessor::Renew(int64_t id) {
  util::MutexLock l(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) return std::nullopt;
  // An expired lease is never extended: it waits for its revocation, and
  // the keep-alive is answered as for a lease that does not exist (etcd).
  const auto now = clock_->Now();
  if (it->second.deadline <= now) return std::nullopt;
  const Clock::TimePoint deadline = now + std::chrono::seconds(it->second.ttl);
  renewed_.fetch_add(1, std::memory_order_relaxed);
  // Renewed again at the same instant: its heap entry is already live.
  if (deadline == it->second.deadline) return it->second.ttl;
  it->second.deadline = deadline;
  PushLocked(id, deadline);
  return it->second.ttl;
}

void Lessor::Promote(Clock::Duration extend) {
  util::MutexLock l(&mu_);
  const auto now = clock_->Now();
  heap_ = {};
  for (auto& [id, lease] : leases_) {
    lease.deadline = now + std::chrono::seconds(lease.ttl) + extend;
    PushLocked(id, lease.deadline);
  }
}

std::vector<int64_t> Lessor::Expired(size_t max) {
  util::MutexLock l(&mu_);
  std::vector<int64_t> out;
  std::vector<HeapEntry> keep;
  absl::flat_hash_set<int64_t> taken;
  const auto now = clock_->Now();
  while (!heap_.empty() && heap_.top().deadline <= now && out.size() < max) {
    HeapEntry e = heap_.top();
    heap_.pop();
    auto it = leases_.find(e.id);
    // Stale entries (renewed or revoked leases) are dropped here, and so
    // are copies of a live one (a lease revoked and granted again with the
    // same deadline): one entry per lease is kept.
    if (it == leases_.end() || it->second.deadline != e.deadline) continue;
    if (!taken.insert(e.id).second) continue;
    out.push_back(e.id);
    keep.push_back(e);
  }
  // Until the revoke lands, the lease stays due.
  for (const auto& e : keep) heap_.push(e);
  return out;
}

void Lessor::Grant(int64_t id, int64_t ttl) {
  util::MutexLock l(&mu_);
  Lease& lease = leases_[id];
  lease.ttl = ttl;
  lease.deadline = clock_->Now() + std::chrono::seconds(ttl);
  PushLocked(id, lease.deadline);
}

std::vector<std::string> Lessor::Revoke(int64_t id) {
  util::MutexLock l(&mu_);
  auto it = leases_.find(id);
  if (it == leases_.end()) return {};
  std::vector<std::string> keys(it->second.keys.begin(), it->second.keys.end());
  std::sort(keys.begin(), keys.end());
  for (const auto& k : keys) key_lease_.erase(k);
  leases_.erase(it);
  return keys;
}

void Lessor::Attach(const std::string& key, int64_t id) {
  util::MutexLock l(&mu_);
  auto old = key_lease_.find(key);
  if (old != key_lease_.end()) {
    if (old->second == id) return;
    if (auto lease = leases_.find(old->second); lease != leases_.end()) lease->second.keys.erase(key);
    key_lease_.erase(old);
  }
  if (id == 0) return;
  auto lease = leases_.find(id);
  if (lease == leases_.end()) return;
  lease->second.keys.insert(key);
  key_lease_[key] = id;
}

int64_t Lessor::LeaseOf(const std::string& key) const {
  util::ReaderMutexLock l(&mu_);
  auto it = key_lease_.find(key);
  return it == key_lease_.end() ? 0 : it->second;
}

std::string EncodeLeaseRecord(int64_t id, int64_t ttl) {
  std::string out;
  util::AppendVarintField(1, static_cast<uint64_t>(id), &out);
  util::AppendVarintField(2, static_cast<uint64_t>(ttl), &out);
  return out;
}

bool DecodeLeaseRecord(std::string_view bytes, int64_t* id, int64_t* ttl) {
  *id = 0;
  *ttl = 0;
  const char* p = bytes.data();
  const char* end = p + bytes.size();
  while (p < end) {
    uint64_t tag, v;
    if (!util::ReadVarint(&p, end, &tag) || (tag & 7) != 0 || !util::ReadVarint(&p, end, &v)) return false;
    if ((tag >> 3) == 1) *id = static_cast<int64_t>(v);
    if ((tag >> 3) == 2) *ttl = static_cast<int64_t>(v);
  }
  return *id != 0;
}

std::string LeaseKey(int64_t id) {
  std::string out;
  util::AppendBigEndian64(static_cast<uint64_t>(id), &out);
  return out;
}

}  // namespace capstan::lease
