// etcd 3.6's renames of the experimental flags, applied as etcd 3.6 applies
// them (server/etcdmain/config.go, server/embed/config.go):
//  - a non-bool --experimental-<x> flag and its new name --<x> set the same
//    setting; setting both is refused ("cannot set --experimental-<x> and
//    --<x> at the same time, please use --<x> only");
//  - the experimental bool flags that became feature gates
//    (--experimental-initial-corrupt-check -> InitialCorruptCheck, ...) set
//    their gate, unless --feature-gates names the gate too, which is refused;
//  - --experimental-warning-unary-request-duration and
//    --warning-unary-request-duration may not both be non-zero;
//  - each deprecated flag that was set is warned about in etcd 3.6's words.
//
// Internal to server/config. Thread safety: pure functions of their
// arguments.

#ifndef CAPSTAN_SERVER_CONFIG_RENAMED_FLAGS_H_
#define CAPSTAN_SERVER_CONFIG_RENAMED_FLAGS_H_

#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "server/config/flags.h"

namespace capstan::server::config_internal {

struct FlagRename {
  absl::string_view old_name;
  absl::string_view new_name;
};
// embed's experimentalFlagMigrationMap.
absl::Span<const FlagRename> RenamedFlags();

struct GateFlagSpec {
  absl::string_view flag;
  absl::string_view gate;
};
// features.ExperimentalFlagToFeatureMap.
absl::Span<const GateFlagSpec> GateFlags();

// etcdmain's deprecatedFlags: the warning for flag, or "" if it is not
// deprecated.
absl::string_view DeprecationWarning(absl::string_view flag);

// embed.SetFeatureGatesFromExperimentalFlags: sets the gate of each
// experimental bool flag that was set, refusing one whose gate name appears
// in gates_text (the --feature-gates value as etcd looks at it: the gates'
// String() for flags and variables, the file's text for --config-file).
absl::Status ApplyGateFlags(ParseState& st, absl::string_view gates_text);

// The first check of embed.Config.Validate: an old name and its new name
// both set.
absl::Status CheckRenamedFlags(const ServerConfig& c);

// etcdmain's parseWarningUnaryRequestDuration into
// ServerConfig::warning_unary_request_duration, and the deprecation
// warnings of every deprecated flag set.
absl::Status FinishRenamedFlags(ParseState& st);

}  // namespace capstan::server::config_internal

#endif  // CAPSTAN_SERVER_CONFIG_RENAMED_FLAGS_H_
