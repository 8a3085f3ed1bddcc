// Structured logs like etcd 3.5's: one JSON object per line with "level"
// (zap's names: debug, info, warn, error, fatal), "ts" (UTC, RFC 3339 with
// microseconds), "caller" (source file:line, relative to the checkout, as
// etcd's "etcdserver/server.go:2063") and "msg", in that order, written with
// spdlog to the --log-outputs (default: stderr) and flushed line by line.
// Log with the SPDLOG_* macros: they pass the caller's location.

#ifndef CAPSTAN_SERVER_OBSERVABILITY_LOGGING_H_
#define CAPSTAN_SERVER_OBSERVABILITY_LOGGING_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/config/config.h"

namespace capstan::server {

// Installs the default logger. Call once, before other threads log.
absl::Status InitLogging(LogLevel level, const std::vector<std::string>& outputs);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_OBSERVABILITY_LOGGING_H_
