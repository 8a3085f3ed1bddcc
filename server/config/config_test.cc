// ParseServerConfig as a whole: etcd's defaults, a real command line, the
// flags it reports as ignored, and the ServerConfig helpers.

#include "server/config/config.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config/config_testing.h"

namespace capstan::server {
namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

using config_testing::Parse;
using config_testing::UrlStrings;

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
  EXPECT_EQ(c->compaction_batch_limit, 1000);
  EXPECT_EQ(c->compaction_sleep_interval, absl::Milliseconds(10));
  EXPECT_EQ(c->watch_progress_notify_interval, absl::Minutes(10));
  EXPECT_EQ(c->warning_apply_duration, absl::Milliseconds(100));
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
// A whole command line
// ---------------------------------------------------------------------------

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
  EXPECT_EQ(c->watch_progress_notify_interval, absl::Seconds(5));
  // Every flag kubeadm sets has its effect (the initial corruption check
  // compares the members' hashes before serving).
  EXPECT_TRUE(c->feature_gates.Enabled(kInitialCorruptCheckGate));
  EXPECT_THAT(c->ignored_flags, IsEmpty());
}

TEST(ServerConfigTest, IgnoredFlagsAreListedInTableOrder) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--listen-peer-urls=http://10.0.0.1:2380", "--snapshot-count=5", "--pre-vote=false",
             "--peer-cert-file=/p", "--force-new-cluster", "--v", "--max-txn-ops=9",
             "--enable-grpc-gateway=false"},
            {{"ETCD_ENABLE_PPROF", "true"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->ignored_flags,
              ElementsAre("enable-pprof", "v"));
}

// ---------------------------------------------------------------------------
// ServerConfig and ConfigFailure
// ---------------------------------------------------------------------------

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

TEST(ServerConfigTest, GetConfigFailureOfOtherStatus) {
  ConfigFailure f = GetConfigFailure(absl::InternalError("x"));
  EXPECT_EQ(f.exit_code, 1);
  EXPECT_FALSE(f.print_usage);
}

}  // namespace
}  // namespace capstan::server
