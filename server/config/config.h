// ServerConfig: Capstan's command line, read the way the `etcd` binary
// (v3.5) reads its own, so Capstan can replace etcd without touching the
// unit file, the Pod spec or the ETCD_* environment that starts it.
//
// What "the way etcd reads it" means here:
//  - every etcd 3.5 flag is accepted, and every flag etcd 3.6 and 3.7 added
//    (the new names of the --experimental-* flags, v3 discovery,
//    --feature-gates with 3.6's and 3.7's gates: feature_gates.h), the old
//    names warned about and refused together with the new ones as in 3.6
//    (renamed_flags.h); each with etcd's default and etcd's value
//    syntax (Go's flag package: --flag=value, --flag value, -flag, bare bool
//    flags; Go durations such as "100ms" or "1h2m"; Go integers "0x10",
//    "1_000"; URL lists validated like etcd's types.NewURLs);
//  - precedence is flag > ETCD_<UPPER_SNAKE> environment variable > default;
//  - --config-file (or ETCD_CONFIG_FILE) names a YAML file with the flag
//    names as keys (server/config/config_file.h); then, as in etcd, every other flag
//    and environment variable is ignored, and unknown keys are ignored too;
//  - failures carry etcd's exact error text and exit code (see
//    GetConfigFailure()).
// Flags that Capstan does not act on (discovery, v2, ...) are accepted and
// validated as etcd does, and listed in ServerConfig::ignored_flags when
// set.
//
// Differences from etcd, all stated in UsageText():
//  - the default data directory is "${name}.capstan", not "${name}.etcd";
//  - --proxy other than 'off' is refused; a config file's values are not
//    type-checked the way Go's JSON decoder checks them (`name: 5` is the
//    name "5" rather than an error);
//  - two Capstan flags: --watch-cache-prefixes and --lease-revoke-rate.
// As in etcd, an ETCD_* variable whose flag is also on the command line is a
// fatal error, and unknown ETCD_* variables are only warned about.
//
// Thread safety: everything here is a pure function of its arguments and
// safe to call from any thread.

#ifndef CAPSTAN_SERVER_CONFIG_CONFIG_H_
#define CAPSTAN_SERVER_CONFIG_CONFIG_H_

#include <cstdint>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/config/feature_gates.h"
#include "util/go_text.h"

namespace capstan::server {

// A URL from an etcd URL-list flag, split the way Go's net/url splits it.
using Url = gotext::Url;


enum class ClusterState { kNew, kExisting };
enum class CompactionMode { kPeriodic, kRevision };
enum class LogLevel { kDebug, kInfo, kWarn, kError, kDPanic, kPanic, kFatal };

// The complete server configuration, a plain value. Each field holds the
// flag of the same name (--snapshot-count -> snapshot_count) and is
// initialized to etcd's default; "(no effect)" marks flags Capstan accepts,
// validates and otherwise ignores.
struct ServerConfig {
  // etcd's default for --quota-backend-bytes=0, and the most it recommends.
  static constexpr int64_t kDefaultQuotaBackendBytes = int64_t{2} << 30;
  static constexpr int64_t kMaxQuotaBackendBytes = int64_t{8} << 30;

