#include "server/http/http1.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <ctime>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "util/go_text.h"

namespace capstan::server {
namespace {

// Go's net/http refuses request headers over 1 MB (DefaultMaxHeaderBytes).
constexpr size_t kMaxHeaderBytes = 1 << 20;
// And Capstan more than this many header lines (each costs two strings).
constexpr size_t kMaxHeaders = 1000;

// RFC 7231's IMF-fixdate, as Go writes the Date header.
std::string HttpDate() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return buf;
}

std::string Head(int status, const HttpHeaders& headers) {
  // Go writes "status code 499" for a status it has no text for.
  const absl::string_view text = HttpStatusText(status);
  std::string head = text.empty()
                         ? absl::StrCat("HTTP/1.1 ", status, " status code ", status, "\r\n")
                         : absl::StrCat("HTTP/1.1 ", status, " ", text, "\r\n");
  for (const auto& [name, value] : headers) absl::StrAppend(&head, name, ": ", value, "\r\n");
  absl::StrAppend(&head, "Date: ", HttpDate(), "\r\n");
  return head;
}

// A TLS write waits this long for room on the socket, as a plain socket's
// SO_SNDTIMEO does (ClientHttp).
constexpr auto kTlsSendTimeout = std::chrono::seconds(60);

}  // namespace

const std::string* HttpRequest::Header(absl::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return &v;
  }
  return nullptr;
}

std::vector<std::string> HttpRequest::QueryValues(absl::string_view name) const {
  // As Go's url.ParseQuery: a pair that does not unescape is skipped.
  std::vector<std::string> values;
  for (absl::string_view pair : absl::StrSplit(query, '&', absl::SkipEmpty())) {
    const size_t eq = pair.find('=');
    absl::StatusOr<std::string> key = gotext::QueryUnescape(pair.substr(0, eq));
    absl::StatusOr<std::string> value =
        gotext::QueryUnescape(eq == absl::string_view::npos ? "" : pair.substr(eq + 1));
    if (key.ok() && value.ok() && *key == name) values.push_back(*std::move(value));
  }
  return values;
}

absl::string_view HttpStatusText(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 412: return "Precondition Failed";
    case 413: return "Request Entity Too Large";
    case 431: return "Request Header Fields Too Large";
    case 421: return "Misdirected Request";
    case 429: return "Too Many Requests";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "";
  }
}

HttpResponse PlainError(int status, absl::string_view text) {
  HttpResponse r;
  r.status = status;
  r.headers = {{"Content-Type", "text/plain; charset=utf-8"}, {"X-Content-Type-Options", "nosniff"}};
  r.body = absl::StrCat(text, "\n");
  return r;
}

bool WaitForTls(int fd, int ssl_error, std::chrono::steady_clock::time_point deadline) {
  short events = 0;
  if (ssl_error == SSL_ERROR_WANT_READ) events = POLLIN;
  if (ssl_error == SSL_ERROR_WANT_WRITE) events = POLLOUT;
  if (events == 0) return false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, events, 0};
    const int ready = poll(&p, 1, static_cast<int>(left.count()));
    if (ready > 0) return true;  // readable, writable, or closed: try again
    if (ready < 0 && errno != EINTR) return false;
  }
}

HttpConnection::HttpConnection(int fd, int idle_timeout_ms, int request_timeout_ms,
                               size_t max_body, SSL* ssl)
    : fd_(fd),
      ssl_(ssl),
      idle_timeout_ms_(idle_timeout_ms),
      request_timeout_(std::chrono::milliseconds(request_timeout_ms)),
      max_body_(max_body) {}

ssize_t HttpConnection::Receive(char* data, size_t n,
                                std::chrono::steady_clock::time_point deadline) {
  if (ssl_ == nullptr) return recv(fd_, data, n, 0);
  for (;;) {
    const int got = SSL_read(ssl_, data, static_cast<int>(n));
    if (got > 0) return got;
    const int error = SSL_get_error(ssl_, got);
    if (error == SSL_ERROR_ZERO_RETURN) return 0;
    if (!WaitForTls(fd_, error, deadline)) {
      tls_failed_ = error != SSL_ERROR_WANT_READ && error != SSL_ERROR_WANT_WRITE;
      return -1;  // without EINTR: the connection failed or is late
    }
  }
}

ssize_t HttpConnection::Send(absl::string_view data) {
  if (ssl_ == nullptr) return send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
  // As SO_SNDTIMEO bounds a plain socket's send.
  const auto deadline = std::chrono::steady_clock::now() + kTlsSendTimeout;
  for (;;) {
    const int sent = SSL_write(ssl_, data.data(), static_cast<int>(data.size()));
    if (sent > 0) return sent;
    const int error = SSL_get_error(ssl_, sent);
    if (!WaitForTls(fd_, error, deadline)) {
      tls_failed_ = true;  // a late write leaves half a record behind
      return -1;
    }
  }
}

