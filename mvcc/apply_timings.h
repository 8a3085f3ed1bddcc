// How long each write took to apply, as etcd's applier reports it:
// etcd_server_apply_duration_seconds{version="v3",op,success} (etcd's op
// names and buckets, 0.1 ms doubling to 52 s; success: applied, or refused
// with "required revision has been compacted") and
// etcd_server_slow_apply_total, the applies that took longer than
// --warning-apply-duration, each logged with etcd's "apply request took too
// long". Timed on the committer, from the write's admission to the end of
// its apply (its part of the group's commit is not included, as etcd's
// apply does not include its backend's commit). Slow Ranges are counted
// there too, as etcd counts them (server/api/kv_service.cc).

#ifndef CAPSTAN_MVCC_APPLY_TIMINGS_H_
#define CAPSTAN_MVCC_APPLY_TIMINGS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "mvcc/write_request.h"
#include "util/latency_histogram.h"

namespace capstan::mvcc {

class ApplyTimings {
 public:
  // etcd's op labels, in its applier's order. AuthStatus is "unknown":
  // etcd 3.5's applier names no op for it.
  static constexpr std::array<const char*, 29> kOps = {
      "ClusterVersionSet", "ClusterMemberAttrSet", "DowngradeInfoSet", "Range",
      "Put", "DeleteRange", "Txn", "Compaction", "LeaseGrant", "LeaseRevoke",
      "LeaseCheckpoint", "Alarm", "Authenticate", "AuthEnable", "AuthDisable", "AuthUserAdd",
      "AuthUserDelete", "AuthUserChangePassword", "AuthUserGrantRole", "AuthUserGet",
      "AuthUserRevokeRole", "AuthRoleAdd", "AuthRoleGrantPermission", "AuthRoleGet",
      "AuthRoleRevokePermission", "AuthRoleDelete", "AuthUserList", "AuthRoleList", "unknown"};

  ApplyTimings();

  // The index in kOps of the op etcd's applier would name for w; -1 for a
  // step of the store's own that etcd's applier never sees (an empty entry,
  // a configuration change, an internal step).
  static int OpOf(const WriteRequest& w);
  // How etcd's log line shows the request: its kind and key, sizes for
  // values (never the values).
  static std::string Describe(const WriteRequest& w);

  // Records one apply of op (from OpOf, not -1) that ended with s.
  void Record(int op, const absl::Status& s, double seconds);
  void CountSlow() { slow_.fetch_add(1, std::memory_order_relaxed); }

  // REQUIRES: 0 <= op < kOps.size().
  const util::LatencyHistogram& histogram(int op, bool success) const {
    return *histograms_[op * 2 + (success ? 1 : 0)];
  }
  uint64_t slow() const { return slow_.load(std::memory_order_relaxed); }

 private:
  std::array<std::unique_ptr<util::LatencyHistogram>, kOps.size() * 2> histograms_;
  std::atomic<uint64_t> slow_{0};
};

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_APPLY_TIMINGS_H_