  // ---- Member -------------------------------------------------------------
  std::string name = "default";               // --name
  std::string data_dir;                       // --data-dir; after parsing, never
                                              // empty: defaults to "<name>.capstan"
  std::string wal_dir;                        // --wal-dir (no effect)
  uint64_t snapshot_count = 100000;           // --snapshot-count
  // --heartbeat-interval and --election-timeout: one member holds no
  // elections; they set the shortest lease TTL (MinLeaseTtlSeconds).
  uint64_t heartbeat_interval_ms = 100;
  uint64_t election_timeout_ms = 1000;
  bool initial_election_tick_advance = true;  // --initial-election-tick-advance (no effect)
  std::vector<Url> listen_peer_urls = {{"http", "localhost:2380"}};
  std::vector<Url> listen_client_urls = {{"http", "localhost:2379"}};  // --listen-client-urls
  std::vector<Url> listen_client_http_urls;  // --listen-client-http-urls ''
  std::vector<Url> listen_metrics_urls;      // --listen-metrics-urls ''
  uint64_t max_snapshots = 5;                // --max-snapshots (no effect)
  uint64_t max_wals = 5;                     // --max-wals (no effect)
  // --quota-backend-bytes: 0 means kDefaultQuotaBackendBytes, negative means
  // no quota (as in etcd). Use QuotaBackendBytes() for the effective value.
  int64_t quota_backend_bytes = 0;
  std::string backend_bbolt_freelist_type = "map";  // --backend-bbolt-freelist-type (no effect)
  // --backend-batch-interval / --backend-batch-limit bound Capstan's group
  // commit: the longest a group waits to grow, and the most write requests
  // in one group. 0 means Capstan's built-in default.
  absl::Duration backend_batch_interval = absl::ZeroDuration();
  int64_t backend_batch_limit = 0;
  uint64_t max_txn_ops = 128;            // --max-txn-ops
  uint64_t max_request_bytes = 1572864;  // --max-request-bytes
  uint32_t max_concurrent_streams =
      std::numeric_limits<uint32_t>::max();                   // --max-concurrent-streams
  absl::Duration grpc_keepalive_min_time = absl::Seconds(5);  // --grpc-keepalive-min-time
  absl::Duration grpc_keepalive_interval = absl::Hours(2);    // --grpc-keepalive-interval
  absl::Duration grpc_keepalive_timeout = absl::Seconds(20);  // --grpc-keepalive-timeout
  bool socket_reuse_port = false;                             // --socket-reuse-port
  bool socket_reuse_address = false;                          // --socket-reuse-address
  bool enable_grpc_gateway = true;                            // --enable-grpc-gateway
  absl::Duration raft_read_timeout = absl::Seconds(5);        // --raft-read-timeout (no effect)
  absl::Duration raft_write_timeout = absl::Seconds(5);       // --raft-write-timeout (no effect)
  bool memory_mlock = false;  // --memory-mlock, --experimental-memory-mlock (no effect)
  // --feature-gates (etcd 3.6), with the experimental flags that etcd 3.6
  // maps to gates (--experimental-initial-corrupt-check, ...) applied.
  FeatureGates feature_gates;

  // ---- Clustering ---------------------------------------------------------
  std::vector<Url> initial_advertise_peer_urls = {{"http", "localhost:2380"}};
  // --initial-cluster "default=http://localhost:2380", verbatim; empty when a
  // discovery flag replaced the default. Always names exactly this member
  // after a successful parse (or is empty).
  std::string initial_cluster = "default=http://localhost:2380";
  ClusterState initial_cluster_state = ClusterState::kNew;  // --initial-cluster-state
  std::string initial_cluster_token = "etcd-cluster";       // --initial-cluster-token
  // --advertise-client-urls http://localhost:2379. Empty only when
  // --listen-client-urls was set without it, which fails validation.
  std::vector<Url> advertise_client_urls = {{"http", "localhost:2379"}};
  std::string discovery;                     // --discovery (no effect)
  std::string discovery_fallback = "proxy";  // --discovery-fallback exit|proxy (no effect)
  std::string discovery_proxy;               // --discovery-proxy (no effect)
  std::string discovery_srv;                 // --discovery-srv (no effect)
  std::string discovery_srv_name;            // --discovery-srv-name (no effect)
  // etcd 3.6's v3 discovery, --discovery-<x> (no effect).
  std::set<std::string> discovery_endpoints;
  std::string discovery_token;
  absl::Duration discovery_dial_timeout = absl::Seconds(2);
  absl::Duration discovery_request_timeout = absl::Seconds(5);
  absl::Duration discovery_keepalive_time = absl::Seconds(2);
  absl::Duration discovery_keepalive_timeout = absl::Seconds(6);
  bool discovery_insecure_transport = true;
  bool discovery_insecure_skip_tls_verify = false;
  std::string discovery_cert;
  std::string discovery_key;
  std::string discovery_cacert;
  std::string discovery_user;
  std::string discovery_password;
  bool strict_reconfig_check = true;         // --strict-reconfig-check
  bool pre_vote = true;                      // --pre-vote
  // --auto-compaction-retention "0" verbatim, and its meaning: for periodic
  // mode a window (a bare integer counts hours), for revision mode a number
  // of revisions. Both 0 when auto compaction is off.
  std::string auto_compaction_retention = "0";
  absl::Duration auto_compaction_period = absl::ZeroDuration();
  int64_t auto_compaction_revisions = 0;
  CompactionMode auto_compaction_mode = CompactionMode::kPeriodic;  // --auto-compaction-mode
  bool enable_v2 = false;                                           // --enable-v2 (no effect)
  std::string experimental_enable_v2v3;    // --experimental-enable-v2v3 (no effect)
  std::string v2_deprecation = "not-yet";  // --v2-deprecation (no effect)

