#include "server/config/renamed_flags.h"

#include <map>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "server/config/failure.h"
#include "server/config/flags.h"

namespace capstan::server::config_internal {
namespace {

// In the order of etcd's map literals (Go iterates maps at random; where
// several entries apply, the first of these is reported).
constexpr FlagRename kRenames[] = {
    {"experimental-compact-hash-check-time", "compact-hash-check-time"},
    {"experimental-corrupt-check-time", "corrupt-check-time"},
    {"experimental-compaction-batch-limit", "compaction-batch-limit"},
    {"experimental-watch-progress-notify-interval", "watch-progress-notify-interval"},
    {"experimental-warning-apply-duration", "warning-apply-duration"},
    {"experimental-bootstrap-defrag-threshold-megabytes", "bootstrap-defrag-threshold-megabytes"},
    {"experimental-memory-mlock", "memory-mlock"},
    {"experimental-snapshot-catchup-entries", "snapshot-catchup-entries"},
    {"experimental-compaction-sleep-interval", "compaction-sleep-interval"},
    {"experimental-downgrade-check-time", "downgrade-check-time"},
    {"experimental-peer-skip-client-san-verification", "peer-skip-client-san-verification"},
    {"experimental-enable-distributed-tracing", "enable-distributed-tracing"},
    {"experimental-distributed-tracing-address", "distributed-tracing-address"},
    {"experimental-distributed-tracing-service-name", "distributed-tracing-service-name"},
    {"experimental-distributed-tracing-instance-id", "distributed-tracing-instance-id"},
    {"experimental-distributed-tracing-sampling-rate", "distributed-tracing-sampling-rate"},
};

constexpr GateFlagSpec kGateFlags[] = {
    {"experimental-stop-grpc-service-on-defrag", "StopGRPCServiceOnDefrag"},
    {"experimental-initial-corrupt-check", "InitialCorruptCheck"},
    {"experimental-compact-hash-check-enabled", "CompactHashCheck"},
    {"experimental-txn-mode-write-with-shared-buffer", "TxnModeWriteWithSharedBuffer"},
    {"experimental-enable-lease-checkpoint", "LeaseCheckpoint"},
    {"experimental-enable-lease-checkpoint-persist", "LeaseCheckpointPersist"},
};

struct Deprecation {
  absl::string_view flag;
  absl::string_view warning;
};

// etcd 3.6's texts, word for word (inconsistencies included).
constexpr Deprecation kDeprecations[] = {
    {"max-snapshots", "--max-snapshots is deprecated in 3.6 and will be decommissioned in 3.8."},
    {"v2-deprecation",
     "--v2-deprecation is deprecated and scheduled for removal in v3.8. The default value is "
     "enforced, ignoring user input."},
    {"experimental-compact-hash-check-enabled",
     "--experimental-compact-hash-check-enabled is deprecated in 3.6 and will be decommissioned "
     "in 3.7. Use '--feature-gates=CompactHashCheck=true' instead."},
    {"experimental-compact-hash-check-time",
     "--experimental-compact-hash-check-time is deprecated in 3.6 and will be decommissioned in "
     "3.7. Use '--compact-hash-check-time' instead."},
    {"experimental-txn-mode-write-with-shared-buffer",
     "--experimental-txn-mode-write-with-shared-buffer is deprecated in v3.6 and will be "
     "decommissioned in v3.7. Use '--feature-gates=TxnModeWriteWithSharedBuffer=true' instead."},
    {"experimental-corrupt-check-time",
     "--experimental-corrupt-check-time is deprecated in v3.6 and will be decommissioned in "
     "v3.7. Use '--corrupt-check-time' instead."},
    {"experimental-compaction-batch-limit",
     "--experimental-compaction-batch-limit is deprecated in v3.6 and will be decommissioned in "
     "v3.7. Use '--compaction-batch-limit' instead."},
    {"experimental-watch-progress-notify-interval",
     "--experimental-watch-progress-notify-interval is deprecated in v3.6 and will be "
     "decommissioned in v3.7. Use '--watch-progress-notify-interval' instead."},
    {"experimental-warning-apply-duration",
     "--experimental-warning-apply-duration is deprecated in v3.6 and will be decommissioned in "
     "v3.7. Use '--warning-apply-duration' instead."},
    {"experimental-bootstrap-defrag-threshold-megabytes",
     "--experimental-bootstrap-defrag-threshold-megabytes is deprecated in v3.6 and will be "
     "decommissioned in v3.7. Use '--bootstrap-defrag-threshold-megabytes' instead."},
    {"experimental-memory-mlock",
     "--experimental-memory-mlock is deprecated in v3.6 and will be decommissioned in v3.7. Use "
     "'--memory-mlock' instead."},
    {"experimental-snapshot-catchup-entries",
     "--experimental-snapshot-catchup-entries is deprecated in v3.6 and will be decommissioned "
     "in v3.7. Use '--snapshot-catchup-entries' instead."},
    {"experimental-compaction-sleep-interval",
     "--experimental-compaction-sleep-interval is deprecated in v3.6 and will be decommissioned "
     "in v3.7. Use 'compaction-sleep-interval' instead."},
    {"experimental-downgrade-check-time",
     "--experimental-downgrade-check-time is deprecated in v3.6 and will be decommissioned in "
     "v3.7. Use '--downgrade-check-time' instead."},
    {"experimental-enable-distributed-tracing",
     "--experimental-enable-distributed-tracing is deprecated in 3.6 and will be decommissioned "
     "in 3.7. Use --enable-distributed-tracing instead."},
    {"experimental-distributed-tracing-address",
     "--experimental-distributed-tracing-address is deprecated in 3.6 and will be "
     "decommissioned in 3.7. Use --distributed-tracing-address instead."},
    {"experimental-distributed-tracing-service-name",
     "--experimental-distributed-tracing-service-name is deprecated in 3.6 and will be "
     "decommissioned in 3.7. Use --distributed-tracing-service-name instead."},
    {"experimental-distributed-tracing-instance-id",
     "--experimental-distributed-tracing-instance-id is deprecated in 3.6 and will be "
     "decommissioned in 3.7. Use --distributed-tracing-instance-id instead."},
    {"experimental-distributed-tracing-sampling-rate",
     "--experimental-distributed-tracing-sampling-rate is deprecated in 3.6 and will be "
     "decommissioned in 3.7. Use --distributed-tracing-sampling-rate instead."},
};

bool IsSet(const ServerConfig& c, absl::string_view flag) {
  return c.explicitly_set.count(std::string(flag)) != 0;
}

}  // namespace

absl::Span<const FlagRename> RenamedFlags() { return kRenames; }

absl::Span<const GateFlagSpec> GateFlags() { return kGateFlags; }

absl::string_view DeprecationWarning(absl::string_view flag) {
  for (const Deprecation& d : kDeprecations) {
    if (d.flag == flag) return d.warning;
  }
  return {};
}

absl::Status ApplyGateFlags(ParseState& st, absl::string_view gates_text) {
  std::map<std::string, bool> values;
  for (const GateFlagSpec& g : kGateFlags) {
    auto it = st.gate_flags.find(std::string(g.flag));
    if (it == st.gate_flags.end()) continue;
    // etcd looks for the gate's name as a substring: LeaseCheckpoint is found
    // in "LeaseCheckpointPersist=true" too.
    if (absl::StrContains(gates_text, g.gate)) {
      const std::string gate_value = st.cfg.feature_gates.Enabled(g.gate) ? "true" : "false";
      return VerifyError(absl::StrCat(
          "cannot specify both flags: --", g.flag, "=", it->second ? "true" : "false",
          " and --feature-gates=", g.gate, "=", gate_value,
          " at the same time, please just use --feature-gates=", g.gate, "=", gate_value));
    }
    values[std::string(g.gate)] = it->second;
  }
  if (absl::Status s = st.cfg.feature_gates.SetFromMap(values); !s.ok()) {
    return VerifyError(std::string(s.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckRenamedFlags(const ServerConfig& c) {
  for (const FlagRename& r : kRenames) {
    if (IsSet(c, r.old_name) && IsSet(c, r.new_name)) {
      return VerifyError(absl::StrCat("cannot set --", r.old_name, " and --", r.new_name,
                                      " at the same time, please use --", r.new_name, " only"));
    }
  }
  return absl::OkStatus();
}

absl::Status FinishRenamedFlags(ParseState& st) {
  ServerConfig& c = st.cfg;
  const absl::Duration old_value = st.experimental_warning_unary_request_duration;
  const absl::Duration new_value = st.warning_unary_request_duration;
  if (old_value != absl::ZeroDuration() && new_value != absl::ZeroDuration()) {
    return VerifyError(
        "both --experimental-warning-unary-request-duration and "
        "--warning-unary-request-duration flags are set. Use only "
        "--warning-unary-request-duration");
  }
  if (new_value != absl::ZeroDuration()) {
    c.warning_unary_request_duration = new_value;
  } else if (old_value != absl::ZeroDuration()) {
    c.warnings.push_back(
        "--experimental-warning-unary-request-duration is deprecated, and will be "
        "decommissioned in v3.7. Use --warning-unary-request-duration instead.");
    c.warning_unary_request_duration = old_value;
  }
  for (const Deprecation& d : kDeprecations) {
    if (IsSet(c, d.flag)) c.warnings.push_back(std::string(d.warning));
  }
  return absl::OkStatus();
}

}  // namespace capstan::server::config_internal
