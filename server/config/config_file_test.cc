#include "server/config/config_file.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config/config.h"

namespace capstan::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Pair;

TEST(YamlSubsetTest, ScalarsQuotesCommentsNull) {
  auto doc = ParseYamlSubset(
      "# etcd.conf.yml\n"
      "---\n"
      "name: 'default' # trailing comment\n"
      "data-dir: \"/var/lib/etcd\"\n"
      "wal-dir:\n"
      "quoted: 'it''s # not a comment'\n"
      "escaped: \"a\\tb\\\"c\"\n"
      "plain: http://127.0.0.1:2379#frag\n"
      "tilde: ~\n");
  ASSERT_TRUE(doc.ok()) << doc.status();
  ASSERT_EQ(doc->entries.size(), 7u);
  EXPECT_EQ(doc->entries[0].first, "name");
  EXPECT_EQ(doc->entries[0].second.scalar, "default");
  EXPECT_TRUE(doc->entries[0].second.quoted);
  EXPECT_EQ(doc->entries[1].second.scalar, "/var/lib/etcd");
  EXPECT_EQ(doc->entries[2].second.kind, YamlNode::Kind::kNull);
  EXPECT_EQ(doc->entries[3].second.scalar, "it's # not a comment");
  EXPECT_EQ(doc->entries[4].second.scalar, "a\tb\"c");
  EXPECT_EQ(doc->entries[5].second.scalar, "http://127.0.0.1:2379#frag");
  EXPECT_FALSE(doc->entries[5].second.quoted);
  EXPECT_EQ(doc->entries[6].second.kind, YamlNode::Kind::kNull);
}

TEST(YamlSubsetTest, ListsAndNestedMaps) {
  auto doc = ParseYamlSubset(
      "log-outputs: [stderr, 'default']\n"
      "cipher-suites:\n"
      "  - TLS_A\n"
      "  - 'TLS_B'\n"
      "same-indent-list:\n"
      "- x\n"
      "client-transport-security:\n"
      "  cert-file: /c.crt\n"
      "  client-cert-auth: true\n"
      "\n"
      "  # comment inside\n"
      "  trusted-ca-file:\n"
      "empty: []\n");
  ASSERT_TRUE(doc.ok()) << doc.status();
  ASSERT_EQ(doc->entries.size(), 5u);
  EXPECT_THAT(doc->entries[0].second.list, ElementsAre("stderr", "default"));
  EXPECT_THAT(doc->entries[1].second.list, ElementsAre("TLS_A", "TLS_B"));
  EXPECT_THAT(doc->entries[2].second.list, ElementsAre("x"));
  const YamlNode& tls = doc->entries[3].second;
  ASSERT_EQ(tls.kind, YamlNode::Kind::kMap);
  ASSERT_EQ(tls.entries.size(), 3u);
  EXPECT_EQ(tls.entries[1].first, "client-cert-auth");
  EXPECT_EQ(tls.entries[1].second.scalar, "true");
  EXPECT_EQ(tls.entries[2].second.kind, YamlNode::Kind::kNull);
  EXPECT_EQ(doc->entries[4].second.kind, YamlNode::Kind::kList);
  EXPECT_TRUE(doc->entries[4].second.list.empty());
}

TEST(YamlSubsetTest, ErrorsNameTheLine) {
  struct Case {
    const char* text;
    const char* error;
  };
  for (const Case& c : {
           Case{"name: [x\n", "yaml: line 1: did not find expected ',' or ']'"},
           Case{"name: x\nnot a mapping\n", "yaml: line 2: could not find expected ':'"},
           Case{"a: 1\na: 2\n", "yaml: line 2: key \"a\" already set in map"},
           Case{"name: 'open\n", "yaml: line 1: found unexpected end of stream"},
           Case{"\tname: x\n", "yaml: line 1: found character that cannot start any token"},
           Case{"a:\n  b:\n    c: 1\n", "yaml: line 3: mappings nested more than one level"},
           Case{"a: &anchor x\n", "yaml: line 1: '&'"},
           Case{"a: |\n  text\n", "yaml: line 1: '|'"},
       }) {
    auto doc = ParseYamlSubset(c.text);
    ASSERT_FALSE(doc.ok()) << c.text;
    EXPECT_THAT(std::string(doc.status().message()), HasSubstr(c.error)) << c.text;
  }
}

TEST(ConfigFileSettingsTest, FlagsFromKeys) {
  auto settings = ConfigFileSettings(
      "name: n1\n"
      "log-outputs: [stderr, default]\n"
      "enable-v2: yes\n"
      "strict-reconfig-check: 'no'\n"
      "grpc-keepalive-min-time: 7000000000\n"
      "grpc-keepalive-interval: 1m30s\n"
      "wal-dir:\n"
      "client-transport-security:\n"
      "  cert-file: /c.crt\n"
      "peer-transport-security:\n"
      "  client-cert-auth: true\n");
  ASSERT_TRUE(settings.ok()) << settings.status();
  EXPECT_THAT(*settings,
              ElementsAre(Pair("name", "n1"), Pair("log-outputs", "stderr,default"),
                          Pair("enable-v2", "true"), Pair("strict-reconfig-check", "no"),
                          Pair("grpc-keepalive-min-time", "7s"),
                          Pair("grpc-keepalive-interval", "1m30s"), Pair("cert-file", "/c.crt"),
                          Pair("peer-client-cert-auth", "true")));
}

