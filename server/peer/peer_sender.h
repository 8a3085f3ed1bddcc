// PeerSender: the outgoing half of one ordered pair of members. It owns a
// bounded queue of marshaled raftpb.Messages for one peer and one thread
// that keeps a stream open to the peer and writes the queue into it, in
// order, in batches: a Raft stream (raft_stream.h) on http and https URLs,
// a capstan.v1.Peer/Raft gRPC stream on unix ones (and on https without
// the peer TLS flags, where gRPC's TLS with the system's roots dials).
//
// The stream is opened as soon as the sender starts (as etcd's stream
// readers dial at once) and reopened after a failure with exponential
// backoff, trying the peer's URLs in turn. Each failure (the peer cannot be
// reached, it refused the stream, the stream broke) is reported once:
// on_unreachable(peer) and on_error(peer, status), where a refusal carries
// the peer's text ("cluster ID mismatch", "the member has been permanently
// removed from the cluster"). The messages of a failed write and those
// queued when an attempt fails are dropped (Raft resends what matters), and
// while no stream is open only the newest few are kept.
//
// On a Raft stream, EnqueueAll writes the messages itself when the stream
// is idle (nothing queued, no write under way): the raft loop's messages
// then reach the socket without waking the sender's thread, one thread
// hand-off fewer per message. Such a direct write never waits: what the
// connection does not take at once, and a failure, are left to the
// sender's thread, which finishes the bytes (or ends the stream) before it
// writes anything else, so the stream's order is the order of EnqueueAll.
//
// Thread safety: Enqueue, Channel and Stop may be called from any thread.
// The callbacks run on the sender's thread, never under its lock.

#ifndef CAPSTAN_SERVER_PEER_PEER_SENDER_H_
#define CAPSTAN_SERVER_PEER_PEER_SENDER_H_

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/security/credentials.h"
#include "openssl/ssl.h"
#include "util/mutex.h"

namespace capstan::server::peer {

struct PeerSenderOptions {
  uint64_t local_id = 0;
  uint64_t cluster_id = 0;
  uint64_t peer_id = 0;
  // The peer's URLs ("http://host:port" or "https://host:port"); at least one.
  std::vector<std::string> urls;
  // For https URLs; nullptr uses TLS with the system's roots and no client
  // certificate (etcd with https peer URLs and no peer TLS flags).
  std::shared_ptr<grpc::ChannelCredentials> tls;
  // For https URLs with peer TLS flags: before each stream is opened, a TLS
  // handshake of its own with this context (NewPeerClientContext) tells
  // whether the peer and this member accept each other's certificates,
  // refusing inside the handshake as etcd does (peer_tls_handshake.h). A
  // failed probe fails the attempt; while they keep failing, etcd's
  // "prober detected unhealthy status" is logged every 5 s. Null: no probe.
  std::shared_ptr<SSL_CTX> probe_tls;
  size_t queue_capacity = 4096;           // messages
  // While no stream is open (the peer is down or restarting), only the
  // newest this many messages are kept: what a member sent to a peer that
  // was gone is stale when it comes back, and a burst of old heartbeats
  // would have the leader answer each of their responses with an append.
  size_t disconnected_queue_capacity = 8;
  size_t max_batch_bytes = 1 << 20;       // per RaftBatch (a larger message goes alone)
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(1);
  std::function<void(uint64_t peer)> on_unreachable;
  std::function<void(uint64_t peer, const absl::Status& status)> on_error;
};

// gRPC channel arguments for peer connections: reconnect backoff and
// keepalive sized for Raft's timing rather than gRPC's defaults.
grpc::ChannelArguments PeerChannelArguments();

// A peer URL as a gRPC target: "https://host:port" -> ("host:port", true).
std::pair<std::string, bool> Target(const std::string& url);
// A target's host ("[::1]:2380" -> "::1"), and its port in *port when it
// has one (*port unchanged otherwise).
std::string SplitHostPort(const std::string& target, int* port);

// How long a stream attempt gets to connect, make its TLS handshake and be
// accepted (PeerChannelArguments says why 5 s).
inline constexpr absl::Duration kStreamOpenTimeout = absl::Seconds(5);

class RaftStreamSender;

class PeerSender {
 public:
  explicit PeerSender(PeerSenderOptions options);
  // Stops and joins the thread.
  ~PeerSender();
  PeerSender(const PeerSender&) = delete;
  PeerSender& operator=(const PeerSender&) = delete;

  // Starts the thread. REQUIRES: called at most once.
  void Start();
  // Queues messages in order, as many as fit, and returns how many did (the
  // rest are dropped; none fit once the sender stopped), or writes them
  // directly into an idle Raft stream (all of them). Never blocks on the
  // network.
  size_t EnqueueAll(std::vector<std::string>* messages);
  // Cancels the stream and joins the thread; the callbacks do not run after
  // Stop returns. Idempotent.
  void Stop();
  // The channel to the peer's current URL, for unary calls.
  std::shared_ptr<grpc::Channel> Channel();

