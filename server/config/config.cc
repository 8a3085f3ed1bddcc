// ParseServerConfig: the order in which etcd reads its configuration (the
// command line, then a config file or the ETCD_* environment, then the
// checks), and the ServerConfig helpers. The steps live beside it:
//   flags.{h,cc}         the flag table
//   flag_values.{h,cc}   how each kind of flag reads its text
//   command_line.{h,cc}  the command line and the ETCD_* variables
//   config_file.{h,cc}   the YAML of --config-file
//   validation.{h,cc}    the checks and their etcd error texts
//   failure.{h,cc}       exit codes carried by the failures
//   usage.cc             --help and the short usage

#include "server/config/config.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/config/command_line.h"
#include "server/config/config_file.h"
#include "server/config/failure.h"
#include "server/config/flags.h"
#include "server/config/renamed_flags.h"
#include "server/config/validation.h"
#include "util/go_text.h"

namespace capstan::server {
namespace {

using config_internal::Flags;
using config_internal::FlagSpec;
using config_internal::InitialCluster;
using config_internal::LookupFlag;
using config_internal::ParseInitialCluster;
using config_internal::ParseState;
using config_internal::Section;
using config_internal::ValidateAtStart;
using config_internal::ValidateLikeEtcd;
using config_internal::VerifyError;
using gotext::GoQuote;

// What etcd does after the flags, environment or config file are read:
// validation, defaults that depend on other settings, and the ignored flags.
absl::StatusOr<ServerConfig> FinishConfig(ParseState st, bool from_file) {
  ServerConfig& c = st.cfg;
  // etcd 3.6 looks for gate names in --feature-gates' value as its flag
  // prints it, or in the config file's text.
  const std::string gates_text = from_file ? st.feature_gates_text : c.feature_gates.String();
  if (absl::Status s = config_internal::ApplyGateFlags(st, gates_text); !s.ok()) return s;
  // A config file's parseWarningUnaryRequestDuration runs before
  // embed.Config.Validate (etcd validates the file when it starts the
  // server), the command line's after.
  if (from_file) {
    if (absl::Status s = config_internal::FinishRenamedFlags(st); !s.ok()) return s;
  }
  if (absl::Status s = config_internal::CheckRenamedFlags(c); !s.ok()) return s;
  std::set<std::string>& explicitly = c.explicitly_set;
  const bool may_be_proxy =
      c.proxy != "off" || (!c.discovery.empty() && c.discovery_fallback == "proxy");
  // etcdmain's configFromCmdLine; a config file keeps the default
  // advertise URL (embed.ConfigFromFile has no such rule).
  if (!from_file && explicitly.count("listen-client-urls") != 0 &&
      explicitly.count("advertise-client-urls") == 0 && !may_be_proxy) {
    c.advertise_client_urls.clear();
  }
  if ((!c.discovery.empty() || !c.discovery_srv.empty() || !c.discovery_srv_name.empty()) &&
      explicitly.count("initial-cluster") == 0) {
    c.initial_cluster.clear();
  }
  if (absl::Status s = ValidateLikeEtcd(st, may_be_proxy); !s.ok()) return s;
  if (!from_file) {
    if (absl::Status s = config_internal::FinishRenamedFlags(st); !s.ok()) return s;
  }

  if (c.data_dir.empty()) {
    c.data_dir = absl::StrCat(c.name, ".capstan");
    c.warnings.push_back(absl::StrCat("'data-dir' was empty; using default: ", c.data_dir));
  }
  if (absl::Status s = ValidateAtStart(c); !s.ok()) return s;

  for (const FlagSpec& f : Flags()) {
    if (f.no_effect && explicitly.count(std::string(f.name)) != 0) {
      c.ignored_flags.push_back(std::string(f.name));
    }
  }
  for (const auto& [gate, enabled] : c.feature_gates.set_gates()) {
    const FeatureGateSpec* spec = c.feature_gates.Lookup(gate);
    if (spec != nullptr && spec->honored) continue;
    c.ignored_feature_gates.push_back(absl::StrCat(gate, "=", enabled ? "true" : "false"));
  }
  c.warnings.insert(c.warnings.end(), c.feature_gates.warnings().begin(),
                    c.feature_gates.warnings().end());
  return std::move(st.cfg);
}

// etcd's configFromFile: the YAML keys are the flag names (see
// server/config/config_file.h); nothing from the command line or the environment is
// used. Keys that name no flag are ignored, as etcd ignores them.
absl::StatusOr<ServerConfig> ParseConfigFile(const std::string& path, bool others_ignored) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::string reason = std::strerror(errno);
    if (!reason.empty()) reason[0] = absl::ascii_tolower(reason[0]);  // Go's wording
    return VerifyError(absl::StrCat("open ", path, ": ", reason));
  }
  std::stringstream text;
  text << in.rdbuf();
  auto settings = ConfigFileSettings(text.str());
  if (!settings.ok()) {
    return VerifyError(absl::StrCat("error converting YAML to JSON: ", settings.status().message()));
  }
  ParseState st;
  st.cfg.config_file = path;
  for (const auto& [key, value] : *settings) {
    // etcd 3.6 reads the key its 3.5 config files spelt this way as the flag.
    const std::string name = key == "experimental-snapshot-catch-up-entries"
                                 ? "experimental-snapshot-catchup-entries"
                                 : key;
    const FlagSpec* flag = LookupFlag(name);
    if (flag == nullptr || flag->section == Section::kHidden) continue;
    if (absl::Status s = flag->value.set(st, value); !s.ok()) {
      // featuregate's error as it is (embed's configFromFile returns it).
      if (name == "feature-gates") return VerifyError(std::string(s.message()));
      if (absl::EndsWith(name, "-urls")) {
        return VerifyError(absl::StrCat("unexpected error setting up ", name, ": ", s.message()));
      }
      return VerifyError(absl::StrCat("invalid value ", GoQuote(value), " for ", name,
                                      " in config file ", GoQuote(path), ": ", s.message()));
    }
    st.cfg.explicitly_set.insert(std::string(flag->name));
  }
  if (others_ignored) {
    st.cfg.warnings.push_back(absl::StrCat(
        "loaded server configuration from ", GoQuote(path),
        "; other configuration command line flags and environment variables are ignored"));
  }
  return FinishConfig(std::move(st), /*from_file=*/true);
}

