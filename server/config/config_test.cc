#include "server/config/config.h"

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace capstan::server {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using Env = std::map<std::string, std::string>;

absl::StatusOr<ServerConfig> Parse(std::vector<std::string> args, Env env = {}) {
  return ParseServerConfig(args, env);
}

// Asserts that parsing fails with exactly `message` and etcd's exit code.
void ExpectFailure(const absl::StatusOr<ServerConfig>& result, const std::string& message,
                   int exit_code, bool print_usage) {
  ASSERT_FALSE(result.ok()) << "expected failure: " << message;
  EXPECT_EQ(result.status().message(), message);
  ConfigFailure failure = GetConfigFailure(result.status());
  EXPECT_EQ(failure.exit_code, exit_code) << message;
  EXPECT_EQ(failure.print_usage, print_usage) << message;
}

// A flag syntax error: Go's flag package prints it with the usage, exit 2.
void ExpectUsageError(const absl::StatusOr<ServerConfig>& result, const std::string& message) {
  ExpectFailure(result, message, 2, true);
}

// A configuration etcd refuses after parsing: exit 1.
void ExpectVerifyError(const absl::StatusOr<ServerConfig>& result, const std::string& message) {
  ExpectFailure(result, message, 1, false);
}

std::vector<std::string> UrlStrings(const std::vector<Url>& urls) {
  std::vector<std::string> out;
  for (const Url& u : urls) out.push_back(u.String());
  return out;
}

// ---------------------------------------------------------------------------
// Defaults
// ---------------------------------------------------------------------------

TEST(ServerConfigTest, DefaultsMatchEtcd) {
  absl::StatusOr<ServerConfig> c = Parse({});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "default");
  EXPECT_EQ(c->data_dir, "default.capstan");
  EXPECT_EQ(c->wal_dir, "");
  EXPECT_EQ(c->snapshot_count, 100000u);
  EXPECT_EQ(c->heartbeat_interval_ms, 100u);
  EXPECT_EQ(c->election_timeout_ms, 1000u);
  EXPECT_THAT(UrlStrings(c->listen_client_urls), ElementsAre("http://localhost:2379"));
  EXPECT_THAT(UrlStrings(c->listen_peer_urls), ElementsAre("http://localhost:2380"));
  EXPECT_THAT(UrlStrings(c->advertise_client_urls), ElementsAre("http://localhost:2379"));
  EXPECT_THAT(UrlStrings(c->initial_advertise_peer_urls), ElementsAre("http://localhost:2380"));
  EXPECT_THAT(c->listen_metrics_urls, IsEmpty());
  EXPECT_EQ(c->max_snapshots, 5u);
  EXPECT_EQ(c->max_wals, 5u);
  EXPECT_EQ(c->quota_backend_bytes, 0);
  EXPECT_EQ(c->QuotaBackendBytes(), int64_t{2} << 30);
  EXPECT_EQ(c->backend_batch_interval, absl::ZeroDuration());
  EXPECT_EQ(c->backend_batch_limit, 0);
  EXPECT_EQ(c->max_txn_ops, 128u);
  EXPECT_EQ(c->max_request_bytes, 1572864u);
  EXPECT_EQ(c->max_concurrent_streams, 4294967295u);
  EXPECT_EQ(c->grpc_keepalive_min_time, absl::Seconds(5));
  EXPECT_EQ(c->grpc_keepalive_interval, absl::Hours(2));
  EXPECT_EQ(c->grpc_keepalive_timeout, absl::Seconds(20));
  EXPECT_EQ(c->initial_cluster, "default=http://localhost:2380");
  EXPECT_EQ(c->initial_cluster_state, ClusterState::kNew);
  EXPECT_EQ(c->initial_cluster_token, "etcd-cluster");
  EXPECT_TRUE(c->strict_reconfig_check);
  EXPECT_TRUE(c->pre_vote);
  EXPECT_EQ(c->auto_compaction_mode, CompactionMode::kPeriodic);
  EXPECT_EQ(c->auto_compaction_period, absl::ZeroDuration());
  EXPECT_EQ(c->auth_token_type, "simple");
  EXPECT_EQ(c->bcrypt_cost, 10u);
  EXPECT_EQ(c->auth_token_ttl_seconds, 300u);
  EXPECT_EQ(c->log_level, LogLevel::kInfo);
  EXPECT_THAT(c->log_outputs, ElementsAre("default"));
  EXPECT_EQ(c->logger, "zap");
  EXPECT_EQ(c->tls_min_version, "TLS1.2");
  EXPECT_THAT(c->cors, ElementsAre("*"));
  EXPECT_THAT(c->host_whitelist, ElementsAre("*"));
  EXPECT_EQ(c->experimental_compaction_batch_limit, 1000);
  EXPECT_EQ(c->experimental_compaction_sleep_interval, absl::Milliseconds(10));
  EXPECT_EQ(c->experimental_watch_progress_notify_interval, absl::Minutes(10));
  EXPECT_EQ(c->experimental_warning_apply_duration, absl::Milliseconds(100));
  EXPECT_FALSE(c->unsafe_no_fsync);
  EXPECT_FALSE(c->force_new_cluster);
  EXPECT_THAT(c->watch_cache_prefixes,
              ElementsAre("/registry/pods/", "/registry/minions/", "/registry/leases/"));
  EXPECT_EQ(c->lease_revoke_rate, 1000);
  EXPECT_FALSE(c->help_requested);
  EXPECT_FALSE(c->version_requested);
  EXPECT_THAT(c->explicitly_set, IsEmpty());
  EXPECT_THAT(c->ignored_flags, IsEmpty());
  EXPECT_THAT(c->warnings, Contains("'data-dir' was empty; using default: default.capstan"));
}

