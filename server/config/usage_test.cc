// --help's text and the short usage (usage.cc).

#include "server/config/config.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace capstan::server {
namespace {

using ::testing::HasSubstr;

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

}  // namespace
}  // namespace capstan::server
