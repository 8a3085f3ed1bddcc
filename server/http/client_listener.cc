#include "server/http/client_listener.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/server_posix.h"
#include "spdlog/spdlog.h"

namespace capstan::server {
namespace {

// A client that connects and sends nothing is dropped after this long.
constexpr auto kFirstBytesTimeout = std::chrono::seconds(10);
// Connections accepted but not yet told apart; past this, the one waiting
// longest is dropped for each new one.
constexpr size_t kMaxUnsorted = 1024;
// HTTP/2's client connection preface starts with these bytes; no HTTP/1.x
// method does ("PUT", "PATCH" and "POST" part from it at the second byte).
constexpr std::string_view kHttp2Preface = "PRI ";

void SetBlocking(int fd, bool blocking) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, blocking ? flags & ~O_NONBLOCK : flags | O_NONBLOCK);
}

enum class Kind {
  kSilent,   // nothing sent yet
  kPartial,  // the start of the preface, not yet all of its first bytes
  kGrpc,
  kHttp,
  kGone,     // closed or failed before it said anything
};

// A TLS record header: type, version, length (RFC 8446, 5.1).
constexpr size_t kTlsRecordHeader = 5;
constexpr unsigned char kTlsHandshake = 0x16;
constexpr size_t kTlsMaxRecord = 16384;

// Peeks at a new plain connection's first bytes without consuming them.
Kind Classify(int fd) {
  char head[4];
  const ssize_t n = recv(fd, head, sizeof(head), MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return Kind::kGone;
  if (n < 0) return errno == EAGAIN || errno == EINTR ? Kind::kSilent : Kind::kGone;
  const std::string_view got(head, static_cast<size_t>(n));
  if (kHttp2Preface.substr(0, got.size()) != got) return Kind::kHttp;
  return got.size() == kHttp2Preface.size() ? Kind::kGrpc : Kind::kPartial;
}

// Peeks at a new TLS connection's ClientHello without consuming it: gRPC if
// it offers HTTP/2 by ALPN and not HTTP/1.1, as gRPC clients do; HTTP
// otherwise (curl, browsers, and clients that name no protocol at all,
// which gRPC would refuse). Partial until the whole first record is in.
Kind ClassifyTls(int fd) {
  thread_local std::string head(kTlsRecordHeader + kTlsMaxRecord, '\0');
  const ssize_t n = recv(fd, head.data(), head.size(), MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return Kind::kGone;
  if (n < 0) return errno == EAGAIN || errno == EINTR ? Kind::kSilent : Kind::kGone;
  const auto* bytes = reinterpret_cast<const unsigned char*>(head.data());
  if (bytes[0] != kTlsHandshake) return Kind::kHttp;  // whose handshake refuses it
  if (static_cast<size_t>(n) < kTlsRecordHeader) return Kind::kPartial;
  const size_t length = (size_t{bytes[3]} << 8) | bytes[4];
  if (static_cast<size_t>(n) < kTlsRecordHeader + length) return Kind::kPartial;
  return ClientHelloIsGrpcs(std::string_view(head.data() + kTlsRecordHeader, length))
             ? Kind::kGrpc
             : Kind::kHttp;
}

}  // namespace

bool ClientHelloIsGrpcs(std::string_view hello) {
  size_t pos = 0;
  auto take = [&](size_t n, std::string_view* out) {
    if (hello.size() - pos < n) return false;
    if (out != nullptr) *out = hello.substr(pos, n);
    pos += n;
    return true;
  };
  auto number = [&](size_t n, size_t* out) {  // big-endian, n bytes
    std::string_view b;
    if (!take(n, &b)) return false;
    *out = 0;
    for (unsigned char c : b) *out = (*out << 8) | c;
    return true;
  };
  size_t type = 0, length = 0, skip = 0;
  // Handshake type 1 (ClientHello) and length; version and random.
  if (!number(1, &type) || type != 1 || !number(3, &length) || !take(2 + 32, nullptr)) return false;
  // Session id, cipher suites and compression methods.
  if (!number(1, &skip) || !take(skip, nullptr) || !number(2, &skip) || !take(skip, nullptr) ||
      !number(1, &skip) || !take(skip, nullptr)) {
    return false;
  }
  size_t extensions_length = 0;
  if (!number(2, &extensions_length) || hello.size() - pos < extensions_length) return false;
  const size_t extensions_end = pos + extensions_length;
  while (pos < extensions_end) {
    size_t ext = 0, ext_length = 0;
    std::string_view data;
    if (!number(2, &ext) || !number(2, &ext_length) || !take(ext_length, &data)) return false;
    if (ext != 16) continue;  // application_layer_protocol_negotiation
    // A two-byte list length, then protocols, each with a one-byte length.
    bool http2 = false;
    for (size_t at = 2; at < data.size();) {
      const size_t name_length = static_cast<unsigned char>(data[at]);
      if (data.size() - at - 1 < name_length) return false;
      const std::string_view name = data.substr(at + 1, name_length);
      if (name == "http/1.1") return false;
      http2 |= name == "h2" || name == "grpc-exp";
      at += 1 + name_length;
    }
    return http2;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<ClientListener>> ClientListener::Bind(const std::string& host,
                                                                     int port, bool reuse_port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(port);
  if (const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_text.c_str(), &hints,
                                 &found);
      rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("listen tcp ", host, ":", port, ": ", gai_strerror(rc)));
  }
  // Every address the host resolves to (both loopbacks for "localhost", as
  // gRPC's own listener binds them), all on one port: the first one bound
  // picks it when port is 0. An address family the machine lacks is skipped.
  std::vector<int> fds;
  int bound_port = port;
  int err = 0;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    // Go's net.Listen sets SO_REUSEADDR on every listener.
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (reuse_port) setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
    if (a->ai_family == AF_INET6) {
      reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_port = htons(static_cast<uint16_t>(bound_port));
    } else {
      reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_port = htons(static_cast<uint16_t>(bound_port));
    }
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
      const int e = errno;
      close(fd);
      if (e == EADDRNOTAVAIL || e == EAFNOSUPPORT) continue;
      err = e;
      break;
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    bound_port = addr.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                                            : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    fds.push_back(fd);
  }
  freeaddrinfo(found);
  if (err != 0 || fds.empty()) {
    for (int fd : fds) close(fd);
    if (err == 0) err = EADDRNOTAVAIL;
    return absl::UnavailableError(absl::StrCat("listen tcp ", host, ":", port, ": bind: ",
                                               err == EADDRINUSE ? "address already in use"
                                                                 : std::strerror(err)));
  }
  return std::unique_ptr<ClientListener>(new ClientListener(std::move(fds), bound_port));
}

