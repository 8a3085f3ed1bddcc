// The flags etcd 3.6 added or renamed, and --feature-gates, through
// ParseServerConfig: command line, ETCD_* variables and --config-file.
//
// etcd 3.5.16 (the differential reference) refuses all of these flags, so
// the expected texts come from etcd's source, v3.6.x:
//   server/etcdmain/config.go   deprecatedFlags, parseWarningUnaryRequestDuration
//   server/embed/config.go      experimentalFlagMigrationMap, Validate,
//                               SetFeatureGatesFromExperimentalFlags
//   pkg/featuregate/feature_gate.go   Set / SetFromMap errors
//   pkg/flags/flag.go           SetFlagsFromEnv's "invalid value %q for %s: %w"
// wrapped as Go's flag package wraps a Value's error on the command line.

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config/config.h"
#include "server/config/config_testing.h"
#include "server/config/flags.h"
#include "util/go_text.h"

namespace capstan::server {
namespace {

using config_testing::Env;
using config_testing::ExpectUsageError;
using config_testing::ExpectVerifyError;
using config_testing::Parse;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Not;

bool HasWarning(const ServerConfig& c, const std::string& w) {
  return std::find(c.warnings.begin(), c.warnings.end(), w) != c.warnings.end();
}

// The command line kubeadm 1.34+ writes (cmd/kubeadm/app/phases/etcd/local.go),
// paths and addresses aside.
TEST(Etcd36FlagsTest, KubeadmCommandLineIsAccepted) {
  auto c = Parse({"--advertise-client-urls=https://10.0.0.1:2379",
                  "--cert-file=/etc/kubernetes/pki/etcd/server.crt", "--client-cert-auth=true",
                  "--data-dir=/var/lib/etcd", "--feature-gates=InitialCorruptCheck=true",
                  "--initial-advertise-peer-urls=https://10.0.0.1:2380",
                  "--initial-cluster=node1=https://10.0.0.1:2380",
                  "--key-file=/etc/kubernetes/pki/etcd/server.key",
                  "--listen-client-urls=https://127.0.0.1:2379,https://10.0.0.1:2379",
                  "--listen-metrics-urls=http://127.0.0.1:2381",
                  "--listen-peer-urls=https://10.0.0.1:2380", "--name=node1",
                  "--peer-cert-file=/etc/kubernetes/pki/etcd/peer.crt",
                  "--peer-client-cert-auth=true", "--peer-key-file=/etc/kubernetes/pki/etcd/peer.key",
                  "--peer-trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt", "--snapshot-count=10000",
                  "--trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt",
                  "--watch-progress-notify-interval=5s"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->feature_gates.Enabled(kInitialCorruptCheckGate));
  EXPECT_EQ(c->watch_progress_notify_interval, absl::Seconds(5));
  // Honored: not logged as having no effect.
  EXPECT_THAT(c->ignored_feature_gates, IsEmpty());
  for (const std::string& w : c->warnings) {
    EXPECT_EQ(w.find("deprecated"), std::string::npos) << w;
  }
}

// Each renamed flag: the new name, the old name (with etcd 3.6's warning),
// and both (refused by embed.Config.Validate).
TEST(Etcd36FlagsTest, RenamedFlagsOldNewAndBoth) {
  struct Case {
    std::string name;   // new name
    std::string value;  // a value other than the default
    std::string warning;
    std::function<std::string(const ServerConfig&)> get;
  };
  auto dur = [](absl::Duration d) { return gotext::FormatGoDuration(d); };
  const std::vector<Case> cases = {
      {"corrupt-check-time", "3s",
       "--experimental-corrupt-check-time is deprecated in v3.6 and will be decommissioned in "
       "v3.7. Use '--corrupt-check-time' instead.",
       [&](const ServerConfig& c) { return dur(c.corrupt_check_time); }},
      {"compact-hash-check-time", "2m0s",
       "--experimental-compact-hash-check-time is deprecated in 3.6 and will be decommissioned "
       "in 3.7. Use '--compact-hash-check-time' instead.",
       [&](const ServerConfig& c) { return dur(c.compact_hash_check_time); }},
      {"compaction-batch-limit", "77",
       "--experimental-compaction-batch-limit is deprecated in v3.6 and will be decommissioned "
       "in v3.7. Use '--compaction-batch-limit' instead.",
       [](const ServerConfig& c) { return std::to_string(c.compaction_batch_limit); }},
      {"compaction-sleep-interval", "20ms",
       "--experimental-compaction-sleep-interval is deprecated in v3.6 and will be "
       "decommissioned in v3.7. Use 'compaction-sleep-interval' instead.",
       [&](const ServerConfig& c) { return dur(c.compaction_sleep_interval); }},
      {"watch-progress-notify-interval", "5s",
       "--experimental-watch-progress-notify-interval is deprecated in v3.6 and will be "
       "decommissioned in v3.7. Use '--watch-progress-notify-interval' instead.",
       [&](const ServerConfig& c) { return dur(c.watch_progress_notify_interval); }},
      {"downgrade-check-time", "9s",
       "--experimental-downgrade-check-time is deprecated in v3.6 and will be decommissioned "
       "in v3.7. Use '--downgrade-check-time' instead.",
       [&](const ServerConfig& c) { return dur(c.downgrade_check_time); }},
      {"warning-apply-duration", "1s",
       "--experimental-warning-apply-duration is deprecated in v3.6 and will be decommissioned "
       "in v3.7. Use '--warning-apply-duration' instead.",
       [&](const ServerConfig& c) { return dur(c.warning_apply_duration); }},
      {"bootstrap-defrag-threshold-megabytes", "12",
       "--experimental-bootstrap-defrag-threshold-megabytes is deprecated in v3.6 and will be "
       "decommissioned in v3.7. Use '--bootstrap-defrag-threshold-megabytes' instead.",
       [](const ServerConfig& c) { return std::to_string(c.bootstrap_defrag_threshold_megabytes); }},
      {"memory-mlock", "true",
       "--experimental-memory-mlock is deprecated in v3.6 and will be decommissioned in v3.7. "
       "Use '--memory-mlock' instead.",
       [](const ServerConfig& c) { return std::string(c.memory_mlock ? "true" : "false"); }},
      {"snapshot-catchup-entries", "42",
       "--experimental-snapshot-catchup-entries is deprecated in v3.6 and will be "
       "decommissioned in v3.7. Use '--snapshot-catchup-entries' instead.",
       [](const ServerConfig& c) { return std::to_string(c.snapshot_catchup_entries); }},
      {"peer-skip-client-san-verification", "true", "",  // 3.6 does not warn about this one
       [](const ServerConfig& c) {
         return std::string(c.peer_skip_client_san_verification ? "true" : "false");
       }},
      {"enable-distributed-tracing", "true",
       "--experimental-enable-distributed-tracing is deprecated in 3.6 and will be "
       "decommissioned in 3.7. Use --enable-distributed-tracing instead.",
       [](const ServerConfig& c) { return std::string(c.enable_distributed_tracing ? "true" : "false"); }},
      {"distributed-tracing-address", "collector:4317",
       "--experimental-distributed-tracing-address is deprecated in 3.6 and will be "
       "decommissioned in 3.7. Use --distributed-tracing-address instead.",
       [](const ServerConfig& c) { return c.distributed_tracing_address; }},
      {"distributed-tracing-service-name", "capstan",
       "--experimental-distributed-tracing-service-name is deprecated in 3.6 and will be "
       "decommissioned in 3.7. Use --distributed-tracing-service-name instead.",
       [](const ServerConfig& c) { return c.distributed_tracing_service_name; }},
      {"distributed-tracing-instance-id", "i-1",
       "--experimental-distributed-tracing-instance-id is deprecated in 3.6 and will be "
       "decommissioned in 3.7. Use --distributed-tracing-instance-id instead.",
       [](const ServerConfig& c) { return c.distributed_tracing_instance_id; }},
      {"distributed-tracing-sampling-rate", "100",
       "--experimental-distributed-tracing-sampling-rate is deprecated in 3.6 and will be "
       "decommissioned in 3.7. Use --distributed-tracing-sampling-rate instead.",
       [](const ServerConfig& c) { return std::to_string(c.distributed_tracing_sampling_rate); }},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    const std::string old_name = "experimental-" + k.name;
    auto by_new = Parse({absl::StrCat("--", k.name, "=", k.value)});
    ASSERT_TRUE(by_new.ok()) << by_new.status();
    EXPECT_EQ(k.get(*by_new), k.value);
    for (const std::string& w : by_new->warnings) EXPECT_EQ(w.find("deprecated"), std::string::npos) << w;

    auto by_old = Parse({absl::StrCat("--", old_name, "=", k.value)});
    ASSERT_TRUE(by_old.ok()) << by_old.status();
    EXPECT_EQ(k.get(*by_old), k.value);
    if (!k.warning.empty()) EXPECT_TRUE(HasWarning(*by_old, k.warning));

    // The environment names both too.
    Env env = {{config_internal::FlagToEnv(k.name), k.value}};
    auto by_env = Parse({}, env);
    ASSERT_TRUE(by_env.ok()) << by_env.status();
    EXPECT_EQ(k.get(*by_env), k.value);

    const std::string both = absl::StrCat("cannot set --", old_name, " and --", k.name,
                                          " at the same time, please use --", k.name, " only");
    ExpectVerifyError(Parse({absl::StrCat("--", old_name, "=", k.value),
                             absl::StrCat("--", k.name, "=", k.value)}),
                      both);
    // A flag and the other name's variable are both set too.
    ExpectVerifyError(Parse({absl::StrCat("--", old_name, "=", k.value)}, env), both);
  }
}

TEST(Etcd36FlagsTest, NewFlagsWithoutOldNames) {
  auto c = Parse({"--log-format=console", "--max-learners=3", "--raft-read-timeout=7s",
                  "--raft-write-timeout=8s", "--discovery-dial-timeout=1s",
                  "--discovery-insecure-transport=false", "--warning-unary-request-duration=1s"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->log_format, "console");
  EXPECT_EQ(c->max_learners, 3);
  EXPECT_EQ(c->raft_read_timeout, absl::Seconds(7));
  EXPECT_EQ(c->raft_write_timeout, absl::Seconds(8));
  EXPECT_EQ(c->discovery_dial_timeout, absl::Seconds(1));
  EXPECT_FALSE(c->discovery_insecure_transport);
  EXPECT_EQ(c->warning_unary_request_duration, absl::Seconds(1));
  EXPECT_THAT(c->ignored_flags, Contains("log-format"));
  EXPECT_THAT(c->ignored_flags, Not(Contains("max-learners")));

  // Defaults.
  auto d = Parse({});
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->log_format, "json");
  EXPECT_EQ(d->max_learners, 1);
  EXPECT_EQ(d->warning_unary_request_duration, absl::Milliseconds(300));
  EXPECT_EQ(d->watch_progress_notify_interval, absl::Minutes(10));
  EXPECT_EQ(d->compaction_batch_limit, 1000);
  EXPECT_EQ(d->compact_hash_check_time, absl::Minutes(1));
  EXPECT_THAT(d->ignored_feature_gates, IsEmpty());

  // server/embed/config_logging.go via logutil.ConvertToZapFormat.
  ExpectVerifyError(Parse({"--log-format=text"}),
                    "unknown log format: text, supported values json, console");
  // Go's flag package.
  ExpectUsageError(Parse({"--max-learners=x"}), "invalid value \"x\" for flag -max-learners: parse error");
  ExpectUsageError(Parse({"--watch-progress-notify-interval=5"}),
                   "invalid value \"5\" for flag -watch-progress-notify-interval: parse error");
  // embed.Config.Validate.
  ExpectVerifyError(Parse({"--compact-hash-check-time=0s"}),
                    "--compact-hash-check-time must be >0 (set to 0s)");
  ExpectVerifyError(Parse({"--experimental-compact-hash-check-time=0s"}),
                    "--experimental-compact-hash-check-time must be >0 (set to 0s)");
}

// etcdmain's parseWarningUnaryRequestDuration.
TEST(Etcd36FlagsTest, WarningUnaryRequestDuration) {
  auto old_only = Parse({"--experimental-warning-unary-request-duration=2s"});
  ASSERT_TRUE(old_only.ok()) << old_only.status();
  EXPECT_EQ(old_only->warning_unary_request_duration, absl::Seconds(2));
  EXPECT_TRUE(HasWarning(*old_only,
                         "--experimental-warning-unary-request-duration is deprecated, and will be "
                         "decommissioned in v3.7. Use --warning-unary-request-duration instead."));
  // Zero is "unset" for both: the other one decides.
  auto zero_new = Parse({"--experimental-warning-unary-request-duration=2s",
                         "--warning-unary-request-duration=0s"});
  ASSERT_TRUE(zero_new.ok()) << zero_new.status();
  EXPECT_EQ(zero_new->warning_unary_request_duration, absl::Seconds(2));
  auto zero_both = Parse({"--experimental-warning-unary-request-duration=0s",
                          "--warning-unary-request-duration=0s"});
  ASSERT_TRUE(zero_both.ok()) << zero_both.status();
  EXPECT_EQ(zero_both->warning_unary_request_duration, absl::Milliseconds(300));
  ExpectVerifyError(Parse({"--experimental-warning-unary-request-duration=2s",
                           "--warning-unary-request-duration=1s"}),
                    "both --experimental-warning-unary-request-duration and "
                    "--warning-unary-request-duration flags are set. Use only "
                    "--warning-unary-request-duration");
}

TEST(Etcd36FlagsTest, FeatureGatesFlagSyntaxRepeatsAndErrors) {
  auto c = Parse({"--feature-gates=InitialCorruptCheck=true,CompactHashCheck=true",
                  "--feature-gates", "CompactHashCheck=false,FastLeaseKeepAlive=false"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->feature_gates.Enabled(kInitialCorruptCheckGate));
  EXPECT_FALSE(c->feature_gates.Enabled(kCompactHashCheckGate));
  EXPECT_FALSE(c->feature_gates.Enabled(kFastLeaseKeepAliveGate));
  EXPECT_TRUE(c->feature_gates.Enabled(kTxnModeWriteWithSharedBufferGate));
  EXPECT_THAT(c->ignored_feature_gates,
              ElementsAre("CompactHashCheck=false", "FastLeaseKeepAlive=false"));
  EXPECT_THAT(c->explicitly_set, Contains("feature-gates"));

  ExpectUsageError(Parse({"--feature-gates=Bogus=true"}),
                   "invalid value \"Bogus=true\" for flag -feature-gates: unrecognized feature "
                   "gate: Bogus");
  ExpectUsageError(Parse({"--feature-gates=InitialCorruptCheck"}),
                   "invalid value \"InitialCorruptCheck\" for flag -feature-gates: missing bool "
                   "value for InitialCorruptCheck");
  ExpectUsageError(Parse({"--feature-gates=InitialCorruptCheck=on"}),
                   "invalid value \"InitialCorruptCheck=on\" for flag -feature-gates: invalid value "
                   "of InitialCorruptCheck=on, err: strconv.ParseBool: parsing \"on\": invalid "
                   "syntax");
  ExpectUsageError(Parse({"--feature-gates"}), "flag needs an argument: -feature-gates");
}

TEST(Etcd36FlagsTest, FeatureGatesFromEnvironment) {
  auto c = Parse({}, {{"ETCD_FEATURE_GATES", "StopGRPCServiceOnDefrag=true"}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->feature_gates.Enabled(kStopGrpcServiceOnDefragGate));
  EXPECT_THAT(c->used_env_vars, Contains("ETCD_FEATURE_GATES=StopGRPCServiceOnDefrag=true"));
  ExpectVerifyError(Parse({}, {{"ETCD_FEATURE_GATES", "Nope=true"}}),
                    "invalid value \"Nope=true\" for ETCD_FEATURE_GATES: unrecognized feature gate: "
                    "Nope");
  ExpectVerifyError(Parse({"--feature-gates=AllAlpha=true"}, {{"ETCD_FEATURE_GATES", "AllBeta=true"}}),
                    "conflicting environment variable \"ETCD_FEATURE_GATES\" is shadowed by "
                    "corresponding command-line flag (either unset environment variable or disable "
                    "flag)");
}

// embed.SetFeatureGatesFromExperimentalFlags.
TEST(Etcd36FlagsTest, ExperimentalFlagsSetTheirGates) {
  auto c = Parse({"--experimental-initial-corrupt-check", "--experimental-compact-hash-check-enabled",
                  "--experimental-txn-mode-write-with-shared-buffer=false",
                  "--experimental-stop-grpc-service-on-defrag=true",
                  "--experimental-enable-lease-checkpoint", "--experimental-enable-lease-checkpoint-persist"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->feature_gates.Enabled(kInitialCorruptCheckGate));
  EXPECT_TRUE(c->feature_gates.Enabled(kCompactHashCheckGate));
  EXPECT_FALSE(c->feature_gates.Enabled(kTxnModeWriteWithSharedBufferGate));
  EXPECT_TRUE(c->feature_gates.Enabled(kStopGrpcServiceOnDefragGate));
  EXPECT_TRUE(c->feature_gates.Enabled(kLeaseCheckpointGate));
  EXPECT_TRUE(c->feature_gates.Enabled(kLeaseCheckpointPersistGate));
  EXPECT_TRUE(HasWarning(*c, "--experimental-compact-hash-check-enabled is deprecated in 3.6 and "
                             "will be decommissioned in 3.7. Use "
                             "'--feature-gates=CompactHashCheck=true' instead."));
  EXPECT_TRUE(HasWarning(*c, "--experimental-txn-mode-write-with-shared-buffer is deprecated in "
                             "v3.6 and will be decommissioned in v3.7. Use "
                             "'--feature-gates=TxnModeWriteWithSharedBuffer=true' instead."));

  // From the environment as well.
  auto e = Parse({}, {{"ETCD_EXPERIMENTAL_INITIAL_CORRUPT_CHECK", "true"}});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->feature_gates.Enabled(kInitialCorruptCheckGate));

  // The flag and --feature-gates naming the same gate: refused, with the
  // gate's value from --feature-gates.
  ExpectVerifyError(Parse({"--experimental-initial-corrupt-check=true",
                           "--feature-gates=InitialCorruptCheck=false"}),
                    "cannot specify both flags: --experimental-initial-corrupt-check=true and "
                    "--feature-gates=InitialCorruptCheck=false at the same time, please just use "
                    "--feature-gates=InitialCorruptCheck=false");
  // etcd looks for the gate's name in the flag's text: LeaseCheckpoint is in
  // "LeaseCheckpointPersist=true".
  ExpectVerifyError(Parse({"--experimental-enable-lease-checkpoint",
                           "--feature-gates=LeaseCheckpointPersist=true"}),
                    "cannot specify both flags: --experimental-enable-lease-checkpoint=true and "
                    "--feature-gates=LeaseCheckpoint=false at the same time, please just use "
                    "--feature-gates=LeaseCheckpoint=false");
  // ...and AllAlpha names every alpha gate in the flag's String().
  ExpectVerifyError(Parse({"--experimental-initial-corrupt-check", "--feature-gates=AllAlpha=true"}),
                    "cannot specify both flags: --experimental-initial-corrupt-check=true and "
                    "--feature-gates=InitialCorruptCheck=true at the same time, please just use "
                    "--feature-gates=InitialCorruptCheck=true");
  // Other gates do not conflict.
  auto mixed = Parse({"--experimental-initial-corrupt-check", "--feature-gates=CompactHashCheck=true"});
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_TRUE(mixed->feature_gates.Enabled(kInitialCorruptCheckGate));
  EXPECT_TRUE(mixed->feature_gates.Enabled(kCompactHashCheckGate));
}

TEST(Etcd36FlagsTest, LeaseCheckpointPersistNeedsLeaseCheckpoint) {
  // etcd 3.5's text when only the experimental flags are used...
  ExpectVerifyError(Parse({"--experimental-enable-lease-checkpoint-persist"}),
                    "setting experimental-enable-lease-checkpoint-persist requires "
                    "experimental-enable-lease-checkpoint");
  // ...3.6's when the gates are.
  ExpectVerifyError(Parse({"--feature-gates=LeaseCheckpointPersist=true"}),
                    "enabling feature gate LeaseCheckpointPersist requires enabling feature gate "
                    "LeaseCheckpoint");
  auto warned = Parse({"--feature-gates=LeaseCheckpoint=true"});
  ASSERT_TRUE(warned.ok()) << warned.status();
  EXPECT_TRUE(HasWarning(*warned,
                         "Detected that checkpointing is enabled without persistence. Consider "
                         "enabling feature gate LeaseCheckpointPersist"));
  auto both = Parse({"--feature-gates=LeaseCheckpoint=true,LeaseCheckpointPersist=true"});
  ASSERT_TRUE(both.ok()) << both.status();
}

TEST(Etcd36FlagsTest, HelpListsTheNewFlagsAndGates) {
  const std::string usage = UsageText();
  for (const char* line :
       {"  --feature-gates ''\n", "    alpha/experimental features. Options are:\n",
        "    InitialCorruptCheck=true|false (ALPHA - default=false)\n",
        "    TxnModeWriteWithSharedBuffer=true|false (BETA - default=true)\n",
        "    FastLeaseKeepAlive=true|false (BETA - default=true)\n",
        "  --watch-progress-notify-interval '10m'\n", "  --compaction-batch-limit 1000\n",
        "  --corrupt-check-time '0s'\n", "  --compact-hash-check-time '1m'\n",
        "  --memory-mlock 'false'\n", "  --discovery-endpoints ''\n", "  --log-format 'json'\n",
        "  --warning-unary-request-duration '300ms'\n", "  --max-learners '1'\n",
        "  --raft-read-timeout '5s'\n", "  --enable-distributed-tracing 'false'\n",
        "  --peer-skip-client-san-verification 'false'\n"}) {
    EXPECT_NE(usage.find(line), std::string::npos) << line;
  }
}

// --config-file: the same keys (embed's configYAML), feature-gates as text.
class Etcd36ConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/capstan-config36-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/etcd.yaml";
  }
  void TearDown() override {
    std::remove(path_.c_str());
    rmdir(dir_.c_str());
  }
  absl::StatusOr<ServerConfig> ParseFile(const std::string& text) {
    std::ofstream(path_) << text;
    return Parse({"--config-file=" + path_});
  }
  std::string dir_;
  std::string path_;
};

TEST_F(Etcd36ConfigFileTest, NewKeysAndFeatureGates) {
  auto c = ParseFile(
      "name: n1\n"
      "feature-gates: InitialCorruptCheck=true,StopGRPCServiceOnDefrag=true\n"
      "watch-progress-notify-interval: 5s\n"
      "compaction-batch-limit: 50\n"
      "compaction-sleep-interval: 20000000\n"  // a JSON number is nanoseconds
      "experimental-snapshot-catch-up-entries: 7\n"
      "log-format: console\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->feature_gates.Enabled(kInitialCorruptCheckGate));
  EXPECT_TRUE(c->feature_gates.Enabled(kStopGrpcServiceOnDefragGate));
  EXPECT_EQ(c->watch_progress_notify_interval, absl::Seconds(5));
  EXPECT_EQ(c->compaction_batch_limit, 50);
  EXPECT_EQ(c->compaction_sleep_interval, absl::Milliseconds(20));
  EXPECT_EQ(c->snapshot_catchup_entries, 7u);
  EXPECT_EQ(c->log_format, "console");

  auto old = ParseFile(
      "experimental-watch-progress-notify-interval: 6s\n"
      "experimental-initial-corrupt-check: true\n");
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(old->watch_progress_notify_interval, absl::Seconds(6));
  EXPECT_TRUE(old->feature_gates.Enabled(kInitialCorruptCheckGate));
  EXPECT_TRUE(HasWarning(*old,
                         "--experimental-watch-progress-notify-interval is deprecated in v3.6 and "
                         "will be decommissioned in v3.7. Use '--watch-progress-notify-interval' "
                         "instead."));
}

TEST_F(Etcd36ConfigFileTest, ErrorsAsEtcd) {
  // featuregate's error as it is: configFromFile returns it unwrapped.
  ExpectVerifyError(ParseFile("feature-gates: Bogus=true\n"), "unrecognized feature gate: Bogus");
  ExpectVerifyError(ParseFile("watch-progress-notify-interval: 5s\n"
                              "experimental-watch-progress-notify-interval: 5s\n"),
                    "cannot set --experimental-watch-progress-notify-interval and "
                    "--watch-progress-notify-interval at the same time, please use "
                    "--watch-progress-notify-interval only");
  // The file's text is searched for the gate's name.
  ExpectVerifyError(ParseFile("feature-gates: InitialCorruptCheck=false\n"
                              "experimental-initial-corrupt-check: true\n"),
                    "cannot specify both flags: --experimental-initial-corrupt-check=true and "
                    "--feature-gates=InitialCorruptCheck=false at the same time, please just use "
                    "--feature-gates=InitialCorruptCheck=false");
  // A config file's unary duration check comes before the other checks.
  ExpectVerifyError(ParseFile("experimental-warning-unary-request-duration: 1s\n"
                              "warning-unary-request-duration: 2s\n"
                              "log-format: text\n"),
                    "both --experimental-warning-unary-request-duration and "
                    "--warning-unary-request-duration flags are set. Use only "
                    "--warning-unary-request-duration");
}

}  // namespace
}  // namespace capstan::server