bool HttpConnection::Fill() {
  if (consumed_ > 0) {
    buffer_.erase(0, consumed_);
    consumed_ = 0;
  }
  pollfd p{fd_, POLLIN, 0};
  // Bytes TLS has decrypted already are not on the socket.
  int ready = ssl_ != nullptr && SSL_pending(ssl_) > 0 ? 1 : 0;
  while (ready == 0) {
    // Waiting for a request's first byte takes up to idle_timeout_ms_; the
    // rest of the request must come before its deadline.
    int timeout = idle_timeout_ms_;
    if (deadline_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          *deadline_ - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;  // late, however fast bytes come now
      timeout = static_cast<int>(left.count());
    }
    ready = poll(&p, 1, timeout);
    if (ready < 0 && errno == EINTR) {
      ready = 0;  // interrupted: wait again
    } else if (ready <= 0) {
      return false;
    }
  }
  char chunk[16384];
  const auto receive_deadline =
      deadline_ ? *deadline_
                : std::chrono::steady_clock::now() + std::chrono::milliseconds(idle_timeout_ms_);
  ssize_t n;
  do {
    errno = 0;
    n = Receive(chunk, sizeof(chunk), receive_deadline);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  buffer_.append(chunk, static_cast<size_t>(n));
  if (reading_ && !deadline_) deadline_ = std::chrono::steady_clock::now() + request_timeout_;
  return true;
}

bool HttpConnection::ReadLine(std::string* line, size_t max_line) {
  size_t scanned = 0;  // bytes past consumed_ known to hold no CRLF start
  for (;;) {
    const size_t eol = buffer_.find("\r\n", consumed_ + scanned);
    if (eol != std::string::npos) {
      if (eol - consumed_ > max_line) return false;
      line->assign(buffer_, consumed_, eol - consumed_);
      consumed_ = eol + 2;
      return true;
    }
    const size_t pending = buffer_.size() - consumed_;
    if (pending > max_line + 1) return false;
    scanned = pending == 0 ? 0 : pending - 1;
    if (!Fill()) return false;  // keeps the pending bytes, now from offset 0
  }
}

bool HttpConnection::ReadExactly(size_t n, std::string* out) {
  while (buffer_.size() - consumed_ < n) {
    if (!Fill()) return false;
  }
  out->append(buffer_, consumed_, n);
  consumed_ += n;
  return true;
}

HttpConnection::ReadResult HttpConnection::ReadChunkedBody(std::string* body) {
  for (;;) {
    std::string size_line;
    if (!ReadLine(&size_line, 1024)) return ReadResult::kBad;
    const absl::string_view hex = absl::StripAsciiWhitespace(
        absl::string_view(size_line).substr(0, size_line.find(';')));
    uint64_t size = 0;
    // Digits only: SimpleHexAtoi would also take a sign or "0x".
    if (hex.empty() || hex.size() > 15 ||
        hex.find_first_not_of("0123456789abcdefABCDEF") != absl::string_view::npos ||
        !absl::SimpleHexAtoi(hex, &size)) {
      return ReadResult::kBad;
    }
    if (size == 0) break;
    if (body->size() + size > max_body_) return ReadResult::kTooLarge;
    std::string crlf;
    if (!ReadExactly(size, body) || !ReadExactly(2, &crlf) || crlf != "\r\n") return ReadResult::kBad;
  }
  // Trailers, up to the empty line.
  for (std::string trailer;;) {
    if (!ReadLine(&trailer, kMaxHeaderBytes)) return ReadResult::kBad;
    if (trailer.empty()) return ReadResult::kRequest;
  }
}

HttpConnection::ReadResult HttpConnection::Read(HttpRequest* request) {
  *request = HttpRequest();
  // The deadline starts with the request's first byte (see Fill).
  deadline_.reset();
  reading_ = true;
  if (buffer_.size() > consumed_) deadline_ = std::chrono::steady_clock::now() + request_timeout_;
  std::string line;
  // Go's server skips empty lines before a request line.
  do {
    if (!ReadLine(&line, kMaxHeaderBytes)) {
      return buffer_.size() - consumed_ > kMaxHeaderBytes ? ReadResult::kHeadersTooLarge
                                                          : ReadResult::kClosed;
    }
  } while (line.empty());
  std::vector<std::string> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || parts[0].empty() || parts[1].empty() ||
      (parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0")) {
    return ReadResult::kBad;
  }
  request->method = parts[0];
  const size_t q = parts[1].find('?');
  request->path = parts[1].substr(0, q);
  if (q != std::string::npos) request->query = parts[1].substr(q + 1);
  request->http10 = parts[2] == "HTTP/1.0";
  request->keep_alive = !request->http10;

  // Go counts a header block's bytes with their line ends.
  size_t header_bytes = line.size() + 2;
  for (;;) {
    if (!ReadLine(&line, kMaxHeaderBytes)) {
      return buffer_.size() - consumed_ > kMaxHeaderBytes ? ReadResult::kHeadersTooLarge
                                                          : ReadResult::kBad;
    }
    if (line.empty()) break;
    header_bytes += line.size() + 2;
    if (header_bytes > kMaxHeaderBytes || request->headers.size() >= kMaxHeaders) {
      return ReadResult::kHeadersTooLarge;
    }
    // A name is a token: no spaces (a "Name :" would hide a header), and
    // no folded continuation lines.
    const size_t colon = line.find(':');
    if (colon == std::string::npos || colon == 0 ||
        line.find_first_of(" \t") < colon) {
      return ReadResult::kBad;
    }
    request->headers.emplace_back(
        absl::AsciiStrToLower(line.substr(0, colon)),
        std::string(absl::StripAsciiWhitespace(absl::string_view(line).substr(colon + 1))));
  }
  if (const std::string* c = request->Header("connection")) {
    const std::string v = absl::AsciiStrToLower(*c);
    if (v == "close") request->keep_alive = false;
    if (v == "keep-alive") request->keep_alive = true;
  }
  // As Go's server: HTTP/1.1 needs a Host; one body length, stated once.
  int host = 0, lengths = 0, encodings = 0;
  const std::string* length = nullptr;
  for (const auto& [name, value] : request->headers) {
    host += name == "host";
    if (name == "content-length") {
      if (length != nullptr && *length != value) return ReadResult::kBad;
      length = &value;
      ++lengths;
    }
    encodings += name == "transfer-encoding";
  }
  if ((!request->http10 && host != 1) || host > 1 || encodings > 1 ||
      (encodings == 1 && lengths > 0)) {
    return ReadResult::kBad;
  }
  if (const std::string* e = request->Header("expect");
      e != nullptr && absl::EqualsIgnoreCase(*e, "100-continue")) {
    if (!SendAll("HTTP/1.1 100 Continue\r\n\r\n")) return ReadResult::kClosed;
  }
  if (const std::string* te = request->Header("transfer-encoding")) {
    if (!absl::EqualsIgnoreCase(*te, "chunked") || request->http10) return ReadResult::kBad;
    return ReadChunkedBody(&request->body);
  }
  if (length != nullptr) {
    uint64_t n = 0;
    if (length->empty() || length->find_first_not_of("0123456789") != std::string::npos ||
        !absl::SimpleAtoi(*length, &n)) {
      return ReadResult::kBad;
    }
    if (n > max_body_) return ReadResult::kTooLarge;
    if (!ReadExactly(n, &request->body)) return ReadResult::kClosed;
  }
  deadline_.reset();
  reading_ = false;
  return ReadResult::kRequest;
}

bool HttpConnection::SendAll(absl::string_view data) {
  while (!data.empty()) {
    errno = 0;
    const ssize_t n = Send(data);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool HttpConnection::Write(const HttpResponse& response, bool keep_alive, bool head_only) {
  std::string out = Head(response.status, response.headers);
  absl::StrAppend(&out, "Content-Length: ", response.body.size(), "\r\n");
  if (!keep_alive) out += "Connection: close\r\n";
  out += "\r\n";
  if (!head_only) out += response.body;
  return SendAll(out);
}

bool HttpConnection::BeginChunked(int status, const HttpHeaders& headers, bool http10) {
  raw_stream_ = http10;
  // HTTP/1.0 has no chunks: the body runs until the connection closes.
  return SendAll(absl::StrCat(Head(status, headers),
                              http10 ? "Connection: close\r\n\r\n"
                                     : "Transfer-Encoding: chunked\r\n\r\n"));
}

bool HttpConnection::WriteChunk(absl::string_view data) {
  if (data.empty()) return true;  // an empty chunk would end the body
  if (raw_stream_) return SendAll(data);
  return SendAll(absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n"));
}

bool HttpConnection::EndChunked() { return raw_stream_ || SendAll("0\r\n\r\n"); }

bool HttpConnection::PeerClosed(int timeout_ms) {
  pollfd p{fd_, static_cast<short>(peer_sent_more_ ? POLLRDHUP : POLLIN | POLLRDHUP), 0};
  if (poll(&p, 1, timeout_ms) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) return true;
  char c;
  const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;
  if (n > 0) peer_sent_more_ = true;
  return n < 0 && errno != EAGAIN && errno != EINTR;
}

}  // namespace capstan::server
