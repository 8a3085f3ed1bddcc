// Server feature gates: etcd 3.6's --feature-gates (and 3.7's gates), read
// the way etcd's pkg/featuregate reads them.
//
// A gate has a name, a stage (Alpha, Beta, GA, Deprecated), a default and
// may be locked to its default. KnownFeatureGates() is the static table of
// every gate etcd 3.6 and 3.7 define, plus featuregate's two special gates
// AllAlpha and AllBeta (which set every Alpha / Beta gate not set
// explicitly). FeatureGates holds what a configuration resolved: the gates
// set explicitly, and through them each gate's value.
//
// The syntax is featuregate's: "A=true,B=false" (spaces around names and
// values trimmed, empty items skipped, values in strconv.ParseBool's
// spellings); each --feature-gates merges into what earlier ones set. The
// error texts are etcd's (pkg/featuregate/feature_gate.go):
//   "missing bool value for A"
//   "invalid value of A=x, err: strconv.ParseBool: parsing \"x\": invalid syntax"
//   "unrecognized feature gate: A"
//   "cannot set feature gate A to false, feature is locked to true"
// and a failing Set changes nothing.
//
// InitialCorruptCheck is honored; the other gates change nothing in Capstan
// (each entry says why): they are accepted, exported and logged as having
// no effect.
//
// Thread safety: the table is immutable. A FeatureGates is a plain value:
// const methods may be called concurrently, a mutating one needs exclusive
// access.

#ifndef CAPSTAN_SERVER_CONFIG_FEATURE_GATES_H_
#define CAPSTAN_SERVER_CONFIG_FEATURE_GATES_H_

#include <map>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace capstan::server {

// featuregate's prerelease.
enum class FeatureStage { kAlpha, kBeta, kGA, kDeprecated };

// The stage as etcd spells it (the `stage` label of etcd_server_feature_enabled
// and --help): "ALPHA", "BETA", "" for GA, "DEPRECATED".
absl::string_view FeatureStageName(FeatureStage stage);

struct FeatureGateSpec {
  absl::string_view name;
  FeatureStage stage = FeatureStage::kAlpha;
  bool default_enabled = false;
  bool locked = false;  // featuregate's LockToDefault
  // The etcd release that introduced the gate: "3.6" or "3.7".
  absl::string_view since;
  // What the gate does in etcd and, unless honored, why it has no effect
  // in Capstan.
  absl::string_view capstan_note;
  // Capstan does what the gate asks (else it is logged as having no effect).
  bool honored = false;
};

// Gate names, as etcd's server/features/etcd_features.go spells them.
inline constexpr absl::string_view kAllAlphaGate = "AllAlpha";
inline constexpr absl::string_view kAllBetaGate = "AllBeta";
inline constexpr absl::string_view kCompactHashCheckGate = "CompactHashCheck";
inline constexpr absl::string_view kFastLeaseKeepAliveGate = "FastLeaseKeepAlive";
inline constexpr absl::string_view kInitialCorruptCheckGate = "InitialCorruptCheck";
inline constexpr absl::string_view kLeaseCheckpointGate = "LeaseCheckpoint";
inline constexpr absl::string_view kLeaseCheckpointPersistGate = "LeaseCheckpointPersist";
inline constexpr absl::string_view kPriorityRequestGate = "PriorityRequest";
inline constexpr absl::string_view kSetMemberLocalAddrGate = "SetMemberLocalAddr";
inline constexpr absl::string_view kStopGrpcServiceOnDefragGate = "StopGRPCServiceOnDefrag";
inline constexpr absl::string_view kTxnModeWriteWithSharedBufferGate = "TxnModeWriteWithSharedBuffer";

// Every known gate, sorted by name. The span lives for the process.
absl::Span<const FeatureGateSpec> KnownFeatureGates();

class FeatureGates {
 public:
  // The gates of KnownFeatureGates(), none set.
  FeatureGates();
  // Gates of another table (tests use one with a locked gate). REQUIRES:
  // known lives as long as this object and its copies.
  explicit FeatureGates(absl::Span<const FeatureGateSpec> known);

  // featuregate's Set: parses "A=true,B=false" and applies it with
  // SetFromMap. On error returns the bare reason (see above), which the
  // caller wraps as Go's flag package does.
  absl::Status Set(absl::string_view value);
  // featuregate's SetFromMap: all or nothing. Items are checked in name order,
  // so the first error in that order is the one reported.
  absl::Status SetFromMap(const std::map<std::string, bool>& values);

  // The gate's value: as set, else its default. REQUIRES: name is known.
  bool Enabled(absl::string_view name) const;
  // The spec of name, or null.
  const FeatureGateSpec* Lookup(absl::string_view name) const;

  // featuregate's String(): the gates set, "A=true,B=false" sorted (gates
  // that AllAlpha/AllBeta set included).
  std::string String() const;
  // The gates set (explicitly or by AllAlpha/AllBeta), by name.
  const std::map<std::string, bool>& set_gates() const { return set_; }

  // One resolved gate, for iteration (metrics, logs).
  struct Resolved {
    const FeatureGateSpec* spec;
    bool enabled;
  };
  // Every known gate with its value, in table order.
  std::vector<Resolved> All() const;

  // featuregate's KnownFeatures(): "Name=true|false (STAGE - default=false)"
  // for every gate that is neither GA nor Deprecated, sorted.
  std::vector<std::string> KnownFeaturesHelp() const;

  // Warnings SetFromMap logged in etcd's words (setting a GA or Deprecated
  // gate), in the order they arose.
  const std::vector<std::string>& warnings() const { return warnings_; }

 private:
  absl::Span<const FeatureGateSpec> known_;
  std::map<std::string, bool> set_;
  std::vector<std::string> warnings_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_CONFIG_FEATURE_GATES_H_
