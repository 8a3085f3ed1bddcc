// A client as an application on a cluster runs it, recording what it sees
// while the cluster changes under it (members added, promoted, removed):
//
//   AvailabilityProbe probe({cluster->endpoint(0)});   // starts at once
//   ...                                                // change the cluster
//   probe.SetEndpoints({cluster->endpoint(1), cluster->endpoint(2)});
//   ...
//   probe.Stop();
//   AvailabilityProbe::Outage o = AvailabilityProbe::LongestOutage(probe.ops());
//
// Every `interval` it starts an exchange, whether or not the earlier ones
// have been answered (an open loop, as many independent callers make): a put
// of a fresh key, then a linearizable get of it, through the next of its
// endpoints, each request with a deadline of `deadline`. A request the
// cluster lost (forwarded to a leader that is gone) fails at its deadline
// without holding back the exchanges after it.
//
// Thread safety: all methods may be called from any thread; the client runs
// on threads of its own from construction until Stop.

#ifndef CAPSTAN_TESTS_CLUSTER_AVAILABILITY_PROBE_H_
#define CAPSTAN_TESTS_CLUSTER_AVAILABILITY_PROBE_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/channel.h"

namespace capstan::testing::cluster {

class AvailabilityProbe {
 public:
  using Clock = std::chrono::steady_clock;

  struct Op {
    Clock::time_point start;
    Clock::time_point end;
    std::string what;  // "put <key> @<endpoint>", "get <key> @<endpoint>"
    bool ok = false;
    std::string error;  // why it failed: the gRPC code and message
  };

  // The longest time in which no operation succeeded: between two successive
  // successful answers (or the first operation's start, or the last one's
  // end). Every operation started inside it failed or was answered only at
  // its end.
  struct Outage {
    std::chrono::milliseconds length{0};
    Clock::time_point from;
    Clock::time_point to;
    int failures = 0;  // operations started inside it that failed
    std::string first_failure;  // "<what>: <error>" of the first and last of them
    std::string last_failure;
  };

  // Starts the client. REQUIRES: `endpoints` ("127.0.0.1:<port>") not empty.
  explicit AvailabilityProbe(std::vector<std::string> endpoints,
                             std::chrono::milliseconds interval = std::chrono::milliseconds(100),
                             std::chrono::milliseconds deadline = std::chrono::milliseconds(1000));
  // Stops the client.
  ~AvailabilityProbe();
  AvailabilityProbe(const AvailabilityProbe&) = delete;
  AvailabilityProbe& operator=(const AvailabilityProbe&) = delete;

  // Exchanges started from now on use `endpoints`. REQUIRES: not empty.
  void SetEndpoints(std::vector<std::string> endpoints);
  // Starts no more exchanges; returns once every one started has ended.
  void Stop();

  // Every operation ended so far, by start time.
  std::vector<Op> ops() const;
  // How many operations that started at or after `t` succeeded.
  int SuccessesSince(Clock::time_point t) const;
  // Gets that contradict the put of their exchange: another value, or none
  // after the put was acknowledged (a lost write). Never expected.
  std::vector<std::string> violations() const;

  static Outage LongestOutage(const std::vector<Op>& ops);

 private:
  struct Worker {
    std::thread thread;
    std::shared_ptr<bool> done;  // guarded by mu_
  };

  void Run();
  // One exchange: a put of probe/<n>, then a get of it.
  void Exchange(std::shared_ptr<grpc::Channel> channel, std::string endpoint, int64_t n);
  void Record(Op op);

  const std::chrono::milliseconds interval_;
  const std::chrono::milliseconds deadline_;
  mutable absl::Mutex mu_;
  std::vector<std::string> endpoints_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Op> ops_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> violations_ ABSL_GUARDED_BY(mu_);
  std::thread runner_;  // last: it runs once the members above exist
};

}  // namespace capstan::testing::cluster

#endif  // CAPSTAN_TESTS_CLUSTER_AVAILABILITY_PROBE_H_
