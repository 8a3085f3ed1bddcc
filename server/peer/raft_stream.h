// The Raft stream: how a member's Raft messages reach a peer, on a
// connection of their own that no gRPC thread polls.
//
// Why not a capstan.v1.Peer/Raft gRPC stream: with gRPC C++ 1.51 every
// connection of a process is in one epoll set that all of gRPC's polling
// threads share, and each batch a peer stream received had the pollers
// hand the poll from one thread to the other, a wake-up of a virtual CPU
// each time. On three members that cost the members about 50 us of CPU per
// put (docs/BENCHMARKS.md, "Three members' puts"). A Raft stream here is a
// connection with one thread at each end, blocking on it alone: the
// sender's thread writes what its queue holds in one write, the receiver's
// reads and hands the messages to Raft.
//
// It runs on the peer URL's own port, beside the capstan.v1.Peer service:
// the peer listener (peer_listener.h) tells a Raft stream from gRPC by its
// first byte ('G'; gRPC's HTTP/2 preface starts "PRI"), after the TLS
// handshake on https URLs. The wire, HTTP/1.1-shaped as rafthttp's streams:
//
//   sender:    GET /raft/stream/capstan HTTP/1.1\r\n
//              Host: <host:port>\r\n
//              X-Etcd-Cluster-ID: <cluster ID>\r\n
//              X-Server-From: <sender's member ID>\r\n
//              X-Raft-To: <receiver's member ID>\r\n
//              \r\n
//   receiver:  HTTP/1.1 200 OK\r\nX-Etcd-Cluster-ID: <cluster ID>\r\n\r\n
//              or a refusal, and it closes:
//              HTTP/1.1 <code> <reason>\r\nContent-Length: <n>\r\n\r\n<text>
//              412 "cluster ID mismatch", 400 "invalid from", 410 "the member
//              has been permanently removed from the cluster", 412 "to field
//              mismatch" (the identity checks of peer_service.h, in rafthttp's
//              order), 404 "404 page not found" (another path).
//   then, sender to receiver, frames: an 8-byte big-endian length and a
//   marshaled raftpb.Message (rafthttp's message encoding), whose `to` and
//   `from` are checked as on the gRPC stream; length 0 is a link heartbeat.
//   Receiver to sender: a link heartbeat now and then, nothing else.
//
// Liveness, as etcd's streams have it (ConnReadTimeout 5 s): each side sends
// a link heartbeat when it has sent nothing for kRaftStreamHeartbeat, and
// gives the connection up when it has heard nothing for kRaftStreamTimeout;
// a write that cannot proceed for that long fails too. A member removed
// while its stream is open is cut off at the receiver's next read, and its
// next stream is refused with 410.
//
// Thread safety: a PeerConn and a RaftStreamSender are used by one thread
// at a time (the sender's own, or a thread that writes directly, never
// both at once: PeerSender hands the stream over); another ends their
// waits through the stop fd they were given.
// The functions are safe from any thread.

#ifndef CAPSTAN_SERVER_PEER_RAFT_STREAM_H_
#define CAPSTAN_SERVER_PEER_RAFT_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "openssl/ssl.h"

namespace capstan::server::peer {

class PeerService;

inline constexpr char kRaftStreamPath[] = "/raft/stream/capstan";
inline constexpr absl::Duration kRaftStreamHeartbeat = absl::Milliseconds(1500);
inline constexpr absl::Duration kRaftStreamTimeout = absl::Seconds(5);
// The largest message a stream takes (etcd's stream decoder's limit).
inline constexpr uint64_t kRaftStreamMaxMessage = 512ull << 20;

// A connected socket, with the TLS session over it or none. Owns both.
// Waits in poll(2) on the socket and, when given, a stop fd (readable:
// stop waiting).
class PeerConn {
 public:
  // REQUIRES: fd is non-blocking. ssl: null for plaintext, else a session
  // whose handshake is done, on fd, from a peer context
  // (peer_tls_handshake.h), whose modes allow partial writes from a moved
  // buffer.
  PeerConn(int fd, SSL* ssl);
  ~PeerConn();
  PeerConn(const PeerConn&) = delete;
  PeerConn& operator=(const PeerConn&) = delete;