  uint64_t peer_id() const { return options_.peer_id; }
  // Since when the current stream has been open, accepted by the peer;
  // absl::InfiniteFuture() while there is none.
  absl::Time ActiveSince() const ABSL_LOCKS_EXCLUDED(mu_);
  // etcd's etcd_network_peer_sent_bytes_total and _sent_failures_total: the
  // bytes of the messages the peer's stream took, and the messages that were
  // not sent (dropped from a full queue, or queued for a stream that failed).
  uint64_t sent_bytes() const { return sent_bytes_.load(std::memory_order_relaxed); }
  uint64_t sent_failures() const { return sent_failures_.load(std::memory_order_relaxed); }

 private:
  void Run();
  // One stream's life: opens it, writes batches until it fails or the
  // sender stops. Returns the failure (OK when stopped) and sets *accepted
  // when the peer accepted the stream.
  absl::Status RunStream(const std::shared_ptr<grpc::Channel>& channel, bool* accepted);
  // The same on a Raft stream (raft_stream.h), which http URLs, and https
  // ones with the peer TLS flags, use (UsesRaftStream); the others (unix
  // URLs, https without a client context) use the gRPC stream.
  bool UsesRaftStream(const std::string& url) const;
  // Waits until the queue holds messages, the sender stops or `wait`
  // passes, then moves the next batch (at most max_batch_bytes, or one
  // larger message) into *batch, its bytes in *bytes: empty when the wait
  // passed. False once the sender stops.
  bool TakeBatch(absl::Duration wait, std::vector<std::string>* batch, size_t* bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // What a direct write left to the sender's thread.
  struct Leftover {
    std::string rest;        // bytes the connection did not take
    size_t rest_bytes = 0;   // the messages' bytes, for sent_bytes_
    size_t rest_count = 0;   // and their number, for sent_failures_
    absl::Status failure;    // the direct write failed: end the stream
  };
  // TakeBatch for a Raft stream: also returns when a direct write left
  // something (moved into *left), and returns (true) holding the writer
  // token (writing_), which the caller gives back with ReleaseWriter.
  bool TakeRaftBatch(std::vector<std::string>* batch, size_t* bytes, Leftover* left)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Gives the writer token back; with end_stream, in the same step, takes
  // the stream from direct writes (after a failed write, nothing may follow
  // a frame that went in part).
  void ReleaseWriter(bool end_stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Moves the next batch from the queue (see TakeBatch).
  void MoveBatchLocked(std::vector<std::string>* batch, size_t* bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // EnqueueAll's queueing, as many as fit; returns how many.
  size_t QueueLocked(std::vector<std::string>* messages) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // EnqueueAll's direct write into `stream`, whose writer token it holds.
  void WriteDirectly(RaftStreamSender* stream, std::vector<std::string>* messages, size_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RunRaftStream(const std::string& url, bool* accepted);
  std::shared_ptr<grpc::Channel> ChannelFor(size_t url_index);
  // The probe of an https URL (see probe_tls): "" when the handshake
  // succeeded. Logs etcd's prober line while the peer stays unhealthy.
  std::string Probe(const std::string& url);

  const PeerSenderOptions options_;
  std::atomic<uint64_t> sent_bytes_{0}, sent_failures_{0};
  std::thread thread_;  // written by Start, joined by Stop (one caller each)
  // An eventfd that Stop makes readable: it ends every wait of a Raft
  // stream (dial, handshake, request, writes).
  const int stop_fd_;
  // The sender's thread only: since when probes fail, when that was last logged.
  absl::Time unhealthy_since_ = absl::InfiniteFuture();
  absl::Time unhealthy_logged_ = absl::InfinitePast();

  // Lock order: a leaf; nothing blocks or calls out under it.
  mutable util::Mutex mu_;
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool joined_ ABSL_GUARDED_BY(mu_) = false;
  // The open call's context, for Stop to cancel.
  std::shared_ptr<grpc::ClientContext> context_ ABSL_GUARDED_BY(mu_);
  size_t url_index_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time active_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::vector<std::shared_ptr<grpc::Channel>> channels_ ABSL_GUARDED_BY(mu_);
  // The open, accepted Raft stream (owned by the sender's thread), for
  // direct writes; null while there is none.
  RaftStreamSender* stream_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Held by whoever writes into stream_: the sender's thread or one direct
  // write.
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  Leftover left_ ABSL_GUARDED_BY(mu_);
};

}  // namespace capstan::server::peer

#endif  // CAPSTAN_SERVER_PEER_PEER_SENDER_H_
