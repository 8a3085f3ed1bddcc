// The server's side of one HTTP/1.1 connection on a plain socket: requests
// with Content-Length or chunked bodies, one after another on a kept-alive
// connection; responses whole (Content-Length) or streamed (chunked). Enough
// of HTTP/1.1 for etcd's client-port endpoints (the JSON gateway, /health,
// /version, /metrics), which clients reach with curl or an HTTP library.
// No TLS, no pipelining (a request is answered before the next is read).

#ifndef CAPSTAN_SERVER_HTTP_HTTP1_H_
#define CAPSTAN_SERVER_HTTP_HTTP1_H_

#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "openssl/ssl.h"

namespace capstan::server {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;
  std::string path;   // the target up to '?', not unescaped
  std::string query;  // after '?', raw
  HttpHeaders headers;  // names lower-cased, in arrival order
  std::string body;
  bool keep_alive = true;
  bool http10 = false;  // an HTTP/1.0 request (no chunked answers)

  // The first header of that (lower-case) name, or null.
  const std::string* Header(absl::string_view name) const;
  // The first value of a query parameter, unescaped; "" if absent.
  std::vector<std::string> QueryValues(absl::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  HttpHeaders headers;  // Content-Length, Date and Connection are added
  std::string body;
};

// Go's http.Error: text/plain, nosniff, the text and a newline.
HttpResponse PlainError(int status, absl::string_view text);
// The reason phrase Go writes for a status ("Not Found"); "" for one Go
// has no text for (499).
absl::string_view HttpStatusText(int status);

// For a TLS call on a non-blocking socket that answered ssl_error: waits
// until the socket is ready for it to be tried again (true), or returns
// false if the error is not SSL_ERROR_WANT_READ or _WRITE or deadline
// passes first.
bool WaitForTls(int fd, int ssl_error, std::chrono::steady_clock::time_point deadline);

// Not thread-safe: one thread reads and writes a connection; another may
// shutdown(2) the socket to end a blocked read or write. Owns neither the
// socket nor the TLS connection.
class HttpConnection {
 public:
  // idle_timeout_ms bounds the wait for a request's first byte,
  // request_timeout_ms the time from there to its last; max_body bounds a
  // request body. With ssl (a handshaken TLS connection over fd, which
  // must be non-blocking), bytes go through it, and a TLS record that
  // trickles in is waited for only until the request's deadline.
  HttpConnection(int fd, int idle_timeout_ms, int request_timeout_ms, size_t max_body,
                 SSL* ssl = nullptr);

  enum class ReadResult {
    kRequest,          // *request holds the next request
    kClosed,           // the peer closed, timed out or the connection failed
    kBad,              // malformed or ambiguous: answer 400 and close
    kHeadersTooLarge,  // over 1 MB or 1000 header lines: answer 431 and close
    kTooLarge,         // a body over max_body: answer 413 and close
  };
  ReadResult Read(HttpRequest* request);

  // Writes a whole response (head_only: without its body, for HEAD). False
  // if the peer is gone.
  bool Write(const HttpResponse& response, bool keep_alive, bool head_only = false);

  // A streamed response: the status line and headers, then chunks, then
  // the last chunk. Each returns false once the peer is gone. For an
  // HTTP/1.0 request (http10) the body is unchunked and the connection
  // closes after it.
  bool BeginChunked(int status, const HttpHeaders& headers, bool http10 = false);
  bool WriteChunk(absl::string_view data);
  bool EndChunked();

  // True once a TLS read or write failed: the connection must not be shut
  // down cleanly (no close_notify).
  bool tls_failed() const { return tls_failed_; }

  // Waits up to timeout_ms for the peer to close its end; true once it has.
  // Bytes the peer sends meanwhile (a next request) are left unread, and are
  // not waited on again.
  bool PeerClosed(int timeout_ms);

 private:
  // Reads more bytes into buffer_; false at end of stream, on error or
  // after idle_timeout_ms without a byte.
  bool Fill();
  // The next line (without CRLF) from buffer_, reading as needed; false if
  // the connection ends first or the line is over max_line.
  bool ReadLine(std::string* line, size_t max_line);
  bool ReadExactly(size_t n, std::string* out);
  ReadResult ReadChunkedBody(std::string* body);
  bool SendAll(absl::string_view data);

  // One read or write of at most n bytes, through ssl_ if set: what
  // recv(2) or send(2) returns. Through TLS, waits for the socket until
  // deadline.
  ssize_t Receive(char* data, size_t n, std::chrono::steady_clock::time_point deadline);
  ssize_t Send(absl::string_view data);

  const int fd_;
  SSL* const ssl_;
  const int idle_timeout_ms_;
  const std::chrono::milliseconds request_timeout_;
  const size_t max_body_;
  // While a request is read: when it must be in.
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  bool reading_ = false;  // inside Read()
  bool raw_stream_ = false;  // the streamed answer is HTTP/1.0's
  std::string buffer_;  // read, not yet consumed
  size_t consumed_ = 0;
  bool peer_sent_more_ = false;
  bool tls_failed_ = false;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_HTTP_HTTP1_H_
