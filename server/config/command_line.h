// Reading the flags from the command line (Go's flag package) and from
// ETCD_* environment variables (etcd's pkg/flags.SetFlagsFromEnv), each with
// etcd's error texts and exit codes.
//
// Internal to server/config. Thread safety: pure functions of their
// arguments and the flag table.

#ifndef CAPSTAN_SERVER_CONFIG_COMMAND_LINE_H_
#define CAPSTAN_SERVER_CONFIG_COMMAND_LINE_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/config/flags.h"

namespace capstan::server::config_internal {

// Go's flag.FlagSet.Parse over args (argv without argv[0]): sets each flag
// in st and records it in st->cfg.explicitly_set. Stops at --help / -h with
// st->cfg.help_requested set and the rest of args unread. A syntax error is
// a UsageError (exit 2 with the usage); an argument left over after the
// flags is a VerifyError, as etcd refuses it.
absl::Status ParseArgs(const std::vector<std::string>& args, ParseState* st);

// pkg/flags.SetFlagsFromEnv: sets each flag not set on the command line
// from its ETCD_<FLAG> variable in env, recording it in explicitly_set and
// used_env_vars, and warns of variables that name no flag. Fails if a
// variable names a flag given on the command line, else with the last
// value that does not parse (flags in name order).
// REQUIRES: ParseArgs(…, st) succeeded.
absl::Status SetFlagsFromEnv(const std::map<std::string, std::string>& env, ParseState* st);

}  // namespace capstan::server::config_internal

#endif  // CAPSTAN_SERVER_CONFIG_COMMAND_LINE_H_
