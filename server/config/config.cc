#include "server/config/config.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "server/config/config_file.h"
#include "util/go_text.h"

namespace capstan::server {
namespace {

using gotext::GoQuote;
using gotext::IsIp;
using gotext::NumError;
using gotext::ParseGoBool;
using gotext::ParseGoInt;
using gotext::ParseGoUint;
using gotext::ParseGoUrl;
using gotext::SplitHostPort;
using gotext::Std;

// ===========================================================================
// Failures carry the exit code in a payload.
// ===========================================================================

constexpr char kFailurePayload[] = "type.capstan.io/capstan.server.ConfigFailure";

absl::Status Failure(absl::StatusCode code, int exit_code, bool print_usage, std::string msg) {
  absl::Status status(code, msg);
  status.SetPayload(kFailurePayload,
                    absl::Cord(absl::StrCat(exit_code, print_usage ? ",usage" : "")));
  return status;
}

// A command-line syntax error: Go's flag package prints it with the usage
// and the process exits 2.
absl::Status UsageError(std::string msg) {
  return Failure(absl::StatusCode::kInvalidArgument, 2, true, std::move(msg));
}

// A configuration etcd refuses after parsing: logged, exit 1.
absl::Status VerifyError(std::string msg) {
  return Failure(absl::StatusCode::kInvalidArgument, 1, false, std::move(msg));
}

// Something etcd would do that Capstan does not: exit 1.
absl::Status RefusalError(std::string msg) {
  return Failure(absl::StatusCode::kUnimplemented, 1, false, std::move(msg));
}

// ===========================================================================
// The flag table.
// ===========================================================================

// Values held as text until validation, as etcd does.
struct ParseState {
  ServerConfig cfg;
  std::string auto_compaction_mode = "periodic";
  std::string log_level = "info";
  std::string initial_cluster_state = "new";
};

// Sets a flag from its text. On failure returns the bare reason ("parse
// error", "invalid value", ...) that the caller wraps in etcd's sentence.
using Setter = std::function<absl::Status(ParseState&, absl::string_view)>;

struct Value {
  Setter set;
  bool is_bool = false;
};

enum class Section {
  kMember,
  kClustering,
  kSecurity,
  kAuth,
  kProfiling,
  kLogging,
  kTracing,
  kProxy,
  kExperimental,
  kUnsafe,
  kCapstan,
  kHidden,  // version, config-file, etcd's ignored legacy flags
};

struct FlagSpec {
  absl::string_view name;
  Section section;
  Value value;
  absl::string_view default_text;  // as --help shows it, quotes included
  absl::string_view help;          // may hold several lines, "\n"-separated
  bool no_effect = false;          // accepted but meaningless for one member
};

absl::Status ParseErr() { return absl::InvalidArgumentError("parse error"); }
absl::Status RangeErr() { return absl::InvalidArgumentError("value out of range"); }

Value Str(std::string ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    st.cfg.*field = std::string(v);
    return absl::OkStatus();
  }};
}

Value StrIn(std::string ParseState::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    st.*field = std::string(v);
    return absl::OkStatus();
  }};
}

Value Bool(bool ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
            std::optional<bool> b = ParseGoBool(v);
            if (!b) return ParseErr();
            st.cfg.*field = *b;
            return absl::OkStatus();
          },
          /*is_bool=*/true};
}

// Go's flag.Uint / flag.Uint64 (64-bit).
Value Uint(uint64_t ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    uint64_t n;
    switch (ParseGoUint(v, 0, 64, &n)) {
      case NumError::kSyntax:
        return ParseErr();
      case NumError::kRange:
        return RangeErr();
      case NumError::kOk:
        break;
    }
    st.cfg.*field = n;
    return absl::OkStatus();
  }};
}

// Go's flag.Int / flag.Int64 (64-bit).
Value Int(int64_t ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    int64_t n;
    switch (ParseGoInt(v, 0, &n)) {
      case NumError::kSyntax:
        return ParseErr();
      case NumError::kRange:
        return RangeErr();
      case NumError::kOk:
        break;
    }
    st.cfg.*field = n;
    return absl::OkStatus();
  }};
}

// etcd's flags.uint32Value, which reports strconv's own error text.
Value Uint32(uint32_t ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    uint64_t n;
    switch (ParseGoUint(v, 0, 32, &n)) {
      case NumError::kSyntax:
        return absl::InvalidArgumentError(
            absl::StrCat("strconv.ParseUint: parsing ", GoQuote(v), ": invalid syntax"));
      case NumError::kRange:
        return absl::InvalidArgumentError(
            absl::StrCat("strconv.ParseUint: parsing ", GoQuote(v), ": value out of range"));
      case NumError::kOk:
        break;
    }
    st.cfg.*field = static_cast<uint32_t>(n);
    return absl::OkStatus();
  }};
}

Value Dur(absl::Duration ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    absl::StatusOr<absl::Duration> d = gotext::ParseGoDuration(Std(v));
    if (!d.ok()) return ParseErr();
    st.cfg.*field = *d;
    return absl::OkStatus();
  }};
}

// etcd's flags.UniqueURLs with the "" exception: an empty value leaves the
// list as it was (etcd keeps the default), any other value replaces it.
Value Urls(std::vector<Url> ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    if (v.empty()) return absl::OkStatus();
    absl::StatusOr<std::vector<Url>> urls = ParseUrlList(Std(v));
    if (!urls.ok()) return urls.status();
    st.cfg.*field = *std::move(urls);
    return absl::OkStatus();
  }};
}

// etcd's flags.UniqueStringsValue: split on ",", sorted, de-duplicated.
Value UniqueStrings(std::set<std::string> ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    std::set<std::string> values;
    for (absl::string_view part : absl::StrSplit(v, ',')) values.insert(std::string(part));
    st.cfg.*field = std::move(values);
    return absl::OkStatus();
  }};
}

// etcd's flags.SelectiveStringValue.
Value Choice(std::string ServerConfig::*field, std::vector<absl::string_view> valid) {
  return {[field, valid](ParseState& st, absl::string_view v) {
    if (std::find(valid.begin(), valid.end(), v) == valid.end()) {
      return absl::InvalidArgumentError("invalid value");
    }
    st.cfg.*field = std::string(v);
    return absl::OkStatus();
  }};
}

Value ChoiceIn(std::string ParseState::*field, std::vector<absl::string_view> valid) {
  return {[field, valid](ParseState& st, absl::string_view v) {
    if (std::find(valid.begin(), valid.end(), v) == valid.end()) {
      return absl::InvalidArgumentError("invalid value");
    }
    st.*field = std::string(v);
    return absl::OkStatus();
  }};
}