  // ---- v2 proxy (everything but --proxy=off is refused) --------------------
  std::string proxy = "off";                   // --proxy off|readonly|on
  uint64_t proxy_failure_wait_ms = 5000;       // --proxy-failure-wait (no effect)
  uint64_t proxy_refresh_interval_ms = 30000;  // --proxy-refresh-interval (no effect)
  uint64_t proxy_dial_timeout_ms = 1000;       // --proxy-dial-timeout (no effect)
  uint64_t proxy_write_timeout_ms = 5000;      // --proxy-write-timeout (no effect)
  uint64_t proxy_read_timeout_ms = 0;          // --proxy-read-timeout (no effect)

  // ---- Security -----------------------------------------------------------
  std::string cert_file;                     // --cert-file
  std::string key_file;                      // --key-file
  std::string client_cert_file;              // --client-cert-file
  std::string client_key_file;               // --client-key-file
  bool client_cert_auth = false;             // --client-cert-auth
  std::string client_crl_file;               // --client-crl-file
  std::string client_cert_allowed_hostname;  // --client-cert-allowed-hostname
  std::string trusted_ca_file;               // --trusted-ca-file
  bool auto_tls = false;                     // --auto-tls
  std::string peer_cert_file;                // --peer-cert-file (no effect)
  std::string peer_key_file;                 // --peer-key-file (no effect)
  std::string peer_client_cert_file;         // --peer-client-cert-file (no effect)
  std::string peer_client_key_file;          // --peer-client-key-file (no effect)
  bool peer_client_cert_auth = false;        // --peer-client-cert-auth (no effect)
  std::string peer_trusted_ca_file;          // --peer-trusted-ca-file (no effect)
  std::string peer_cert_allowed_cn;          // --peer-cert-allowed-cn (no effect)
  std::string peer_cert_allowed_hostname;    // --peer-cert-allowed-hostname (no effect)
  bool peer_auto_tls = false;                // --peer-auto-tls (no effect)
  std::string peer_crl_file;                 // --peer-crl-file (no effect)
  // --peer-skip-client-san-verification, --experimental-peer-skip-client-san-verification
  bool peer_skip_client_san_verification = false;  // (no effect)
  uint64_t self_signed_cert_validity_years = 1;                 // --self-signed-cert-validity
  std::vector<std::string> cipher_suites;        // --cipher-suites, Go names, validated
  std::set<std::string> cors = {"*"};            // --cors: origins as URLs, or "*"
  std::set<std::string> host_whitelist = {"*"};  // --host-whitelist
  std::string tls_min_version = "TLS1.2";        // --tls-min-version TLS1.2|TLS1.3
  std::string tls_max_version;                   // --tls-max-version ''|TLS1.2|TLS1.3

