// The checks etcd makes once the flags, environment or config file are read,
// with etcd's error texts, and Capstan's own refusals. Each check also
// completes what depends on other settings (the typed values held as text
// while parsing, the effective initial cluster, the compaction retention,
// the auth token options) and adds etcd's warnings to ServerConfig.
//
// Internal to server/config. Thread safety: pure functions of their
// arguments.

#ifndef CAPSTAN_SERVER_CONFIG_VALIDATION_H_
#define CAPSTAN_SERVER_CONFIG_VALIDATION_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/config/config.h"
#include "server/config/flags.h"

namespace capstan::server::config_internal {

// embed.Config.Validate, in etcd's order: logging, listener and advertised
// URLs, bootstrap, raft timing, compaction mode, lease checkpoints, TLS
// versions. may_be_proxy: --proxy or a discovery that falls back to proxy,
// which lifts the need for --advertise-client-urls.
absl::Status ValidateLikeEtcd(ParseState& st, bool may_be_proxy);

// What etcd checks while starting the server (the initial cluster, the
// compaction retention, cipher suites, auth token options and bcrypt cost,
// the backend quota), and Capstan's own refusals (--proxy, several members).
// REQUIRES: ValidateLikeEtcd succeeded on the state holding c.
absl::Status ValidateAtStart(ServerConfig& c);

// types.NewURLsMap: "name=url" pairs; a name may repeat to list several URLs.
using InitialCluster = std::map<std::string, std::vector<Url>>;
absl::StatusOr<InitialCluster> ParseInitialCluster(absl::string_view text);

}  // namespace capstan::server::config_internal

#endif  // CAPSTAN_SERVER_CONFIG_VALIDATION_H_