  enum class Io { kOk, kEnd, kTimedOut, kStopped };
  // Reads what is there, at most n bytes, into buf (*got), waiting for it
  // until `deadline` (in the past: not at all) or stop_fd (-1: none). kEnd:
  // the peer closed the connection or it broke.
  Io Read(char* buf, size_t n, size_t* got, absl::Time deadline, int stop_fd);
  // Writes all n bytes; kTimedOut when the connection took none of them for
  // `stall`.
  Io Write(const char* buf, size_t n, absl::Duration stall, int stop_fd);
  // Writes what the connection takes now, without waiting: *written of the
  // n bytes (fewer when it would block; kEnd when it broke). The rest is
  // finished with Write, from the same bytes (on TLS, a record OpenSSL
  // could not send is retried with them). Both block SIGPIPE on the
  // calling thread on TLS (OpenSSL writes with write(2)).
  Io TryWrite(const char* buf, size_t n, size_t* written);
  int fd() const { return fd_; }

 private:
  // Waits for `events` on the socket; kOk when it is ready.
  Io Await(short events, absl::Time deadline, int stop_fd);
  // Writes buf[*written, n) as far as the connection takes it now, advancing
  // *written; *want: 0 when all went, else the poll event to wait for.
  Io WriteSome(const char* buf, size_t n, size_t* written, short* want);

  const int fd_;
  SSL* const ssl_;
};

// The receiving end: serves one Raft stream on conn, whose first bytes are
// the sender's request. Admits it with the service's identity checks,
// answers, then hands each message to the service, in order, until the
// stream ends or breaks, it hears nothing for kRaftStreamTimeout, a message
// is refused (logged), the sender is removed, or stop_fd becomes readable.
void ServeRaftStream(PeerConn* conn, const PeerService& service, int stop_fd);

// The sending end: a stream opened to one peer.
class RaftStreamSender {
 public:
  struct Target {
    std::string host;
    int port = 0;
    // The client context of https peer URLs (NewPeerClientContext); null:
    // plaintext.
    SSL_CTX* tls = nullptr;
  };
  // Connects to the peer and makes the TLS handshake, within `timeout`.
  // Unavailable with why not.
  // A readable stop_fd (-1: none) ends the attempt at once, and every
  // later wait of the stream's (Start, Write); it must outlive the stream.
  static absl::StatusOr<std::unique_ptr<RaftStreamSender>> Dial(const Target& target,
                                                                absl::Duration timeout,
                                                                int stop_fd = -1);
  // Sends the request and waits for the answer, each within `timeout`
  // (the stop fd ends the wait). Errors: the peer's refusal
  // (FailedPrecondition, PermissionDenied, InvalidArgument or NotFound with
  // its text), or Unavailable.
  // `silence`: how long the peer may send nothing (not even a heartbeat)
  // before Write gives the stream up, and how long a write may stall.
  absl::Status Start(const Target& target, uint64_t cluster_id, uint64_t from, uint64_t to,
                     absl::Duration timeout, absl::Duration silence = kRaftStreamTimeout);

  // Writes the messages, framed, in one write (a link heartbeat when there
  // are none). Fails (Unavailable) when the connection broke, the write
  // could not proceed for `silence`, or the peer has sent nothing for that
  // long (looked at once a second).
  absl::Status Write(const std::vector<std::string>& messages);

  // Writes the messages, framed, as far as the connection takes them now,
  // without waiting: the raft loop's direct write (peer_sender.h). What the
  // connection did not take is left in *rest (empty: all of it went), to be
  // finished with WriteRest before anything else is written. Unavailable
  // when the connection broke.
  absl::Status TryWrite(const std::vector<std::string>& messages, std::string* rest);
  // Finishes what TryWrite left, waiting as Write does.
  absl::Status WriteRest(const std::string& rest);

 private:
  RaftStreamSender(std::unique_ptr<PeerConn> conn, int stop_fd);
  // Reads (without waiting) what the peer sent: link heartbeats.
  absl::Status Drain();
  // buffer_ = the messages' frames (a link heartbeat when there are none).
  void Frame(const std::vector<std::string>& messages);
  // Writes n bytes of buf as Write does, its outcome as Write returns it.
  absl::Status WriteAll(const char* buf, size_t n);

  std::unique_ptr<PeerConn> conn_;
  const int stop_fd_;
  std::string buffer_;       // the frames of one Write
  absl::Time heard_;         // when the peer last sent something
  absl::Time drained_;       // when Drain last ran
  absl::Duration silence_ = kRaftStreamTimeout;
};

}  // namespace capstan::server::peer

#endif  // CAPSTAN_SERVER_PEER_RAFT_STREAM_H_
