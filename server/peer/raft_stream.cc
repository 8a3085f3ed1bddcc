#include "server/peer/raft_stream.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "openssl/err.h"
#include "server/peer/peer_protocol.h"
#include "server/peer/peer_service.h"
#include "server/peer/peer_tls_handshake.h"
#include "spdlog/spdlog.h"

namespace capstan::server::peer {
namespace {

// The longest request or answer head a stream reads.
constexpr size_t kMaxHead = 16 << 10;
// How much a receiver reads at a time.
constexpr size_t kReadChunk = 64 << 10;
// How often a busy sender looks at what the receiver sent (its heartbeats).
constexpr absl::Duration kDrainInterval = absl::Seconds(1);

void AppendLength(std::string* out, uint64_t n) {
  char b[8];
  for (int i = 7; i >= 0; --i, n >>= 8) b[i] = static_cast<char>(n & 0xff);
  out->append(b, 8);
}

uint64_t ReadLength(const char* p) {
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n = (n << 8) | static_cast<unsigned char>(p[i]);
  return n;
}

// A request or answer head: the first line, and the headers by lower-case
// name.
struct Head {
  std::string first_line;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string Header(const std::string& name) const {
    for (const auto& [key, value] : headers) {
      if (key == name) return value;
    }
    return {};
  }
};

// (Debian's Abseil has a string_view of its own: absl::string_view here.)
Head ParseHead(absl::string_view text) {
  Head head;
  bool first = true;
  for (absl::string_view line : absl::StrSplit(text, "\r\n")) {
    if (first) {
      head.first_line = std::string(line);
      first = false;
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;
    head.headers.emplace_back(absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, colon))),
                              std::string(absl::StripAsciiWhitespace(line.substr(colon + 1))));
  }
  return head;
}

// Reads until *in holds a whole head ("\r\n\r\n"); its length with the
// blank line, or 0 when the connection ended, broke or stalled first.
size_t ReadHead(PeerConn* conn, std::string* in, absl::Time deadline, int stop_fd) {
  char buf[4096];
  while (true) {
    const size_t end = in->find("\r\n\r\n");
    if (end != std::string::npos) return end + 4;
    if (in->size() > kMaxHead) return 0;
    size_t got = 0;
    if (conn->Read(buf, sizeof buf, &got, deadline, stop_fd) != PeerConn::Io::kOk) return 0;
    in->append(buf, got);
  }
}

std::string HttpAnswer(int code, const std::string& reason, const std::string& text) {
  return absl::StrCat("HTTP/1.1 ", code, " ", reason, "\r\nContent-Type: text/plain; charset=utf-8\r\n",
                      "Content-Length: ", text.size(), "\r\n\r\n", text);
}

// rafthttp's answer to a refused stream request.
std::string Refusal(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::FAILED_PRECONDITION:
      return HttpAnswer(412, "Precondition Failed", status.error_message());
    case grpc::PERMISSION_DENIED:
      return HttpAnswer(410, "Gone", status.error_message());
    case grpc::INVALID_ARGUMENT:
      return HttpAnswer(400, "Bad Request", status.error_message());
    default:
      return HttpAnswer(500, "Internal Server Error", status.error_message());
  }
}

// A refusal's status as the sender reports it (the gRPC stream's codes).
absl::Status RefusalStatus(int code, std::string text) {
  switch (code) {
    case 412:
      return absl::FailedPreconditionError(text);
    case 403:
    case 410:
      return absl::PermissionDeniedError(text);
    case 400:
      return absl::InvalidArgumentError(text);
    case 404:
      return absl::NotFoundError(text);
    default:
      return absl::UnavailableError(absl::StrCat("unexpected http status ", code, ": ", text));
  }
}

std::string HostPort(const std::string& host, int port) {
  return host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                              : absl::StrCat(host, ":", port);
}

}  // namespace

PeerConn::PeerConn(int fd, SSL* ssl) : fd_(fd), ssl_(ssl) {}

PeerConn::~PeerConn() {
  if (ssl_ != nullptr) SSL_free(ssl_);
  close(fd_);
}

PeerConn::Io PeerConn::Await(short events, absl::Time deadline, int stop_fd) {
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return Io::kTimedOut;
    // Rounded up, so that a wait never ends just before the deadline.
    const int64_t ms =
        deadline == absl::InfiniteFuture()
            ? -1
            : std::min<int64_t>(absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1))),
                                INT_MAX);
    pollfd fds[2] = {{fd_, events, 0}, {stop_fd, POLLIN, 0}};
    const int n = poll(fds, stop_fd >= 0 ? 2 : 1, static_cast<int>(ms));
    if (n < 0 && errno != EINTR) return Io::kEnd;
    if (n <= 0) continue;
    if (stop_fd >= 0 && fds[1].revents != 0) return Io::kStopped;
    // Ready, or an error or a hang-up that the next call reports.
    if (fds[0].revents != 0) return Io::kOk;
  }
}

