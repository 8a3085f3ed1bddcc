// Structured logs like etcd 3.5's: one JSON object per line with level,
// timestamp (UTC, RFC 3339 with milliseconds) and message, written with
// spdlog to the --log-outputs (default: stderr).

#ifndef CAPSTAN_SERVER_LOGGING_H_
#define CAPSTAN_SERVER_LOGGING_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/config.h"

namespace capstan::server {

// Installs the default logger. Call once, before other threads log.
absl::Status InitLogging(LogLevel level, const std::vector<std::string>& outputs);

// Escapes text for use inside a JSON string.
std::string JsonEscape(std::string_view text);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_LOGGING_H_
