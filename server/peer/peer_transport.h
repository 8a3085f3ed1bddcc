// PeerTransport: replication::Transport over the peer URLs: Raft streams
// (raft_stream.h) beside the capstan.v1.Peer gRPC service
// (proto/capstan/v1/peer.proto explains why not etcd's rafthttp), secured
// with etcd's peer TLS flags (peer_tls.h).
//
// Receiving: a PeerListener (peer_listener.h) on every http:// or https://
// --listen-peer-urls URL (https with the peer certificate) serves the Raft
// streams on threads of their own and hands every other connection to a
// gRPC server running PeerService (peer_service.h) (unix:// URLs are the
// gRPC server's own). Streams and calls from another cluster or from
// removed members are refused with rafthttp's texts before the handler
// sees them.
//
// Sending: one PeerSender (peer_sender.h) per peer: a bounded queue
// (queue_capacity messages) and one thread holding one Raft stream to the
// peer, reconnecting with backoff. Send never blocks: a
// message that does not fit is dropped and on_unreachable(peer) called; a
// failed stream calls on_unreachable once per failure. Messages to one peer
// keep their order. Outgoing https connections present the peer certificate
// (or --peer-client-cert-file) as their client certificate, as etcd's do.
//
// Thread safety: every method may be called from any thread, concurrently,
// except from inside a callback (a handler's or on_peer_error) for Stop,
// AddPeer and RemovePeer, which join sender threads.
// The handler's callbacks run on transport threads (the Raft streams'
// receiving threads, gRPC's callback threads, the peer service's snapshot
// thread, the senders' threads) and on
// the caller's thread of Send (an overflow), never under a transport lock.

#ifndef CAPSTAN_SERVER_PEER_PEER_TRANSPORT_H_
#define CAPSTAN_SERVER_PEER_PEER_TRANSPORT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "openssl/ssl.h"
#include "replication/transport.h"
#include "server/config/config.h"
#include "server/peer/peer_prober.h"
#include "server/peer/peer_tls.h"
#include "util/mutex.h"

namespace capstan::server {

namespace peer {
class PeerSender;
class PeerService;
class PeerListener;
}  // namespace peer

struct PeerTransportOptions {
  uint64_t member_id = 0;
  uint64_t cluster_id = 0;
  // Where to serve: http://host:port or https://host:port (port 0 picks a
  // free port; BoundPorts tells which).
  std::vector<Url> listen_peer_urls;
  // The peer TLS settings (ResolvePeerTls); nullopt when the flags give no
  // peer certificate. REQUIRED for https listen URLs.
  std::optional<PeerTls> tls;
  size_t queue_capacity = 4096;      // messages queued per peer
  size_t max_batch_bytes = 1 << 20;  // per RaftBatch written to a stream
  absl::Duration initial_backoff = absl::Milliseconds(100);  // stream reconnects
  absl::Duration max_backoff = absl::Seconds(1);
  // The longest a snapshot stream to a peer may take.
  absl::Duration snapshot_timeout = absl::Minutes(30);
  // The round-trip probes of the peers (etcd's prober timing by default;
  // log_unhealthy is set by the transport: off where the TLS probe of
  // peer_sender.h logs instead).
  peer::PeerProberOptions probe;
  // Called (on a sender thread) with each failure of a stream to `peer`: a
  // refusal with the peer's status (FailedPrecondition "cluster ID
  // mismatch", PermissionDenied "the member has been permanently removed
  // from the cluster": this member should stop, as etcd does) or the
  // connection's error. Optional. Like the handler's callbacks it must not
  // block, and must not call Stop, AddPeer or RemovePeer itself (they join
  // the sender thread it runs on): hand the decision to another thread.
  std::function<void(uint64_t peer, const absl::Status& status)> on_peer_error;
};

// The options etcd's peer flags give a member: --listen-peer-urls and the
// peer TLS flags (when HasPeerCertificate). Fails as ResolvePeerTls fails,
// or when an https listen URL has no peer certificate.
absl::StatusOr<PeerTransportOptions> PeerTransportOptionsFromConfig(const ServerConfig& config,
                                                                    uint64_t member_id,
                                                                    uint64_t cluster_id);

// etcd's GetClusterFromRemotePeers, for a member joining a running cluster
// (--initial-cluster-state existing): asks each peer URL in turn for the
// members (capstan.v1.Peer/Members), each within `timeout`, and returns the
// first answer with members (the cluster ID in its header). Fails with
// etcd's "could not retrieve cluster information from the given URLs".
absl::StatusOr<etcdserverpb::MemberListResponse> FetchClusterMembers(
    const std::optional<PeerTls>& tls, const std::vector<std::string>& urls,
    absl::Duration timeout);

class PeerTransport final : public replication::Transport {
 public:
  explicit PeerTransport(PeerTransportOptions options);
  // Stops (see Stop).
  ~PeerTransport() override;
  PeerTransport(const PeerTransport&) = delete;
  PeerTransport& operator=(const PeerTransport&) = delete;

