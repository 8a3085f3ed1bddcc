#include "server/config/flags.h"

#include <iterator>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/config/config.h"
#include "server/config/flag_values.h"

namespace capstan::server::config_internal {
namespace {

using S = ServerConfig;
constexpr bool kNoEffect = true;

// The table in parts of a --help section or a few, in table order.

// --feature-gates' help: etcd 3.6's sentence and featuregate's list of
// the gates, then what they do in Capstan. Built once, lives for the process.
absl::string_view FeatureGatesHelp() {
  static const std::string* const help = [] {
    auto* text = new std::string(
        "A set of key=value pairs that describe server level feature gates for\n"
        "alpha/experimental features. Options are:");
    for (const std::string& line : FeatureGates().KnownFeaturesHelp()) {
      absl::StrAppend(text, "\n", line);
    }
    absl::StrAppend(text,
                    "\nThe gates of etcd 3.6 and 3.7 are accepted; none changes what a\n"
                    "single-member Capstan does, and each gate set is logged as having no effect.");
    return text;
  }();
  return *help;
}

// The member: its name, data directory, listeners and backend.
std::vector<FlagSpec> MemberFlags() {
  return {
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
       "Number of committed transactions to trigger a snapshot to disk."},
      {"heartbeat-interval", Section::kMember, Uint(&S::heartbeat_interval_ms), "'100'",
       "Time (in milliseconds) of a heartbeat interval (one Raft tick). With\n"
       "--election-timeout it also sets the shortest lease TTL, as in etcd."},
      {"election-timeout", Section::kMember, Uint(&S::election_timeout_ms), "'1000'",
       "Time (in milliseconds) for an election to timeout. Leases live at least 1.5\n"
       "election timeouts (rounded up to seconds), as in etcd."},
      {"initial-election-tick-advance", Section::kMember, Bool(&S::initial_election_tick_advance),
       "'true'",
       "Whether to fast-forward initial election ticks on boot for faster election. No\n"
       "effect in Capstan.",
       kNoEffect},
      {"listen-peer-urls", Section::kMember, Urls(&S::listen_peer_urls), "'http://localhost:2380'",
       "List of URLs to listen on for peer traffic."},
      {"listen-client-urls", Section::kMember, Urls(&S::listen_client_urls),
       "'http://localhost:2379'",
       "List of URLs to listen on for client grpc traffic and http as long as\n"
       "--listen-client-http-urls is not specified."},
      {"listen-client-http-urls", Section::kMember, Urls(&S::listen_client_http_urls), "''",
       "List of URLs to listen on for http only client traffic. Enabling this flag\n"
       "removes http services from --listen-client-urls."},
      {"max-snapshots", Section::kMember, Uint(&S::max_snapshots), "'5'",
       "Maximum number of snapshot files to retain (0 is unlimited). No effect in Capstan.",
       kNoEffect},
      {"max-wals", Section::kMember, Uint(&S::max_wals), "'5'",
       "Maximum number of wal files to retain (0 is unlimited). No effect in Capstan.", kNoEffect},
      {"memory-mlock", Section::kMember, Bool(&S::memory_mlock), "'false'",
       "Enable to enforce etcd pages (in particular bbolt) to stay in RAM. No effect in\n"
       "Capstan.",
       kNoEffect},
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
  };
}

// The member's limits on requests, gRPC's keepalives and sockets, the
// gateway (still in --help's Member section).
std::vector<FlagSpec> RequestAndGrpcFlags() {
  return {
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
      {"raft-read-timeout", Section::kMember, Dur(&S::raft_read_timeout), "'5s'",
       "Read timeout set on each rafthttp connection. No effect in Capstan.", kNoEffect},
      {"raft-write-timeout", Section::kMember, Dur(&S::raft_write_timeout), "'5s'",
       "Write timeout set on each rafthttp connection. No effect in Capstan.", kNoEffect},
      {"feature-gates", Section::kMember, FeatureGatesValue(), "''", FeatureGatesHelp()},
  };
}

// Clustering: bootstrap, advertised URLs, auto compaction, v2.
std::vector<FlagSpec> ClusteringFlags() {
  return {
      {"initial-advertise-peer-urls", Section::kClustering, Urls(&S::initial_advertise_peer_urls),
       "'http://localhost:2380'",
       "List of this member's peer URLs to advertise to the rest of the cluster."},
      {"initial-cluster", Section::kClustering, Str(&S::initial_cluster),
       "'default=http://localhost:2380'",
       "Initial cluster configuration for bootstrapping: name=peerURL pairs. With more\n"
       "than one member, this member (--name) replicates through Raft with the others."},
      {"initial-cluster-state", Section::kClustering,
       ChoiceIn(&ParseState::initial_cluster_state, {"new", "existing"}), "'new'",
       "Initial cluster state ('new' or 'existing')."},
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
      {"discovery-token", Section::kClustering, Str(&S::discovery_token), "''",
       "V3 discovery: discovery token for the etcd cluster to be bootstrapped. No effect\n"
       "in Capstan.",
       kNoEffect},
      {"discovery-endpoints", Section::kClustering, UniqueStrings(&S::discovery_endpoints), "''",
       "V3 discovery: List of gRPC endpoints of the discovery service. No effect in Capstan.",
       kNoEffect},
      {"discovery-dial-timeout", Section::kClustering, Dur(&S::discovery_dial_timeout), "'2s'",
       "V3 discovery: dial timeout for client connections. No effect in Capstan.", kNoEffect},
      {"discovery-request-timeout", Section::kClustering, Dur(&S::discovery_request_timeout),
       "'5s'",
       "V3 discovery: timeout for discovery requests (excluding dial timeout). No effect in\n"
       "Capstan.",
       kNoEffect},
      {"discovery-keepalive-time", Section::kClustering, Dur(&S::discovery_keepalive_time), "'2s'",
       "V3 discovery: keepalive time for client connections. No effect in Capstan.", kNoEffect},
      {"discovery-keepalive-timeout", Section::kClustering, Dur(&S::discovery_keepalive_timeout),
       "'6s'", "V3 discovery: keepalive timeout for client connections. No effect in Capstan.",
       kNoEffect},
      {"discovery-insecure-transport", Section::kClustering,
       Bool(&S::discovery_insecure_transport), "'true'",
       "V3 discovery: disable transport security for client connections. No effect in\n"
       "Capstan.",
       kNoEffect},
      {"discovery-insecure-skip-tls-verify", Section::kClustering,
       Bool(&S::discovery_insecure_skip_tls_verify), "'false'",
       "V3 discovery: skip server certificate verification (CAUTION: this option should be\n"
       "enabled only for testing purposes). No effect in Capstan.",
       kNoEffect},
      {"discovery-cert", Section::kClustering, Str(&S::discovery_cert), "''",
       "V3 discovery: identify secure client using this TLS certificate file. No effect in\n"
       "Capstan.",
       kNoEffect},
      {"discovery-key", Section::kClustering, Str(&S::discovery_key), "''",
       "V3 discovery: identify secure client using this TLS key file. No effect in Capstan.",
       kNoEffect},
      {"discovery-cacert", Section::kClustering, Str(&S::discovery_cacert), "''",
       "V3 discovery: verify certificates of TLS-enabled secure servers using this CA\n"
       "bundle. No effect in Capstan.",
       kNoEffect},
      {"discovery-user", Section::kClustering, Str(&S::discovery_user), "''",
       "V3 discovery: username[:password] for authentication (prompt if password is not\n"
       "supplied). No effect in Capstan.",
       kNoEffect},
      {"discovery-password", Section::kClustering, Str(&S::discovery_password), "''",
       "V3 discovery: password for authentication (if this option is used, --user option\n"
       "shouldn't include password). No effect in Capstan.",
       kNoEffect},
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
       "Reject reconfiguration requests that would cause quorum loss."},
      {"pre-vote", Section::kClustering, Bool(&S::pre_vote), "'true'",
       "Enable the raft Pre-Vote algorithm to prevent disruption when a node that has been\n"
       "partitioned away rejoins the cluster."},
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
  };
}