ClientListener::ClientListener(std::vector<int> fds, int port)
    : listen_fds_(std::move(fds)), port_(port) {}

ClientListener::~ClientListener() {
  Stop();
  for (int fd : listen_fds_) close(fd);
}

void ClientListener::StartTls(grpc::experimental::ExternalConnectionAcceptor* grpc,
                              HttpHandler https) {
  tls_ = true;
  grpc_tls_ = grpc;
  Start(nullptr, std::move(https));
}

void ClientListener::Start(grpc::Server* grpc_server, HttpHandler http) {
  grpc_server_ = grpc_server;
  http_ = std::move(http);
  if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    SPDLOG_ERROR("client listener on port {}: pipe: {}", port_, std::strerror(errno));
    return;
  }
  thread_ = std::thread([this] { Run(); });
}

void ClientListener::Stop() {
  if (!thread_.joinable()) return;
  const char byte = 0;
  (void)!write(wake_[1], &byte, 1);
  thread_.join();
  close(wake_[0]);
  close(wake_[1]);
}

namespace {

// A connection accepted but not yet sorted between gRPC and HTTP.
struct Unsorted {
  int fd;
  std::chrono::steady_clock::time_point deadline;
  bool partial;  // some preface bytes seen: more are awaited by timer, not poll
};

// Hands a sorted connection (kGrpc or kHttp) over to whoever serves it.
using HandOver = std::function<void(int fd, Kind kind)>;

// Fills *polled with what Run waits on: the wake pipe first, the listening
// sockets, and the unsorted connections poll can wait on. Returns poll's
// timeout in ms: short while a connection sent part of its preface, a
// second while any is unsorted, else none.
int FillPolled(int wake_fd, const std::vector<int>& listen_fds,
               const std::vector<Unsorted>& unsorted, std::vector<pollfd>* polled) {
  polled->clear();
  polled->push_back({wake_fd, POLLIN, 0});
  for (int fd : listen_fds) polled->push_back({fd, POLLIN, 0});
  bool any_partial = false;
  for (const Unsorted& u : unsorted) {
    if (u.partial) {
      any_partial = true;
    } else {
      polled->push_back({u.fd, POLLIN, 0});
    }
  }
  return any_partial ? 5 : unsorted.empty() ? -1 : 1000;
}

// Accepts every connection waiting on listen_fd. Without gRPC to sort from
// (sorts false) each goes to HTTP at once; else it joins *unsorted, and
// when that is full the one waiting longest makes room. Out of descriptors
// or memory, backs off (*backoff) as Go's accept loop does.
void AcceptAll(int listen_fd, int port, bool sorts, std::chrono::milliseconds* backoff,
               std::vector<Unsorted>* unsorted, const HandOver& hand_over) {
  for (;;) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors or memory: the connection stays queued and
        // the socket readable. Back off as Go's accept loop does (5 ms,
        // doubling up to 1 s) rather than spin.
        *backoff = std::min(*backoff == std::chrono::milliseconds(0) ? std::chrono::milliseconds(5)
                                                                      : *backoff * 2,
                            std::chrono::milliseconds(1000));
        SPDLOG_WARN("client listener on port {}: accept: {}; retrying in {} ms", port,
                    std::strerror(errno), backoff->count());
        std::this_thread::sleep_for(*backoff);
      }
      break;
    }
    *backoff = std::chrono::milliseconds(0);
    if (!sorts) {
      hand_over(fd, Kind::kHttp);
      continue;
    }
    if (unsorted->size() >= kMaxUnsorted) {
      // Full of connections that have not spoken: the one waiting longest
      // makes room, so silent clients cannot lock the port.
      auto oldest = std::min_element(unsorted->begin(), unsorted->end(),
                                     [](const Unsorted& a, const Unsorted& b) {
                                       return a.deadline < b.deadline;
                                     });
      close(oldest->fd);
      *oldest = unsorted->back();
      unsorted->pop_back();
    }
    unsorted->push_back({fd, std::chrono::steady_clock::now() + kFirstBytesTimeout, false});
  }
}