PeerConn::Io PeerConn::Read(char* buf, size_t n, size_t* got, absl::Time deadline, int stop_fd) {
  *got = 0;
  const size_t len = std::min<size_t>(n, INT_MAX);
  while (true) {
    short want = POLLIN;
    if (ssl_ != nullptr) {
      ERR_clear_error();
      const int r = SSL_read(ssl_, buf, static_cast<int>(len));
      if (r > 0) {
        *got = static_cast<size_t>(r);
        return Io::kOk;
      }
      const int e = SSL_get_error(ssl_, r);
      if (e == SSL_ERROR_WANT_WRITE) {
        want = POLLOUT;
      } else if (e != SSL_ERROR_WANT_READ) {
        ERR_clear_error();
        return Io::kEnd;
      }
    } else {
      const ssize_t r = recv(fd_, buf, len, 0);
      if (r > 0) {
        *got = static_cast<size_t>(r);
        return Io::kOk;
      }
      if (r == 0) return Io::kEnd;
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Io::kEnd;
    }
    if (const Io w = Await(want, deadline, stop_fd); w != Io::kOk) return w;
  }
}

PeerConn::Io PeerConn::WriteSome(const char* buf, size_t n, size_t* written, short* want) {
  *want = 0;
  while (*written < n) {
    const size_t len = std::min<size_t>(n - *written, INT_MAX);
    if (ssl_ != nullptr) {
      // OpenSSL writes with write(2), on whichever thread calls this.
      BlockSigpipeOnThisThread();
      ERR_clear_error();
      // Partial writes from a moved buffer (the peer contexts' modes): a
      // retry passes the bytes not yet taken, wherever they are.
      const int w = SSL_write(ssl_, buf + *written, static_cast<int>(len));
      if (w > 0) {
        *written += static_cast<size_t>(w);
        continue;
      }
      const int e = SSL_get_error(ssl_, w);
      if (e == SSL_ERROR_WANT_READ) {
        *want = POLLIN;
      } else if (e == SSL_ERROR_WANT_WRITE) {
        *want = POLLOUT;
      } else {
        ERR_clear_error();
        return Io::kEnd;
      }
      return Io::kOk;
    }
    const ssize_t w = send(fd_, buf + *written, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      *written += static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return Io::kEnd;
    *want = POLLOUT;
    return Io::kOk;
  }
  return Io::kOk;
}

PeerConn::Io PeerConn::Write(const char* buf, size_t n, absl::Duration stall, int stop_fd) {
  size_t done = 0;
  absl::Time deadline = absl::Now() + stall;
  while (true) {
    const size_t before = done;
    short want = 0;
    if (const Io w = WriteSome(buf, n, &done, &want); w != Io::kOk) return w;
    if (want == 0) return Io::kOk;
    // The stall counts from the last write that took something.
    if (done > before) deadline = absl::Now() + stall;
    if (const Io a = Await(want, deadline, stop_fd); a != Io::kOk) return a;
  }
}

PeerConn::Io PeerConn::TryWrite(const char* buf, size_t n, size_t* written) {
  *written = 0;
  short want = 0;
  return WriteSome(buf, n, written, &want);
}

void ServeRaftStream(PeerConn* conn, const PeerService& service, int stop_fd) {
  std::string in;
  // The sender writes its request as soon as it is connected.
  const size_t head_len = ReadHead(conn, &in, absl::Now() + kRaftStreamTimeout, stop_fd);
  if (head_len == 0) return;
  const Head head = ParseHead(absl::string_view(in).substr(0, head_len - 4));
  const std::vector<std::string> request = absl::StrSplit(head.first_line, ' ');
  if (request.size() != 3 || request[0] != "GET" || request[1] != kRaftStreamPath) {
    const std::string answer = HttpAnswer(404, "Not Found", "404 page not found\n");
    conn->Write(answer.data(), answer.size(), kRaftStreamTimeout, stop_fd);
    return;
  }
  uint64_t from = 0;
  const grpc::Status admitted = service.AdmitIdentity(
      head.Header("x-etcd-cluster-id"), head.Header("x-server-from"), head.Header("x-raft-to"), &from);
  if (!admitted.ok()) {
    const std::string answer = Refusal(admitted);
    conn->Write(answer.data(), answer.size(), kRaftStreamTimeout, stop_fd);
    return;
  }
  {
    const std::string answer = absl::StrCat("HTTP/1.1 200 OK\r\nX-Etcd-Cluster-ID: ",
                                            head.Header("x-etcd-cluster-id"), "\r\n\r\n");
    if (conn->Write(answer.data(), answer.size(), kRaftStreamTimeout, stop_fd) != PeerConn::Io::kOk) {
      return;
    }
  }
  // buf[0, filled) holds what was read and not yet handed on. It grows
  // (doubling) only as far as a frame needs, as its bytes arrive, and
  // shrinks back once a large frame is through.
  std::string buf = in.substr(head_len);
  size_t filled = buf.size();
  buf.resize(std::max(buf.size(), kReadChunk));
  std::atomic<uint64_t>* const received = service.ReceivedCounter(from);
  static constexpr char kHeartbeat[8] = {};
  absl::Time heard = absl::Now();
  absl::Time next_heartbeat = heard + kRaftStreamHeartbeat;
  while (true) {
    // Hand on every whole message read so far.
    size_t pos = 0;
    while (filled - pos >= 8) {
      const uint64_t len = ReadLength(buf.data() + pos);
      if (len > kRaftStreamMaxMessage) {
        SPDLOG_WARN("failed to read raft message from {}: message of {} bytes is too large",
                    IdText(from), len);
        return;
      }
      if (filled - pos - 8 < len) break;
      if (len > 0) {
        const grpc::Status s = service.HandleMessage(from, buf.substr(pos + 8, len), received);
        if (!s.ok()) {
          SPDLOG_WARN("failed to read raft message from {}: {}", IdText(from), s.error_message());
          return;
        }
      }
      pos += 8 + len;
    }
    if (pos > 0) {
      std::memmove(buf.data(), buf.data() + pos, filled - pos);
      filled -= pos;
      if (buf.size() > 4 * kReadChunk && filled < kReadChunk) {
        buf.resize(kReadChunk);
        buf.shrink_to_fit();
      }
    }
    absl::Time now = absl::Now();
    if (now >= next_heartbeat) {
      if (conn->Write(kHeartbeat, sizeof kHeartbeat, kRaftStreamTimeout, stop_fd) !=
          PeerConn::Io::kOk) {
        return;
      }
      next_heartbeat = now + kRaftStreamHeartbeat;
    }
    if (buf.size() - filled < kReadChunk / 2) {
      // Room for what the frame being read still lacks, at most twice the
      // buffer at a time.
      uint64_t need = filled + kReadChunk;
      if (filled >= 8) need = std::max<uint64_t>(need, ReadLength(buf.data()) + 8);
      buf.resize(std::min<uint64_t>(need, std::max<size_t>(2 * buf.size(), kReadChunk)));
    }
    size_t got = 0;
    const PeerConn::Io io = conn->Read(buf.data() + filled, buf.size() - filled, &got,
                                       std::min(heard + kRaftStreamTimeout, next_heartbeat), stop_fd);
    filled += got;
    if (io == PeerConn::Io::kOk) {
      heard = absl::Now();
      // Checked for what each read brought, before any of it is handed on.
      if (service.IsRemoved(from)) {
        SPDLOG_WARN("rejected stream from remote peer {} because it was removed", IdText(from));
        return;
      }
    } else if (io == PeerConn::Io::kTimedOut) {
      if (absl::Now() >= heard + kRaftStreamTimeout) {
        SPDLOG_WARN("lost the raft stream from {}: nothing read for {}", IdText(from),
                    absl::FormatDuration(kRaftStreamTimeout));
        return;
      }
    } else {
      return;  // ended, broke, or the listener stops
    }
  }
}

RaftStreamSender::RaftStreamSender(std::unique_ptr<PeerConn> conn, int stop_fd)
    : conn_(std::move(conn)), stop_fd_(stop_fd), heard_(absl::Now()), drained_(absl::Now()) {}

absl::StatusOr<std::unique_ptr<RaftStreamSender>> RaftStreamSender::Dial(const Target& target,
                                                                         absl::Duration timeout,
                                                                         int stop_fd) {
  int fd = -1;
  SSL* ssl = nullptr;
  const std::string error =
      DialPeer(target.tls, target.host, target.port, timeout, stop_fd, &fd, &ssl);
  if (!error.empty()) return absl::UnavailableError(error);
  return std::unique_ptr<RaftStreamSender>(
      new RaftStreamSender(std::make_unique<PeerConn>(fd, ssl), stop_fd));
}

absl::Status RaftStreamSender::Start(const Target& target, uint64_t cluster_id, uint64_t from,
                                     uint64_t to, absl::Duration timeout, absl::Duration silence) {
  silence_ = silence;
  const std::string request =
      absl::StrCat("GET ", kRaftStreamPath, " HTTP/1.1\r\nHost: ", HostPort(target.host, target.port),
                   "\r\nX-Etcd-Cluster-ID: ", IdText(cluster_id), "\r\nX-Server-From: ", IdText(from),
                   "\r\nX-Raft-To: ", IdText(to), "\r\n\r\n");
  if (conn_->Write(request.data(), request.size(), timeout, stop_fd_) != PeerConn::Io::kOk) {
    return absl::UnavailableError("the peer closed the connection");
  }
  std::string in;
  const size_t head_len = ReadHead(conn_.get(), &in, absl::Now() + timeout, stop_fd_);
  if (head_len == 0) return absl::UnavailableError("no answer to the raft stream request");
  const Head head = ParseHead(absl::string_view(in).substr(0, head_len - 4));
  const std::vector<std::string> status = absl::StrSplit(head.first_line, absl::MaxSplits(' ', 2));
  int code = 0;
  if (status.size() < 2 || !absl::SimpleAtoi(status[1], &code)) {
    return absl::UnavailableError(absl::StrCat("bad answer to the raft stream request: ", head.first_line));
  }
  if (code == 200) {
    heard_ = drained_ = absl::Now();
    return absl::OkStatus();  // what follows the head is heartbeats
  }
  size_t length = 0;
  if (!absl::SimpleAtoi(head.Header("content-length"), &length) || length > kMaxHead) length = 0;
  std::string body = in.substr(head_len);
  const absl::Time deadline = absl::Now() + timeout;
  char buf[1024];
  while (body.size() < length) {
    size_t got = 0;
    if (conn_->Read(buf, sizeof buf, &got, deadline, stop_fd_) != PeerConn::Io::kOk) break;
    body.append(buf, got);
  }
  if (body.size() > length) body.resize(length);
  while (!body.empty() && body.back() == '\n') body.pop_back();
  return RefusalStatus(code, std::move(body));
}

absl::Status RaftStreamSender::Drain() {
  const absl::Time now = absl::Now();
  drained_ = now;
  char buf[256];
  while (true) {
    size_t got = 0;
    const PeerConn::Io io = conn_->Read(buf, sizeof buf, &got, absl::InfinitePast(), -1);
    if (io == PeerConn::Io::kOk) {
      heard_ = now;
      continue;
    }
    if (io == PeerConn::Io::kEnd) return absl::UnavailableError("the peer closed the stream");
    break;  // nothing more now
  }
  if (now - heard_ > silence_) {
    return absl::UnavailableError(absl::StrCat("i/o timeout: nothing heard from the peer for ",
                                               absl::FormatDuration(now - heard_)));
  }
  return absl::OkStatus();
}

void RaftStreamSender::Frame(const std::vector<std::string>& messages) {
  buffer_.clear();
  if (messages.empty()) {
    AppendLength(&buffer_, 0);
    return;
  }
  for (const std::string& m : messages) {
    AppendLength(&buffer_, m.size());
    buffer_.append(m);
  }
}

absl::Status RaftStreamSender::WriteAll(const char* buf, size_t n) {
  switch (conn_->Write(buf, n, silence_, stop_fd_)) {
    case PeerConn::Io::kOk:
      return absl::OkStatus();
    case PeerConn::Io::kTimedOut:
      return absl::UnavailableError(absl::StrCat("i/o timeout: the peer took nothing for ",
                                                 absl::FormatDuration(silence_)));
    default:
      return absl::UnavailableError("the raft stream broke");
  }
}

absl::Status RaftStreamSender::Write(const std::vector<std::string>& messages) {
  if (absl::Now() - drained_ >= kDrainInterval) {
    if (absl::Status s = Drain(); !s.ok()) return s;
  }
  Frame(messages);
  return WriteAll(buffer_.data(), buffer_.size());
}

absl::Status RaftStreamSender::TryWrite(const std::vector<std::string>& messages,
                                        std::string* rest) {
  rest->clear();
  Frame(messages);
  size_t written = 0;
  if (conn_->TryWrite(buffer_.data(), buffer_.size(), &written) != PeerConn::Io::kOk) {
    return absl::UnavailableError("the raft stream broke");
  }
  if (written < buffer_.size()) rest->assign(buffer_, written);
  return absl::OkStatus();
}

absl::Status RaftStreamSender::WriteRest(const std::string& rest) {
  return WriteAll(rest.data(), rest.size());
}

}  // namespace capstan::server::peer
