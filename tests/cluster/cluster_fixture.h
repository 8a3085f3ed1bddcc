// A cluster of 1, 3 or 5 server processes (the reference etcd, or Capstan: the
// binary is a parameter, started with etcd's clustering flags) on loopback
// ports, each with its own data dir and log, for replication and fault tests:
//
//   ClusterOptions o;                       // etcd 3.5, 3 members
//   auto cluster = Cluster::Start(o);       // returns once a leader is agreed
//   ASSERT_TRUE(cluster.ok()) << cluster.status();
//   auto leader = (*cluster)->WaitForLeader(std::chrono::seconds(10));
//   (*cluster)->Kill(*leader);              // SIGKILL
//   ASSERT_TRUE((*cluster)->Restart(*leader).ok());  // same data dir, same flags
//
// Member i is named "m<i>"; its data dir is <dir>/m<i>/data and its log
// (stdout and stderr, every start appended after a banner) <dir>/m<i>/server.log.
// Children die with the test process (process_fixture.h: SpawnChild).
// Waiting is polling with deadlines, never a fixed sleep.
//
// A running cluster grows the way an operator grows etcd's: the test reserves
// a member (ports, directory), asks the cluster to add it (MemberAdd, or
// `etcdctl member add`), and starts it with the environment that
// `etcdctl member add` prints:
//
//   absl::StatusOr<int> m = cluster->ReserveMember();  // "m3", not started
//   // etcdctl member add m3 --learner --peer-urls=<cluster->peer_url(*m)>
//   ASSERT_TRUE(cluster->StartJoining(*m, {"ETCD_NAME=m3", ...}).ok());
//
// A member the cluster removed exits by itself: WaitForExit says how.
//
// Thread safety: a Cluster is driven by one thread (start, kill, restart,
// pause, reserve). Endpoints, NewChannel and the RPC helpers (Status, HashKV,
// WaitForLeader) may be called from any thread while no member is being
// started, reserved or reaped.

#ifndef CAPSTAN_TESTS_CLUSTER_CLUSTER_FIXTURE_H_
#define CAPSTAN_TESTS_CLUSTER_CLUSTER_FIXTURE_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "etcdserverpb/rpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/status.h"
#include "process_fixture.h"

namespace capstan::testing::cluster {

// A new insecure channel to `endpoint` ("127.0.0.1:<port>") with its own
// connection (no subchannel shared with other channels), no message size
// limits, and reconnects within 250 ms while a member restarts.
std::shared_ptr<grpc::Channel> NewMemberChannel(const std::string& endpoint);

// What `etcdctl member add` printed: the new member's ID and the environment
// to start it with ("NAME=value", in etcdctl's order; StartJoining takes it).
struct MemberAdded {
  uint64_t id = 0;
  std::vector<std::string> env;
  std::map<std::string, std::string> vars;
};

// Parses etcdctl's simple output of `member add`:
//   Member 8e9e05c52164694d added as learner to cluster cdf818194e3a8c32
//
//   ETCD_NAME="m1"
//   ETCD_INITIAL_CLUSTER="m0=http://127.0.0.1:1,m1=http://127.0.0.1:2"
//   ETCD_INITIAL_ADVERTISE_PEER_URLS="http://127.0.0.1:2"
//   ETCD_INITIAL_CLUSTER_STATE="existing"
absl::StatusOr<MemberAdded> ParseMemberAdd(const std::string& out);

// The range_end of the keys starting with `prefix` (etcd's prefix end).
std::string PrefixEnd(const std::string& prefix);

struct ClusterOptions {
  ServerFlavor flavor = ServerFlavor::kEtcd;
  // Empty: EtcdBinary() or CapstanBinary() by flavor.
  std::string binary;
  int members = 3;
  int heartbeat_interval_ms = 100;   // --heartbeat-interval
  int election_timeout_ms = 1000;    // --election-timeout
  int64_t snapshot_count = 10000;    // --snapshot-count
  std::string cluster_token = "capstan-test-cluster";  // --initial-cluster-token
  // Appended after the standard flags on every member.
  std::vector<std::string> extra_args;
  // Called for each member before its first start, once its ports are
  // picked (e.g. to restore a snapshot into its data dir); a failure fails
  // Start.
  std::function<absl::Status(const class Cluster& cluster, int i)> prepare;
  // When set, called for each member once its ports are picked, with its
  // index and listen-peer port; returns the port the member advertises as its
  // peer URL and the others dial (a FaultProxy's front, fault_proxy.h).
  std::function<absl::StatusOr<int>(const class Cluster& cluster, int i, int listen_peer_port)>
      peer_front;
  // When set, "NAME=value" entries added to member i's environment at every
  // start (a test hook's variable).
  std::function<std::vector<std::string>(const class Cluster& cluster, int i)> member_env;
  // "https" for peer URLs over TLS (the peer TLS flags go in extra_args).
  std::string peer_scheme = "http";
  // Start and Restart give up after this long.
  std::chrono::milliseconds start_timeout{30000};
  // Stop sends SIGKILL after this long.
  std::chrono::milliseconds stop_timeout{10000};

