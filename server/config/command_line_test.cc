// The command line as Go's flag package reads it, and the ETCD_* variables
// as etcd's pkg/flags reads them (command_line.h).

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

using ::testing::Contains;
using ::testing::ElementsAre;

using config_testing::ExpectUsageError;
using config_testing::ExpectVerifyError;
using config_testing::Parse;
using config_testing::UrlStrings;

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

TEST(ServerConfigTest, BoolFlagDoesNotTakeTheNextArgument) {
  // Go stops at "false", which then is an argument, not a flag.
  ExpectVerifyError(Parse({"--unsafe-no-fsync", "false"}), "'false' is not a valid flag");
}

TEST(ServerConfigTest, LaterFlagWins) {
  absl::StatusOr<ServerConfig> c = Parse({"--max-txn-ops=5", "--max-txn-ops=7"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->max_txn_ops, 7u);
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
  EXPECT_EQ(c->watch_progress_notify_interval, absl::Seconds(5));
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

}  // namespace
}  // namespace capstan::server
