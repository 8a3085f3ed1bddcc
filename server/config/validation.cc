#include "server/config/validation.h"

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "server/config/config.h"
#include "server/config/feature_gates.h"
#include "server/config/failure.h"
#include "server/config/flags.h"
#include "util/go_text.h"

namespace capstan::server::config_internal {
namespace {

using gotext::GoQuote;
using gotext::IsIp;
using gotext::NumError;
using gotext::ParseGoInt;
using gotext::SplitHostPort;

// ---------------------------------------------------------------------------
// embed.Config.Validate
// ---------------------------------------------------------------------------

// embed's checkBindURLs: listeners need an IP or "localhost".
absl::Status CheckBindUrls(const std::vector<Url>& urls) {
  for (const Url& u : urls) {
    if (u.scheme == "unix" || u.scheme == "unixs") continue;
    std::string host, port;
    if (absl::Status s = SplitHostPort(u.host, &host, &port); !s.ok()) {
      return VerifyError(std::string(s.message()));
    }
    if (host == "localhost") continue;
    if (!IsIp(host)) {
      return VerifyError(absl::StrCat("expected IP in URL for binding (", u.String(), ")"));
    }
  }
  return absl::OkStatus();
}

// embed's checkHostURLs, wrapped the way Validate() wraps it.
absl::Status CheckHostUrls(absl::string_view flag, const std::vector<Url>& urls) {
  for (const Url& u : urls) {
    if (u.scheme == "unix" || u.scheme == "unixs") continue;
    std::string host, port;
    std::string why;
    if (absl::Status s = SplitHostPort(u.host, &host, &port); !s.ok()) {
      why = std::string(s.message());
    } else if (host.empty()) {
      why = absl::StrCat("unexpected empty host (", u.String(), ")");
    } else {
      continue;
    }
    std::vector<std::string> all;
    for (const Url& x : urls) all.push_back(x.String());
    return VerifyError(absl::StrCat("--", flag, " ", GoQuote(absl::StrJoin(all, ",")),
                                    " must be \"host:port\" (", why, ")"));
  }
  return absl::OkStatus();
}

// tlsutil.GetTLSVersion: 0 for the default, else 12 or 13.
absl::StatusOr<int> TlsVersion(const std::string& v) {
  if (v.empty()) return 0;
  if (v == "TLS1.2") return 12;
  if (v == "TLS1.3") return 13;
  return VerifyError(
      absl::StrCat("unexpected TLS version ", GoQuote(v), " (must be one of: TLS1.2, TLS1.3)"));
}

// Names Go's crypto/tls knows (tls.CipherSuites() and InsecureCipherSuites()),
// plus the two legacy aliases etcd's tlsutil accepts.
bool IsKnownCipherSuite(absl::string_view name) {
  static constexpr absl::string_view kSuites[] = {
      "TLS_RSA_WITH_RC4_128_SHA",
      "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
      "TLS_RSA_WITH_AES_128_CBC_SHA",
      "TLS_RSA_WITH_AES_256_CBC_SHA",
      "TLS_RSA_WITH_AES_128_CBC_SHA256",
      "TLS_RSA_WITH_AES_128_GCM_SHA256",
      "TLS_RSA_WITH_AES_256_GCM_SHA384",
      "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
      "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
      "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
      "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
      "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
      "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
      "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
      "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
      "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
      "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
      "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
      "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
      "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
      "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
      "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
      "TLS_AES_128_GCM_SHA256",
      "TLS_AES_256_GCM_SHA384",
      "TLS_CHACHA20_POLY1305_SHA256",
      "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
      "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
  };
  return std::find(std::begin(kSuites), std::end(kSuites), name) != std::end(kSuites);
}

// zap's Level.UnmarshalText, which etcd's ConvertToZapLevel panics on.
std::optional<LogLevel> ParseLogLevel(absl::string_view s) {
  static const std::pair<absl::string_view, LogLevel> kLevels[] = {
      {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo},   {"", LogLevel::kInfo},
      {"warn", LogLevel::kWarn},   {"error", LogLevel::kError}, {"dpanic", LogLevel::kDPanic},
      {"panic", LogLevel::kPanic}, {"fatal", LogLevel::kFatal},
  };
  for (const auto& [name, level] : kLevels) {
    if (s == name || s == absl::AsciiStrToUpper(name)) return level;
  }
  return std::nullopt;
}

// embed's setupLogging checks.
absl::Status ValidateLogging(ParseState& st) {
  ServerConfig& c = st.cfg;
  if (c.logger == "capnslog") return VerifyError("--logger=capnslog is removed in v3.5");
  if (c.logger != "zap") {
    return VerifyError(absl::StrCat("unknown logger option ", GoQuote(c.logger)));
  }
  if (c.log_outputs.empty()) c.log_outputs = {"default"};
  if (c.log_outputs.size() > 1 &&
      std::find(c.log_outputs.begin(), c.log_outputs.end(), "default") != c.log_outputs.end()) {
    return VerifyError("multi logoutput for \"default\" is not supported yet");
  }
  if (c.enable_log_rotation) {
    int files = 0;
    for (const std::string& o : c.log_outputs) {
      if (o != "default" && o != "stderr" && o != "stdout") ++files;
    }
    if ((c.log_outputs.size() == 1 && files == 0) || files > 1) {
      return VerifyError(
          "--log-outputs requires a single file path when --log-rotate-config-json is defined");
    }
  }
  for (const std::string& o : c.log_outputs) {
    if (o.empty()) return VerifyError("open sink \"\": open : no such file or directory");
  }
  std::optional<LogLevel> level = ParseLogLevel(st.log_level);
  if (!level) {
    // etcd panics here (Go exits 2 after printing "panic: " and a trace).
    return Failure(absl::StatusCode::kInvalidArgument, 2, false,
                   absl::StrCat("unrecognized level: ", GoQuote(st.log_level)));
  }
  c.log_level = *level;
  // etcd 3.6's logutil.ConvertToZapFormat ("" means json).
  if (c.log_format.empty()) c.log_format = "json";
  if (c.log_format != "json" && c.log_format != "console") {
    return VerifyError(absl::StrCat("unknown log format: ", c.log_format,
                                    ", supported values json, console"));
  }
  return absl::OkStatus();
}


// The listener URLs (checkBindURLs) and the advertised ones (checkHostURLs).
absl::Status CheckUrls(const ServerConfig& c) {
  for (const auto* urls : {&c.listen_peer_urls, &c.listen_client_urls, &c.listen_client_http_urls,
                           &c.listen_metrics_urls}) {
    if (absl::Status s = CheckBindUrls(*urls); !s.ok()) return s;
  }
  if (absl::Status s = CheckHostUrls("initial-advertise-peer-urls", c.initial_advertise_peer_urls);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckHostUrls("advertise-client-urls", c.advertise_client_urls); !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

// --initial-cluster-state, and at most one way to bootstrap.
absl::Status CheckBootstrap(ParseState& st) {
  ServerConfig& c = st.cfg;
  int bootstrap_flags =
      !c.discovery.empty() + !c.initial_cluster.empty() + !c.discovery_srv.empty();
  if (st.initial_cluster_state != "new" && st.initial_cluster_state != "existing") {
    return VerifyError(absl::StrCat("unexpected clusterState ", GoQuote(st.initial_cluster_state)));
  }
  c.initial_cluster_state =
      st.initial_cluster_state == "new" ? ClusterState::kNew : ClusterState::kExisting;
  if (bootstrap_flags > 1) {
    return VerifyError(
        "multiple discovery or bootstrap flags are set. Choose one of \"initial-cluster\", "
        "\"discovery\" or \"discovery-srv\"");
  }
  return absl::OkStatus();
}

// --heartbeat-interval and --election-timeout, bounded as etcd bounds them.
absl::Status CheckRaftTiming(const ServerConfig& c) {
  if (c.heartbeat_interval_ms == 0) {
    return VerifyError(
        absl::StrCat("--heartbeat-interval must be >0 (set to ", c.heartbeat_interval_ms, "ms)"));
  }
  if (c.election_timeout_ms == 0) {
    return VerifyError(
        absl::StrCat("--election-timeout must be >0 (set to ", c.election_timeout_ms, "ms)"));
  }
  if (static_cast<unsigned __int128>(c.heartbeat_interval_ms) * 5 > c.election_timeout_ms) {
    return VerifyError(absl::StrCat("--election-timeout[", c.election_timeout_ms,
                                    "ms] should be at least as 5 times as --heartbeat-interval[",
                                    c.heartbeat_interval_ms, "ms]"));
  }
  if (c.election_timeout_ms > 50000) {
    return VerifyError(absl::StrCat("--election-timeout[", c.election_timeout_ms,
                                    "ms] is too long, and should be set less than 50000ms"));
  }
  return absl::OkStatus();
}

// --auto-compaction-mode, from its text.
absl::Status SetCompactionMode(ParseState& st) {
  ServerConfig& c = st.cfg;
  if (st.auto_compaction_mode == "periodic" || st.auto_compaction_mode.empty()) {
    c.auto_compaction_mode = CompactionMode::kPeriodic;
  } else if (st.auto_compaction_mode == "revision") {
    c.auto_compaction_mode = CompactionMode::kRevision;
  } else {
    return VerifyError(
        absl::StrCat("unknown auto-compaction-mode ", GoQuote(st.auto_compaction_mode)));
  }
  return absl::OkStatus();
}

// The lease checkpoint gates and --compact-hash-check-time. The texts are
// etcd 3.5's when only the experimental flags set the gates, etcd 3.6's when
// --feature-gates was given.
absl::Status CheckExperimental(ServerConfig& c) {
  const bool checkpoint = c.feature_gates.Enabled(kLeaseCheckpointGate);
  const bool persist = c.feature_gates.Enabled(kLeaseCheckpointPersistGate);
  const bool gates_given = c.explicitly_set.count("feature-gates") != 0;
  if (checkpoint && !persist) {
    c.warnings.push_back(absl::StrCat(
        "Detected that checkpointing is enabled without persistence. Consider enabling ",
        gates_given ? "feature gate LeaseCheckpointPersist"
                    : "experimental-enable-lease-checkpoint-persist"));
  }
  if (persist && !checkpoint) {
    return VerifyError(gates_given ? "enabling feature gate LeaseCheckpointPersist requires "
                                     "enabling feature gate LeaseCheckpoint"
                                   : "setting experimental-enable-lease-checkpoint-persist "
                                     "requires experimental-enable-lease-checkpoint");
  }
  // etcd 3.6 checks the value of each name before copying the old into the
  // new one: the message names the flag that was set.
  if (c.compact_hash_check_time <= absl::ZeroDuration()) {
    const bool new_name = c.explicitly_set.count("compact-hash-check-time") != 0;
    return VerifyError(absl::StrCat(
        new_name ? "--compact-hash-check-time" : "--experimental-compact-hash-check-time",
        " must be >0 (set to ", gotext::FormatGoDuration(c.compact_hash_check_time), ")"));
  }
  return absl::OkStatus();
}

// --tls-min-version and --tls-max-version, and cipher suites with them.
absl::Status CheckTlsVersions(const ServerConfig& c) {
  absl::StatusOr<int> min_version = TlsVersion(c.tls_min_version);
  if (!min_version.ok()) return min_version.status();
  absl::StatusOr<int> max_version = TlsVersion(c.tls_max_version);
  if (!max_version.ok()) return max_version.status();
  if (*max_version != 0 && *min_version > *max_version) {
    return VerifyError(absl::StrCat("min version (", c.tls_min_version,
                                    ") is greater than max version (", c.tls_max_version, ")"));
  }
  if (*min_version == 13 && !c.cipher_suites.empty()) {
    return VerifyError("cipher suites cannot be configured when only TLS1.3 is enabled");
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// What etcd checks while starting the server, and Capstan's own refusals
// ---------------------------------------------------------------------------

// embed.Config.UpdateDefaultClusterFromName: `etcd --name=abc` alone
// bootstraps member abc at its advertised peer URLs.
void UpdateDefaultClusterFromName(ServerConfig& c) {
  if (c.name != ServerConfig().name && c.initial_cluster == ServerConfig().initial_cluster) {
    std::vector<std::string> entries;
    for (const Url& url : c.initial_advertise_peer_urls) {
      entries.push_back(absl::StrCat(c.name, "=", url.String()));
    }
    c.initial_cluster = absl::StrJoin(entries, ",");
  }
}

// --initial-cluster, if any, names this member.
absl::Status CheckInitialCluster(const ServerConfig& c) {
  if (c.initial_cluster.empty()) return absl::OkStatus();
  absl::StatusOr<InitialCluster> members = ParseInitialCluster(c.initial_cluster);
  if (!members.ok()) {
    return VerifyError(
        absl::StrCat("error setting up initial cluster: ", members.status().message()));
  }
  if (members->count(c.name) == 0) {
    return VerifyError(absl::StrCat("couldn't find local name ", GoQuote(c.name),
                                    " in the initial cluster configuration"));
  }
  return absl::OkStatus();
}

// embed's parseCompactionRetention: --auto-compaction-retention as a
// period or a number of revisions, by the mode.
absl::Status ParseCompactionRetention(ServerConfig& c) {
  c.auto_compaction_period = absl::ZeroDuration();
  c.auto_compaction_revisions = 0;
  int64_t whole;
  if (ParseGoInt(c.auto_compaction_retention, 10, &whole) == NumError::kOk && whole >= 0) {
    if (c.auto_compaction_mode == CompactionMode::kRevision) {
      c.auto_compaction_revisions = whole;
    } else {
      c.auto_compaction_period = absl::Hours(whole);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<absl::Duration> d = gotext::ParseGoDuration(c.auto_compaction_retention);
  if (!d.ok()) {
    return VerifyError(absl::StrCat("error parsing CompactionRetention: ", d.status().message()));
  }
  if (c.auto_compaction_mode == CompactionMode::kRevision) {
    c.auto_compaction_revisions = absl::ToInt64Nanoseconds(*d);
  } else {
    c.auto_compaction_period = *d;
  }
  return absl::OkStatus();
}

absl::Status CheckCipherSuites(const ServerConfig& c) {
  for (const std::string& suite : c.cipher_suites) {
    if (!IsKnownCipherSuite(suite)) {
      return VerifyError(absl::StrCat("unexpected TLS cipher suite ", GoQuote(suite)));
    }
  }
  return absl::OkStatus();
}

// auth.NewTokenProvider's decomposeOpts over --auth-token, and the bcrypt
// cost etcd falls back from.
absl::Status CheckAuth(ServerConfig& c) {
  std::vector<std::string> opts = absl::StrSplit(c.auth_token, ',');
  c.auth_token_type = opts[0];
  c.auth_token_options.clear();
  for (size_t i = 1; i < opts.size(); ++i) {
    std::vector<std::string> kv = absl::StrSplit(opts[i], '=');
    if (kv.size() != 2 || c.auth_token_options.count(kv[0]) != 0) {
      return VerifyError("auth: invalid auth options");
    }
    c.auth_token_options[kv[0]] = kv[1];
  }
  if (c.auth_token_type != "simple" && c.auth_token_type != "jwt" && !c.auth_token_type.empty()) {
    return VerifyError("auth: invalid auth options");
  }
  if (c.auth_token_type == "simple") {
    c.warnings.push_back("simple token is not cryptographically signed");
  }
  if (c.bcrypt_cost < 4 || c.bcrypt_cost > 31) {
    c.warnings.push_back(absl::StrFormat(
        "use default bcrypt cost instead of the invalid given cost (given-cost %d, min-cost 4, "
        "max-cost 31, default-cost 10)",
        c.bcrypt_cost));
    c.bcrypt_cost = 10;
  }
  return absl::OkStatus();
}

// The backend quota (only a warning, as in etcd), and Capstan's own limits.
absl::Status CheckLimits(ServerConfig& c) {
  if (c.quota_backend_bytes > ServerConfig::kMaxQuotaBackendBytes) {
    c.warnings.push_back(absl::StrFormat(
        "quota exceeds the maximum value (quota-size-bytes %d, maximum-value-bytes %d)",
        c.quota_backend_bytes, ServerConfig::kMaxQuotaBackendBytes));
  }
  if (c.backend_cache_bytes < 0) {
    return VerifyError(
        absl::StrCat("--backend-cache-bytes must be >=0 (set to ", c.backend_cache_bytes, ")"));
  }
  if (c.lease_revoke_rate <= 0) {
    return VerifyError(
        absl::StrCat("--lease-revoke-rate must be >0 (set to ", c.lease_revoke_rate, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateLikeEtcd(ParseState& st, bool may_be_proxy) {
  ServerConfig& c = st.cfg;
  if (absl::Status s = ValidateLogging(st); !s.ok()) return s;
  if (absl::Status s = CheckUrls(c); !s.ok()) return s;
  if (absl::Status s = CheckBootstrap(st); !s.ok()) return s;
  if (absl::Status s = CheckRaftTiming(c); !s.ok()) return s;
  if (!c.listen_client_urls.empty() && c.advertise_client_urls.empty() && !may_be_proxy) {
    return VerifyError(
        "--advertise-client-urls is required when --listen-client-urls is set "
        "explicitly");
  }
  if (absl::Status s = SetCompactionMode(st); !s.ok()) return s;
  if (absl::Status s = CheckExperimental(c); !s.ok()) return s;
  return CheckTlsVersions(c);
}

absl::StatusOr<InitialCluster> ParseInitialCluster(absl::string_view text) {
  std::map<std::string, std::vector<std::string>> texts;
  for (absl::string_view pair : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(pair, absl::MaxSplits('=', 1));
    texts[kv.first].push_back(kv.second);
  }
  InitialCluster members;
  for (const auto& [member, urls] : texts) {
    absl::StatusOr<std::vector<Url>> parsed = ParseUrlList(absl::StrJoin(urls, ","));
    if (!parsed.ok()) return parsed.status();
    members[member] = *std::move(parsed);
  }
  return members;
}

absl::Status ValidateAtStart(ServerConfig& c) {
  if (c.proxy != "off") {
    return RefusalError(
        absl::StrCat("Capstan does not implement the v2 proxy: --proxy must be "
                     "'off' (got ",
                     GoQuote(c.proxy), ")"));
  }
  UpdateDefaultClusterFromName(c);
  if (absl::Status s = CheckInitialCluster(c); !s.ok()) return s;
  if (absl::Status s = ParseCompactionRetention(c); !s.ok()) return s;
  if (absl::Status s = CheckCipherSuites(c); !s.ok()) return s;
  if (absl::Status s = CheckAuth(c); !s.ok()) return s;
  return CheckLimits(c);
}

}  // namespace capstan::server::config_internal
