// What the ServerConfig tests share: parsing a command line and expecting
// etcd's failure texts and exit codes. For the *_test.cc files of
// server/config only.

#ifndef CAPSTAN_SERVER_CONFIG_CONFIG_TESTING_H_
#define CAPSTAN_SERVER_CONFIG_CONFIG_TESTING_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "gtest/gtest.h"
#include "server/config/config.h"

namespace capstan::server::config_testing {

using Env = std::map<std::string, std::string>;

inline absl::StatusOr<ServerConfig> Parse(std::vector<std::string> args, Env env = {}) {
  return ParseServerConfig(args, env);
}

// Asserts that parsing fails with exactly `message` and etcd's exit code.
inline void ExpectFailure(const absl::StatusOr<ServerConfig>& result, const std::string& message,
                          int exit_code, bool print_usage) {
  ASSERT_FALSE(result.ok()) << "expected failure: " << message;
  EXPECT_EQ(result.status().message(), message);
  ConfigFailure failure = GetConfigFailure(result.status());
  EXPECT_EQ(failure.exit_code, exit_code) << message;
  EXPECT_EQ(failure.print_usage, print_usage) << message;
}

// A flag syntax error: Go's flag package prints it with the usage, exit 2.
inline void ExpectUsageError(const absl::StatusOr<ServerConfig>& result,
                             const std::string& message) {
  ExpectFailure(result, message, 2, true);
}

// A configuration etcd refuses after parsing: exit 1.
inline void ExpectVerifyError(const absl::StatusOr<ServerConfig>& result,
                              const std::string& message) {
  ExpectFailure(result, message, 1, false);
}

inline std::vector<std::string> UrlStrings(const std::vector<Url>& urls) {
  std::vector<std::string> out;
  for (const Url& u : urls) out.push_back(u.String());
  return out;
}

}  // namespace capstan::server::config_testing

#endif  // CAPSTAN_SERVER_CONFIG_CONFIG_TESTING_H_
