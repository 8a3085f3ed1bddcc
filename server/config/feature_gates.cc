#include "server/config/feature_gates.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "util/check.h"
#include "util/go_text.h"

namespace capstan::server {
namespace {

constexpr FeatureStage kAlpha = FeatureStage::kAlpha;
constexpr FeatureStage kBeta = FeatureStage::kBeta;

// etcd 3.6's server/features/etcd_features.go, 3.7's additions, and
// pkg/featuregate's AllAlpha / AllBeta; sorted by name.
constexpr FeatureGateSpec kKnownGates[] = {
    {kAllAlphaGate, kAlpha, false, false, "3.6",
     "Sets every Alpha gate not set explicitly."},
    {kAllBetaGate, kBeta, false, false, "3.6", "Sets every Beta gate not set explicitly."},
    {kCompactHashCheckGate, kAlpha, false, false, "3.6",
     "The leader compares followers' hashes at compactions; not done by Capstan (its\n"
     "leader compares the members' hashes every --corrupt-check-time)."},
    {kFastLeaseKeepAliveGate, kBeta, true, false, "3.7",
     "Lease renewal without waiting for the applied index; Capstan answers keepalives\n"
     "from its lessor directly already."},
    {kInitialCorruptCheckGate, kAlpha, false, false, "3.6",
     "Compares this member's hash with its peers' before it serves clients, and does not\n"
     "start on a mismatch, as etcd.",
     /*honored=*/true},
    {kLeaseCheckpointGate, kAlpha, false, false, "3.6",
     "The leader checkpoints remaining lease TTLs to followers; Capstan's new leader\n"
     "gives every lease its whole TTL again, as etcd without the gate."},
    {kLeaseCheckpointPersistGate, kAlpha, false, false, "3.6",
     "Persists checkpointed remaining TTLs; Capstan makes no checkpoints."},
    {kPriorityRequestGate, kAlpha, false, false, "3.7",
     "Applies lease revocations first under raft overload; not done by Capstan."},
    {kSetMemberLocalAddrGate, kAlpha, false, false, "3.6",
     "Binds the local address of peer connections; not done by Capstan."},
    {kStopGrpcServiceOnDefragGate, kAlpha, false, false, "3.6",
     "Reports NOT_SERVING during defragmentation; Capstan's defragmentation runs\n"
     "online."},
    {kTxnModeWriteWithSharedBufferGate, kBeta, true, false, "3.6",
     "bbolt read buffers in write transactions; Capstan's backend is RocksDB."},
};

// The stage whose unset gates a special gate (AllAlpha, AllBeta) sets.
std::optional<FeatureStage> SpecialGateStage(absl::string_view name) {
  if (name == kAllAlphaGate) return FeatureStage::kAlpha;
  if (name == kAllBetaGate) return FeatureStage::kBeta;
  return std::nullopt;
}

}  // namespace

absl::string_view FeatureStageName(FeatureStage stage) {
  switch (stage) {
    case FeatureStage::kAlpha: return "ALPHA";
    case FeatureStage::kBeta: return "BETA";
    case FeatureStage::kGA: return "";
    case FeatureStage::kDeprecated: return "DEPRECATED";
  }
  return "";
}

absl::Span<const FeatureGateSpec> KnownFeatureGates() { return kKnownGates; }

FeatureGates::FeatureGates() : known_(kKnownGates) {}

FeatureGates::FeatureGates(absl::Span<const FeatureGateSpec> known) : known_(known) {}

absl::Status FeatureGates::Set(absl::string_view value) {
  std::map<std::string, bool> m;
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    if (item.empty()) continue;
    std::vector<absl::string_view> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    const std::string key(absl::StripAsciiWhitespace(kv[0]));
    if (kv.size() != 2) return absl::InvalidArgumentError(absl::StrCat("missing bool value for ", key));
    const absl::string_view v = absl::StripAsciiWhitespace(kv[1]);
    std::optional<bool> b = gotext::ParseGoBool(v);
    if (!b) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid value of ", key, "=", v, ", err: strconv.ParseBool: parsing ",
                       gotext::GoQuote(v), ": invalid syntax"));
    }
    m[key] = *b;
  }
  return SetFromMap(m);
}

absl::Status FeatureGates::SetFromMap(const std::map<std::string, bool>& values) {
  std::map<std::string, bool> set = set_;
  std::vector<std::string> warnings;
  // Explicit values win over what a special gate sets, whatever the order
  // (etcd's result does not depend on its map's order either): apply the
  // special gates first.
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& [name, v] : values) {
      const FeatureGateSpec* spec = Lookup(name);
      if (spec == nullptr) return absl::InvalidArgumentError("unrecognized feature gate: " + name);
      if (spec->locked && spec->default_enabled != v) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot set feature gate ", name, " to ", v ? "true" : "false",
                         ", feature is locked to ", spec->default_enabled ? "true" : "false"));
      }
      const std::optional<FeatureStage> special = SpecialGateStage(name);
      if (special.has_value() != (pass == 0)) continue;
      set[name] = v;
      if (special) {
        for (const FeatureGateSpec& g : known_) {
          if (g.stage == *special && set.count(std::string(g.name)) == 0) set[std::string(g.name)] = v;
        }
      }
      if (spec->stage == FeatureStage::kDeprecated) {
        warnings.push_back(absl::StrCat("Setting deprecated feature gate ", name, "=",
                                        v ? "true" : "false",
                                        ". It will be removed in a future release."));
      } else if (spec->stage == FeatureStage::kGA) {
        warnings.push_back(absl::StrCat("Setting GA feature gate ", name, "=", v ? "true" : "false",
                                        ". It will be removed in a future release."));
      }
    }
  }
  set_ = std::move(set);
  warnings_.insert(warnings_.end(), warnings.begin(), warnings.end());
  return absl::OkStatus();
}

const FeatureGateSpec* FeatureGates::Lookup(absl::string_view name) const {
  for (const FeatureGateSpec& g : known_) {
    if (g.name == name) return &g;
  }
  return nullptr;
}

bool FeatureGates::Enabled(absl::string_view name) const {
  if (auto it = set_.find(std::string(name)); it != set_.end()) return it->second;
  const FeatureGateSpec* spec = Lookup(name);
  CHECK(spec != nullptr) << "feature \"" << name << "\" is not registered";
  return spec->default_enabled;
}

std::string FeatureGates::String() const {
  return absl::StrJoin(set_, ",", [](std::string* out, const auto& kv) {
    absl::StrAppend(out, kv.first, "=", kv.second ? "true" : "false");
  });
}

std::vector<FeatureGates::Resolved> FeatureGates::All() const {
  std::vector<Resolved> all;
  for (const FeatureGateSpec& g : known_) all.push_back({&g, Enabled(g.name)});
  return all;
}

std::vector<std::string> FeatureGates::KnownFeaturesHelp() const {
  std::vector<std::string> lines;
  for (const FeatureGateSpec& g : known_) {
    if (g.stage == FeatureStage::kGA || g.stage == FeatureStage::kDeprecated) continue;
    lines.push_back(absl::StrCat(g.name, "=true|false (", FeatureStageName(g.stage),
                                 " - default=", g.default_enabled ? "true" : "false", ")"));
  }
  std::sort(lines.begin(), lines.end());
  return lines;
}

}  // namespace capstan::server
