// How each kind of flag reads its text (flag_values.h): Go's bools,
// integers and durations, etcd's URL lists and selective values.

#include "server/config/config.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/config/config_testing.h"
#include "util/go_text.h"

namespace capstan::server {
namespace {

using ::testing::ElementsAre;

using config_testing::ExpectUsageError;
using config_testing::Parse;
using config_testing::UrlStrings;

// ---------------------------------------------------------------------------
// Bools, integers and selective values
// ---------------------------------------------------------------------------

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
  EXPECT_EQ(c->compaction_sleep_interval, absl::Milliseconds(100));
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

TEST(ServerConfigTest, CorsAndHostWhitelist) {
  absl::StatusOr<ServerConfig> c =
      Parse({"--cors=http://b.example:80,http://a.example:80", "--host-whitelist=b,a,b"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->cors, ElementsAre("http://a.example:80", "http://b.example:80"));
  EXPECT_THAT(c->host_whitelist, ElementsAre("a", "b"));
}

}  // namespace
}  // namespace capstan::server