// Flags etcd still swallows for compatibility with etcd 0.4/2.x command
// lines (etcd's flags.IgnoredFlag: bool-like, any value).
Value Legacy() {
  return {[](ParseState&, absl::string_view) { return absl::OkStatus(); }, /*is_bool=*/true};
}

// --cors: comma-separated origins, each a URL as etcd validates them, or "*".
Value Cors() {
  return {[](ParseState& st, absl::string_view v) {
    if (v == "*") {
      st.cfg.cors.insert("*");
      return absl::OkStatus();
    }
    absl::StatusOr<std::vector<Url>> urls = ParseUrlList(Std(v));
    if (!urls.ok()) return urls.status();
    st.cfg.cors.clear();
    for (const Url& u : *urls) st.cfg.cors.insert(u.String());
    return absl::OkStatus();
  }};
}

// --log-outputs: UniqueStringsValue into a sorted vector.
Value LogOutputs() {
  return {[](ParseState& st, absl::string_view v) {
    std::set<std::string> values;
    for (absl::string_view part : absl::StrSplit(v, ',')) values.insert(std::string(part));
    st.cfg.log_outputs.assign(values.begin(), values.end());
    return absl::OkStatus();
  }};
}

// --cipher-suites: StringsValue, split on "," as given.
Value CipherSuites() {
  return {[](ParseState& st, absl::string_view v) {
    st.cfg.cipher_suites = absl::StrSplit(v, ',');
    return absl::OkStatus();
  }};
}

// --v2-deprecation: SelectiveStringsValue.
Value V2Deprecation() {
  return {[](ParseState& st, absl::string_view v) {
    for (absl::string_view part : absl::StrSplit(v, ',')) {
      if (part != "not-yet" && part != "write-only" && part != "write-only-drop-data" &&
          part != "gone") {
        return absl::InvalidArgumentError(absl::StrCat("invalid value ", GoQuote(part)));
      }
    }
    st.cfg.v2_deprecation = std::string(v);
    return absl::OkStatus();
  }};
}

// --watch-cache-prefixes: comma list kept in order, empty entries dropped,
// duplicates removed.
Value Prefixes() {
  return {[](ParseState& st, absl::string_view v) {
    std::vector<std::string> prefixes;
    for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipEmpty())) {
      std::string p(absl::StripAsciiWhitespace(part));
      if (!p.empty() && std::find(prefixes.begin(), prefixes.end(), p) == prefixes.end()) {
        prefixes.push_back(std::move(p));
      }
    }
    st.cfg.watch_cache_prefixes = std::move(prefixes);
    return absl::OkStatus();
  }};
}

using S = ServerConfig;
constexpr bool kNoEffect = true;

