#include "server/peer/peer_listener.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "grpcpp/server_posix.h"
#include "openssl/err.h"
#include "server/peer/raft_stream.h"
#include "server/security/host_in_dns.h"
#include "spdlog/spdlog.h"
#include "util/thread_name.h"

namespace capstan::server::peer {
namespace {

constexpr absl::Duration kHandshakeTimeout = absl::Seconds(10);
constexpr absl::Duration kRefusalLogInterval = absl::Seconds(5);

// The connection's peer as Go prints a net.Addr: "127.0.0.1:5000",
// "[::1]:5000"; *host gets the IP alone.
std::string RemoteAddr(int fd, std::string* host) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  if (addr.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&addr);
    *host = IpText(&in->sin_addr, AF_INET);
    return absl::StrCat(*host, ":", ntohs(in->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&addr);
    if (IN6_IS_ADDR_V4MAPPED(&in->sin6_addr)) {
      *host = IpText(&in->sin6_addr.s6_addr[12], AF_INET);
      return absl::StrCat(*host, ":", ntohs(in->sin6_port));
    }
    *host = IpText(&in->sin6_addr, AF_INET6);
    return absl::StrCat("[", *host, "]:", ntohs(in->sin6_port));
  }
  return "";
}

bool WouldBlock() { return errno == EAGAIN || errno == EWOULDBLOCK; }

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// As Go and gRPC do on every TCP connection: without it, a small record
// written while the last one is unacknowledged (the HTTP/2 settings after
// TLS 1.3's session tickets) waits for the peer's delayed ACK, 40 ms.
void SetNoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

PeerListener::PeerListener(SslCtxPtr ctx, grpc::Server* server, const PeerService* service)
    : ctx_(std::move(ctx)), server_(server), service_(service), refusals_(kRefusalLogInterval) {}

PeerListener::~PeerListener() { Stop(); }

absl::Status PeerListener::Start(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("missing port in address ", host_port));
  }
  std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found) != 0 ||
      found == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("cannot resolve peer address ", host_port));
  }
  // A host name listens on one of its addresses, an IPv4 one first, as Go's
  // net.Listen does (etcd's default peer URL is http://localhost:2380).
  const addrinfo* chosen = found;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      chosen = a;
      break;
    }
  }
  const int fd = socket(chosen->ai_family, chosen->ai_socktype | SOCK_CLOEXEC, chosen->ai_protocol);
  const int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || bind(fd, chosen->ai_addr, chosen->ai_addrlen) != 0 || listen(fd, 128) != 0) {
    const std::string why = strerror(errno);
    if (fd >= 0) close(fd);
    freeaddrinfo(found);
    return absl::UnavailableError(absl::StrCat("listen tcp ", host_port, ": ", why));
  }
  freeaddrinfo(found);
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = bound.ss_family == AF_INET6
              ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
              : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  listen_fd_ = fd;
  wake_fd_ = eventfd(0, EFD_CLOEXEC);
  accept_thread_ = NamedThread("peer-listen", [this] { AcceptLoop(); });
  return absl::OkStatus();
}

void PeerListener::Stop() {
  if (stopping_.exchange(true)) return;
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<std::unique_ptr<Connection>> connections;
  {
    util::MutexLock l(&mu_);
    connections.swap(connections_);
  }
  for (auto& c : connections) {
    if (c->thread.joinable()) c->thread.join();
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
}

void PeerListener::AcceptLoop() {
  while (!stopping()) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (stopping()) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    // Non-blocking from the start: the handshake and the pump wait in poll.
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      // Out of descriptors or memory: the connection stays queued and the
      // socket readable. Wait a little (or for Stop) rather than spin.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        pollfd wake{wake_fd_, POLLIN, 0};
        poll(&wake, 1, 100);
      }
      continue;
    }
    SetNoDelay(fd);
    std::string host;
    std::string addr = RemoteAddr(fd, &host);
    auto connection = std::make_unique<Connection>();
    Connection* c = connection.get();
    util::MutexLock l(&mu_);
    // Join the connections that ended.
    for (auto it = connections_.begin(); it != connections_.end();) {
      if ((*it)->done.load()) {
        (*it)->thread.join();
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
    c->thread = NamedThread("peer-conn", [this, c, fd, addr = std::move(addr),
                                          host = std::move(host)]() mutable {
      Serve(fd, std::move(addr), std::move(host));
      c->done.store(true);
    });
    connections_.push_back(std::move(connection));
  }
}

void PeerListener::Serve(int fd, std::string remote_addr, std::string remote_host) {
  BlockSigpipeOnThisThread();
  // The handshake waits in poll on the socket and the wake fd, so Stop ends
  // it at once, and its end hands the connection on at once.
  SSL* ssl = nullptr;
  if (ctx_ != nullptr) {
    const HandshakeResult result =
        HandshakeAsServer(ctx_.get(), fd, remote_host, kHandshakeTimeout, wake_fd_, &ssl);
    if (ssl == nullptr) {
      if (!stopping()) LogRefusal(remote_addr, remote_host, result);
      close(fd);
      return;
    }
  }
  char first = 0;
  if (!PeekFirstByte(fd, ssl, &first) || stopping()) {
    if (ssl != nullptr) SSL_free(ssl);
    close(fd);
    return;
  }
  if (first == kProbeByte) {  // a sender's probe: the handshake was all it wanted
    if (ssl != nullptr) SSL_free(ssl);
    close(fd);
    return;
  }
  // Records come back to back on both kinds of connection: OpenSSL reads
  // what the socket holds in one read(2) instead of each record's header and
  // body apart. PeerConn::Read and Pump call SSL_read until it wants more
  // before they poll, so what it buffered never waits for the socket.
  if (ssl != nullptr) SSL_set_read_ahead(ssl, 1);
  if (first == 'G') {
    pthread_setname_np(pthread_self(), "peer-raft");
    PeerConn conn(fd, ssl);  // owns both
    ServeRaftStream(&conn, *service_, wake_fd_);
    return;
  }
  if (ssl == nullptr) {
    grpc::AddInsecureChannelFromFd(server_, fd);  // gRPC owns fd now
    return;
  }
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    SSL_free(ssl);
    close(fd);
    return;
  }
  SetNonBlocking(pair[0]);
  grpc::AddInsecureChannelFromFd(server_, pair[0]);  // gRPC owns pair[0] now
  Pump(ssl, fd, pair[1]);
  SSL_free(ssl);
  close(fd);
  close(pair[1]);
}

