// HTTP/1.1 on the client URLs, as etcd serves it beside gRPC: the JSON
// gateway (/v3/...), /health, /version, /metrics (and /livez, /readyz),
// with etcd's CORS headers (--cors) and, on plain connections, its
// DNS-rebinding check (--host-whitelist). Each connection, plain or TLS, is
// served on a thread of its own.

#ifndef CAPSTAN_SERVER_HTTP_CLIENT_HTTP_H_
#define CAPSTAN_SERVER_HTTP_CLIENT_HTTP_H_

#include <atomic>
#include <cstddef>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "openssl/ssl.h"
#include "server/http/http1.h"
#include "util/mutex.h"

namespace capstan::server {

class HttpEndpoints;
class JsonGateway;

struct ClientHttpOptions {
  std::set<std::string> cors = {"*"};            // origins allowed, or "*"
  std::set<std::string> host_whitelist = {"*"};  // Host names allowed, or "*"
  size_t max_body = 0;                           // bytes of a request body
};

// Thread-safe.
class ClientHttp {
 public:
  // gateway may be null (--enable-grpc-gateway=false: no /v3/). endpoints
  // and gateway must outlive Stop().
  ClientHttp(const HttpEndpoints* endpoints, const JsonGateway* gateway, ClientHttpOptions options);
  ~ClientHttp();

  // Serves the connected socket fd until the client or Stop() ends it, then
  // closes it. Past kMaxConnections at once, closes it unserved. With tls,
  // the connection starts with a TLS handshake in that context (which must
  // outlive Stop()).
  void Adopt(int fd, SSL_CTX* tls = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // Ends every connection (a streaming answer ends as the server's gRPC
  // calls do) and waits for their threads. Adopt afterwards closes at once.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  static constexpr int kMaxConnections = 512;

 private:
  // The TLS handshake, then ServeConnection.
  void ServeTlsConnection(int fd, SSL_CTX* tls);
  // ssl: the connection's TLS, or null; *tls_failed (if given) is set when
  // it failed.
  void ServeConnection(int fd, SSL* ssl, bool* tls_failed);
  // Answers one request. False: close the connection.
  bool Answer(const HttpRequest& request, bool tls, HttpConnection* connection);

  const HttpEndpoints* const endpoints_;
  const JsonGateway* const gateway_;
  const ClientHttpOptions options_;
  std::atomic<bool> stopping_{false};

  // The connections. A leaf. Sockets are closed (and shut down, by Stop)
  // under it, on purpose: a descriptor number leaves fds_ only once closed,
  // so a new connection never finds its number still there. Neither call
  // blocks. Stop waits on a condition over fds_.
  util::Mutex mu_;
  std::set<int> fds_ ABSL_GUARDED_BY(mu_);  // being served
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_HTTP_CLIENT_HTTP_H_