TEST(ServerConfigTest, DataDirFollowsName) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--name=infra0", "--initial-cluster=infra0=http://localhost:2380"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data_dir, "infra0.capstan");
  c = Parse({"--data-dir=/var/lib/etcd"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data_dir, "/var/lib/etcd");
}

// ---------------------------------------------------------------------------
// Flag syntax, as Go's flag package reads it
// ---------------------------------------------------------------------------

TEST(ServerConfigTest, EveryFormOfFlagSyntax) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--data-dir=/d"}, {"--data-dir", "/d"}, {"-data-dir=/d"}, {"-data-dir", "/d"}}) {
    absl::StatusOr<ServerConfig> c = Parse(args);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->data_dir, "/d") << args[0];
    EXPECT_THAT(c->explicitly_set, Contains("data-dir"));
  }
}

TEST(ServerConfigTest, ValueMayStartWithDash) {
  absl::StatusOr<ServerConfig> c = Parse({"--data-dir", "-weird"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data_dir, "-weird");
}

TEST(ServerConfigTest, BoolFlags) {
  absl::StatusOr<ServerConfig> c = Parse({"--unsafe-no-fsync"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->unsafe_no_fsync);
  for (const char* v : {"1", "t", "T", "TRUE", "true", "True"}) {
    c = Parse({std::string("--socket-reuse-port=") + v});
    ASSERT_TRUE(c.ok()) << v;
    EXPECT_TRUE(c->socket_reuse_port) << v;
  }
  for (const char* v : {"0", "f", "F", "FALSE", "false", "False"}) {
    c = Parse({std::string("-strict-reconfig-check=") + v});
    ASSERT_TRUE(c.ok()) << v;
    EXPECT_FALSE(c->strict_reconfig_check) << v;
  }
}

TEST(ServerConfigTest, BoolFlagDoesNotTakeTheNextArgument) {
  // Go stops at "false", which then is an argument, not a flag.
  ExpectVerifyError(Parse({"--unsafe-no-fsync", "false"}), "'false' is not a valid flag");
}

TEST(ServerConfigTest, LaterFlagWins) {
  absl::StatusOr<ServerConfig> c = Parse({"--max-txn-ops=5", "--max-txn-ops=7"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_txn_ops, 7u);
}

// The command line kubeadm writes into its etcd static Pod.
TEST(ServerConfigTest, KubeadmCommandLine) {
  absl::StatusOr<ServerConfig> c = Parse({
      "--advertise-client-urls=https://10.0.0.5:2379",
      "--cert-file=/etc/kubernetes/pki/etcd/server.crt",
      "--client-cert-auth=true",
      "--data-dir=/var/lib/etcd",
      "--experimental-initial-corrupt-check=true",
      "--experimental-watch-progress-notify-interval=5s",
      "--initial-advertise-peer-urls=https://10.0.0.5:2380",
      "--initial-cluster=cp-1=https://10.0.0.5:2380",
      "--key-file=/etc/kubernetes/pki/etcd/server.key",
      "--listen-client-urls=https://127.0.0.1:2379,https://10.0.0.5:2379",
      "--listen-metrics-urls=http://127.0.0.1:2381",
      "--listen-peer-urls=https://10.0.0.5:2380",
      "--name=cp-1",
      "--peer-cert-file=/etc/kubernetes/pki/etcd/peer.crt",
      "--peer-client-cert-auth=true",
      "--peer-key-file=/etc/kubernetes/pki/etcd/peer.key",
      "--peer-trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt",
      "--snapshot-count=10000",
      "--trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt",
  });
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "cp-1");
  EXPECT_EQ(c->data_dir, "/var/lib/etcd");
  EXPECT_THAT(UrlStrings(c->listen_client_urls),
              ElementsAre("https://10.0.0.5:2379", "https://127.0.0.1:2379"));
  EXPECT_THAT(UrlStrings(c->listen_metrics_urls), ElementsAre("http://127.0.0.1:2381"));
  EXPECT_TRUE(c->client_cert_auth);
  EXPECT_EQ(c->experimental_watch_progress_notify_interval, absl::Seconds(5));
  EXPECT_THAT(
      c->ignored_flags,
      ElementsAre("snapshot-count", "listen-peer-urls", "initial-advertise-peer-urls",
                  "initial-cluster", "peer-cert-file", "peer-key-file", "peer-client-cert-auth",
                  "peer-trusted-ca-file", "experimental-initial-corrupt-check"));
}

TEST(ServerConfigTest, UnknownFlag) {
  ExpectUsageError(Parse({"--bogus-flag"}), "flag provided but not defined: -bogus-flag");
  ExpectUsageError(Parse({"-bogus-flag"}), "flag provided but not defined: -bogus-flag");
  ExpectUsageError(Parse({"--bogus=1"}), "flag provided but not defined: -bogus");
  ExpectUsageError(Parse({"--Name=x"}), "flag provided but not defined: -Name");
}

TEST(ServerConfigTest, BadFlagSyntax) {
  ExpectUsageError(Parse({"---name=x"}), "bad flag syntax: ---name=x");
  ExpectUsageError(Parse({"--=x"}), "bad flag syntax: --=x");
  ExpectUsageError(Parse({"-=x"}), "bad flag syntax: -=x");
}

TEST(ServerConfigTest, MissingArgument) {
  ExpectUsageError(Parse({"--snapshot-count"}), "flag needs an argument: -snapshot-count");
  ExpectUsageError(Parse({"--name"}), "flag needs an argument: -name");
}

TEST(ServerConfigTest, PositionalArguments) {
  ExpectVerifyError(Parse({"--name=x", "extra"}), "'extra' is not a valid flag");
  ExpectVerifyError(Parse({"-"}), "'-' is not a valid flag");
  ExpectVerifyError(Parse({"--", "--name=x"}), "'--name=x' is not a valid flag");
  absl::StatusOr<ServerConfig> c = Parse({"--"});
  EXPECT_TRUE(c.ok()) << c.status();
}

TEST(ServerConfigTest, BadBool) {
  ExpectUsageError(Parse({"--force-new-cluster=maybe"}),
                   "invalid boolean value \"maybe\" for -force-new-cluster: parse error");
  ExpectUsageError(Parse({"--force-new-cluster="}),
                   "invalid boolean value \"\" for -force-new-cluster: parse error");
}

TEST(ServerConfigTest, Integers) {
  ExpectUsageError(Parse({"--snapshot-count=abc"}),
                   "invalid value \"abc\" for flag -snapshot-count: parse error");
  ExpectUsageError(Parse({"--heartbeat-interval=-1"}),
                   "invalid value \"-1\" for flag -heartbeat-interval: parse error");
  ExpectUsageError(Parse({"--snapshot-count=1e3"}),
                   "invalid value \"1e3\" for flag -snapshot-count: parse error");
  ExpectUsageError(Parse({"--snapshot-count=99999999999999999999"}),
                   "invalid value \"99999999999999999999\" for flag -snapshot-count: value out "
                   "of range");
  ExpectUsageError(Parse({"--max-txn-ops="}),
                   "invalid value \"\" for flag -max-txn-ops: parse error");
  ExpectUsageError(Parse({"--snapshot-count=a\"b"}),
                   "invalid value \"a\\\"b\" for flag -snapshot-count: parse error");
  // Go reads base prefixes and digit separators.
  absl::StatusOr<ServerConfig> c = Parse({"--snapshot-count=0x10", "--max-txn-ops=1_000",
                                          "--max-wals=010", "--quota-backend-bytes=-1"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->snapshot_count, 16u);
  EXPECT_EQ(c->max_txn_ops, 1000u);
  EXPECT_EQ(c->max_wals, 8u);
  EXPECT_EQ(c->quota_backend_bytes, -1);
  EXPECT_EQ(c->QuotaBackendBytes(), 0);
  ExpectUsageError(Parse({"--max-txn-ops=1__0"}),
                   "invalid value \"1__0\" for flag -max-txn-ops: parse error");
}

TEST(ServerConfigTest, MaxConcurrentStreamsReportsStrconvText) {
  ExpectUsageError(Parse({"--max-concurrent-streams=abc"}),
                   "invalid value \"abc\" for flag -max-concurrent-streams: strconv.ParseUint: "
                   "parsing \"abc\": invalid syntax");
  ExpectUsageError(Parse({"--max-concurrent-streams=4294967296"}),
                   "invalid value \"4294967296\" for flag -max-concurrent-streams: "
                   "strconv.ParseUint: parsing \"4294967296\": value out of range");
  absl::StatusOr<ServerConfig> c = Parse({"--max-concurrent-streams=100"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_concurrent_streams, 100u);
}

TEST(ServerConfigTest, SelectiveValues) {
  ExpectUsageError(Parse({"--initial-cluster-state=foo"}),
                   "invalid value \"foo\" for flag -initial-cluster-state: invalid value");
  ExpectUsageError(Parse({"--discovery-fallback=x"}),
                   "invalid value \"x\" for flag -discovery-fallback: invalid value");
  ExpectUsageError(Parse({"--proxy=x"}), "invalid value \"x\" for flag -proxy: invalid value");
  absl::StatusOr<ServerConfig> c = Parse({"--initial-cluster-state=existing"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->initial_cluster_state, ClusterState::kExisting);
}

// ---------------------------------------------------------------------------
// --help and --version
// ---------------------------------------------------------------------------

TEST(ServerConfigTest, Help) {
  for (const char* h : {"--help", "-h", "-help", "--h", "--help=maybe"}) {
    absl::StatusOr<ServerConfig> c = Parse({h});
    ASSERT_TRUE(c.ok()) << h;
    EXPECT_TRUE(c->help_requested) << h;
  }
  // Go stops at the help flag; an error before it still wins.
  absl::StatusOr<ServerConfig> c = Parse({"-h", "--snapshot-count=abc"});
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->help_requested);
  ExpectUsageError(Parse({"--snapshot-count=abc", "-h"}),
                   "invalid value \"abc\" for flag -snapshot-count: parse error");
}

TEST(ServerConfigTest, Version) {
  absl::StatusOr<ServerConfig> c = Parse({"--version"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->version_requested);
  // Flags are parsed first; validation and the environment are skipped.
  ExpectUsageError(Parse({"--version", "--initial-cluster-state=x"}),
                   "invalid value \"x\" for flag -initial-cluster-state: invalid value");
  c = Parse({"--version", "--auto-compaction-mode=x"}, {{"ETCD_SNAPSHOT_COUNT", "x"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->version_requested);
  ExpectVerifyError(Parse({"--version", "x"}), "'x' is not a valid flag");
}

// ---------------------------------------------------------------------------
// Environment
// ---------------------------------------------------------------------------

TEST(ServerConfigTest, EnvironmentSetsFlags) {
  absl::StatusOr<ServerConfig> c =
      Parse({}, {{"ETCD_DATA_DIR", "/env"},
                 {"ETCD_UNSAFE_NO_FSYNC", "true"},
                 {"ETCD_AUTO_COMPACTION_RETENTION", "5m"},
                 {"ETCD_EXPERIMENTAL_WATCH_PROGRESS_NOTIFY_INTERVAL", "5s"},
                 {"ETCD_WATCH_CACHE_PREFIXES", "/a/,/b/"},
                 {"PATH", "/bin"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->data_dir, "/env");
  EXPECT_TRUE(c->unsafe_no_fsync);
  EXPECT_EQ(c->auto_compaction_period, absl::Minutes(5));
  EXPECT_EQ(c->experimental_watch_progress_notify_interval, absl::Seconds(5));
  EXPECT_THAT(c->watch_cache_prefixes, ElementsAre("/a/", "/b/"));
  EXPECT_THAT(c->used_env_vars, Contains("ETCD_DATA_DIR=/env"));
  EXPECT_THAT(c->explicitly_set, Contains("unsafe-no-fsync"));
  for (const std::string& w : c->warnings) {
    EXPECT_FALSE(absl::StrContains(w, "unrecognized")) << w;
  }
}

TEST(ServerConfigTest, FlagShadowingEnvironmentIsFatalAsInEtcd) {
  ExpectVerifyError(Parse({"--name=bar"}, {{"ETCD_NAME", "foo"}}),
                    "conflicting environment variable \"ETCD_NAME\" is shadowed by corresponding "
                    "command-line flag (either unset environment variable or disable flag)");
  // Even an empty variable conflicts.
  EXPECT_FALSE(Parse({"--name=bar"}, {{"ETCD_NAME", ""}}).ok());
}

TEST(ServerConfigTest, UnrecognizedEnvironmentIsAWarning) {
  absl::StatusOr<ServerConfig> c =
      Parse({}, {{"ETCD_BOGUS", "1"}, {"ETCD_NAME", ""}, {"ETCDCTL_API", "3"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->warnings, Contains("unrecognized environment variable ETCD_BOGUS=1"));
  // etcd ignores an empty value and then calls the variable unrecognized.
  EXPECT_THAT(c->warnings, Contains("unrecognized environment variable ETCD_NAME="));
  for (const std::string& w : c->warnings) EXPECT_FALSE(absl::StrContains(w, "ETCDCTL")) << w;
  EXPECT_EQ(c->name, "default");
}

TEST(ServerConfigTest, EtcdVersionVariableIsRefusedWithAWarning) {
  absl::StatusOr<ServerConfig> c = Parse({}, {{"ETCD_VERSION", "1"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->version_requested);
  EXPECT_THAT(c->warnings, Contains("cannot set special environment variable ETCD_VERSION=1"));
}

TEST(ServerConfigTest, BadEnvironmentValue) {
  ExpectVerifyError(Parse({}, {{"ETCD_SNAPSHOT_COUNT", "abc"}}),
                    "invalid value \"abc\" for ETCD_SNAPSHOT_COUNT: parse error");
  ExpectVerifyError(Parse({}, {{"ETCD_FORCE_NEW_CLUSTER", "maybe"}}),
                    "invalid value \"maybe\" for ETCD_FORCE_NEW_CLUSTER: parse error");
  ExpectVerifyError(Parse({}, {{"ETCD_LISTEN_CLIENT_URLS", "foo"}}),
                    "invalid value \"foo\" for ETCD_LISTEN_CLIENT_URLS: URL scheme must be http, "
                    "https, unix, or unixs: foo");
  // Several bad values: etcd reports the last flag in name order.
  ExpectVerifyError(Parse({}, {{"ETCD_SNAPSHOT_COUNT", "x"}, {"ETCD_HEARTBEAT_INTERVAL", "y"}}),
                    "invalid value \"x\" for ETCD_SNAPSHOT_COUNT: parse error");
}

TEST(ServerConfigTest, EnvironmentListenUrlsNeedAdvertiseUrlsToo) {
  absl::StatusOr<ServerConfig> c =
      Parse({}, {{"ETCD_LISTEN_CLIENT_URLS", "http://0.0.0.0:2379"},
                 {"ETCD_ADVERTISE_CLIENT_URLS", "http://10.0.0.1:2379"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(UrlStrings(c->listen_client_urls), ElementsAre("http://0.0.0.0:2379"));
  ExpectVerifyError(Parse({}, {{"ETCD_LISTEN_CLIENT_URLS", "http://0.0.0.0:2379"}}),
                    "--advertise-client-urls is required when --listen-client-urls is set "
                    "explicitly");
}

// ---------------------------------------------------------------------------
// Durations
// ---------------------------------------------------------------------------

TEST(GoDurationTest, Parses) {
  struct Case {
    const char* text;
    absl::Duration want;
  };
  for (const Case& tc : std::vector<Case>{
           {"0", absl::ZeroDuration()},
           {"+0", absl::ZeroDuration()},
           {"-0", absl::ZeroDuration()},
           {"100ms", absl::Milliseconds(100)},
           {"10s", absl::Seconds(10)},
           {"1h2m", absl::Hours(1) + absl::Minutes(2)},
           {"1.5h", absl::Minutes(90)},
           {"-1.5h", -absl::Minutes(90)},
           {"1h2m3.5s", absl::Hours(1) + absl::Minutes(2) + absl::Milliseconds(3500)},
           {"300us", absl::Microseconds(300)},
           {"300\xc2\xb5s", absl::Microseconds(300)},
           {"300\xce\xbcs", absl::Microseconds(300)},
           {"7ns", absl::Nanoseconds(7)},
           {".5s", absl::Milliseconds(500)},
           {"5.s", absl::Seconds(5)},
           {"9223372036854775807ns", absl::Nanoseconds(9223372036854775807)},
       }) {
    absl::StatusOr<absl::Duration> d = gotext::ParseGoDuration(tc.text);
    ASSERT_TRUE(d.ok()) << tc.text << ": " << d.status();
    EXPECT_EQ(*d, tc.want) << tc.text;
  }
}

TEST(GoDurationTest, ErrorsReadLikeGo) {
  struct Case {
    const char* text;
    const char* error;
  };
  for (const Case& tc : std::vector<Case>{
           {"", "time: invalid duration \"\""},
           {"abc", "time: invalid duration \"abc\""},
           {"5", "time: missing unit in duration \"5\""},
           {"-5", "time: missing unit in duration \"-5\""},
           {"1d", "time: unknown unit \"d\" in duration \"1d\""},
           {".", "time: invalid duration \".\""},
           {"-", "time: invalid duration \"-\""},
           {"1h-2m", "time: unknown unit \"h-\" in duration \"1h-2m\""},
           {"5.5", "time: missing unit in duration \"5.5\""},
           {"1e5s", "time: unknown unit \"e\" in duration \"1e5s\""},
           {"+", "time: invalid duration \"+\""},
           {"1\xc2\xb5x", "time: unknown unit \"\\xc2\\xb5x\" in duration \"1\\xc2\\xb5x\""},
           {"9223372036854775808ns", "time: invalid duration \"9223372036854775808ns\""},
       }) {
    absl::StatusOr<absl::Duration> d = gotext::ParseGoDuration(tc.text);
    ASSERT_FALSE(d.ok()) << tc.text;
    EXPECT_EQ(d.status().message(), tc.error);
  }
}

TEST(GoDurationTest, FormatsLikeGo) {
  EXPECT_EQ(gotext::FormatGoDuration(absl::ZeroDuration()), "0s");
  EXPECT_EQ(gotext::FormatGoDuration(absl::Hours(1)), "1h0m0s");
  EXPECT_EQ(gotext::FormatGoDuration(absl::Milliseconds(100)), "100ms");
  EXPECT_EQ(gotext::FormatGoDuration(absl::Milliseconds(1500)), "1.5s");
  EXPECT_EQ(gotext::FormatGoDuration(absl::Microseconds(1500)), "1.5ms");
  EXPECT_EQ(gotext::FormatGoDuration(absl::Microseconds(1)), "1\xc2\xb5s");
  EXPECT_EQ(gotext::FormatGoDuration(absl::Nanoseconds(1)), "1ns");
  EXPECT_EQ(gotext::FormatGoDuration(-absl::Minutes(2)), "-2m0s");
  EXPECT_EQ(gotext::FormatGoDuration(absl::Hours(2) + absl::Minutes(3) + absl::Seconds(4)), "2h3m4s");
}

TEST(ServerConfigTest, DurationFlags) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--backend-batch-interval=2ms", "--grpc-keepalive-min-time", "1h2m",
             "--experimental-compaction-sleep-interval=100ms"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->backend_batch_interval, absl::Milliseconds(2));
  EXPECT_EQ(c->grpc_keepalive_min_time, absl::Hours(1) + absl::Minutes(2));
  EXPECT_EQ(c->experimental_compaction_sleep_interval, absl::Milliseconds(100));
  ExpectUsageError(Parse({"--grpc-keepalive-min-time=1d"}),
                   "invalid value \"1d\" for flag -grpc-keepalive-min-time: parse error");
  ExpectUsageError(Parse({"--backend-batch-interval=1"}),
                   "invalid value \"1\" for flag -backend-batch-interval: parse error");
  ExpectUsageError(Parse({"--grpc-keepalive-min-time="}),
                   "invalid value \"\" for flag -grpc-keepalive-min-time: parse error");
}

// ---------------------------------------------------------------------------
// URLs
// ---------------------------------------------------------------------------

TEST(ServerConfigTest, UrlListsAreValidatedLikeEtcd) {
  ExpectUsageError(Parse({"--listen-client-urls=foo"}),
                   "invalid value \"foo\" for flag -listen-client-urls: URL scheme must be http, "
                   "https, unix, or unixs: foo");
  ExpectUsageError(Parse({"--listen-client-urls=http://foo"}),
                   "invalid value \"http://foo\" for flag -listen-client-urls: URL address does "
                   "not have the form \"host:port\": http://foo");
  ExpectUsageError(Parse({"--listen-client-urls=http://foo:2379/path"}),
                   "invalid value \"http://foo:2379/path\" for flag -listen-client-urls: URL must "
                   "not contain a path: http://foo:2379/path");
  ExpectUsageError(Parse({"--listen-client-urls=http://a:1/"}),
                   "invalid value \"http://a:1/\" for flag -listen-client-urls: URL must not "
                   "contain a path: http://a:1/");
  ExpectUsageError(Parse({"--listen-client-urls=ftp://a:1"}),
                   "invalid value \"ftp://a:1\" for flag -listen-client-urls: URL scheme must be "
                   "http, https, unix, or unixs: ftp://a:1");
  ExpectUsageError(Parse({"--listen-client-urls=http://a:1,,http://b:2"}),
                   "invalid value \"http://a:1,,http://b:2\" for flag -listen-client-urls: URL "
                   "scheme must be http, https, unix, or unixs: ");
  ExpectUsageError(Parse({"--listen-client-urls=http://[::1"}),
                   "invalid value \"http://[::1\" for flag -listen-client-urls: parse "
                   "\"http://[::1\": missing ']' in host");
  ExpectUsageError(Parse({"--listen-client-urls=http://a:b"}),
                   "invalid value \"http://a:b\" for flag -listen-client-urls: parse "
                   "\"http://a:b\": invalid port \":b\" after host");
  ExpectUsageError(Parse({"--cors=http://example.com"}),
                   "invalid value \"http://example.com\" for flag -cors: URL address does not "
                   "have the form \"host:port\": http://example.com");
}

TEST(ServerConfigTest, UrlListsAreSortedTrimmedAndDeduplicated) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--listen-client-urls=http://127.0.0.1:2379, HTTPS://127.0.0.1:2379,"
             "http://127.0.0.1:2379,unix://localhost:1234",
             "--advertise-client-urls=https://[::1]:2379"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(
      UrlStrings(c->listen_client_urls),
      ElementsAre("http://127.0.0.1:2379", "https://127.0.0.1:2379", "unix://localhost:1234"));
  ASSERT_EQ(c->advertise_client_urls.size(), 1u);
  EXPECT_EQ(c->advertise_client_urls[0].Hostname(), "::1");
  EXPECT_EQ(c->advertise_client_urls[0].Port(), "2379");
}

TEST(ParseUrlListTest, Basics) {
  absl::StatusOr<std::vector<Url>> urls = ParseUrlList("unix:///var/run/etcd.sock");
  ASSERT_TRUE(urls.ok()) << urls.status();
  EXPECT_EQ((*urls)[0].scheme, "unix");
  EXPECT_EQ((*urls)[0].path, "/var/run/etcd.sock");
  EXPECT_EQ((*urls)[0].String(), "unix:///var/run/etcd.sock");
  EXPECT_FALSE(ParseUrlList("").ok());
  EXPECT_EQ(ParseUrlList("http://a b:1").status().message(),
            "parse \"http://a b:1\": invalid character \" \" in host name");
  EXPECT_EQ(ParseUrlList(":foo").status().message(), "parse \":foo\": missing protocol scheme");
}

TEST(ServerConfigTest, ListenersNeedAnIp) {
  ExpectVerifyError(
      Parse({"--listen-client-urls=http://foo:1", "--advertise-client-urls=http://foo:1"}),
      "expected IP in URL for binding (http://foo:1)");
  ExpectVerifyError(Parse({"--listen-metrics-urls=http://foo:1"}),
                    "expected IP in URL for binding (http://foo:1)");
  ExpectVerifyError(Parse({"--listen-peer-urls=HTTP://a:1"}),
                    "expected IP in URL for binding (http://a:1)");
  // Go prints the host re-escaped; the zone makes it no IP for Go either.
  ExpectVerifyError(Parse({"--listen-peer-urls=http://[fe80::1%25eth0]:2380"}),
                    "expected IP in URL for binding (http://[fe80::1%25eth0]:2380)");
  absl::StatusOr<ServerConfig> c =
      Parse({"--listen-client-urls=http://[::]:2379,http://localhost:2379",
             "--advertise-client-urls=http://host.example:2379",
             "--listen-metrics-urls=http://0.0.0.0:2381"});
  ASSERT_TRUE(c.ok()) << c.status();
}

TEST(ServerConfigTest, AdvertiseUrlsNeedAHost) {
  ExpectVerifyError(Parse({"--initial-advertise-peer-urls=http://:2380"}),
                    "--initial-advertise-peer-urls \"http://:2380\" must be \"host:port\" "
                    "(unexpected empty host (http://:2380))");
}

TEST(ServerConfigTest, ListenClientUrlsWithoutAdvertiseUrls) {
  ExpectVerifyError(Parse({"--listen-client-urls=http://127.0.0.1:2379"}),
                    "--advertise-client-urls is required when --listen-client-urls is set "
                    "explicitly");
  // An empty value is etcd's allowed exception: the list keeps its value,
  // but the flag still counts as set.
  ExpectVerifyError(Parse({"--listen-client-urls="}),
                    "--advertise-client-urls is required when --listen-client-urls is set "
                    "explicitly");
}

// ---------------------------------------------------------------------------
// Clustering
// ---------------------------------------------------------------------------

TEST(ServerConfigTest, MultiMemberClusterIsRefused) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--name=a",
             "--initial-cluster=a=http://10.0.0.1:2380,b=http://10.0.0.2:2380,"
             "c=http://10.0.0.3:2380"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("single-member"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("3 members (a, b, c)"));
  EXPECT_EQ(GetConfigFailure(c.status()).exit_code, 1);
}

TEST(ServerConfigTest, SingleMemberClusterWithSeveralUrls) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--name=a", "--initial-cluster=a=http://10.0.0.1:2380,a=http://10.0.0.2:2380",
             "--initial-cluster-token=tok"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->initial_cluster_token, "tok");
  EXPECT_THAT(c->ignored_flags, ElementsAre("initial-cluster"));
}

TEST(ServerConfigTest, InitialClusterMustNameThisMember) {
  ExpectVerifyError(Parse({"--name=a", "--initial-cluster=b=http://localhost:2380"}),
                    "couldn't find local name \"a\" in the initial cluster configuration");
  ExpectVerifyError(Parse({"--initial-cluster=foo"}),
                    "error setting up initial cluster: URL scheme must be http, https, unix, or "
                    "unixs: ");
}

TEST(ServerConfigTest, NameAloneBootstrapsThatMember) {
  // embed.Config.UpdateDefaultClusterFromName: the default initial cluster
  // follows --name, at the advertised peer URLs.
  absl::StatusOr<ServerConfig> c =
      Parse({"--name=abc",
             "--initial-advertise-peer-urls=http://10.0.0.1:2380,http://10.0.0.2:2380"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->initial_cluster, "abc=http://10.0.0.1:2380,abc=http://10.0.0.2:2380");
  EXPECT_THAT(UrlStrings(InitialPeerUrls(*c)),
              ElementsAre("http://10.0.0.1:2380", "http://10.0.0.2:2380"));
  // Given explicitly as the default text, it is replaced all the same.
  c = Parse({"--name=abc", "--initial-cluster=default=http://localhost:2380"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->initial_cluster, "abc=http://localhost:2380");
  // Another initial cluster is this member's own statement of its URLs.
  c = Parse({"--name=abc", "--initial-cluster=abc=http://10.0.0.3:2380"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(UrlStrings(InitialPeerUrls(*c)), ElementsAre("http://10.0.0.3:2380"));
}

TEST(ServerConfigTest, DiscoveryIsAcceptedAndClearsTheDefaultInitialCluster) {
  absl::StatusOr<ServerConfig> c = Parse({"--discovery-srv=example.com"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->initial_cluster, "");
  EXPECT_THAT(c->ignored_flags, ElementsAre("discovery-srv"));
  ExpectVerifyError(
      Parse({"--discovery-srv=example.com", "--initial-cluster=default=http://localhost:2380"}),
      "multiple discovery or bootstrap flags are set. Choose one of \"initial-cluster\", "
      "\"discovery\" or \"discovery-srv\"");
}

TEST(ServerConfigTest, RaftTimingIsValidatedThoughIgnored) {
  ExpectVerifyError(Parse({"--heartbeat-interval=0"}),
                    "--heartbeat-interval must be >0 (set to 0ms)");
  ExpectVerifyError(Parse({"--election-timeout=0"}), "--election-timeout must be >0 (set to 0ms)");
  ExpectVerifyError(Parse({"--election-timeout=400"}),
                    "--election-timeout[400ms] should be at least as 5 times as "
                    "--heartbeat-interval[100ms]");
  ExpectVerifyError(Parse({"--election-timeout=60000"}),
                    "--election-timeout[60000ms] is too long, and should be set less than 50000ms");
}

TEST(ServerConfigTest, IgnoredFlagsAreListedInTableOrder) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--listen-peer-urls=http://10.0.0.1:2380", "--snapshot-count=5", "--pre-vote=false",
             "--peer-cert-file=/p", "--force-new-cluster", "--v", "--max-txn-ops=9",
             "--enable-grpc-gateway=false"},
            {{"ETCD_ENABLE_PPROF", "true"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->ignored_flags,
              ElementsAre("snapshot-count", "listen-peer-urls", "pre-vote", "peer-cert-file",
                          "enable-pprof", "force-new-cluster", "v"));
}

TEST(ServerConfigTest, AutoCompaction) {
  absl::StatusOr<ServerConfig> c = Parse({"--auto-compaction-retention=5"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->auto_compaction_period, absl::Hours(5));
  c = Parse({"--auto-compaction-retention=30m"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->auto_compaction_period, absl::Minutes(30));
  c = Parse({"--auto-compaction-mode=revision", "--auto-compaction-retention=1000"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->auto_compaction_mode, CompactionMode::kRevision);
  EXPECT_EQ(c->auto_compaction_revisions, 1000);
  EXPECT_EQ(c->auto_compaction_period, absl::ZeroDuration());
  ExpectVerifyError(Parse({"--auto-compaction-mode=foo"}), "unknown auto-compaction-mode \"foo\"");
  ExpectVerifyError(Parse({"--auto-compaction-retention=abc"}),
                    "error parsing CompactionRetention: time: invalid duration \"abc\"");
  ExpectVerifyError(Parse({"--auto-compaction-retention=-5"}),
                    "error parsing CompactionRetention: time: missing unit in duration \"-5\"");
}

// ---------------------------------------------------------------------------
// Logging, security, auth
// ---------------------------------------------------------------------------

TEST(ServerConfigTest, Logging) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--log-level=debug", "--log-outputs=stdout,stderr,stdout"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->log_level, LogLevel::kDebug);
  EXPECT_THAT(c->log_outputs, ElementsAre("stderr", "stdout"));
  c = Parse({"--log-level=WARN"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->log_level, LogLevel::kWarn);
  // etcd panics on an unknown level: exit 2 without the usage.
  ExpectFailure(Parse({"--log-level=foo"}), "unrecognized level: \"foo\"", 2, false);
  ExpectVerifyError(Parse({"--logger=capnslog"}), "--logger=capnslog is removed in v3.5");
  ExpectVerifyError(Parse({"--logger=bogus"}), "unknown logger option \"bogus\"");
  ExpectVerifyError(Parse({"--log-outputs=stderr,default"}),
                    "multi logoutput for \"default\" is not supported yet");
  ExpectVerifyError(Parse({"--enable-log-rotation"}),
                    "--log-outputs requires a single file path when --log-rotate-config-json is "
                    "defined");
  c = Parse({"--enable-log-rotation", "--log-outputs=/var/log/capstan.log"});
  EXPECT_TRUE(c.ok()) << c.status();
}

TEST(ServerConfigTest, Tls) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--cert-file=/c", "--key-file=/k", "--trusted-ca-file=/ca", "--client-cert-auth",
             "--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,"
             "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
             "--tls-max-version=TLS1.3"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->client_cert_auth);
  EXPECT_EQ(c->cipher_suites.size(), 2u);
  ExpectVerifyError(Parse({"--cipher-suites=FOO"}), "unexpected TLS cipher suite \"FOO\"");
  ExpectVerifyError(Parse({"--tls-min-version=TLS1.1"}),
                    "unexpected TLS version \"TLS1.1\" (must be one of: TLS1.2, TLS1.3)");
  ExpectVerifyError(Parse({"--tls-min-version=TLS1.3", "--tls-max-version=TLS1.2"}),
                    "min version (TLS1.3) is greater than max version (TLS1.2)");
  ExpectVerifyError(
      Parse({"--tls-min-version=TLS1.3", "--cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"}),
      "cipher suites cannot be configured when only TLS1.3 is enabled");
}

TEST(ServerConfigTest, CorsAndHostWhitelist) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--cors=http://b.example:80,http://a.example:80", "--host-whitelist=b,a,b"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->cors, ElementsAre("http://a.example:80", "http://b.example:80"));
  EXPECT_THAT(c->host_whitelist, ElementsAre("a", "b"));
}

TEST(ServerConfigTest, Auth) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--auth-token=jwt,sign-method=RS256,pub-key=/p,priv-key=/k,ttl=10m",
             "--bcrypt-cost=12", "--auth-token-ttl=60"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->auth_token_type, "jwt");
  EXPECT_EQ(c->auth_token_options.at("sign-method"), "RS256");
  EXPECT_EQ(c->auth_token_options.at("ttl"), "10m");
  EXPECT_EQ(c->bcrypt_cost, 12u);
  EXPECT_EQ(c->auth_token_ttl_seconds, 60u);
  ExpectVerifyError(Parse({"--auth-token=foo"}), "auth: invalid auth options");
  ExpectVerifyError(Parse({"--auth-token=simple,x"}), "auth: invalid auth options");
  c = Parse({"--bcrypt-cost=100"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->bcrypt_cost, 10u);
  bool warned = false;
  for (const std::string& w : c->warnings) warned |= absl::StrContains(w, "bcrypt cost");
  EXPECT_TRUE(warned);
}

TEST(ServerConfigTest, LeaseCheckpointPersistNeedsCheckpoint) {
  ExpectVerifyError(Parse({"--experimental-enable-lease-checkpoint-persist"}),
                    "setting experimental-enable-lease-checkpoint-persist requires "
                    "experimental-enable-lease-checkpoint");
}

// ---------------------------------------------------------------------------
// Refusals and Capstan's own flags
// ---------------------------------------------------------------------------

TEST(ServerConfigTest, ProxyIsRefused) {
  absl::StatusOr<ServerConfig> c = Parse({"--proxy=on"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(GetConfigFailure(c.status()).exit_code, 1);
  EXPECT_TRUE(Parse({"--proxy=off"}).ok());
  // --config-file is read (config_file_test.cc); a missing one is etcd's error.
  c = Parse({}, {{"ETCD_CONFIG_FILE", "/nonexistent/etcd.yml"}});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "open /nonexistent/etcd.yml: no such file or directory");
}

TEST(ServerConfigTest, CapstanFlags) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--watch-cache-prefixes=/registry/pods/,,/registry/events/,/registry/pods/",
             "--lease-revoke-rate=50", "--backend-batch-limit=64", "--backend-cache-bytes=4096"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->backend_cache_bytes, 4096);
  EXPECT_THAT(c->watch_cache_prefixes, ElementsAre("/registry/pods/", "/registry/events/"));
  EXPECT_EQ(c->lease_revoke_rate, 50);
  EXPECT_EQ(c->backend_batch_limit, 64);
  EXPECT_THAT(c->ignored_flags, IsEmpty());
  c = Parse({"--watch-cache-prefixes="});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->watch_cache_prefixes, IsEmpty());
  ExpectVerifyError(Parse({"--lease-revoke-rate=0"}), "--lease-revoke-rate must be >0 (set to 0)");
  ExpectVerifyError(Parse({"--backend-cache-bytes=-1"}),
                    "--backend-cache-bytes must be >=0 (set to -1)");
}

TEST(ServerConfigTest, GetConfigFailureOfOtherStatus) {
  ConfigFailure f = GetConfigFailure(absl::InternalError("x"));
  EXPECT_EQ(f.exit_code, 1);
  EXPECT_FALSE(f.print_usage);
}

// ---------------------------------------------------------------------------
// Usage
// ---------------------------------------------------------------------------

TEST(UsageTextTest, ListsEverySectionAndFlag) {
  const std::string usage = UsageText();
  EXPECT_TRUE(absl::StartsWith(usage, ShortUsageText()));
  for (const char* section :
       {"\nMember:\n", "\nClustering:\n", "\nSecurity:\n", "\nAuth:\n", "\nLogging:\n",
        "\nExperimental feature:\n", "\nUnsafe feature:\n", "\nCapstan:\n"}) {
    EXPECT_THAT(usage, HasSubstr(section));
  }
  for (const char* flag : {
           "--name 'default'",
           "--data-dir '${name}.capstan'",
           "--listen-client-urls 'http://localhost:2379'",
           "--max-request-bytes '1572864'",
           "--max-txn-ops '128'",
           "--quota-backend-bytes '0'",
           "--backend-batch-interval ''",
           "--backend-batch-limit '0'",
           "--snapshot-count '100000'",
           "--auto-compaction-mode 'periodic'",
           "--log-level 'info'",
           "--experimental-compaction-batch-limit 1000",
           "--experimental-compaction-sleep-interval '10ms'",
           "--experimental-watch-progress-notify-interval '10m'",
           "--unsafe-no-fsync 'false'",
           "--force-new-cluster 'false'",
           "--socket-reuse-port 'false'",
           "--tls-min-version 'TLS1.2'",
           "--watch-cache-prefixes '/registry/pods/,/registry/minions/,/registry/leases/'",
           "--lease-revoke-rate 1000",
           "--backend-cache-bytes 268435456",
       }) {
    EXPECT_THAT(usage, HasSubstr(std::string("\n  ") + flag + "\n")) << flag;
  }
  EXPECT_THAT(usage, HasSubstr("group commit"));
  // Hidden flags are not listed.
  EXPECT_THAT(usage, ::testing::Not(HasSubstr("--cluster-active-size")));
}

TEST(ServerConfigTest, MinLeaseTtlFollowsTheElectionTimeoutAsEtcds) {
  // etcd: ceil(⌊3·ticks/2⌋ · heartbeat), ticks = ⌊election timeout / heartbeat⌋.
  struct Case {
    std::vector<std::string> flags;
    int64_t ttl;
  };
  for (const Case& c : std::vector<Case>{
           {{}, 2},                                                      // 15 × 100 ms
           {{"--election-timeout=5000", "--heartbeat-interval=500"}, 8},  // 15 × 500 ms
           {{"--election-timeout=2500", "--heartbeat-interval=250"}, 4},  // 15 × 250 ms
           {{"--election-timeout=1100", "--heartbeat-interval=100"}, 2},  // 16 × 100 ms
           {{"--election-timeout=10000"}, 15},                           // 150 × 100 ms
           {{"--election-timeout=50000", "--heartbeat-interval=10000"}, 70},  // 7 × 10 s
       }) {
    auto config = Parse(c.flags);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->MinLeaseTtlSeconds(), c.ttl) << absl::StrJoin(c.flags, " ");
  }
}

}  // namespace
}  // namespace capstan::server
