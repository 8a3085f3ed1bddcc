// GoRaftEngineFactory: the RaftEngine of replication/raft_engine.h on etcd's
// own Raft library (raft.RawNode of go.etcd.io/etcd/raft 3.4), which runs in
// the Go runtime of the c-archive built from shim/ (C API: shim/capstan_raft.h).
//
// Only the capstan binary links this library: a process can hold one Go
// runtime, and libcapstan holds none.
//
// Threads. RunLoop runs its loop on a goroutine locked to its OS thread, and
// RunSteps each step on a goroutine that passes through Go's scheduler
// between steps, so that every call into Go from the loop is a nested cgo
// call (about 70 ns; from a thread Go did not create, Go 1.19 spends
// microseconds on each). An engine is made, used and destroyed inside its
// loop only, never by two threads at once, and its RaftStorage and log
// callbacks run there, synchronously inside engine calls. Debug builds
// CHECK that engines are used inside a loop. The factory itself may be used
// from any thread; several loops may run at once, each with its own engines.
//
// The Go runtime. It starts before main() (from the archive's initializers)
// and runs its own threads and garbage collector in the process; GOMAXPROCS
// and GOGC are read from the environment only. It installs handlers for
// SIGSEGV, SIGBUS, SIGFPE, SIGPIPE and SIGURG: a crash handler installed
// later must use SA_ONSTACK and chain to the previous handler, and the
// process must still ignore SIGPIPE (or write with MSG_NOSIGNAL) as before.
// A binary can hold only one Go c-archive.
//
// Failures. A raft invariant violation or a storage callback returning
// LogError::kFailed makes raft panic: the shim logs the panic through the
// engine's log function (else the global logger, spdlog) and aborts the
// process, as etcd does. C++ exceptions thrown by RaftStorage or the log
// function are caught at the boundary (a storage error becomes kFailed).

#ifndef CAPSTAN_REPLICATION_GORAFT_GO_RAFT_ENGINE_H_
#define CAPSTAN_REPLICATION_GORAFT_GO_RAFT_ENGINE_H_

#include <memory>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "replication/raft_engine.h"

namespace capstan::replication {

class GoRaftEngineFactory : public RaftEngineFactory {
 public:
  // Sends the raft package's own log lines (and those of engines without a
  // RaftConfig::log) to spdlog, with the prefix "raft: ".
  GoRaftEngineFactory();

  // Runs loop on a goroutine locked to a Go-created thread; returns when
  // loop returns. loop must not throw.
  void RunLoop(absl::AnyInvocable<void()> loop) override;
  void RunSteps(absl::AnyInvocable<bool()> step) override;

  // REQUIRES: called inside RunLoop; config.storage is set. InvalidArgument
  // for a configuration raft refuses (id 0, election_tick <= heartbeat_tick,
  // ...) or bootstrap voters given for a non-empty log; the storage's error
  // when InitialState fails.
  absl::StatusOr<std::unique_ptr<RaftEngine>> NewEngine(const RaftConfig& config) override;
};

}  // namespace capstan::replication

#endif  // CAPSTAN_REPLICATION_GORAFT_GO_RAFT_ENGINE_H_