  // Binds every listen URL and starts serving and sending. Fails (and
  // serves nothing) when a URL cannot be bound or its TLS files are
  // unusable. REQUIRES: called once, before Stop.
  absl::Status Start(replication::TransportHandler handler) override;
  // Stops the senders (queued messages are dropped) and the server (open
  // streams are cancelled); no handler callback runs after Stop returns.
  // Idempotent.
  void Stop() override;
  // Adds a peer, or replaces its URLs (its queue is then dropped). Peers
  // added before Start start sending at Start (messages to them before
  // that are dropped). A removed ID is not added
  // again (etcd never reuses member IDs).
  void AddPeer(uint64_t id, const std::vector<std::string>& peer_urls) override;
  // Stops sending to the peer and refuses its calls from now on.
  void RemovePeer(uint64_t id) override;
  // Queues each message for its peer. Messages to unknown peers are dropped
  // (as etcd drops them); a full queue drops the message and calls
  // on_unreachable once per peer per call.
  void Send(std::vector<replication::RaftMessage> messages) override;
  // deadline_ms: how long, in milliseconds from the call, to wait for the
  // leader's answer. Unavailable when the leader is not a known peer or
  // cannot be reached in time (or the transport stops first); otherwise the
  // leader's status (etcd's lease errors, code and text). An asynchronous
  // call on gRPC's callback API: `done` runs on a gRPC thread.
  void LeaseRenew(uint64_t leader, const etcdserverpb::LeaseKeepAliveRequest& request,
                  int64_t deadline_ms, LeaseRenewDone done) override;
  absl::StatusOr<std::vector<membership::ClusterMember>> PromoteMember(
      uint64_t leader, uint64_t id, int64_t deadline_ms) override;
  absl::Status LeaseTimeToLive(uint64_t leader, const etcdserverpb::LeaseTimeToLiveRequest& request,
                               etcdserverpb::LeaseTimeToLiveResponse* response,
                               int64_t deadline_ms) override;
  absl::StatusOr<etcdserverpb::HashKVResponse> PeerHashKV(uint64_t id, int64_t revision,
                                                          int64_t deadline_ms) override;

  // Since when the Raft stream to the peer has been open (accepted by it).
  absl::Time ActiveSince(uint64_t id) const override;

  // Streams the checkpoint in dir and the MsgSnap over Peer/Snapshot, on the
  // calling thread (the replicator's snapshot sender).
  absl::Status SendSnapshot(uint64_t to, const std::string& dir, const std::string& message,
                            int64_t rate_bytes_per_sec) override;

  // The ports bound, in listen_peer_urls order. REQUIRES: Start succeeded.
  std::vector<int> BoundPorts() const;

  // The senders' counts for each peer it sends to, the round trips the
  // prober observed, and the bytes of the messages received from each.
  std::vector<membership::PeerTraffic> Traffic() const override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // Makes, registers and starts the sender of a peer, replacing any.
  void AddPeerSender(uint64_t id, const std::vector<std::string>& peer_urls);
  std::shared_ptr<peer::PeerSender> NewSender(uint64_t id, const std::vector<std::string>& urls);
  bool IsRemoved(uint64_t id) const;
  void ReportUnreachable(uint64_t id) const;
  // The channel to peer id; nullptr when it is not a known peer.
  std::shared_ptr<grpc::Channel> ChannelTo(uint64_t id);
  // A Peer stub on that channel, made once per channel (a stub registers
  // every method of the service with its channel when it is made); nullptr
  // when it is not a known peer.
  struct PeerStub;
  std::shared_ptr<PeerStub> StubTo(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);

  const PeerTransportOptions options_;
  // Outgoing https credentials, made at Start. Written once before any
  // sender starts, read-only afterwards.
  std::shared_ptr<grpc::ChannelCredentials> channel_tls_;
  // The senders' probes of https peers (peer_tls_handshake.h), made at
  // Start like channel_tls_.
  std::shared_ptr<SSL_CTX> probe_tls_;
  // Written by Start before the server and senders start, read-only
  // afterwards (the callbacks read it without the lock).
  replication::TransportHandler handler_;
  std::unique_ptr<peer::PeerService> service_;
  // Made by Start before started_ is set; stopped by Stop, first.
  std::unique_ptr<peer::PeerProber> prober_;
  std::unique_ptr<grpc::Server> server_;
  std::vector<int> ports_;
  // One per http or https listen URL, made by Start, stopped by Stop.
  std::vector<std::unique_ptr<peer::PeerListener>> listeners_;

  // Lock order: mu_ before the prober's (which comes before a sender's, in
  // its channel getter) and nothing else: senders are started, stopped and
  // fed outside it. Nothing blocks under it.
  mutable util::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  int active_sends_ ABSL_GUARDED_BY(mu_) = 0;  // Send calls past their stopped_ check
  // Forwarded keep-alives waiting for the leader: Stop cancels them and waits
  // for their answers.
  struct LeaseCall;
  std::map<const LeaseCall*, std::shared_ptr<LeaseCall>> lease_calls_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<PeerStub>> stubs_ ABSL_GUARDED_BY(mu_);  // StubTo's
  std::map<uint64_t, std::vector<std::string>> peer_urls_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, std::shared_ptr<peer::PeerSender>> senders_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> removed_ ABSL_GUARDED_BY(mu_);
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_PEER_PEER_TRANSPORT_H_
