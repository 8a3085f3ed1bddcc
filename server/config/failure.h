// How a configuration failure tells the process to end: etcd's exit code
// (and whether Go's flag package would print the usage) travel with the
// status as a payload, read back by GetConfigFailure() (config.h).
//
// Internal to server/config. Thread safety: pure functions.

#ifndef CAPSTAN_SERVER_CONFIG_FAILURE_H_
#define CAPSTAN_SERVER_CONFIG_FAILURE_H_

#include <string>

#include "absl/status/status.h"

namespace capstan::server::config_internal {

// A failure with etcd's exit code; print_usage asks for ShortUsageText()
// after the message.
absl::Status Failure(absl::StatusCode code, int exit_code, bool print_usage, std::string msg);

// A command-line syntax error: Go's flag package prints it with the usage
// and the process exits 2.
absl::Status UsageError(std::string msg);

// A configuration etcd refuses after parsing: logged, exit 1.
absl::Status VerifyError(std::string msg);

// Something etcd would do that Capstan does not: exit 1.
absl::Status RefusalError(std::string msg);

}  // namespace capstan::server::config_internal

#endif  // CAPSTAN_SERVER_CONFIG_FAILURE_H_