  // ---- Auth ---------------------------------------------------------------
  // --auth-token "simple": "<type>[,key=value...]"; type is simple or jwt.
  std::string auth_token = "simple";
  std::string auth_token_type = "simple";                 // parsed from auth_token
  std::map<std::string, std::string> auth_token_options;  // e.g. sign-method, ttl
  uint64_t bcrypt_cost = 10;              // --bcrypt-cost; out of [4,31] -> 10 + warning
  uint64_t auth_token_ttl_seconds = 300;  // --auth-token-ttl

  // ---- Profiling and monitoring -------------------------------------------
  bool enable_pprof = false;      // --enable-pprof (no effect)
  std::string metrics = "basic";  // --metrics basic|extensive

  // ---- Logging ------------------------------------------------------------
  std::string logger = "zap";  // --logger (only zap)
  std::string log_format = "json";  // --log-format json|console (etcd 3.6)
  // --log-outputs "default": sorted, de-duplicated; "default" means stderr.
  std::vector<std::string> log_outputs = {"default"};
  LogLevel log_level = LogLevel::kInfo;   // --log-level
  bool enable_log_rotation = false;       // --enable-log-rotation
  std::string log_rotation_config_json =  // --log-rotation-config-json
      R"({"maxsize": 100, "maxage": 0, "maxbackups": 0, "localtime": false, "compress": false})";

  // ---- Distributed tracing (no effect) ------------------------------------
  // etcd 3.6's names; the --experimental-<name> flags set the same fields.
  bool enable_distributed_tracing = false;
  std::string distributed_tracing_address = "localhost:4317";
  std::string distributed_tracing_service_name = "etcd";
  std::string distributed_tracing_instance_id;
  int64_t distributed_tracing_sampling_rate = 0;

  // ---- Formerly experimental ----------------------------------------------
  // Each field is set by etcd 3.6's name (--watch-progress-notify-interval)
  // and by the 3.5 name it replaces (--experimental-watch-progress-notify-
  // interval), which is warned about; setting both is refused, as in etcd
  // 3.6. The experimental bool flags that 3.6 turned into feature gates set
  // feature_gates instead.
  absl::Duration corrupt_check_time = absl::ZeroDuration();  // the leader's check
  absl::Duration compact_hash_check_time = absl::Minutes(1);  // (no effect)
  int64_t compaction_batch_limit = 1000;
  absl::Duration compaction_sleep_interval = absl::Milliseconds(10);
  absl::Duration watch_progress_notify_interval = absl::Minutes(10);
  absl::Duration downgrade_check_time = absl::Seconds(5);  // (no effect)
  absl::Duration warning_apply_duration = absl::Milliseconds(100);
  // --warning-unary-request-duration, else a non-zero
  // --experimental-warning-unary-request-duration, else 300ms (etcd 3.6's
  // parseWarningUnaryRequestDuration). Both non-zero is refused.
  absl::Duration warning_unary_request_duration = absl::Milliseconds(300);
  uint64_t bootstrap_defrag_threshold_megabytes = 0;  // (no effect)
  uint64_t snapshot_catchup_entries = 5000;           // (no effect)
  int64_t max_learners = 1;                           // --max-learners

  // ---- Unsafe -------------------------------------------------------------
  bool force_new_cluster = false;  // --force-new-cluster
  bool unsafe_no_fsync = false;    // --unsafe-no-fsync

  // ---- Capstan ------------------------------------------------------------
  // --watch-cache-prefixes: key prefixes whose watchers are served from the
  // in-memory watch cache. Empty disables the cache.
  std::vector<std::string> watch_cache_prefixes = {"/registry/pods/", "/registry/minions/",
                                                   "/registry/leases/"};
  int64_t lease_revoke_rate = 1000;  // --lease-revoke-rate: leases revoked per second
  // --backend-cache-bytes: RocksDB's block cache, the uncompressed blocks
  // kept in memory for reads (etcd relies on the kernel's page cache over its
  // mmap instead).
  int64_t backend_cache_bytes = int64_t{256} << 20;