bool PeerListener::PeekFirstByte(int fd, SSL* ssl, char* first) {
  const absl::Time deadline = absl::Now() + kHandshakeTimeout;
  while (!stopping()) {
    short events = POLLIN;
    if (ssl != nullptr) {
      ERR_clear_error();
      const int n = SSL_peek(ssl, first, 1);
      if (n > 0) return true;
      const int e = SSL_get_error(ssl, n);
      if (e == SSL_ERROR_WANT_WRITE) {
        events = POLLOUT;
      } else if (e != SSL_ERROR_WANT_READ) {
        ERR_clear_error();
        return false;
      }
    } else {
      const ssize_t n = recv(fd, first, 1, MSG_PEEK);
      if (n > 0) return true;
      if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
    }
    const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(deadline - absl::Now(), absl::Milliseconds(1)));
    if (ms <= 0) return false;
    pollfd fds[2] = {{fd, events, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 2, static_cast<int>(std::min<int64_t>(ms, 60000))) < 0 && errno != EINTR) return false;
  }
  return false;
}

void PeerListener::Pump(SSL* ssl, int net, int local) {
  SetNonBlocking(local);
  std::string to_local, to_net;  // bytes read from one side, not yet written to the other
  size_t to_local_done = 0, to_net_done = 0;
  bool net_ended = false, local_ended = false;
  char buf[16384];
  while (!stopping()) {
    short net_events = 0, local_events = 0;
    bool progress = true;
    while (progress) {
      progress = false;
      net_events = local_events = 0;
      if (to_local_done == to_local.size() && !net_ended) {
        to_local.clear();
        to_local_done = 0;
        const int n = SSL_read(ssl, buf, sizeof buf);
        if (n > 0) {
          to_local.assign(buf, n);
          progress = true;
        } else {
          const int e = SSL_get_error(ssl, n);
          if (e == SSL_ERROR_WANT_READ) {
            net_events |= POLLIN;
          } else if (e == SSL_ERROR_WANT_WRITE) {
            net_events |= POLLOUT;
          } else {
            net_ended = true;
          }
        }
      }
      if (to_local_done < to_local.size()) {
        const ssize_t w = write(local, to_local.data() + to_local_done, to_local.size() - to_local_done);
        if (w > 0) {
          to_local_done += static_cast<size_t>(w);
          progress = true;
        } else if (w < 0 && WouldBlock()) {
          local_events |= POLLOUT;
        } else {
          return;  // gRPC closed its end
        }
      }
      if (to_net_done == to_net.size() && !local_ended) {
        to_net.clear();
        to_net_done = 0;
        const ssize_t r = read(local, buf, sizeof buf);
        if (r > 0) {
          to_net.assign(buf, static_cast<size_t>(r));
          progress = true;
        } else if (r < 0 && WouldBlock()) {
          local_events |= POLLIN;
        } else {
          local_ended = true;
        }
      }
      if (to_net_done < to_net.size()) {
        const int w = SSL_write(ssl, to_net.data() + to_net_done,
                                static_cast<int>(to_net.size() - to_net_done));
        if (w > 0) {
          to_net_done += static_cast<size_t>(w);
          progress = true;
        } else {
          const int e = SSL_get_error(ssl, w);
          if (e == SSL_ERROR_WANT_WRITE) {
            net_events |= POLLOUT;
          } else if (e == SSL_ERROR_WANT_READ) {
            net_events |= POLLIN;
          } else {
            return;  // the connection broke
          }
        }
      }
    }
    if (net_ended && to_local_done == to_local.size()) return;
    if (local_ended && to_net_done == to_net.size()) {
      SSL_shutdown(ssl);
      return;
    }
    pollfd fds[3] = {{net, net_events, 0}, {local, local_events, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(fds, 3, -1) < 0 && errno != EINTR) return;
  }
}

void PeerListener::LogRefusal(const std::string& remote_addr, const std::string& remote_host,
                                 const HandshakeResult& result) {
  int64_t suppressed = 0;
  if (!refusals_.Allow(absl::StrCat(remote_host, "\n", result.error), absl::Now(), &suppressed)) {
    return;
  }
  std::string names;
  if (result.peer_sent_certificate) {
    names = absl::StrCat(", ip-addresses [", absl::StrJoin(result.ip_sans, " "), "], dns-names [",
                         absl::StrJoin(result.dns_sans, " "), "]");
  }
  const std::string more =
      suppressed > 0 ? absl::StrCat(" (", suppressed, " more from ", remote_host, " not logged)")
                     : "";
  SPDLOG_WARN("rejected connection on peer endpoint (remote-addr {}, server-name \"{}\"{}): {}{}",
              remote_addr, result.server_name, names, result.error, more);
}

}  // namespace capstan::server::peer
