// A recording watcher over several members, as a Kubernetes reflector
// watches etcd: one Watch stream on a key prefix (prev_kv, progress_notify)
// from a start revision, moving to the next member whenever the stream ends
// and resuming just above the highest revision it has seen, by an event or a
// progress notification. What it receives goes, in arrival order, into
// WatchRecords for CheckWatch (watch_checker.h):
//
//   WatchClient watcher(/*id=*/0, cluster->endpoints(), /*first=*/1, "w/", rev + 1);
//   watcher.Start();
//   ... writes under "w/", faults ...
//   ASSERT_TRUE(watcher.WaitUntil(last_revision, std::chrono::seconds(30)));
//   watcher.Stop();
//   WatchCheckResult r = CheckWatch(watcher.Records(), rev + 1, "w/", log);
//
// The stream: the create request asks for the range [prefix, prefix + 1)
// with the "hasleader" metadata (etcd's WithRequireLeader: a member that
// loses its leader ends the stream, so the watcher moves on). Every 200 ms a
// second thread sends a progress request on it; a stream on which nothing at
// all arrives for 3 s (a paused member, a dead connection) is canceled and
// replaced. A response with events records each event; one with no events
// and neither created nor canceled records a progress notification at its
// header revision. A watch the server cancels is reopened, except when it
// was compacted: that is recorded as a kError and the watcher stops
// watching (resuming would skip the compacted changes).
//
// Reconnecting: the next stream goes to the next member (endpoints cycle from
// `first`), with start_revision = max(start_revision, last_revision() + 1),
// and a kReconnect record says why the previous stream ended. After a stream
// that received nothing the watcher waits 200 ms before the next.
//
// Thread safety: Start and Stop are called by one thread (the owner); the
// accessors and WaitUntil may be called from any thread at any time. The
// watcher runs on two threads of its own from Start until Stop.

#ifndef CAPSTAN_TESTS_CLUSTER_WATCH_CLIENT_H_
#define CAPSTAN_TESTS_CLUSTER_WATCH_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "cluster/watch_checker.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "util/mutex.h"

namespace capstan::testing::cluster {

class WatchClient {
 public:
  // `endpoints`: "127.0.0.1:<port>" of the members, not empty; the first
  // stream goes to endpoints[first % size]. `prefix`: not empty.
  // `start_revision`: the revision the first watch starts from (>= 1).
  WatchClient(int id, std::vector<std::string> endpoints, int first, std::string prefix,
              int64_t start_revision);
  // Stops the watcher.
  ~WatchClient();
  WatchClient(const WatchClient&) = delete;
  WatchClient& operator=(const WatchClient&) = delete;

  // Starts watching. REQUIRES: not started before.
  void Start();
  // Ends the stream and joins the watcher's threads; the records stay.
  // Idempotent.
  void Stop();

  int id() const { return id_; }
  const std::string& prefix() const { return prefix_; }
  int64_t start_revision() const { return start_revision_; }

  // A copy of every record so far, in arrival order.
  std::vector<WatchRecord> Records() const;
  // The highest revision received, by an event or a progress notification;
  // 0 before the first.
  int64_t last_revision() const;
  int64_t events() const;
  int64_t progress() const;
  int64_t reconnects() const;
  // True once the watch failed for good (a kError record).
  bool failed() const;
  // Blocks until last_revision() >= `revision`, the watch failed, or
  // `timeout` passed. Returns whether last_revision() >= `revision`.
  bool WaitUntil(int64_t revision, std::chrono::milliseconds timeout) const;

 private:
  struct Stream;

  // The reading thread: opens streams one after another and records what
  // they deliver.
  void Run();
  // Reads `stream` until it ends or must be given up, then finishes it;
  // returns why it ended. Sets *received when anything arrived, *fatal when
  // the watch cannot resume.
  std::string Consume(Stream* stream, bool* received, bool* fatal);
  // Records one response. Returns a non-empty reason when the stream must
  // be given up (the server canceled the watch); sets *fatal if for good.
  std::string Record(const etcdserverpb::WatchResponse& resp, const std::string& endpoint,
                     bool* fatal);
  // The second thread: progress requests and stall detection.
  void Watchdog();

  const int id_;
  const std::vector<std::string> endpoints_;
  const int first_;
  const std::string prefix_;
  const int64_t start_revision_;
  std::vector<std::unique_ptr<etcdserverpb::Watch::Stub>> stubs_;

  // Lock order: mu_ is never held while taking a Stream's write_mu, nor
  // while calling into gRPC.
  mutable util::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<WatchRecord> records_ ABSL_GUARDED_BY(mu_);
  int64_t last_revision_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t events_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t progress_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reconnects_ ABSL_GUARDED_BY(mu_) = 0;
  // The open stream (null between streams), when it last received anything
  // (or opened), and whether the watchdog canceled it as stalled.
  std::shared_ptr<Stream> current_ ABSL_GUARDED_BY(mu_);
  int64_t last_receive_ns_ ABSL_GUARDED_BY(mu_) = 0;
  bool stalled_ ABSL_GUARDED_BY(mu_) = false;

  std::thread reader_;
  std::thread watchdog_;
};

}  // namespace capstan::testing::cluster

#endif  // CAPSTAN_TESTS_CLUSTER_WATCH_CLIENT_H_