  static ClusterOptions Etcd(int members = 3) {
    ClusterOptions o;
    o.members = members;
    return o;
  }
  static ClusterOptions Capstan(int members = 3) {
    ClusterOptions o;
    o.flavor = ServerFlavor::kCapstan;
    o.members = members;
    return o;
  }
};

class Cluster {
 public:
  // Picks ports, starts every member with --initial-cluster-state new, and
  // waits until every member answers Status naming the same leader. On
  // failure every member is killed and the error carries the logs' tails.
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(ClusterOptions options);

  // Kills every member still running (resuming paused ones); removes the
  // directory unless CAPSTAN_KEEP_TEST_DIRS is set.
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  const ClusterOptions& options() const { return options_; }
  const std::string& dir() const { return dir_; }

  // Member i's client endpoint "127.0.0.1:<port>", and all of them.
  std::string endpoint(int i) const;
  std::vector<std::string> endpoints() const;
  std::string client_url(int i) const;
  // The peer URL member i advertises (its front when options.peer_front is
  // set), and the one it listens on.
  std::string peer_url(int i) const;
  std::string listen_peer_url(int i) const;
  std::string name(int i) const;
  std::string data_dir(int i) const;
  std::string log_path(int i) const;
  // --initial-cluster of the members Start started: "m0=<peer url>,...".
  std::string initial_cluster() const;
  // The member's log, or its last `max_bytes`.
  std::string ReadLog(int i, size_t max_bytes = 0) const;
  // The last bytes_each bytes of every member's log, each headed by its name.
  std::string LogTails(size_t bytes_each) const;
  // The command line member i was (last) started with.
  const std::vector<std::string>& argv(int i) const;
  // A new insecure channel to member i (its own connection, quick reconnects).
  std::shared_ptr<grpc::Channel> NewChannel(int i) const;

  // --- process control. REQUIRES: 0 <= i < size().
  bool running(int i);
  bool paused(int i) const;
  pid_t pid(int i) const;
  // SIGKILL (a crash), and reap it. REQUIRES: running(i).
  ExitInfo Kill(int i);
  // SIGTERM, SIGKILL after options.stop_timeout. REQUIRES: running(i).
  ExitInfo Stop(int i);
  // SIGSTOP: the member stops answering anyone (a hung or partitioned member).
  absl::Status Pause(int i);
  // SIGCONT after Pause.
  absl::Status Resume(int i);
  // Starts member i again with the same flags (and, for a member that joined
  // a running cluster, the same environment) and data dir, and waits until it
  // answers Status naming a leader. REQUIRES: !running(i).
  absl::Status Restart(int i);
  // Restart with `flags` added to its command line for this run only (as
  // --force-new-cluster is given once).
  absl::Status Restart(int i, const std::vector<std::string>& flags);
  // Polls (reaping) until member i has exited by itself, as a member the
  // cluster removed does; returns how it ended, or DeadlineExceeded with the
  // tail of its log. Never signals it.
  absl::StatusOr<ExitInfo> WaitForExit(int i, std::chrono::milliseconds timeout);
  // How member i's last run ended. Meaningful once !running(i).
  const ExitInfo& exit_info(int i) const;