std::vector<FlagSpec> BuildFlags() {
  return {
      // ---- Member ----
      {"name", Section::kMember, Str(&S::name), "'default'",
       "Human-readable name for this member."},
      {"data-dir", Section::kMember, Str(&S::data_dir), "'${name}.capstan'",
       "Path to the data directory. Capstan's default is '${name}.capstan' (etcd's is\n"
       "'${name}.etcd'): Capstan's RocksDB files are not an etcd data directory."},
      {"wal-dir", Section::kMember, Str(&S::wal_dir), "''",
       "Path to the dedicated wal directory. No effect in Capstan: the storage engine's\n"
       "write-ahead log lives in --data-dir.",
       kNoEffect},
      {"snapshot-count", Section::kMember, Uint(&S::snapshot_count), "'100000'",
       "Number of committed transactions to trigger a snapshot to disk. No effect in\n"
       "Capstan (no raft log to snapshot).",
       kNoEffect},
      {"heartbeat-interval", Section::kMember, Uint(&S::heartbeat_interval_ms), "'100'",
       "Time (in milliseconds) of a heartbeat interval. Validated as etcd does; with\n"
       "--election-timeout it sets the shortest lease TTL, as in etcd (one member holds\n"
       "no elections)."},
      {"election-timeout", Section::kMember, Uint(&S::election_timeout_ms), "'1000'",
       "Time (in milliseconds) for an election to timeout. Validated as etcd does; leases\n"
       "live at least 1.5 election timeouts (rounded up to seconds), as in etcd."},
      {"initial-election-tick-advance", Section::kMember, Bool(&S::initial_election_tick_advance),
       "'true'",
       "Whether to fast-forward initial election ticks on boot for faster election. No\n"
       "effect in Capstan.",
       kNoEffect},
      {"listen-peer-urls", Section::kMember, Urls(&S::listen_peer_urls), "'http://localhost:2380'",
       "List of URLs to listen on for peer traffic. Validated; no effect in a\n"
       "single-member Capstan (nothing listens for peers).",
       kNoEffect},
      {"listen-client-urls", Section::kMember, Urls(&S::listen_client_urls),
       "'http://localhost:2379'",
       "List of URLs to listen on for client grpc traffic and http as long as\n"
       "--listen-client-http-urls is not specified."},
      {"listen-client-http-urls", Section::kMember, Urls(&S::listen_client_http_urls), "''",
       "List of URLs to listen on for http only client traffic. Enabling this flag\n"
       "removes http services from --listen-client-urls. http:// URLs only."},
      {"max-snapshots", Section::kMember, Uint(&S::max_snapshots), "'5'",
       "Maximum number of snapshot files to retain (0 is unlimited). No effect in Capstan.",
       kNoEffect},
      {"max-wals", Section::kMember, Uint(&S::max_wals), "'5'",
       "Maximum number of wal files to retain (0 is unlimited). No effect in Capstan.", kNoEffect},
      {"quota-backend-bytes", Section::kMember, Int(&S::quota_backend_bytes), "'0'",
       "Raise alarms when backend size exceeds the given quota (0 defaults to low space\n"
       "quota, 2 GiB; a negative value disables the quota)."},
      {"backend-bbolt-freelist-type", Section::kMember, Str(&S::backend_bbolt_freelist_type),
       "'map'",
       "BackendFreelistType specifies the type of freelist that boltdb backend uses (array\n"
       "and map are supported types). No effect in Capstan, whose backend is RocksDB.",
       kNoEffect},
      {"backend-batch-interval", Section::kMember, Dur(&S::backend_batch_interval), "''",
       "Capstan: the longest time a group commit waits to gather more write requests\n"
       "before it is written and synced (Go duration, e.g. '2ms'). Unset or 0 uses\n"
       "Capstan's default. In etcd: the maximum time before committing the backend\n"
       "transaction."},
      {"backend-batch-limit", Section::kMember, Int(&S::backend_batch_limit), "'0'",
       "Capstan: the most write requests in one group commit. 0 uses Capstan's default.\n"
       "In etcd: the maximum operations before committing the backend transaction."},
      {"max-txn-ops", Section::kMember, Uint(&S::max_txn_ops), "'128'",
       "Maximum number of operations permitted in a transaction."},
      {"max-request-bytes", Section::kMember, Uint(&S::max_request_bytes), "'1572864'",
       "Maximum client request size in bytes the server will accept."},
      {"max-concurrent-streams", Section::kMember, Uint32(&S::max_concurrent_streams),
       "'math.MaxUint32'", "Maximum concurrent streams that each client can open at a time."},
      {"grpc-keepalive-min-time", Section::kMember, Dur(&S::grpc_keepalive_min_time), "'5s'",
       "Minimum duration interval that a client should wait before pinging server."},
      {"grpc-keepalive-interval", Section::kMember, Dur(&S::grpc_keepalive_interval), "'2h'",
       "Frequency duration of server-to-client ping to check if a connection is alive (0\n"
       "to disable)."},
      {"grpc-keepalive-timeout", Section::kMember, Dur(&S::grpc_keepalive_timeout), "'20s'",
       "Additional duration of wait before closing a non-responsive connection (0 to\n"
       "disable)."},
      {"socket-reuse-port", Section::kMember, Bool(&S::socket_reuse_port), "'false'",
       "Enable to set socket option SO_REUSEPORT on listeners allowing rebinding of a port\n"
       "already in use."},
      {"socket-reuse-address", Section::kMember, Bool(&S::socket_reuse_address), "'false'",
       "Enable to set socket option SO_REUSEADDR on listeners allowing binding to an\n"
       "address in TIME_WAIT state."},

      {"enable-grpc-gateway", Section::kMember, Bool(&S::enable_grpc_gateway), "'true'",
       "Enable GRPC gateway: etcd's JSON API (/v3/kv/range, ...) on the http client URLs."},

      // ---- Clustering ----
      {"initial-advertise-peer-urls", Section::kClustering, Urls(&S::initial_advertise_peer_urls),
       "'http://localhost:2380'",
       "List of this member's peer URLs to advertise to the rest of the cluster. Validated;\n"
       "no effect in a single-member Capstan.",
       kNoEffect},
      {"initial-cluster", Section::kClustering, Str(&S::initial_cluster),
       "'default=http://localhost:2380'",
       "Initial cluster configuration for bootstrapping. Capstan is single-member: the\n"
       "list must name only this member (--name); more members are refused.",
       kNoEffect},
      {"initial-cluster-state", Section::kClustering,
       ChoiceIn(&ParseState::initial_cluster_state, {"new", "existing"}), "'new'",
       "Initial cluster state ('new' or 'existing'). No effect in Capstan, which starts\n"
       "from whatever --data-dir holds.",
       kNoEffect},
      {"initial-cluster-token", Section::kClustering, Str(&S::initial_cluster_token),
       "'etcd-cluster'",
       "Initial cluster token for the etcd cluster during bootstrap.\n"
       "Specifying this can protect you from unintended cross-cluster interaction when\n"
       "running multiple clusters."},
      {"advertise-client-urls", Section::kClustering, Urls(&S::advertise_client_urls),
       "'http://localhost:2379'",
       "List of this member's client URLs to advertise to the public.\n"
       "The client URLs advertised should be accessible to machines that talk to etcd\n"
       "cluster. etcd client libraries parse these URLs to connect to the cluster."},
      {"discovery", Section::kClustering, Str(&S::discovery), "''",
       "Discovery URL used to bootstrap the cluster. No effect in Capstan.", kNoEffect},
      {"discovery-fallback", Section::kClustering,
       Choice(&S::discovery_fallback, {"exit", "proxy"}), "'proxy'",
       "Expected behavior ('exit' or 'proxy') when discovery services fails.\n"
       "\"proxy\" supports v2 API only. No effect in Capstan.",
       kNoEffect},
      {"discovery-proxy", Section::kClustering, Str(&S::discovery_proxy), "''",
       "HTTP proxy to use for traffic to discovery service. No effect in Capstan.", kNoEffect},
      {"discovery-srv", Section::kClustering, Str(&S::discovery_srv), "''",
       "DNS srv domain used to bootstrap the cluster. No effect in Capstan.", kNoEffect},
      {"discovery-srv-name", Section::kClustering, Str(&S::discovery_srv_name), "''",
       "Suffix to the dns srv name queried when bootstrapping. No effect in Capstan.", kNoEffect},
      {"strict-reconfig-check", Section::kClustering, Bool(&S::strict_reconfig_check), "'true'",
       "Reject reconfiguration requests that would cause quorum loss. No effect in Capstan.",
       kNoEffect},
      {"pre-vote", Section::kClustering, Bool(&S::pre_vote), "'true'",
       "Enable the raft Pre-Vote algorithm to prevent disruption when a node that has been\n"
       "partitioned away rejoins the cluster. No effect in Capstan.",
       kNoEffect},
      {"auto-compaction-retention", Section::kClustering, Str(&S::auto_compaction_retention), "'0'",
       "Auto compaction retention length. 0 means disable auto compaction."},
      {"auto-compaction-mode", Section::kClustering, StrIn(&ParseState::auto_compaction_mode),
       "'periodic'",
       "Interpret 'auto-compaction-retention' one of: periodic|revision. 'periodic' for\n"
       "duration based retention, defaulting to hours if no time unit is provided (e.g.\n"
       "'5m'). 'revision' for revision number based retention."},
      {"enable-v2", Section::kClustering, Bool(&S::enable_v2), "'false'",
       "Accept etcd V2 client requests. No effect in Capstan, which serves the v3 API only.",
       kNoEffect},
      {"v2-deprecation", Section::kClustering, V2Deprecation(), "'not-yet'",
       "Phase of v2store deprecation ('not-yet', 'write-only', 'write-only-drop-data' or\n"
       "'gone'). No effect in Capstan, which has no v2 store.",
       kNoEffect},

      // ---- Security ----
      {"cert-file", Section::kSecurity, Str(&S::cert_file), "''",
       "Path to the client server TLS cert file."},
      {"key-file", Section::kSecurity, Str(&S::key_file), "''",
       "Path to the client server TLS key file."},
      {"client-cert-file", Section::kSecurity, Str(&S::client_cert_file), "''",
       "Path to an explicit peer client TLS cert file otherwise cert file will be used when\n"
       "client auth is required."},
      {"client-key-file", Section::kSecurity, Str(&S::client_key_file), "''",
       "Path to an explicit peer client TLS key file otherwise key file will be used when\n"
       "client auth is required."},
      {"client-cert-auth", Section::kSecurity, Bool(&S::client_cert_auth), "'false'",
       "Enable client cert authentication."},
      {"client-crl-file", Section::kSecurity, Str(&S::client_crl_file), "''",
       "Path to the client certificate revocation list file."},
      {"client-cert-allowed-hostname", Section::kSecurity, Str(&S::client_cert_allowed_hostname),
       "''", "Allowed TLS hostname for client cert authentication."},
      {"trusted-ca-file", Section::kSecurity, Str(&S::trusted_ca_file), "''",
       "Path to the client server TLS trusted CA cert file."},
      {"auto-tls", Section::kSecurity, Bool(&S::auto_tls), "'false'",
       "Client TLS using generated certificates."},
      {"peer-cert-file", Section::kSecurity, Str(&S::peer_cert_file), "''",
       "Path to the peer server TLS cert file. No effect in Capstan.", kNoEffect},
      {"peer-key-file", Section::kSecurity, Str(&S::peer_key_file), "''",
       "Path to the peer server TLS key file. No effect in Capstan.", kNoEffect},
      {"peer-client-cert-file", Section::kSecurity, Str(&S::peer_client_cert_file), "''",
       "Path to an explicit peer client TLS cert file. No effect in Capstan.", kNoEffect},
      {"peer-client-key-file", Section::kSecurity, Str(&S::peer_client_key_file), "''",
       "Path to an explicit peer client TLS key file. No effect in Capstan.", kNoEffect},
      {"peer-client-cert-auth", Section::kSecurity, Bool(&S::peer_client_cert_auth), "'false'",
       "Enable peer client cert authentication. No effect in Capstan.", kNoEffect},
      {"peer-trusted-ca-file", Section::kSecurity, Str(&S::peer_trusted_ca_file), "''",
       "Path to the peer server TLS trusted CA file. No effect in Capstan.", kNoEffect},
      {"peer-cert-allowed-cn", Section::kSecurity, Str(&S::peer_cert_allowed_cn), "''",
       "Required CN for client certs connecting to the peer endpoint. No effect in Capstan.",
       kNoEffect},
      {"peer-cert-allowed-hostname", Section::kSecurity, Str(&S::peer_cert_allowed_hostname), "''",
       "Allowed TLS hostname for inter peer authentication. No effect in Capstan.", kNoEffect},
      {"peer-auto-tls", Section::kSecurity, Bool(&S::peer_auto_tls), "'false'",
       "Peer TLS using self-generated certificates if --peer-key-file and --peer-cert-file\n"
       "are not provided. No effect in Capstan.",
       kNoEffect},
      {"self-signed-cert-validity", Section::kSecurity, Uint(&S::self_signed_cert_validity_years),
       "'1'",
       "The validity period of the client and peer certificates that are automatically\n"
       "generated by etcd when you specify ClientAutoTLS and PeerAutoTLS, the unit is year,\n"
       "and the default is 1."},
      {"peer-crl-file", Section::kSecurity, Str(&S::peer_crl_file), "''",
       "Path to the peer certificate revocation list file. No effect in Capstan.", kNoEffect},
      {"cipher-suites", Section::kSecurity, CipherSuites(), "''",
       "Comma-separated list of supported TLS cipher suites between client/server and peers\n"
       "(empty will be auto-populated). Go's names, e.g.\n"
       "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256."},
      {"cors", Section::kSecurity, Cors(), "'*'",
       "Comma-separated whitelist of origins for CORS, or cross-origin resource sharing,\n"
       "(empty or * means allow all)."},
      {"host-whitelist", Section::kSecurity, UniqueStrings(&S::host_whitelist), "'*'",
       "Acceptable hostnames from HTTP client requests, if server is not secure (empty or *\n"
       "means allow all)."},
      {"tls-min-version", Section::kSecurity, Str(&S::tls_min_version), "'TLS1.2'",
       "Minimum TLS version supported by etcd. Possible values: TLS1.2, TLS1.3."},
      {"tls-max-version", Section::kSecurity, Str(&S::tls_max_version), "''",
       "Maximum TLS version supported by etcd. Possible values: TLS1.2, TLS1.3 (empty\n"
       "will be auto-populated)."},
      {"experimental-peer-skip-client-san-verification", Section::kSecurity,
       Bool(&S::experimental_peer_skip_client_san_verification), "'false'",
       "Skip verification of SAN field in client certificate for peer connections. No\n"
       "effect in Capstan.",
       kNoEffect},

      // ---- Auth ----
      {"auth-token", Section::kAuth, Str(&S::auth_token), "'simple'",
       "Specify a v3 authentication token type and token specific options, especially for\n"
       "JWT. Its format is \"type,var1=val1,var2=val2,...\". Possible type is 'simple' or\n"
       "'jwt'. Possible variables are 'sign-method', 'pub-key', 'priv-key' and 'ttl'."},
      {"bcrypt-cost", Section::kAuth, Uint(&S::bcrypt_cost), "10",
       "Specify the cost / strength of the bcrypt algorithm for hashing auth passwords.\n"
       "Valid values are between 4 and 31."},
      {"auth-token-ttl", Section::kAuth, Uint(&S::auth_token_ttl_seconds), "300",
       "Time (in seconds) of the auth-token-ttl."},

      // ---- Profiling and monitoring ----
      {"enable-pprof", Section::kProfiling, Bool(&S::enable_pprof), "'false'",
       "Enable runtime profiling data via HTTP server. No effect in Capstan (Go's pprof\n"
       "does not apply).",
       kNoEffect},
      {"metrics", Section::kProfiling, Str(&S::metrics), "'basic'",
       "Set level of detail for exported metrics, specify 'extensive' to include server\n"
       "side grpc histogram metrics."},
      {"listen-metrics-urls", Section::kProfiling, Urls(&S::listen_metrics_urls), "''",
       "List of URLs to listen on for the metrics and health endpoints."},

      // ---- Logging ----
      {"logger", Section::kLogging, Str(&S::logger), "'zap'",
       "Currently only supports 'zap' for structured logging."},
      {"log-outputs", Section::kLogging, LogOutputs(), "'default'",
       "Specify 'stdout' or 'stderr' to skip journald logging even when running under\n"
       "systemd, or list of comma separated output targets."},
      {"log-level", Section::kLogging, StrIn(&ParseState::log_level), "'info'",
       "Configures log level. Only supports debug, info, warn, error, panic, or fatal."},
      {"enable-log-rotation", Section::kLogging, Bool(&S::enable_log_rotation), "'false'",
       "Enable log rotation of a single log-outputs file target."},
      {"log-rotation-config-json", Section::kLogging, Str(&S::log_rotation_config_json),
       "'{\"maxsize\": 100, \"maxage\": 0, \"maxbackups\": 0, \"localtime\": false, "
       "\"compress\": false}'",
       "Configures log rotation if enabled with a JSON logger config. MaxSize(MB),\n"
       "MaxAge(days,0=no limit), MaxBackups(0=no limit), LocalTime(use computers local\n"
       "time), Compress(gzip)."},

      // ---- Experimental distributed tracing ----
      {"experimental-enable-distributed-tracing", Section::kTracing,
       Bool(&S::experimental_enable_distributed_tracing), "'false'",
       "Enable experimental distributed tracing. No effect in Capstan.", kNoEffect},
      {"experimental-distributed-tracing-address", Section::kTracing,
       Str(&S::experimental_distributed_tracing_address), "'localhost:4317'",
       "Distributed tracing collector address. No effect in Capstan.", kNoEffect},
      {"experimental-distributed-tracing-service-name", Section::kTracing,
       Str(&S::experimental_distributed_tracing_service_name), "'etcd'",
       "Distributed tracing service name, must be same across all etcd instances. No effect\n"
       "in Capstan.",
       kNoEffect},
      {"experimental-distributed-tracing-instance-id", Section::kTracing,
       Str(&S::experimental_distributed_tracing_instance_id), "''",
       "Distributed tracing instance ID, must be unique per each etcd instance. No effect in\n"
       "Capstan.",
       kNoEffect},
      {"experimental-distributed-tracing-sampling-rate", Section::kTracing,
       Int(&S::experimental_distributed_tracing_sampling_rate), "'0'",
       "Number of samples to collect per million spans for OpenTelemetry Tracing. No effect\n"
       "in Capstan.",
       kNoEffect},

      // ---- v2 proxy ----
      {"proxy", Section::kProxy, Choice(&S::proxy, {"off", "readonly", "on"}), "'off'",
       "Proxy mode setting ('off', 'readonly' or 'on'). Capstan has no v2 proxy: only 'off'\n"
       "is accepted.",
       kNoEffect},
      {"proxy-failure-wait", Section::kProxy, Uint(&S::proxy_failure_wait_ms), "5000",
       "Time (in milliseconds) an endpoint will be held in a failed state. No effect.", kNoEffect},
      {"proxy-refresh-interval", Section::kProxy, Uint(&S::proxy_refresh_interval_ms), "30000",
       "Time (in milliseconds) of the endpoints refresh interval. No effect.", kNoEffect},
      {"proxy-dial-timeout", Section::kProxy, Uint(&S::proxy_dial_timeout_ms), "1000",
       "Time (in milliseconds) for a dial to timeout. No effect.", kNoEffect},
      {"proxy-write-timeout", Section::kProxy, Uint(&S::proxy_write_timeout_ms), "5000",
       "Time (in milliseconds) for a write to timeout. No effect.", kNoEffect},
      {"proxy-read-timeout", Section::kProxy, Uint(&S::proxy_read_timeout_ms), "0",
       "Time (in milliseconds) for a read to timeout. No effect.", kNoEffect},

      // ---- Experimental ----
      {"experimental-initial-corrupt-check", Section::kExperimental,
       Bool(&S::experimental_initial_corrupt_check), "'false'",
       "Enable to check data corruption before serving any client/peer traffic. No effect in\n"
       "Capstan (there are no peers to compare with).",
       kNoEffect},
      {"experimental-corrupt-check-time", Section::kExperimental,
       Dur(&S::experimental_corrupt_check_time), "'0s'",
       "Duration of time between cluster corruption check passes. No effect in Capstan.",
       kNoEffect},
      {"experimental-compact-hash-check-enabled", Section::kExperimental,
       Bool(&S::experimental_compact_hash_check_enabled), "'false'",
       "Enable leader to periodically check followers compaction hashes. No effect in\n"
       "Capstan.",
       kNoEffect},
      {"experimental-compact-hash-check-time", Section::kExperimental,
       Dur(&S::experimental_compact_hash_check_time), "'1m'",
       "Duration of time between leader checks followers compaction hashes. No effect in\n"
       "Capstan.",
       kNoEffect},
      {"experimental-enable-v2v3", Section::kExperimental, Str(&S::experimental_enable_v2v3), "''",
       "Serve v2 requests through the v3 backend under a given prefix. No effect in Capstan.",
       kNoEffect},
      {"experimental-enable-lease-checkpoint", Section::kExperimental,
       Bool(&S::experimental_enable_lease_checkpoint), "'false'",
       "ExperimentalEnableLeaseCheckpoint enables leader to send regular checkpoints to\n"
       "other members to prevent reset of remaining TTL on leader change. No effect in\n"
       "Capstan.",
       kNoEffect},
      {"experimental-enable-lease-checkpoint-persist", Section::kExperimental,
       Bool(&S::experimental_enable_lease_checkpoint_persist), "'false'",
       "Enable persisting remainingTTL to prevent indefinite auto-renewal of long lived\n"
       "leases. Requires --experimental-enable-lease-checkpoint. No effect in Capstan.",
       kNoEffect},
      {"experimental-compaction-batch-limit", Section::kExperimental,
       Int(&S::experimental_compaction_batch_limit), "1000",
       "ExperimentalCompactionBatchLimit sets the maximum revisions deleted in each\n"
       "compaction batch."},
      {"experimental-compaction-sleep-interval", Section::kExperimental,
       Dur(&S::experimental_compaction_sleep_interval), "'10ms'",
       "Sets the sleep interval between each compaction batch."},
      {"experimental-watch-progress-notify-interval", Section::kExperimental,
       Dur(&S::experimental_watch_progress_notify_interval), "'10m'",
       "Duration of periodical watch progress notification."},
      {"experimental-downgrade-check-time", Section::kExperimental,
       Dur(&S::experimental_downgrade_check_time), "'5s'",
       "Duration of time between two downgrade status checks. No effect in Capstan.", kNoEffect},
      {"experimental-warning-apply-duration", Section::kExperimental,
       Dur(&S::experimental_warning_apply_duration), "'100ms'",
       "Warning is generated if requests take more than this duration."},
      {"experimental-warning-unary-request-duration", Section::kExperimental,
       Dur(&S::experimental_warning_unary_request_duration), "'300ms'",
       "Set time duration after which a warning is generated if a unary request takes more\n"
       "than this duration."},
      {"experimental-memory-mlock", Section::kExperimental, Bool(&S::experimental_memory_mlock),
       "'false'",
       "Enable to enforce etcd pages (in particular bbolt) to stay in RAM. No effect in\n"
       "Capstan.",
       kNoEffect},
      {"experimental-txn-mode-write-with-shared-buffer", Section::kExperimental,
       Bool(&S::experimental_txn_mode_write_with_shared_buffer), "'true'",
       "Enable the write transaction to use a shared buffer in its readonly check\n"
       "operations. No effect in Capstan.",
       kNoEffect},
      {"experimental-bootstrap-defrag-threshold-megabytes", Section::kExperimental,
       Uint(&S::experimental_bootstrap_defrag_threshold_megabytes), "'0'",
       "Enable the defrag during etcd server bootstrap on condition that it will free at\n"
       "least the provided threshold of disk space. No effect in Capstan.",
       kNoEffect},
      {"experimental-snapshot-catchup-entries", Section::kExperimental,
       Uint(&S::experimental_snapshot_catchup_entries), "'5000'",
       "Number of entries for a slow follower to catch up after compacting the raft\n"
       "storage entries. No effect in Capstan.",
       kNoEffect},
      {"experimental-stop-grpc-service-on-defrag", Section::kExperimental,
       Bool(&S::experimental_stop_grpc_service_on_defrag), "'false'",
       "Enable etcd gRPC service to stop serving client requests on defragmentation. No\n"
       "effect in Capstan, whose defragmentation runs online.",
       kNoEffect},

      // ---- Unsafe ----
      {"force-new-cluster", Section::kUnsafe, Bool(&S::force_new_cluster), "'false'",
       "Force to create a new one-member cluster. No effect in Capstan, which is always a\n"
       "one-member cluster.",
       kNoEffect},
      {"unsafe-no-fsync", Section::kUnsafe, Bool(&S::unsafe_no_fsync), "'false'",
       "Disables fsync, unsafe, will cause data loss."},

      // ---- Capstan ----
      {"watch-cache-prefixes", Section::kCapstan, Prefixes(),
       "'/registry/pods/,/registry/minions/,/registry/leases/'",
       "Comma-separated key prefixes whose watches are served from Capstan's in-memory\n"
       "watch cache. Empty disables the cache."},
      {"lease-revoke-rate", Section::kCapstan, Int(&S::lease_revoke_rate), "1000",
       "Most expired leases revoked per second (etcd's fixed rate is 1000). Must be > 0."},
      {"backend-cache-bytes", Section::kCapstan, Int(&S::backend_cache_bytes), "268435456",
       "Bytes of uncompressed storage blocks kept in memory for reads, taken as blocks\n"
       "are read. A full list of a prefix bigger than this reads and decompresses its\n"
       "blocks again every time. Must be >= 0."},

      // ---- Not listed by section ----
      {"config-file", Section::kHidden, Str(&S::config_file), "''", ""},
      {"version", Section::kHidden, Bool(&S::version_requested), "'false'", ""},
      // etcd's ignored legacy flags.
      {"cluster-active-size", Section::kHidden, Legacy(), "", "", kNoEffect},
      {"cluster-remove-delay", Section::kHidden, Legacy(), "", "", kNoEffect},
      {"cluster-sync-interval", Section::kHidden, Legacy(), "", "", kNoEffect},
      {"config", Section::kHidden, Legacy(), "", "", kNoEffect},
      {"force", Section::kHidden, Legacy(), "", "", kNoEffect},
      {"max-result-buffer", Section::kHidden, Legacy(), "", "", kNoEffect},
      {"max-retry-attempts", Section::kHidden, Legacy(), "", "", kNoEffect},
      {"peer-heartbeat-interval", Section::kHidden, Legacy(), "", "", kNoEffect},
      {"peer-election-timeout", Section::kHidden, Legacy(), "", "", kNoEffect},
      {"retry-interval", Section::kHidden, Legacy(), "", "", kNoEffect},
      {"snapshot", Section::kHidden, Legacy(), "", "", kNoEffect},
      {"v", Section::kHidden, Legacy(), "", "", kNoEffect},
      {"vv", Section::kHidden, Legacy(), "", "", kNoEffect},
  };
}

