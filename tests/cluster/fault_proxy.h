// A fault-injecting TCP proxy between the members of a cluster: each member
// advertises a peer URL on the proxy, which forwards to the member's own
// listen-peer URL. Every connection is attributed to the member that dialed
// it (the process owning the connecting socket, found through /proc, matched
// by its --data-dir), so traffic can be held or delayed per ordered pair of
// members: a partition, a one-way loss, a flapping link, a slow follower.
//
//   FaultProxy proxy;
//   options.peer_front = [&](const Cluster& c, int i, int port) {
//     return proxy.Front(i, c.data_dir(i), port);
//   };
//   proxy.Isolate(leader);   // nothing flows between the leader and the others
//   proxy.HealAll();
//
// A held direction is what a dropped link looks like to TCP: the proxy stops
// reading from the sender, whose writes back up in the kernel's buffers, and
// what it already read waits; when the link heals the data flows on, as TCP
// would retransmit it. Nothing is ever dropped from the middle of a stream,
// so the peers' framing stays intact; the members' own timeouts decide when
// to give up on a connection, as on a real network. A delay is latency, not
// a bandwidth limit: each chunk is passed on that long after it was read,
// while the chunks behind it are read on (up to 64 MiB per direction). Connections from processes that are not
// members (a client, a probe) are forwarded without faults.
//
// Thread safety: every method may be called from any thread. Each connection
// is served by two threads of its own (one per direction), each listener by
// one; all stop in the destructor, which joins them.

#ifndef CAPSTAN_TESTS_CLUSTER_FAULT_PROXY_H_
#define CAPSTAN_TESTS_CLUSTER_FAULT_PROXY_H_

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "util/mutex.h"

namespace capstan::testing::cluster {

class FaultProxy {
 public:
  FaultProxy();
  ~FaultProxy();
  FaultProxy(const FaultProxy&) = delete;
  FaultProxy& operator=(const FaultProxy&) = delete;

  // Starts (or retargets) member i's front: a listener on a free loopback
  // port forwarding to 127.0.0.1:`target_port`. Returns the front's port.
  // `data_dir`: member i's --data-dir as its command line gives it, by which
  // its connections are known.
  absl::StatusOr<int> Front(int i, const std::string& data_dir, int target_port);

  // --- faults. Each replaces what was set for the same pair.
  // Holds (true) or lets flow (false) the traffic that member `from` sends to
  // member `to`.
  void Hold(int from, int to, bool held);
  // Holds both directions between every member of `side` and every other.
  void Partition(const std::vector<int>& side);
  void Isolate(int i) { Partition({i}); }
  // Delays every chunk in both directions between member i and the others.
  void Delay(int i, std::chrono::milliseconds delay);
  // Lets everything flow, without delay.
  void HealAll();

  struct Stats {
    int64_t connections = 0;
    int64_t unattributed = 0;  // from processes that are not members
    int64_t bytes = 0;
  };
  Stats stats() const;

 private:
  struct Listener;
  struct Link;
  void AcceptLoop(Listener* l);
  void Serve(int client_fd, int to, int target_port);
  void Pump(int src, int dst, int from, int to);
  int Attribute(int client_fd, int listen_port);
  void Grow(size_t n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool Held(int from, int to) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::chrono::milliseconds DelayOf(int from, int to) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  std::atomic<bool> stop_{false};
  mutable util::Mutex mu_;
  std::vector<std::string> data_dirs_ ABSL_GUARDED_BY(mu_);
  // held_[from][to], delay_[i] (ms) for member i's links.
  std::vector<std::vector<bool>> held_ ABSL_GUARDED_BY(mu_);
  std::vector<int> delay_ms_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Listener>> listeners_ ABSL_GUARDED_BY(mu_);
  // The listeners' threads, and each connection's (joined once done).
  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
  };
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::list<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace capstan::testing::cluster

#endif  // CAPSTAN_TESTS_CLUSTER_FAULT_PROXY_H_
