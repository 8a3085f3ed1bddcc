#include "cluster/lease_checker.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace capstan::testing::cluster {
namespace {

constexpr int64_t kNsPerSecond = 1000000000;

double Seconds(int64_t ns) { return static_cast<double>(ns) / kNsPerSecond; }

}  // namespace

const char* LeaseRuleName(LeaseRule r) {
  switch (r) {
    case LeaseRule::kRevokedEarly: return "revoked-early";
    case LeaseRule::kOutlived: return "outlived";
  }
  return "?";
}

size_t LeaseCheckResult::Count(LeaseRule r) const {
  return static_cast<size_t>(std::count_if(violations.begin(), violations.end(),
                                           [r](const LeaseViolation& v) { return v.rule == r; }));
}

std::string LeaseCheckResult::Report(size_t max_violations) const {
  std::string out = absl::StrFormat(
      "%d leases, %d keep-alives, %d reads checked, %d seen to expire; %d violations; %d "
      "early revocations excused\n",
      leases, keepalives, reads_checked, expired, violations.size(), excused);
  for (const std::string& e : excused_examples) absl::StrAppend(&out, "  excused: ", e, "\n");
  for (size_t i = 0; i < violations.size() && i < max_violations; ++i) {
    absl::StrAppend(&out, "  ", LeaseRuleName(violations[i].rule), ": ", violations[i].message,
                    "\n");
  }
  return out;
}

LeaseCheckResult CheckLeases(
    const std::vector<LeaseRecord>& records,
    const std::function<int64_t(int64_t from_ns, int64_t to_ns)>& allowance, int64_t origin_ns,
    const std::vector<ExcusedWindow>& excused_early) {
  LeaseCheckResult result;
  const auto at = [origin_ns](int64_t ns) { return Seconds(ns - origin_ns); };
  for (const LeaseRecord& r : records) {
    ++result.leases;
    result.keepalives += static_cast<int64_t>(r.keepalives.size());
    if (r.grant.ttl <= 0 || r.put_complete_ns == 0) continue;  // nothing to hold it to
    // Each answered call: alive until at least invoke + TTL.
    std::vector<LeaseRecord::Call> calls = {r.grant};
    for (const auto& k : r.keepalives) {
      if (k.ttl > 0) calls.push_back(k);
    }
    int64_t alive_until = 0;  // the lease was alive at least until then
    std::string alive_by;     // the call that showed it
    int64_t last_complete = r.grant.complete_ns;
    int64_t last_ttl = r.grant.ttl;
    for (const auto& c : calls) {
      if (c.invoke_ns + c.ttl * kNsPerSecond > alive_until) {
        alive_until = c.invoke_ns + c.ttl * kNsPerSecond;
        alive_by = absl::StrFormat("a call invoked at %.3f s and answered at %.3f s by %s with TTL %d",
                                   at(c.invoke_ns), at(c.complete_ns), c.endpoint, c.ttl);
      }
      if (c.complete_ns >= last_complete) {
        last_complete = c.complete_ns;
        last_ttl = c.ttl;
      }
    }
    const int64_t nominal_end = last_complete + last_ttl * kNsPerSecond;
    const int64_t must_be_gone = nominal_end + allowance(r.grant.invoke_ns, nominal_end);
    bool seen_gone = false;
    for (const auto& read : r.reads) {
      if (read.invoke_ns < r.put_complete_ns) continue;
      ++result.reads_checked;
      const bool revoked_before = r.revoke_invoke_ns != 0 && read.complete_ns >= r.revoke_invoke_ns;
      if (!read.found && !revoked_before) seen_gone = true;
      if (!read.found && !revoked_before && read.complete_ns < alive_until) {
        // The key went between the last read that found it and this one.
        int64_t gone_after = r.grant.invoke_ns;
        for (const auto& other : r.reads) {
          if (other.found && other.invoke_ns < read.complete_ns) {
            gone_after = std::max(gone_after, other.invoke_ns);
          }
        }
        const auto excuse = std::find_if(
            excused_early.begin(), excused_early.end(), [&](const ExcusedWindow& w) {
              return w.from_ns <= read.complete_ns && w.to_ns >= gone_after;
            });
        if (excuse != excused_early.end()) {
          if (result.excused++ < 3) {
            result.excused_examples.push_back(absl::StrFormat(
                "lease %x (%s): gone between %.3f s and %.3f s, alive until at least %.3f s; %s",
                r.lease, r.key, at(gone_after), at(read.complete_ns), at(alive_until),
                excuse->why));
          }
          continue;
        }
        result.violations.push_back(
            {LeaseRule::kRevokedEarly,
             absl::StrFormat("lease %x (%s, TTL %d s): a read invoked at %.3f s, answered at "
                             "%.3f s by %s, found the key gone, but the lease was alive until at "
                             "least %.3f s (%s)",
                             r.lease, r.key, r.grant.ttl, at(read.invoke_ns), at(read.complete_ns),
                             read.endpoint, at(alive_until), alive_by)});
      }
      if (read.found && r.revoke_complete_ns != 0 && read.invoke_ns > r.revoke_complete_ns) {
        result.violations.push_back(
            {LeaseRule::kOutlived,
             absl::StrFormat("lease %x (%s): a read invoked at %.3f s found the key after the "
                             "lease was revoked at %.3f s",
                             r.lease, r.key, at(read.invoke_ns), at(r.revoke_complete_ns))});
      } else if (read.found && r.revoke_invoke_ns == 0 && read.invoke_ns > must_be_gone) {
        result.violations.push_back(
            {LeaseRule::kOutlived,
             absl::StrFormat("lease %x (%s, TTL %d s): a read invoked at %.3f s found the key; "
                             "its last keep-alive completed at %.3f s, so it had to be gone by "
                             "%.3f s (%.3f s allowed beyond its TTL)",
                             r.lease, r.key, last_ttl, at(read.invoke_ns), at(last_complete),
                             at(must_be_gone), Seconds(must_be_gone - nominal_end))});
      }
    }
    if (seen_gone && r.revoke_invoke_ns == 0) ++result.expired;
  }
  return result;
}

}  // namespace capstan::testing::cluster