// Hands over each unsorted connection whose first bytes tell what it
// speaks, and closes those gone or silent past their deadline.
void SortUnsorted(bool tls, std::vector<Unsorted>* unsorted, const HandOver& hand_over) {
  const auto now = std::chrono::steady_clock::now();
  for (size_t i = 0; i < unsorted->size();) {
    Unsorted& u = (*unsorted)[i];
    Kind kind = tls ? ClassifyTls(u.fd) : Classify(u.fd);
    const bool undecided = kind == Kind::kSilent || kind == Kind::kPartial;
    if (undecided && now >= u.deadline) kind = Kind::kGone;
    if (undecided && kind != Kind::kGone) {
      // Bytes that may yet become the preface stay readable; wait for the
      // rest on a timer rather than on poll, which would not block.
      u.partial = kind == Kind::kPartial;
      ++i;
      continue;
    }
    if (kind == Kind::kGone) {
      close(u.fd);
    } else {
      hand_over(u.fd, kind);
    }
    (*unsorted)[i] = unsorted->back();
    unsorted->pop_back();
  }
}

}  // namespace

void ClientListener::Run() {
  std::vector<Unsorted> unsorted;
  std::vector<pollfd> polled;
  std::chrono::milliseconds backoff(0);
  const HandOver hand_over = [this](int fd, Kind kind) {
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (kind == Kind::kGrpc && tls_) {
      // gRPC reads the ClientHello itself: only peeked at so far.
      grpc::experimental::ExternalConnectionAcceptor::NewConnectionParameters params;
      params.fd = fd;
      grpc_tls_->HandleNewConnection(&params);
    } else if (kind == Kind::kGrpc) {
      // gRPC reads the preface itself: only peeked at so far.
      grpc::AddInsecureChannelFromFd(grpc_server_, fd);
    } else {
      SetBlocking(fd, true);
      http_(fd);
    }
  };
  const bool sorts = grpc_server_ != nullptr || grpc_tls_ != nullptr;
  for (;;) {
    const int timeout_ms = FillPolled(wake_[0], listen_fds_, unsorted, &polled);
    if (poll(polled.data(), polled.size(), timeout_ms) < 0 && errno != EINTR) {
      SPDLOG_ERROR("client listener on port {}: poll: {}", port_, std::strerror(errno));
      break;
    }
    if (polled[0].revents != 0) break;
    for (int listen_fd : listen_fds_) {
      AcceptAll(listen_fd, port_, sorts, &backoff, &unsorted, hand_over);
    }
    SortUnsorted(tls_, &unsorted, hand_over);
  }
  for (const Unsorted& u : unsorted) close(u.fd);
}

}  // namespace capstan::server
