// A TCP listener for an http:// or https:// client URL, shared by gRPC and
// HTTP/1.1 as etcd shares its client port. Each accepted connection is told
// apart by its first bytes, which are only peeked at:
//
//   http://   HTTP/2's connection preface ("PRI * HTTP/2.0") goes to the
//             gRPC server, any other connection to the HTTP handler;
//   https://  a TLS ClientHello that offers HTTP/2 by ALPN and not HTTP/1.1
//             (gRPC clients offer h2 alone) goes to gRPC, which does its
//             own handshake; any other connection (curl, browsers,
//             Prometheus, clients naming no protocol) to the HTTP handler,
//             which does the TLS handshake with the same settings.
//
// With --listen-client-http-urls a listener (http:// or https://) serves
// HTTP only and gRPC keeps its own listeners.

#ifndef CAPSTAN_SERVER_HTTP_CLIENT_LISTENER_H_
#define CAPSTAN_SERVER_HTTP_CLIENT_LISTENER_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace grpc {
class Server;
namespace experimental {
class ExternalConnectionAcceptor;
}
}  // namespace grpc

namespace capstan::server {

// Thread-safe. One thread accepts and sorts connections.
class ClientListener {
 public:
  // Takes a connected socket (blocking mode) and must close it.
  using HttpHandler = std::function<void(int fd)>;

  // Binds every address host resolves to, on port (0 picks a free one),
  // with SO_REUSEADDR, as Go listens, and SO_REUSEPORT if asked
  // (--socket-reuse-port). Errors are worded like the Go net.Listen errors
  // etcd prints.
  static absl::StatusOr<std::unique_ptr<ClientListener>> Bind(const std::string& host, int port,
                                                              bool reuse_port);
  ~ClientListener();

  int port() const { return port_; }

  // Starts accepting plain connections. grpc_server null: every connection
  // is HTTP's. REQUIRES: grpc_server (if any) is started and outlives
  // Stop(); Start or StartTls is called at most once.
  void Start(grpc::Server* grpc_server, HttpHandler http);
  // Starts accepting TLS connections: gRPC's go to grpc (an acceptor of the
  // started gRPC server, with its TLS credentials), the rest to https with
  // their ClientHello unread; grpc null: every connection is https's.
  // REQUIRES: grpc (if any) outlives Stop().
  void StartTls(grpc::experimental::ExternalConnectionAcceptor* grpc, HttpHandler https);

  // Stops accepting and closes connections not yet handed over. After it
  // returns nothing more reaches the gRPC server or the handler. Idempotent.
  void Stop();

 private:
  ClientListener(std::vector<int> fds, int port);
  void Run();

  const std::vector<int> listen_fds_;
  const int port_;
  int wake_[2] = {-1, -1};  // a pipe: a byte ends Run()
  grpc::Server* grpc_server_ = nullptr;
  grpc::experimental::ExternalConnectionAcceptor* grpc_tls_ = nullptr;
  bool tls_ = false;
  HttpHandler http_;
  std::thread thread_;
};

// Whether a TLS ClientHello (the body of its handshake record) is a gRPC
// client's: its ALPN protocols include h2 or grpc-exp and not http/1.1.
// False for anything else, malformed or cut input included. Exposed for
// tests.
bool ClientHelloIsGrpcs(std::string_view hello);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_HTTP_CLIENT_LISTENER_H_
