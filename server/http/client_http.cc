#include "server/http/client_http.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "openssl/err.h"
#include "server/http/http_endpoints.h"
#include "server/http/json_gateway.h"
#include "spdlog/spdlog.h"
#include "util/go_text.h"

namespace capstan::server {
namespace {

// A kept-alive connection may idle this long between requests; a request
// must arrive whole within kRequestTimeoutMs of its first byte. (etcd's
// server sets neither; Capstan bounds what a connection can hold.)
constexpr int kIdleTimeoutMs = 2 * 60 * 1000;
constexpr int kRequestTimeoutMs = 60 * 1000;
// A peer that stops reading a response is dropped after this long.
constexpr int kSendTimeoutSeconds = 60;
// A TLS client has this long to complete its handshake.
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);

// The host of a Host header, without its port (etcd's
// httputil.GetHostname: the header as it is if it has no port).
std::string HostName(const std::string& host) {
  std::string name, port;
  return gotext::SplitHostPort(host, &name, &port).ok() ? name : host;
}

// etcd's answer to a Host outside --host-whitelist (embed/serve.go).
std::string DnsRebindingText(const std::string& host) {
  return absl::StrFormat(
      "\netcd received your request, but the Host header was unrecognized.\n\n"
      "To fix this, choose one of the following options:\n"
      "- Enable TLS, then any HTTPS request will be allowed.\n"
      "- Add the hostname you want to use to the whitelist in settings.\n"
      "  - e.g. etcd --host-whitelist %s\n\n"
      "This requirement has been added to help prevent \"DNS Rebinding\" attacks "
      "(CVE-2018-5702).\n",
      gotext::GoQuote(host));
}

}  // namespace

ClientHttp::ClientHttp(const HttpEndpoints* endpoints, const JsonGateway* gateway,
                       ClientHttpOptions options)
    : endpoints_(endpoints), gateway_(gateway), options_(std::move(options)) {}

ClientHttp::~ClientHttp() { Stop(); }

void ClientHttp::Adopt(int fd, SSL_CTX* tls) {
  {
    util::MutexLock lock(&mu_);
    if (stopped_ || fds_.size() >= kMaxConnections) {
      if (!stopped_ && tls == nullptr) {
        // Told, not left to guess; the socket's buffer is empty, so this
        // does not block.
        static constexpr char kBusy[] =
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
            "Connection: close\r\nContent-Length: 20\r\n\r\ntoo many connections";
        (void)!send(fd, kBusy, sizeof(kBusy) - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      close(fd);
      return;
    }
    fds_.insert(fd);
  }
  timeval send_timeout{kSendTimeoutSeconds, 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof(send_timeout));
  std::thread([this, fd, tls] {
    if (tls != nullptr) {
      ServeTlsConnection(fd, tls);
    } else {
      ServeConnection(fd, nullptr, nullptr);
    }
    // Closed under the lock: once closed, the number may be reused by a new
    // connection, which must not find it still in fds_ (nor Stop() shut
    // down a stranger's socket).
    util::MutexLock lock(&mu_);
    fds_.erase(fd);
    close(fd);  // wakes Stop once fds_ is empty
  }).detach();
}

void ClientHttp::Stop() {
  stopping_ = true;
  util::MutexLock lock(&mu_);
  stopped_ = true;
  for (int fd : fds_) shutdown(fd, SHUT_RDWR);
  auto served = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return fds_.empty(); };
  mu_.Await(absl::Condition(&served));
}

void ClientHttp::ServeTlsConnection(int fd, SSL_CTX* tls) {
  // OpenSSL writes with write(2): a client gone mid-answer must not raise
  // SIGPIPE. Blocked on this thread alone; one left pending ends with it.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  // Non-blocking, so that no TLS record trickling in holds a read past its
  // deadline: the handshake gets kHandshakeTimeout in all, a request its
  // deadline (HttpConnection).
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK);
  SSL* ssl = SSL_new(tls);
  bool handshaken = ssl != nullptr && SSL_set_fd(ssl, fd) == 1;
  const auto deadline = std::chrono::steady_clock::now() + kHandshakeTimeout;
  while (handshaken) {
    const int r = SSL_accept(ssl);
    if (r == 1) break;
    handshaken = WaitForTls(fd, SSL_get_error(ssl, r), deadline);
  }
  if (handshaken) {
    bool failed = false;
    ServeConnection(fd, ssl, &failed);
    // close_notify, unless the connection failed (OpenSSL forbids it then);
    // never waited for.
    if (!failed) SSL_shutdown(ssl);
  }
  SSL_free(ssl);
  ERR_clear_error();
}

