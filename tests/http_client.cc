#include "http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace capstan::testing {

using Clock = std::chrono::steady_clock;

HttpClient::HttpClient(int port) {
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Close();
}

HttpClient::~HttpClient() { Close(); }

void HttpClient::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

bool HttpClient::Send(const std::string& method, const std::string& path, const std::string& body,
                      const std::vector<std::pair<std::string, std::string>>& headers) {
  if (fd_ < 0) return false;
  std::string out = absl::StrCat(method, " ", path, " HTTP/1.1\r\n");
  bool host = false;
  for (const auto& [n, v] : headers) {
    absl::StrAppend(&out, n, ": ", v, "\r\n");
    host |= absl::AsciiStrToLower(n) == "host";
  }
  if (!host) out += "Host: 127.0.0.1\r\n";
  absl::StrAppend(&out, "Content-Length: ", body.size(), "\r\n\r\n", body);
  return SendRaw(out);
}

bool HttpClient::SendRaw(const std::string& bytes) {
  if (fd_ < 0) return false;
  chunked_ = ended_ = false;
  head_ = absl::StartsWith(bytes, "HEAD ");
  partial_.clear();
  content_length_ = -1;
  for (size_t sent = 0; sent < bytes.size();) {
    const ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

bool HttpClient::Fill(Clock::time_point deadline) {
  if (fd_ < 0) return false;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  if (left.count() <= 0) return false;
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
  char buf[65536];
  const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
  if (n <= 0) return false;
  in_.append(buf, static_cast<size_t>(n));
  return true;
}

bool HttpClient::Line(std::string* line, Clock::time_point deadline) {
  for (;;) {
    const size_t eol = in_.find("\r\n");
    if (eol != std::string::npos) {
      *line = in_.substr(0, eol);
      in_.erase(0, eol + 2);
      return true;
    }
    if (!Fill(deadline)) return false;
  }
}

bool HttpClient::Exactly(size_t n, std::string* out, Clock::time_point deadline) {
  while (in_.size() < n) {
    if (!Fill(deadline)) return false;
  }
  out->append(in_, 0, n);
  in_.erase(0, n);
  return true;
}

bool HttpClient::ReadHead(HttpAnswer* answer, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string line;
  if (!Line(&line, deadline)) return false;
  // "HTTP/1.1 200 OK"
  if (line.size() < 12 || !absl::SimpleAtoi(line.substr(9, 3), &answer->status)) return false;
  while (Line(&line, deadline)) {
    if (line.empty()) {
      chunked_ = answer->headers["transfer-encoding"] == "chunked";
      if (!chunked_) {
        content_length_ = std::strtol(answer->headers["content-length"].c_str(), nullptr, 10);
      }
      return true;
    }
    const size_t colon = line.find(':');
    if (colon == std::string::npos) return false;
    answer->headers[absl::AsciiStrToLower(line.substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return false;
}

bool HttpClient::Chunk(std::string* out, Clock::time_point deadline) {
  if (ended_) return false;
  std::string size_line;
  if (!Line(&size_line, deadline)) return false;
  const size_t size = std::strtoul(size_line.c_str(), nullptr, 16);
  if (size == 0) {
    std::string trailer;
    while (Line(&trailer, deadline) && !trailer.empty()) {
    }
    ended_ = true;
    return false;
  }
  std::string crlf;
  return Exactly(size, out, deadline) && Exactly(2, &crlf, deadline);
}

bool HttpClient::ReadBody(HttpAnswer* answer, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  if (head_) return true;  // the answer to HEAD has no body
  if (!chunked_) return Exactly(static_cast<size_t>(std::max(0L, content_length_)), &answer->body,
                                deadline);
  while (Chunk(&answer->body, deadline)) {
  }
  return ended_;
}

bool HttpClient::ReadLines(size_t n, std::vector<std::string>* lines,
                           std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  size_t got = 0;
  for (;;) {
    size_t eol;
    while (got < n && (eol = partial_.find('\n')) != std::string::npos) {
      lines->push_back(partial_.substr(0, eol));
      partial_.erase(0, eol + 1);
      ++got;
    }
    if (got >= n) return true;
    if (!Chunk(&partial_, deadline)) {
      // What is left of an ended body is a last line without a newline.
      if (ended_ && !partial_.empty()) {
        lines->push_back(partial_);
        partial_.clear();
      }
      return false;
    }
  }
}

HttpAnswer HttpClient::Request(const std::string& method, const std::string& path,
                               const std::string& body,
                               const std::vector<std::pair<std::string, std::string>>& headers,
                               std::chrono::milliseconds timeout) {
  HttpAnswer answer;
  if (!Send(method, path, body, headers) || !ReadHead(&answer, timeout) ||
      !ReadBody(&answer, timeout)) {
    answer.status = 0;
  }
  return answer;
}

HttpAnswer HttpRequestTo(int port, const std::string& method, const std::string& path,
                         const std::string& body,
                         const std::vector<std::pair<std::string, std::string>>& headers) {
  HttpClient client(port);
  return client.Request(method, path, body, headers);
}

}  // namespace capstan::testing