// Client and peer TLS, CORS and the host whitelist.
std::vector<FlagSpec> SecurityFlags() {
  return {
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
       "Path to the peer server TLS cert file."},
      {"peer-key-file", Section::kSecurity, Str(&S::peer_key_file), "''",
       "Path to the peer server TLS key file."},
      {"peer-client-cert-file", Section::kSecurity, Str(&S::peer_client_cert_file), "''",
       "Path to an explicit peer client TLS cert file."},
      {"peer-client-key-file", Section::kSecurity, Str(&S::peer_client_key_file), "''",
       "Path to an explicit peer client TLS key file."},
      {"peer-client-cert-auth", Section::kSecurity, Bool(&S::peer_client_cert_auth), "'false'",
       "Enable peer client cert authentication."},
      {"peer-trusted-ca-file", Section::kSecurity, Str(&S::peer_trusted_ca_file), "''",
       "Path to the peer server TLS trusted CA file."},
      {"peer-cert-allowed-cn", Section::kSecurity, Str(&S::peer_cert_allowed_cn), "''",
       "Required CN for client certs connecting to the peer endpoint."},
      {"peer-cert-allowed-hostname", Section::kSecurity, Str(&S::peer_cert_allowed_hostname), "''",
       "Allowed TLS hostname for inter peer authentication."},
      {"peer-auto-tls", Section::kSecurity, Bool(&S::peer_auto_tls), "'false'",
       "Peer TLS using self-generated certificates if --peer-key-file and --peer-cert-file\n"
       "are not provided."},
      {"self-signed-cert-validity", Section::kSecurity, Uint(&S::self_signed_cert_validity_years),
       "'1'",
       "The validity period of the client and peer certificates that are automatically\n"
       "generated by etcd when you specify ClientAutoTLS and PeerAutoTLS, the unit is year,\n"
       "and the default is 1."},
      {"peer-crl-file", Section::kSecurity, Str(&S::peer_crl_file), "''",
       "Path to the peer certificate revocation list file."},
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
       Bool(&S::peer_skip_client_san_verification), "'false'",
       "Skip verification of SAN field in client certificate for peer connections.\n"
       "Deprecated in v3.6 and will be decommissioned in v3.7. Use\n"
       "'--peer-skip-client-san-verification' instead. No effect in Capstan.",
       kNoEffect},
      {"peer-skip-client-san-verification", Section::kSecurity,
       Bool(&S::peer_skip_client_san_verification), "'false'",
       "Skip verification of SAN field in client certificate for peer connections."},
  };
}

