// The TLS handshakes of https peer URLs, made with OpenSSL directly so that
// a refusal happens inside the handshake, as in Go's crypto/tls: the side
// that refuses the other's certificate sends a bad_certificate alert, and
// the other side sees "remote error: tls: bad certificate". gRPC's TLS
// (peer_tls.h's credentials) checks the allowed CN or hostname only after
// its handshake completed and closes the connection without an alert, so
// neither side could tell etcd's story. The peer listener
// (peer_listener.h) answers every https connection with the server context
// below, and a sender probes a peer with the client context before it
// opens its gRPC stream (ProbePeer).
//
// Error texts are Go's and etcd's: "client certificate authentication
// failed" (--peer-cert-allowed-cn or --peer-cert-allowed-hostname refused
// the certificate, on either side), "remote error: tls: bad certificate"
// (the other side refused ours), "tls: failed to verify certificate: x509:
// certificate signed by unknown authority", etcd's checkSAN and CRL texts.
//
// Thread safety: the contexts are immutable once made and may serve any
// number of threads; the functions are safe from any thread.

#ifndef CAPSTAN_SERVER_PEER_PEER_TLS_HANDSHAKE_H_
#define CAPSTAN_SERVER_PEER_PEER_TLS_HANDSHAKE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "openssl/ssl.h"
#include "server/peer/peer_tls.h"
#include "util/mutex.h"

namespace capstan::server::peer {

struct SslCtxFree {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
using SslCtxPtr = std::unique_ptr<SSL_CTX, SslCtxFree>;

// The context of the peer listener: the peer certificate, client
// certificates required and checked as etcd's peer listener does (chain,
// allowed CN or hostname, CRL, checkSAN), ALPN "h2" for gRPC. Fails with a
// message naming the flag when a file cannot be loaded.
absl::StatusOr<SslCtxPtr> NewPeerServerContext(const PeerTls& tls);

// The context of a member dialing its peers: its client certificate, the
// peer's certificate checked (chain, allowed CN or hostname; the host
// dialed is checked by HandshakeAsClient).
absl::StatusOr<SslCtxPtr> NewPeerClientContext(const PeerTls& tls);

// A finished or failed handshake: "" when it succeeded, otherwise why, in
// Go's words. For a failed server handshake also what the client presented.
struct HandshakeResult {
  std::string error;
  std::string server_name;             // the SNI the client sent
  std::vector<std::string> ip_sans;    // the peer's certificate, if it sent one
  std::vector<std::string> dns_sans;
  bool peer_sent_certificate = false;
};

// Accepts on the connected socket fd with ctx (NewPeerServerContext),
// `remote_host` being the client's address (for checkSAN). The calling
// thread waits for the socket in poll(2), never in a read or a write: the
// handshake gives up after `timeout` ("i/o timeout") or as soon as
// `stop_fd` is readable ("use of closed network connection"; -1: no stop
// fd). A client that hangs up before the handshake ends gives "EOF", as in
// Go. On success *ssl owns the session (the caller frees it); on failure
// *ssl is null. REQUIRES: fd is non-blocking.
HandshakeResult HandshakeAsServer(SSL_CTX* ctx, int fd, const std::string& remote_host,
                                  absl::Duration timeout, int stop_fd, SSL** ssl);

// etcd's prober, reduced to the handshake: connects to host:port, makes a
// TLS handshake with ctx (NewPeerClientContext), checking that the peer's
// certificate is valid for `host`, and closes, all within timeout (a probe
// that has not finished by then fails "i/o timeout"). "" when the handshake
// succeeded, otherwise why not ("dial tcp 127.0.0.1:2380: connect:
// connection refused", "client certificate authentication failed",
// "remote error: tls: bad certificate", ...).
std::string ProbePeer(SSL_CTX* ctx, const std::string& host, int port, absl::Duration timeout);

// Connects to host:port and, when ctx is not null, makes the TLS handshake
// as ProbePeer does (ctx: NewPeerClientContext), within timeout. "" on
// success, with *fd (non-blocking, TCP_NODELAY) and *ssl (null without ctx)
// the caller's to free; otherwise why not, in ProbePeer's words, and *fd is
// -1. A refusal of this member's certificate by a TLS 1.3 listener comes
// only with the first read after the handshake.
// A readable stop_fd (-1: none) ends the attempt at once.
std::string DialPeer(SSL_CTX* ctx, const std::string& host, int port, absl::Duration timeout,
                     int stop_fd, int* fd, SSL** ssl);

// What ProbePeer writes after its handshake, so that the listener closes
// the connection at once rather than waiting for a Raft stream's request
// or gRPC's preface.
inline constexpr char kProbeByte = 'Q';

// OpenSSL writes with write(2): a peer gone mid-write must not raise
// SIGPIPE. Blocks it on the calling thread alone (one left pending ends
// with the thread); a system call the first time on each thread only.
void BlockSigpipeOnThisThread();

// Go's text for a TLS alert a peer sent ("tls: bad certificate").
std::string GoAlertText(int alert);

// Says whether a log line with `key` may be written now: at most one per
// `interval` per key; *suppressed is how many were held back since the last
// one written. Thread-safe.
class LogLimiter {
 public:
  explicit LogLimiter(absl::Duration interval) : interval_(interval) {}
  bool Allow(const std::string& key, absl::Time now, int64_t* suppressed);

 private:
  struct Entry {
    absl::Time last = absl::InfinitePast();
    int64_t suppressed = 0;
  };
  const absl::Duration interval_;
  util::Mutex mu_;
  std::map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace capstan::server::peer

#endif  // CAPSTAN_SERVER_PEER_PEER_TLS_HANDSHAKE_H_