const std::vector<FlagSpec>& Flags() {
  static const std::vector<FlagSpec>* const flags = new std::vector<FlagSpec>(BuildFlags());
  return *flags;
}

const FlagSpec* LookupFlag(absl::string_view name) {
  for (const FlagSpec& f : Flags()) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

// pkg/flags.FlagToEnv("ETCD", name).
std::string FlagToEnv(absl::string_view name) {
  std::string key = absl::StrCat("ETCD_", name);
  for (char& c : key) c = c == '-' ? '_' : absl::ascii_toupper(c);
  return key;
}

// ===========================================================================
// Validation after parsing.
// ===========================================================================

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
  return absl::OkStatus();
}

// embed.Config.Validate, in etcd's order.
absl::Status ValidateLikeEtcd(ParseState& st, bool may_be_proxy) {
  ServerConfig& c = st.cfg;
  if (absl::Status s = ValidateLogging(st); !s.ok()) return s;
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
  if (!c.listen_client_urls.empty() && c.advertise_client_urls.empty() && !may_be_proxy) {
    return VerifyError(
        "--advertise-client-urls is required when --listen-client-urls is set "
        "explicitly");
  }
  if (st.auto_compaction_mode == "periodic" || st.auto_compaction_mode.empty()) {
    c.auto_compaction_mode = CompactionMode::kPeriodic;
  } else if (st.auto_compaction_mode == "revision") {
    c.auto_compaction_mode = CompactionMode::kRevision;
  } else {
    return VerifyError(
        absl::StrCat("unknown auto-compaction-mode ", GoQuote(st.auto_compaction_mode)));
  }
  if (c.experimental_enable_lease_checkpoint && !c.experimental_enable_lease_checkpoint_persist) {
    c.warnings.push_back(
        "Detected that checkpointing is enabled without persistence. Consider enabling "
        "experimental-enable-lease-checkpoint-persist");
  }
  if (c.experimental_enable_lease_checkpoint_persist && !c.experimental_enable_lease_checkpoint) {
    return VerifyError(
        "setting experimental-enable-lease-checkpoint-persist requires "
        "experimental-enable-lease-checkpoint");
  }
  if (c.experimental_compact_hash_check_time <= absl::ZeroDuration()) {
    return VerifyError(absl::StrCat("--experimental-compact-hash-check-time must be >0 (set to ",
                                    gotext::FormatGoDuration(c.experimental_compact_hash_check_time), ")"));
  }
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

// What etcd checks while starting the server, and Capstan's own refusals.
// types.NewURLsMap: "name=url" pairs; a name may repeat to list several URLs.
using InitialCluster = std::map<std::string, std::vector<Url>>;
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
  // embed.Config.UpdateDefaultClusterFromName: `etcd --name=abc` alone
  // bootstraps member abc at its advertised peer URLs.
  if (c.name != ServerConfig().name && c.initial_cluster == ServerConfig().initial_cluster) {
    std::vector<std::string> entries;
    for (const Url& url : c.initial_advertise_peer_urls) {
      entries.push_back(absl::StrCat(c.name, "=", url.String()));
    }
    c.initial_cluster = absl::StrJoin(entries, ",");
  }
  if (!c.initial_cluster.empty()) {
    absl::StatusOr<InitialCluster> members = ParseInitialCluster(c.initial_cluster);
    if (!members.ok()) {
      return VerifyError(
          absl::StrCat("error setting up initial cluster: ", members.status().message()));
    }
    if (members->size() > 1) {
      std::vector<std::string> names;
      for (const auto& [member, urls] : *members) names.push_back(member);
      return RefusalError(absl::StrCat(
          "Capstan is a single-member server and does not support multi-member clusters yet: "
          "--initial-cluster lists ",
          members->size(), " members (", absl::StrJoin(names, ", "),
          "); give it only this member, e.g. --initial-cluster=", c.name,
          "=http://localhost:2380"));
    }
    if (members->count(c.name) == 0) {
      return VerifyError(absl::StrCat("couldn't find local name ", GoQuote(c.name),
                                      " in the initial cluster configuration"));
    }
  }

  // embed's parseCompactionRetention.
  c.auto_compaction_period = absl::ZeroDuration();
  c.auto_compaction_revisions = 0;
  int64_t whole;
  if (ParseGoInt(c.auto_compaction_retention, 10, &whole) == NumError::kOk && whole >= 0) {
    if (c.auto_compaction_mode == CompactionMode::kRevision) {
      c.auto_compaction_revisions = whole;
    } else {
      c.auto_compaction_period = absl::Hours(whole);
    }
  } else {
    absl::StatusOr<absl::Duration> d = gotext::ParseGoDuration(c.auto_compaction_retention);
    if (!d.ok()) {
      return VerifyError(absl::StrCat("error parsing CompactionRetention: ", d.status().message()));
    }
    if (c.auto_compaction_mode == CompactionMode::kRevision) {
      c.auto_compaction_revisions = absl::ToInt64Nanoseconds(*d);
    } else {
      c.auto_compaction_period = *d;
    }
  }

  for (const std::string& suite : c.cipher_suites) {
    if (!IsKnownCipherSuite(suite)) {
      return VerifyError(absl::StrCat("unexpected TLS cipher suite ", GoQuote(suite)));
    }
  }

  // auth.NewTokenProvider's decomposeOpts.
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

// ===========================================================================
// Public API.
// ===========================================================================

ConfigFailure GetConfigFailure(const absl::Status& status) {
  ConfigFailure failure;
  absl::optional<absl::Cord> payload = status.GetPayload(kFailurePayload);
  if (!payload) return failure;
  std::string text(*payload);
  failure.print_usage = absl::EndsWith(text, ",usage");
  failure.exit_code = text[0] - '0';
  return failure;
}

namespace {

// What etcd does after the flags, environment or config file are read:
// validation, defaults that depend on other settings, and the ignored flags.
absl::StatusOr<ServerConfig> FinishConfig(ParseState st, bool from_file) {
  ServerConfig& c = st.cfg;
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
  for (const auto& [name, value] : *settings) {
    const FlagSpec* flag = LookupFlag(name);
    if (flag == nullptr || flag->section == Section::kHidden) continue;
    if (absl::Status s = flag->value.set(st, value); !s.ok()) {
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

}  // namespace

absl::StatusOr<ServerConfig> ParseServerConfig(const std::vector<std::string>& args,
                                               const std::map<std::string, std::string>& env) {
  ParseState st;
  std::set<std::string>& explicitly = st.cfg.explicitly_set;

  // Go's flag.FlagSet.Parse.
  size_t i = 0;
  while (i < args.size()) {
    const std::string& arg = args[i];
    if (arg.size() < 2 || arg[0] != '-') break;
    size_t minuses = 1;
    if (arg[1] == '-') {
      minuses = 2;
      if (arg.size() == 2) {  // "--" ends the flags
        ++i;
        break;
      }
    }
    std::string name = arg.substr(minuses);
    if (name.empty() || name[0] == '-' || name[0] == '=') {
      return UsageError(absl::StrCat("bad flag syntax: ", arg));
    }
    ++i;
    bool has_value = false;
    std::string value;
    if (size_t eq = name.find('=', 1); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      has_value = true;
    }
    const FlagSpec* flag = LookupFlag(name);
    if (flag == nullptr) {
      if (name == "help" || name == "h") {
        st.cfg.help_requested = true;
        return std::move(st.cfg);
      }
      return UsageError(absl::StrCat("flag provided but not defined: -", name));
    }
    if (flag->value.is_bool) {
      if (has_value) {
        if (absl::Status s = flag->value.set(st, value); !s.ok()) {
          return UsageError(absl::StrCat("invalid boolean value ", GoQuote(value), " for -", name,
                                         ": ", s.message()));
        }
      } else if (absl::Status s = flag->value.set(st, "true"); !s.ok()) {
        return UsageError(absl::StrCat("invalid boolean flag ", name, ": ", s.message()));
      }
    } else {
      if (!has_value && i < args.size()) {
        value = args[i++];
        has_value = true;
      }
      if (!has_value) return UsageError(absl::StrCat("flag needs an argument: -", name));
      if (absl::Status s = flag->value.set(st, value); !s.ok()) {
        return UsageError(
            absl::StrCat("invalid value ", GoQuote(value), " for flag -", name, ": ", s.message()));
      }
    }
    explicitly.insert(std::string(flag->name));
  }
  if (i < args.size()) {
    return VerifyError(absl::StrCat("'", args[i], "' is not a valid flag"));
  }
  if (st.cfg.version_requested) return std::move(st.cfg);

  // ETCD_CONFIG_FILE is read before the other variables, as etcd does.
  if (st.cfg.config_file.empty()) {
    if (auto it = env.find("ETCD_CONFIG_FILE"); it != env.end()) st.cfg.config_file = it->second;
  }
  if (!st.cfg.config_file.empty()) {
    bool env_given = false;
    for (const auto& [key, value] : env) {
      env_given |= absl::StartsWith(key, "ETCD_") && key != "ETCD_CONFIG_FILE";
    }
    const bool flags_given = explicitly.size() > (explicitly.count("config-file") != 0 ? 1u : 0u);
    return ParseConfigFile(st.cfg.config_file, flags_given || env_given);
  }

  // pkg/flags.SetFlagsFromEnv: flags in name order; the last bad value is
  // the one reported, after the check for variables shadowed by flags.
  std::map<std::string, std::string> env_to_flag;  // ETCD_X -> flag name
  std::vector<absl::string_view> names;
  for (const FlagSpec& f : Flags()) names.push_back(f.name);
  std::sort(names.begin(), names.end());
  std::set<std::string> used;
  absl::Status env_error;
  for (absl::string_view name : names) {
    std::string key = FlagToEnv(name);
    env_to_flag[key] = std::string(name);
    if (explicitly.count(std::string(name)) != 0) continue;
    auto it = env.find(key);
    if (it == env.end() || it->second.empty()) continue;
    used.insert(key);
    if (key == "ETCD_VERSION") continue;  // handled below
    if (absl::Status s = LookupFlag(name)->value.set(st, it->second); !s.ok()) {
      env_error = VerifyError(
          absl::StrCat("invalid value ", GoQuote(it->second), " for ", key, ": ", s.message()));
      continue;
    }
    explicitly.insert(std::string(name));
    st.cfg.used_env_vars.push_back(absl::StrCat(key, "=", it->second));
  }
  for (const auto& [key, value] : env) {
    if (key == "ETCD_VERSION" && !value.empty()) {
      st.cfg.warnings.push_back(
          absl::StrCat("cannot set special environment variable ETCD_VERSION=", value));
      continue;
    }
    if (used.count(key) != 0) continue;
    if (auto it = env_to_flag.find(key);
        it != env_to_flag.end() && explicitly.count(it->second) != 0) {
      return VerifyError(absl::StrCat(
          "conflicting environment variable ", GoQuote(key),
          " is shadowed by corresponding command-line flag (either unset environment variable "
          "or disable flag)"));
    }
    if (absl::StartsWith(key, "ETCD_")) {
      st.cfg.warnings.push_back(
          absl::StrCat("unrecognized environment variable ", key, "=", value));
    }
  }
  if (!env_error.ok()) return env_error;

  return FinishConfig(std::move(st), /*from_file=*/false);
}

std::string ShortUsageText() {
  return "Usage:\n"
         "\n"
         "  capstan [flags]\n"
         "    Start a Capstan server: a single-member key-value store that speaks etcd's v3 API\n"
         "    and takes etcd 3.5's flags and ETCD_* environment variables.\n"
         "\n"
         "  capstan --version\n"
         "    Show the version of Capstan.\n"
         "\n"
         "  capstan -h | --help\n"
         "    Show the help information about Capstan.\n"
         "\n"
         "  capstan --config-file\n"
         "    Path to an etcd server configuration file (YAML, keys named as the flags;\n"
         "    TLS under client-transport-security / peer-transport-security). When given,\n"
         "    other command line flags and environment variables are ignored, as in etcd.\n"
         "\n"
         "  Every flag can also be set by the environment variable ETCD_<FLAG_NAME>, e.g.\n"
         "  ETCD_DATA_DIR for --data-dir. A flag given on the command line and in the\n"
         "  environment is an error, as in etcd.\n";
}

std::string UsageText() {
  struct Heading {
    Section section;
    absl::string_view title;
  };
  static constexpr Heading kHeadings[] = {
      {Section::kMember, "Member"},
      {Section::kClustering, "Clustering"},
      {Section::kSecurity, "Security"},
      {Section::kAuth, "Auth"},
      {Section::kProfiling, "Profiling and Monitoring"},
      {Section::kLogging, "Logging"},
      {Section::kTracing, "Experimental distributed tracing"},
      {Section::kProxy, "v2 Proxy (not supported by Capstan)"},
      {Section::kExperimental, "Experimental feature"},
      {Section::kUnsafe, "Unsafe feature"},
      {Section::kCapstan, "Capstan"},
  };
  std::string out = ShortUsageText();
  for (const Heading& h : kHeadings) {
    absl::StrAppend(&out, "\n", h.title, ":\n");
    for (const FlagSpec& f : Flags()) {
      if (f.section != h.section) continue;
      absl::StrAppend(&out, "  --", f.name, " ", f.default_text, "\n");
      for (absl::string_view line : absl::StrSplit(f.help, '\n')) {
        absl::StrAppend(&out, "    ", line, "\n");
      }
    }
    if (h.section == Section::kUnsafe) {
      out +=
          "\nCAUTIOUS with unsafe flag! It may break the guarantees given by the consensus "
          "protocol!\n";
    }
  }
  out +=
      "\nFlags marked \"No effect\" are accepted so that etcd command lines keep working; the\n"
      "server logs them as \"accepted, no effect in a single-member Capstan\".\n";
  return out;
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

absl::StatusOr<std::vector<Url>> ParseUrlList(std::string_view text_in) {
  const absl::string_view text(text_in.data(), text_in.size());
  std::vector<Url> urls;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    absl::string_view in = absl::StripAsciiWhitespace(part);
    absl::StatusOr<Url> u = ParseGoUrl(in);
    if (!u.ok()) return u.status();
    if (u->scheme == "http" || u->scheme == "https") {
      std::string host, port;
      if (!SplitHostPort(u->host, &host, &port).ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("URL address does not have the form \"host:port\": ", in));
      }
      if (!u->path.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("URL must not contain a path: ", in));
      }
    } else if (u->scheme != "unix" && u->scheme != "unixs") {
      return absl::InvalidArgumentError(
          absl::StrCat("URL scheme must be http, https, unix, or unixs: ", in));
    }
    urls.push_back(*std::move(u));
  }
  std::sort(urls.begin(), urls.end(),
            [](const Url& a, const Url& b) { return a.String() < b.String(); });
  urls.erase(std::unique(urls.begin(), urls.end(),
                         [](const Url& a, const Url& b) { return a.String() == b.String(); }),
             urls.end());
  return urls;
}


}  // namespace capstan::server
