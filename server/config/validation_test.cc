// The checks etcd makes after parsing, with its error texts, and Capstan's
// own refusals (validation.h).

#include "server/config/config.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config/config_testing.h"

namespace capstan::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

using config_testing::ExpectFailure;
using config_testing::ExpectVerifyError;
using config_testing::Parse;
using config_testing::UrlStrings;

// ---------------------------------------------------------------------------
// URLs
// ---------------------------------------------------------------------------

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

TEST(ServerConfigTest, MultiMemberClusterIsAccepted) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--name=a",
             "--initial-cluster=a=http://10.0.0.1:2380,b=http://10.0.0.2:2380,"
             "c=http://10.0.0.3:2380"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->ignored_flags, IsEmpty());
}

TEST(ServerConfigTest, SingleMemberClusterWithSeveralUrls) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--name=a", "--initial-cluster=a=http://10.0.0.1:2380,a=http://10.0.0.2:2380",
             "--initial-cluster-token=tok"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->initial_cluster_token, "tok");
  EXPECT_THAT(c->ignored_flags, IsEmpty());
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

}  // namespace
}  // namespace capstan::server
