// etcdctl against one server process, for tests that drive a real etcd (or
// Capstan) the way an operator does:
//
//   auto etcd = ServerProcess::Start(ServerOptions::Etcd());
//   CommandResult r = EtcdctlCommand(**etcd, "put /a 1");
//   EtcdctlCommand(**etcd, "txn", "put /b 1\n\n\n");   // stdin
//
// Thread-safe (each call runs its own etcdctl process).

#ifndef CAPSTAN_TESTS_ETCDCTL_COMMAND_H_
#define CAPSTAN_TESTS_ETCDCTL_COMMAND_H_

#include <string>
#include <string_view>
#include <vector>

#include "process_fixture.h"

namespace capstan::testing {

// Runs `etcdctl --endpoints <server> <args...>` (API v3) with stdin_data.
CommandResult EtcdctlCommand(const ServerProcess& server, const std::vector<std::string>& args,
                             const std::string& stdin_data = "");

// The same with args split at spaces; the word '' stands for an empty
// argument ("get '' --prefix"). No other quoting.
CommandResult EtcdctlCommand(const ServerProcess& server, std::string_view args,
                             const std::string& stdin_data = "");

}  // namespace capstan::testing

#endif  // CAPSTAN_TESTS_ETCDCTL_COMMAND_H_