// ParseServerConfig with --config-file, as etcd's configFromFile.
class ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/capstan-config-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/etcd.yaml";
  }
  void TearDown() override {
    std::remove(path_.c_str());
    rmdir(dir_.c_str());
  }
  void Write(const std::string& text) { std::ofstream(path_) << text; }

  std::string dir_;
  std::string path_;
};

TEST_F(ConfigFileTest, KeysSetFlagsOthersIgnored) {
  Write(
      "name: 'from-file'\n"
      "data-dir: /var/lib/capstan-test\n"
      "listen-client-urls: http://127.0.0.1:12379\n"
      "advertise-client-urls: http://127.0.0.1:12379\n"
      "listen-peer-urls: http://127.0.0.1:12380\n"
      "initial-advertise-peer-urls: http://127.0.0.1:12380\n"
      "initial-cluster: from-file=http://127.0.0.1:12380\n"
      "quota-backend-bytes: 123456789\n"
      "auto-compaction-mode: revision\n"
      "auto-compaction-retention: \"1000\"\n"
      "log-outputs: [stderr]\n"
      "grpc-keepalive-min-time: 7000000000\n"
      "peer-transport-security:\n"
      "  cert-file: /p.crt\n"
      "  client-cert-auth: true\n"
      "no-such-key: 5\n"
      "another-unknown:\n"
      "  nested: 1\n");
  auto c = ParseServerConfig({"--config-file", path_, "--name", "from-flag"},
                             {{"ETCD_QUOTA_BACKEND_BYTES", "5"}, {"ETCD_DATA_DIR", "/env"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "from-file");
  EXPECT_EQ(c->data_dir, "/var/lib/capstan-test");
  ASSERT_EQ(c->listen_client_urls.size(), 1u);
  EXPECT_EQ(c->listen_client_urls[0].String(), "http://127.0.0.1:12379");
  EXPECT_EQ(c->quota_backend_bytes, 123456789);
  EXPECT_EQ(c->auto_compaction_mode, CompactionMode::kRevision);
  EXPECT_EQ(c->auto_compaction_revisions, 1000);
  EXPECT_THAT(c->log_outputs, ElementsAre("stderr"));
  EXPECT_EQ(c->grpc_keepalive_min_time, absl::Seconds(7));
  EXPECT_EQ(c->peer_cert_file, "/p.crt");
  EXPECT_TRUE(c->peer_client_cert_auth);
  EXPECT_TRUE(c->used_env_vars.empty());
  EXPECT_THAT(c->warnings, ::testing::Contains(HasSubstr("other configuration command line flags "
                                                          "and environment variables are ignored")));
}

TEST_F(ConfigFileTest, EnvNamesTheFileAndDefaultsStay) {
  // ETCD_CONFIG_FILE works like the flag; absent keys keep etcd's defaults,
  // including the advertise URL (no "advertise-client-urls must be set" as
  // with flags).
  Write("listen-client-urls: http://127.0.0.1:12379\nmax-txn-ops: 64\n");
  auto c = ParseServerConfig({}, {{"ETCD_CONFIG_FILE", path_}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "default");
  EXPECT_EQ(c->data_dir, "default.capstan");
  EXPECT_EQ(c->max_txn_ops, 64u);
  EXPECT_EQ(c->quota_backend_bytes, 0);
  ASSERT_EQ(c->advertise_client_urls.size(), 1u);
  EXPECT_EQ(c->advertise_client_urls[0].String(), "http://localhost:2379");
}

// etcd's own etcd.conf.yml.sample, as shipped with etcd 3.4/3.5.
constexpr char kEtcdSample[] = R"yaml(# This is the configuration file for the etcd server.

# Human-readable name for this member.
name: 'default'

# Path to the data directory.
data-dir:

# Path to the dedicated wal directory.
wal-dir:

# Number of committed transactions to trigger a snapshot to disk.
snapshot-count: 10000

# Time (in milliseconds) of a heartbeat interval.
heartbeat-interval: 100

# Time (in milliseconds) for an election to timeout.
election-timeout: 1000

# Raise alarms when backend size exceeds the given quota. 0 means use the
# default quota.
quota-backend-bytes: 0

# List of comma separated URLs to listen on for peer traffic.
listen-peer-urls: http://localhost:2380

# List of comma separated URLs to listen on for client traffic.
listen-client-urls: http://localhost:2379

# Maximum number of snapshot files to retain (0 is unlimited).
max-snapshots: 5

# Maximum number of wal files to retain (0 is unlimited).
max-wals: 5

# Comma-separated white list of origins for CORS (cross-origin resource sharing).
cors:

# List of this member's peer URLs to advertise to the rest of the cluster.
# The URLs needed to be a comma-separated list.
initial-advertise-peer-urls: http://localhost:2380

# List of this member's client URLs to advertise to the public.
# The URLs needed to be a comma-separated list.
advertise-client-urls: http://localhost:2379

# Discovery URL used to bootstrap the cluster.
discovery:

# Valid values include 'exit', 'proxy'
discovery-fallback: 'proxy'

# HTTP proxy to use for traffic to discovery service.
discovery-proxy:

# DNS domain used to bootstrap initial cluster.
discovery-srv:

# Initial cluster configuration for bootstrapping.
initial-cluster:

# Initial cluster token for the etcd cluster during bootstrap.
initial-cluster-token: 'etcd-cluster'

# Initial cluster state ('new' or 'existing').
initial-cluster-state: 'new'

# Reject reconfiguration requests that would cause quorum loss.
strict-reconfig-check: false

# Accept etcd V2 client requests
enable-v2: true

# Enable runtime profiling data via HTTP server
enable-pprof: true

# Valid values include 'on', 'readonly', 'off'
proxy: 'off'

# Time (in milliseconds) an endpoint will be held in a failed state.
proxy-failure-wait: 5000

# Time (in milliseconds) of the endpoints refresh interval.
proxy-refresh-interval: 30000

# Time (in milliseconds) for a dial to timeout.
proxy-dial-timeout: 1000

# Time (in milliseconds) for a write to timeout.
proxy-write-timeout: 5000

# Time (in milliseconds) for a read to timeout.
proxy-read-timeout: 0

client-transport-security:
  # Path to the client server TLS cert file.
  cert-file:

  # Path to the client server TLS key file.
  key-file:

  # Enable client cert authentication.
  client-cert-auth: false

  # Path to the client server TLS trusted CA cert file.
  trusted-ca-file:

  # Client TLS using generated certificates
  auto-tls: false

peer-transport-security:
  # Path to the peer server TLS cert file.
  cert-file:

  # Path to the peer server TLS key file.
  key-file:

  # Enable peer client cert authentication.
  client-cert-auth: false

  # Path to the peer server TLS trusted CA cert file.
  trusted-ca-file:

  # Peer TLS using generated certificates.
  auto-tls: false

# Enable debug-level logging for etcd.
debug: false

logger: zap

# Specify 'stdout' or 'stderr' to skip journald logging even when running under systemd.
log-outputs: [stderr]

# Force to create a new one member cluster.
force-new-cluster: false

auto-compaction-mode: periodic
auto-compaction-retention: "1"
)yaml";

TEST_F(ConfigFileTest, EtcdsSampleFile) {
  Write(kEtcdSample);
  auto c = ParseServerConfig({"--config-file", path_}, {});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->name, "default");
  EXPECT_EQ(c->data_dir, "default.capstan");  // data-dir: null keeps the default
  ASSERT_EQ(c->listen_client_urls.size(), 1u);
  EXPECT_EQ(c->listen_client_urls[0].String(), "http://localhost:2379");
  EXPECT_EQ(c->auto_compaction_mode, CompactionMode::kPeriodic);
  EXPECT_EQ(c->auto_compaction_period, absl::Hours(1));
  EXPECT_THAT(c->log_outputs, ElementsAre("stderr"));
  EXPECT_FALSE(c->client_cert_auth);
  EXPECT_TRUE(c->cert_file.empty());
}

TEST_F(ConfigFileTest, ErrorsAsEtcd) {
  auto missing = ParseServerConfig({"--config-file", dir_ + "/none.yaml"}, {});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().message(), "open " + dir_ + "/none.yaml: no such file or directory");
  EXPECT_EQ(GetConfigFailure(missing.status()).exit_code, 1);

  Write("name: [x\n");
  auto syntax = ParseServerConfig({"--config-file", path_}, {});
  ASSERT_FALSE(syntax.ok());
  EXPECT_EQ(syntax.status().message(),
            "error converting YAML to JSON: yaml: line 1: did not find expected ',' or ']'");

  Write("listen-client-urls: foo\n");
  auto url = ParseServerConfig({"--config-file", path_}, {});
  ASSERT_FALSE(url.ok());
  EXPECT_EQ(url.status().message(),
            "unexpected error setting up listen-client-urls: URL scheme must be http, https, "
            "unix, or unixs: foo");

  Write("quota-backend-bytes: abc\n");
  auto bad = ParseServerConfig({"--config-file", path_}, {});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("quota-backend-bytes"));
  EXPECT_EQ(GetConfigFailure(bad.status()).exit_code, 1);
}

}  // namespace
}  // namespace capstan::server