// Auth, profiling and monitoring, logging.
std::vector<FlagSpec> AuthMonitoringAndLoggingFlags() {
  return {
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
      {"log-format", Section::kLogging, Str(&S::log_format), "'json'",
       "Configures log format. Only supports json, console. Validated as etcd does; no\n"
       "effect in Capstan, whose log lines have one format.",
       kNoEffect},
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
      {"warning-unary-request-duration", Section::kLogging,
       DurIn(&ParseState::warning_unary_request_duration), "'300ms'",
       "Set time duration after which a warning is logged if a unary request takes more\n"
       "than this duration."},
  };
}

// Distributed tracing and the v2 proxy (neither has an effect).
std::vector<FlagSpec> TracingAndProxyFlags() {
  return {
      // ---- Distributed tracing: etcd 3.6's names and the 3.5 ones ----
      {"experimental-enable-distributed-tracing", Section::kTracing,
       Bool(&S::enable_distributed_tracing), "'false'",
       "Enable experimental distributed tracing. Deprecated in v3.6 and will be\n"
       "decommissioned in v3.7. Use '--enable-distributed-tracing' instead. No effect in\n"
       "Capstan.",
       kNoEffect},
      {"enable-distributed-tracing", Section::kTracing, Bool(&S::enable_distributed_tracing),
       "'false'", "Enable distributed tracing. No effect in Capstan.", kNoEffect},
      {"experimental-distributed-tracing-address", Section::kTracing,
       Str(&S::distributed_tracing_address), "'localhost:4317'",
       "Distributed tracing collector address. Deprecated in v3.6 and will be\n"
       "decommissioned in v3.7. Use '--distributed-tracing-address' instead. No effect in\n"
       "Capstan.",
       kNoEffect},
      {"distributed-tracing-address", Section::kTracing, Str(&S::distributed_tracing_address),
       "'localhost:4317'", "Distributed tracing collector address. No effect in Capstan.",
       kNoEffect},
      {"experimental-distributed-tracing-service-name", Section::kTracing,
       Str(&S::distributed_tracing_service_name), "'etcd'",
       "Distributed tracing service name, must be same across all etcd instances.\n"
       "Deprecated in v3.6 and will be decommissioned in v3.7. Use\n"
       "'--distributed-tracing-service-name' instead. No effect in Capstan.",
       kNoEffect},
      {"distributed-tracing-service-name", Section::kTracing,
       Str(&S::distributed_tracing_service_name), "'etcd'",
       "Distributed tracing service name, must be same across all etcd instances. No effect\n"
       "in Capstan.",
       kNoEffect},
      {"experimental-distributed-tracing-instance-id", Section::kTracing,
       Str(&S::distributed_tracing_instance_id), "''",
       "Distributed tracing instance ID, must be unique per each etcd instance. Deprecated\n"
       "in v3.6 and will be decommissioned in v3.7. Use '--distributed-tracing-instance-id'\n"
       "instead. No effect in Capstan.",
       kNoEffect},
      {"distributed-tracing-instance-id", Section::kTracing,
       Str(&S::distributed_tracing_instance_id), "''",
       "Distributed tracing instance ID, must be unique per each etcd instance. No effect in\n"
       "Capstan.",
       kNoEffect},
      {"experimental-distributed-tracing-sampling-rate", Section::kTracing,
       Int(&S::distributed_tracing_sampling_rate), "'0'",
       "Number of samples to collect per million spans for distributed tracing. Deprecated\n"
       "in v3.6 and will be decommissioned in v3.7. Use\n"
       "'--distributed-tracing-sampling-rate' instead. No effect in Capstan.",
       kNoEffect},
      {"distributed-tracing-sampling-rate", Section::kTracing,
       Int(&S::distributed_tracing_sampling_rate), "'0'",
       "Number of samples to collect per million spans for distributed tracing. No effect\n"
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
  };
}

// etcd's experimental flags, each 3.5 name beside the etcd 3.6 name that
// replaces it (a flag or a feature gate).
std::vector<FlagSpec> ExperimentalFlags() {
  return {
      {"experimental-initial-corrupt-check", Section::kExperimental,
       GateFlag("experimental-initial-corrupt-check"), "'false'",
       "Enable to check data corruption before serving any client/peer traffic. Deprecated\n"
       "in v3.6 and will be decommissioned in v3.7. Use\n"
       "'--feature-gates=InitialCorruptCheck=true' instead."},
      {"experimental-corrupt-check-time", Section::kExperimental, Dur(&S::corrupt_check_time),
       "'0s'",
       "Duration of time between cluster corruption check passes. Deprecated in v3.6 and\n"
       "will be decommissioned in v3.7. Use '--corrupt-check-time' instead."},
      {"corrupt-check-time", Section::kExperimental, Dur(&S::corrupt_check_time), "'0s'",
       "Duration of time between cluster corruption check passes."},
      {"experimental-compact-hash-check-enabled", Section::kExperimental,
       GateFlag("experimental-compact-hash-check-enabled"), "'false'",
       "Enable leader to periodically check followers compaction hashes. Deprecated in v3.6\n"
       "and will be decommissioned in v3.7. Use '--feature-gates=CompactHashCheck=true'\n"
       "instead. No effect in Capstan.",
       kNoEffect},
      {"experimental-compact-hash-check-time", Section::kExperimental,
       Dur(&S::compact_hash_check_time), "'1m'",
       "Duration of time between leader checks followers compaction hashes. Deprecated in\n"
       "v3.6 and will be decommissioned in v3.7. Use '--compact-hash-check-time' instead.\n"
       "No effect in Capstan.",
       kNoEffect},
      {"compact-hash-check-time", Section::kExperimental, Dur(&S::compact_hash_check_time),
       "'1m'",
       "Duration of time between leader checks followers compaction hashes. No effect in\n"
       "Capstan.",
       kNoEffect},
      {"experimental-enable-v2v3", Section::kExperimental, Str(&S::experimental_enable_v2v3), "''",
       "Serve v2 requests through the v3 backend under a given prefix. No effect in Capstan.",
       kNoEffect},
      {"experimental-enable-lease-checkpoint", Section::kExperimental,
       GateFlag("experimental-enable-lease-checkpoint"), "'false'",
       "ExperimentalEnableLeaseCheckpoint enables leader to send regular checkpoints to\n"
       "other members to prevent reset of remaining TTL on leader change. Deprecated in\n"
       "v3.6 and will be decommissioned in v3.7. Use '--feature-gates=LeaseCheckpoint=true'\n"
       "instead. No effect in Capstan.",
       kNoEffect},
      {"experimental-enable-lease-checkpoint-persist", Section::kExperimental,
       GateFlag("experimental-enable-lease-checkpoint-persist"), "'false'",
       "Enable persisting remainingTTL to prevent indefinite auto-renewal of long lived\n"
       "leases. Requires --experimental-enable-lease-checkpoint. Deprecated in v3.6 and\n"
       "will be decommissioned in v3.7. Use '--feature-gates=LeaseCheckpointPersist=true'\n"
       "instead. No effect in Capstan.",
       kNoEffect},
      {"experimental-compaction-batch-limit", Section::kExperimental,
       Int(&S::compaction_batch_limit), "1000",
       "ExperimentalCompactionBatchLimit sets the maximum revisions deleted in each\n"
       "compaction batch. Deprecated in v3.6 and will be decommissioned in v3.7. Use\n"
       "'--compaction-batch-limit' instead."},
      {"compaction-batch-limit", Section::kExperimental, Int(&S::compaction_batch_limit), "1000",
       "CompactionBatchLimit sets the maximum revisions deleted in each compaction batch."},
      {"experimental-compaction-sleep-interval", Section::kExperimental,
       Dur(&S::compaction_sleep_interval), "'10ms'",
       "Sets the sleep interval between each compaction batch. Deprecated in v3.6 and will\n"
       "be decommissioned in v3.7. Use '--compaction-sleep-interval' instead."},
      {"compaction-sleep-interval", Section::kExperimental, Dur(&S::compaction_sleep_interval),
       "'10ms'", "Sets the sleep interval between each compaction batch."},
      {"experimental-watch-progress-notify-interval", Section::kExperimental,
       Dur(&S::watch_progress_notify_interval), "'10m'",
       "Duration of periodical watch progress notification. Deprecated in v3.6 and will be\n"
       "decommissioned in v3.7. Use '--watch-progress-notify-interval' instead."},
      {"watch-progress-notify-interval", Section::kExperimental,
       Dur(&S::watch_progress_notify_interval), "'10m'",
       "Duration of periodical watch progress notification."},
      {"experimental-downgrade-check-time", Section::kExperimental,
       Dur(&S::downgrade_check_time), "'5s'",
       "Duration of time between two downgrade status checks. Deprecated in v3.6 and will be\n"
       "decommissioned in v3.7. Use '--downgrade-check-time' instead. No effect in Capstan.",
       kNoEffect},
      {"downgrade-check-time", Section::kExperimental, Dur(&S::downgrade_check_time), "'5s'",
       "Duration of time between two downgrade status checks. No effect in Capstan.",
       kNoEffect},
      {"experimental-warning-apply-duration", Section::kExperimental,
       Dur(&S::warning_apply_duration), "'100ms'",
       "Warning is generated if requests take more than this duration. Deprecated in v3.6\n"
       "and will be decommissioned in v3.7. Use '--warning-apply-duration' instead."},
      {"warning-apply-duration", Section::kExperimental, Dur(&S::warning_apply_duration),
       "'100ms'", "Warning is generated if requests take more than this duration."},
      {"experimental-warning-unary-request-duration", Section::kExperimental,
       DurIn(&ParseState::experimental_warning_unary_request_duration), "'300ms'",
       "Set time duration after which a warning is generated if a unary request takes more\n"
       "than this duration. Deprecated in v3.6 and will be decommissioned in v3.7. Use\n"
       "'--warning-unary-request-duration' instead."},
      {"experimental-memory-mlock", Section::kExperimental, Bool(&S::memory_mlock), "'false'",
       "Enable to enforce etcd pages (in particular bbolt) to stay in RAM. Deprecated in\n"
       "v3.6 and will be decommissioned in v3.7. Use '--memory-mlock' instead. No effect in\n"
       "Capstan.",
       kNoEffect},
      {"experimental-txn-mode-write-with-shared-buffer", Section::kExperimental,
       GateFlag("experimental-txn-mode-write-with-shared-buffer"), "'true'",
       "Enable the write transaction to use a shared buffer in its readonly check\n"
       "operations. Deprecated in v3.6 and will be decommissioned in v3.7. Use\n"
       "'--feature-gates=TxnModeWriteWithSharedBuffer=true' instead. No effect in Capstan.",
       kNoEffect},
      {"experimental-bootstrap-defrag-threshold-megabytes", Section::kExperimental,
       Uint(&S::bootstrap_defrag_threshold_megabytes), "'0'",
       "Enable the defrag during etcd server bootstrap on condition that it will free at\n"
       "least the provided threshold of disk space. Deprecated in v3.6 and will be\n"
       "decommissioned in v3.7. Use '--bootstrap-defrag-threshold-megabytes' instead. No\n"
       "effect in Capstan.",
       kNoEffect},
      {"bootstrap-defrag-threshold-megabytes", Section::kExperimental,
       Uint(&S::bootstrap_defrag_threshold_megabytes), "'0'",
       "Enable the defrag during etcd server bootstrap on condition that it will free at\n"
       "least the provided threshold of disk space. No effect in Capstan.",
       kNoEffect},
      {"max-learners", Section::kExperimental, Int(&S::max_learners), "'1'",
       "Set the max number of learner members allowed in the cluster membership."},
      {"experimental-snapshot-catchup-entries", Section::kExperimental,
       Uint(&S::snapshot_catchup_entries), "'5000'",
       "Number of entries for a slow follower to catch up after compacting the raft\n"
       "storage entries. Deprecated in v3.6 and will be decommissioned in v3.7. Use\n"
       "'--snapshot-catchup-entries' instead. No effect in Capstan.",
       kNoEffect},
      {"snapshot-catchup-entries", Section::kExperimental, Uint(&S::snapshot_catchup_entries),
       "'5000'",
       "Number of entries for a slow follower to catch up after compacting the raft\n"
       "storage entries. No effect in Capstan.",
       kNoEffect},
      {"experimental-stop-grpc-service-on-defrag", Section::kExperimental,
       GateFlag("experimental-stop-grpc-service-on-defrag"), "'false'",
       "Enable etcd gRPC service to stop serving client requests on defragmentation.\n"
       "Deprecated in v3.6 and will be decommissioned in v3.7. Use\n"
       "'--feature-gates=StopGRPCServiceOnDefrag=true' instead. No effect in Capstan, whose\n"
       "defragmentation runs online.",
       kNoEffect},
  };
}

// Unsafe flags, then Capstan's own.
std::vector<FlagSpec> UnsafeAndCapstanFlags() {
  return {
      // ---- Unsafe ----
      {"force-new-cluster", Section::kUnsafe, Bool(&S::force_new_cluster), "'false'",
       "Force to create a new one-member cluster."},
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
  };
}

// Flags --help does not list: --config-file, --version and etcd's ignored
// legacy flags.
std::vector<FlagSpec> HiddenFlags() {
  return {
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

// The parts above, in table order.
std::vector<FlagSpec> BuildFlags() {
  std::vector<FlagSpec> flags;
  for (std::vector<FlagSpec> (*part)() :
       {MemberFlags, RequestAndGrpcFlags, ClusteringFlags, SecurityFlags,
        AuthMonitoringAndLoggingFlags, TracingAndProxyFlags, ExperimentalFlags,
        UnsafeAndCapstanFlags, HiddenFlags}) {
    std::vector<FlagSpec> more = part();
    flags.insert(flags.end(), std::make_move_iterator(more.begin()),
                 std::make_move_iterator(more.end()));
  }
  return flags;
}

}  // namespace

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

std::string FlagToEnv(absl::string_view name) {
  std::string key = absl::StrCat("ETCD_", name);
  for (char& c : key) c = c == '-' ? '_' : absl::ascii_toupper(c);
  return key;
}

}  // namespace capstan::server::config_internal
