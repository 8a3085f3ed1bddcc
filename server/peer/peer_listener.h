// PeerListener: a peer URL's listener (http or https). It accepts TCP
// connections itself and, on https URLs, makes the TLS handshake with
// OpenSSL (peer_tls_handshake.h: etcd's checks inside the handshake). Then
// the connection's first byte tells what it carries: a Raft stream
// (raft_stream.h: 'G', its request line) is served on the connection's
// thread until it ends; anything else is gRPC (HTTP/2's preface, "PRI"),
// handed to the gRPC server: a plaintext socket as it is, a TLS session's
// plaintext through a socket pair (grpc::AddInsecureChannelFromFd), copying
// bytes both ways on the connection's thread. That thread waits in poll(2)
// on its sockets and on an eventfd that Stop makes readable, through the
// handshake, the Raft stream and the copying alike: no timer, no second
// thread. A refused handshake is logged as etcd's embed/config_logging.go
// logs it:
//
//   rejected connection on peer endpoint (remote-addr 127.0.0.1:41318,
//   server-name "", ip-addresses [127.0.0.1], dns-names [localhost]):
//   client certificate authentication failed
//
// (the addresses only when the peer sent a certificate), with the error Go
// gives: this side's refusal, or "remote error: tls: bad certificate" when
// the dialing peer refused this member's certificate. A peer retrying does
// not flood the log: one line per client address and error every 5 s, the
// next one saying how many were left out.
//
// Thread safety: Start and Stop from one thread; the connection threads are
// the listener's own.

#ifndef CAPSTAN_SERVER_PEER_PEER_LISTENER_H_
#define CAPSTAN_SERVER_PEER_PEER_LISTENER_H_

#include <atomic>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "grpcpp/server.h"
#include "server/peer/peer_tls_handshake.h"
#include "util/mutex.h"

namespace capstan::server::peer {

class PeerService;

class PeerListener {
 public:
  // ctx: NewPeerServerContext's, or null for plaintext (http URLs);
  // server: where gRPC connections go; service: what serves Raft streams.
  // Both must outlive the listener's Stop.
  PeerListener(SslCtxPtr ctx, grpc::Server* server, const PeerService* service);
  // Stops.
  ~PeerListener();
  PeerListener(const PeerListener&) = delete;
  PeerListener& operator=(const PeerListener&) = delete;

  // Binds host_port ("127.0.0.1:2380", "[::1]:0", "0.0.0.0:2380"; port 0
  // picks a free one) and starts accepting. REQUIRES: called once.
  absl::Status Start(const std::string& host_port);
  // The port bound. REQUIRES: Start succeeded.
  int port() const { return port_; }
  // Closes the listening socket and every connection, and joins the
  // threads. Idempotent.
  void Stop();

 private:
  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
  };
  void AcceptLoop();
  void Serve(int fd, std::string remote_addr, std::string remote_host);
  // Waits until the connection's first byte is there and reads it without
  // taking it (*first); false when the connection ended, broke, stalled
  // for the handshake timeout or the listener stops first.
  bool PeekFirstByte(int fd, SSL* ssl, char* first);
  // Copies between the TLS session on `net` and `local` until either ends
  // or the listener stops. REQUIRES: net is non-blocking.
  void Pump(SSL* ssl, int net, int local);
  void LogRefusal(const std::string& remote_addr, const std::string& remote_host,
                  const HandshakeResult& result);
  bool stopping() const { return stopping_.load(std::memory_order_acquire); }

  const SslCtxPtr ctx_;
  grpc::Server* const server_;
  const PeerService* const service_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd, readable once Stop begins
  int port_ = 0;
  std::thread accept_thread_;
  std::atomic<bool> stopping_{false};
  LogLimiter refusals_;

  // Lock order: a leaf.
  util::Mutex mu_;
  std::list<std::unique_ptr<Connection>> connections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace capstan::server::peer

#endif  // CAPSTAN_SERVER_PEER_PEER_LISTENER_H_