// Whether anything but --config-file was given, on the command line or as
// an ETCD_* variable: all of it is ignored when a config file is read.
bool OthersGiven(const std::set<std::string>& explicitly,
                 const std::map<std::string, std::string>& env) {
  bool env_given = false;
  for (const auto& [key, value] : env) {
    env_given |= absl::StartsWith(key, "ETCD_") && key != "ETCD_CONFIG_FILE";
  }
  const bool flags_given = explicitly.size() > (explicitly.count("config-file") != 0 ? 1u : 0u);
  return flags_given || env_given;
}

}  // namespace

absl::StatusOr<ServerConfig> ParseServerConfig(const std::vector<std::string>& args,
                                               const std::map<std::string, std::string>& env) {
  ParseState st;
  if (absl::Status s = config_internal::ParseArgs(args, &st); !s.ok()) return s;
  if (st.cfg.help_requested || st.cfg.version_requested) return std::move(st.cfg);

  // ETCD_CONFIG_FILE is read before the other variables, as etcd does.
  if (st.cfg.config_file.empty()) {
    if (auto it = env.find("ETCD_CONFIG_FILE"); it != env.end()) st.cfg.config_file = it->second;
  }
  if (!st.cfg.config_file.empty()) {
    return ParseConfigFile(st.cfg.config_file, OthersGiven(st.cfg.explicitly_set, env));
  }
  if (absl::Status s = config_internal::SetFlagsFromEnv(env, &st); !s.ok()) return s;
  return FinishConfig(std::move(st), /*from_file=*/false);
}

std::vector<Url> InitialPeerUrls(const ServerConfig& c) {
  absl::StatusOr<InitialCluster> members = ParseInitialCluster(c.initial_cluster);
  if (members.ok()) {
    if (auto it = members->find(c.name); it != members->end()) return it->second;
  }
  return c.initial_advertise_peer_urls;
}

int64_t ServerConfig::QuotaBackendBytes() const {
  if (quota_backend_bytes < 0) return 0;
  if (quota_backend_bytes == 0) return kDefaultQuotaBackendBytes;
  return quota_backend_bytes;
}

int64_t ServerConfig::MinLeaseTtlSeconds() const {
  if (heartbeat_interval_ms == 0) return 1;
  const uint64_t ticks = election_timeout_ms / heartbeat_interval_ms;
  const uint64_t min_ttl_ms = (3 * ticks / 2) * heartbeat_interval_ms;
  return static_cast<int64_t>(std::max<uint64_t>((min_ttl_ms + 999) / 1000, 1));
}

}  // namespace capstan::server