  // ---- Command, not configuration ------------------------------------------
  std::string config_file;  // --config-file: the YAML file read instead of flags and env
  // --help / -h: the caller prints UsageText() to stdout and exits 0. When
  // set, nothing after the help flag was parsed and no other field is
  // meaningful.
  bool help_requested = false;
  // --version: the caller prints the version and exits 0. When set, flags
  // were parsed but environment variables were not read and nothing was
  // validated.
  bool version_requested = false;

  // ---- What the caller should log -----------------------------------------
  // Names (without dashes) of the flags set by command line or environment.
  std::set<std::string> explicitly_set;
  // Flags set by command line or environment that have no effect in a
  // single-member Capstan, in flag order; log them as "accepted, no effect".
  std::vector<std::string> ignored_flags;
  // The feature gates set, "Name=true" by name: none changes what Capstan
  // does; log them as "accepted, no effect".
  std::vector<std::string> ignored_feature_gates;
  // "ETCD_X=value" for each environment variable that set a flag (etcd logs
  // these at info level: "recognized and used environment variable").
  std::vector<std::string> used_env_vars;
  // Warning-level messages in etcd's words, e.g.
  // "unrecognized environment variable ETCD_FOO=1".
  std::vector<std::string> warnings;

  // The effective backend quota in bytes; 0 means no quota.
  int64_t QuotaBackendBytes() const;
  // The shortest lease TTL, as etcd derives it: one and a half election
  // timeouts in whole heartbeats (⌊3·ticks/2⌋ heartbeats, ticks =
  // ⌊election timeout / heartbeat⌋), rounded up to seconds: 2 with the
  // defaults, 8 with --election-timeout 5000 --heartbeat-interval 500.
  int64_t MinLeaseTtlSeconds() const;
};

// Parses args (argv without argv[0]) and env (the process environment; only
// keys starting with "ETCD_" are looked at) into a configuration, and
// validates it as etcd does before it starts serving.
//
// On failure the status message is etcd's exact text; GetConfigFailure()
// tells how to end the process:
//  - exit 2 with print_usage: a command-line syntax error. Print the message
//    and then ShortUsageText() to stderr, as Go's flag package does.
//  - exit 2 without print_usage: an unknown --log-level, on which etcd
//    panics (it prints "panic: " and the message).
//  - exit 1: a configuration etcd refuses after parsing. etcd logs it as
//    the "error" field of "failed to verify flags".
// The code is kInvalidArgument for everything etcd refuses too, and
// kUnimplemented where only Capstan refuses (multi-member --initial-cluster,
// --proxy).
absl::StatusOr<ServerConfig> ParseServerConfig(const std::vector<std::string>& args,
                                               const std::map<std::string, std::string>& env);

// How the process should end after ParseServerConfig failed.
struct ConfigFailure {
  int exit_code = 1;
  // When true, print ShortUsageText() to stderr after the message, as Go's
  // flag package does.
  bool print_usage = false;
};
// REQUIRES: status came from ParseServerConfig and is not OK. For any other
// status returns {1, false}.
ConfigFailure GetConfigFailure(const absl::Status& status);

// The complete --help text in etcd's layout, one flag per entry with its
// default; Capstan's meaning is given where it differs from etcd's.
std::string UsageText();
// The "Usage:" block etcd prints to stderr after a flag syntax error.
std::string ShortUsageText();

// Helpers with Go's semantics and error texts, exposed for reuse and tests.
//
// etcd's types.NewURLs over a comma-separated list: each URL trimmed, scheme
// http/https (with host:port, no path) or unix/unixs; sorted and
// de-duplicated. Errors read like etcd's, e.g.
// "URL scheme must be http, https, unix, or unixs: foo".
absl::StatusOr<std::vector<Url>> ParseUrlList(std::string_view text);

// The peer URLs this member is bootstrapped with, as etcd takes them for its
// id: its entry in --initial-cluster, else --initial-advertise-peer-urls
// (bootstrapping by discovery).
std::vector<Url> InitialPeerUrls(const ServerConfig& c);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_CONFIG_CONFIG_H_
