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

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "etcdserverpb/rpc.pb.h"
#include "process_fixture.h"

namespace capstan::testing {

// Runs `etcdctl --endpoints <server> <args...>` (API v3) with stdin_data.
CommandResult EtcdctlCommand(const ServerProcess& server, const std::vector<std::string>& args,
                             const std::string& stdin_data = "");

// The same with args split at spaces; the word '' stands for an empty
// argument ("get '' --prefix"). No other quoting.
CommandResult EtcdctlCommand(const ServerProcess& server, std::string_view args,
                             const std::string& stdin_data = "");

// A server process (etcd by default) driven with etcdctl, for tests that
// build a history the way an operator would and then read etcd's own files
// (bbolt db, snapshots). Used by one thread at a time.
class EtcdctlServer {
 public:
  static bool EtcdAvailable() {
    return IsExecutable(EtcdBinary()) && IsExecutable(EtcdctlBinary());
  }

  absl::Status Start(ServerOptions options = ServerOptions::Etcd());
  // Stops the server; its data dir stays until this object is destroyed.
  void Stop();

  // Runs etcdctl with args (split at spaces, '' for an empty word) and
  // returns its stdout. A non-zero exit fails the test unless rc is given.
  std::string Ctl(const std::string& args, const std::string& input = "", int* rc = nullptr);
  // The whole key space at rev (0: current), as the server answers it.
  etcdserverpb::RangeResponse GetAll(int64_t rev);
  int64_t Rev() { return GetAll(0).header().revision(); }
  // `lease grant ttl`; returns the lease ID.
  int64_t Grant(int ttl);

  ServerProcess& server() { return *server_; }
  std::string data_dir() const { return server_->data_dir(); }
  // etcd's bbolt file in the data dir.
  std::string db_path() const { return data_dir() + "/member/snap/db"; }

 private:
  std::unique_ptr<ServerProcess> server_;
};

}  // namespace capstan::testing

#endif  // CAPSTAN_TESTS_ETCDCTL_COMMAND_H_