  // --- growing a running cluster.
  // Reserves member size(): named "m<size()>", its directory made, fresh
  // client and peer ports picked. It is neither started nor a member of the
  // cluster until the cluster adds peer_url(i) (MemberAdd) and StartJoining
  // starts it. Returns its index.
  absl::StatusOr<int> ReserveMember();
  // Starts reserved member i to join the running cluster. `env` holds
  // "NAME=value" entries: the block `etcdctl member add` prints (ETCD_NAME,
  // ETCD_INITIAL_CLUSTER, ETCD_INITIAL_ADVERTISE_PEER_URLS,
  // ETCD_INITIAL_CLUSTER_STATE=existing), passed in the environment only
  // (etcd refuses a flag that shadows a variable of its own); the flags are
  // --data-dir, the client and peer URLs, the timing flags and
  // options.extra_args. Waits until it answers Status naming a leader (a
  // learner answers too) and takes its member ID from that answer. Restart
  // reuses `env`. On failure the member is killed and the error carries its
  // log's tail. REQUIRES: i came from ReserveMember and was never started.
  absl::Status StartJoining(int i, std::vector<std::string> env);

  // --- state, by RPC to one member (each call its own deadline).
  absl::StatusOr<etcdserverpb::StatusResponse> Status(
      int i, std::chrono::milliseconds timeout = std::chrono::milliseconds(1000)) const;
  // Range of `key` at member i, serializable (its own store's answer).
  absl::StatusOr<etcdserverpb::RangeResponse> LocalGet(
      int i, const std::string& key,
      std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) const;
  // One renewal of lease `id` on a LeaseKeepAlive stream of its own at
  // member i, with clientv3.WithRequireLeader's metadata when
  // require_leader: the stream's final status (after the client closed it
  // when the renewal was answered), and *answered whether it was.
  grpc::Status KeepAliveOnce(int i, int64_t id, bool require_leader, bool* answered,
                             std::chrono::milliseconds timeout = std::chrono::seconds(5)) const;
  // HashKV of member i at `revision` (0: its current one). Polls while the
  // member has not reached `revision` yet (etcd's "future revision" answer).
  absl::StatusOr<etcdserverpb::HashKVResponse> HashKV(
      int i, int64_t revision, std::chrono::milliseconds timeout = std::chrono::seconds(10)) const;

  // The value on the first line of member i's /metrics (on its client URL)
  // that starts with `prefix` and holds `label`: `missing` when there is
  // none, -1 when /metrics does not answer.
  int64_t Metric(int i, absl::string_view prefix, absl::string_view label, int64_t missing) const;

  // Ok when every member in `members` answers HashKV at `revision` with the
  // same hash; otherwise the error of the first that cannot, or every
  // member's hash, named.
  absl::Status SameHashKV(const std::vector<int>& members, int64_t revision) const;

  // Polls until every running, unpaused member answers Status naming the same
  // leader, and that leader is one of them; returns the leader's index.
  absl::StatusOr<int> WaitForLeader(std::chrono::milliseconds timeout) const;
  // Like WaitForLeader, then the index of the leader (an alias that reads
  // better at call sites that only want to find it).
  absl::StatusOr<int> Leader(std::chrono::milliseconds timeout) const {
    return WaitForLeader(timeout);
  }
  // Polls until every running, unpaused member's Status revision is the same
  // and at least `revision`; returns that revision.
  absl::StatusOr<int64_t> WaitForConvergence(int64_t revision,
                                             std::chrono::milliseconds timeout) const;
  // The index of the member with ID `id` (etcd's member ID), or -1.
  int IndexOfMemberId(uint64_t id) const;
  uint64_t member_id(int i) const { return member_ids_[i]; }

 private:
  struct Member {
    std::string name;
    std::string dir;
    int client_port = 0;
    int peer_port = 0;
    int advertised_peer_port = 0;
    std::vector<std::string> argv;
    // A member that joined a running cluster: its ETCD_* environment, and
    // no clustering flags in argv.
    bool joined = false;
    std::vector<std::string> env;
    pid_t pid = -1;
    bool paused = false;
    ExitInfo exit;
  };

  explicit Cluster(ClusterOptions options);
  // Picks member i's client and peer ports (and its front's, with peer_front).
  absl::Status PickPorts(int i);
  std::vector<std::string> BuildArgv(int i) const;
  absl::Status Spawn(int i, const std::vector<std::string>& flags = {});
  bool Reap(int i, bool block);
  ExitInfo SignalAndWait(int i, int sig, std::chrono::milliseconds timeout);
  absl::Status WaitMemberReady(int i, std::chrono::milliseconds timeout);

  ClusterOptions options_;
  std::string dir_;
  std::vector<Member> members_;
  // Member IDs by index, from MemberList once the cluster has started.
  std::vector<uint64_t> member_ids_;
};

}  // namespace capstan::testing::cluster

#endif  // CAPSTAN_TESTS_CLUSTER_CLUSTER_FIXTURE_H_