void ClientHttp::ServeConnection(int fd, SSL* ssl, bool* tls_failed) {
  HttpConnection connection(fd, kIdleTimeoutMs, kRequestTimeoutMs, options_.max_body, ssl);
  struct Report {
    const HttpConnection& connection;
    bool* failed;
    ~Report() {
      if (failed != nullptr) *failed = connection.tls_failed();
    }
  } report{connection, tls_failed};
  for (;;) {
    HttpRequest request;
    const HttpConnection::ReadResult result = connection.Read(&request);
    switch (result) {
      case HttpConnection::ReadResult::kRequest:
        break;
      case HttpConnection::ReadResult::kClosed:
        return;
      case HttpConnection::ReadResult::kBad:
      case HttpConnection::ReadResult::kHeadersTooLarge:
      case HttpConnection::ReadResult::kTooLarge: {
        // As Go's server answers what it cannot read, and closes.
        HttpResponse r;
        r.status = result == HttpConnection::ReadResult::kBad               ? 400
                   : result == HttpConnection::ReadResult::kHeadersTooLarge ? 431
                                                                            : 413;
        r.headers = {{"Content-Type", "text/plain; charset=utf-8"}};
        r.body = absl::StrCat(r.status, " ", HttpStatusText(r.status));
        connection.Write(r, false);
        return;
      }
    }
    if (!Answer(request, ssl != nullptr, &connection) || !request.keep_alive || stopping_) return;
  }
}

bool ClientHttp::Answer(const HttpRequest& request, bool tls, HttpConnection* connection) {
  auto reply = [&](HttpResponse response, const HttpHeaders& first) {
    response.headers.insert(response.headers.begin(), first.begin(), first.end());
    return connection->Write(response, request.keep_alive, request.method == "HEAD");
  };
  // etcd's DNS-rebinding check: "any HTTPS request will be allowed".
  if (!tls && options_.host_whitelist.count("*") == 0) {
    const std::string* host_header = request.Header("host");
    const std::string host = HostName(host_header ? *host_header : "");
    if (options_.host_whitelist.count(host) == 0) {
      SPDLOG_WARN("rejecting HTTP request from \"{}\" to prevent DNS rebinding attacks", host);
      return reply(PlainError(421, DnsRebindingText(host)), {});
    }
  }
  HttpHeaders cors;
  std::string origin;
  if (options_.cors.count("*") > 0) {
    origin = "*";
  } else if (const std::string* o = request.Header("origin");
             o != nullptr && options_.cors.count(*o) > 0) {
    origin = *o;
  }
  if (!origin.empty()) {
    cors = {{"Access-Control-Allow-Methods", "POST, GET, OPTIONS, PUT, DELETE"},
            {"Access-Control-Allow-Origin", origin},
            {"Access-Control-Allow-Headers", "accept, content-type, authorization"}};
  }
  if (request.method == "OPTIONS") return reply(HttpResponse{}, cors);

  // etcd (3.4 and 3.5) still answers the /v3beta/ paths as /v3/ ones.
  std::string path = request.path;
  if (absl::StartsWith(path, "/v3beta/")) path.replace(0, 8, "/v3/");
  if (gateway_ != nullptr && absl::StartsWith(path, "/v3/")) {
    const auto* method = gateway_->Route(path);
    // grpc-gateway's routing errors: NotFound, and Unimplemented (501) for
    // a method the path is not served with.
    if (method == nullptr) return reply(GatewayError(5, "Not Found", {}), cors);
    if (request.method != "POST") return reply(GatewayError(12, "Method Not Allowed", {}), cors);
    return gateway_->Serve(method, request, cors, stopping_, connection);
  }
  EndpointQuery query;
  query.exclude = request.QueryValues("exclude");
  query.verbose = !request.QueryValues("verbose").empty();
  const std::vector<std::string> serializable = request.QueryValues("serializable");
  query.serializable = !serializable.empty() && serializable.front() == "true";
  if (std::optional<HttpResponse> answer = endpoints_->Answer(request.method, request.path, query)) {
    return reply(*std::move(answer), cors);
  }
  return reply(PlainError(404, "404 page not found"), cors);
}

}  // namespace capstan::server
