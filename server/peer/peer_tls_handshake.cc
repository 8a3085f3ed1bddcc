#include "server/peer/peer_tls_handshake.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "openssl/err.h"
#include "openssl/x509v3.h"
#include "server/security/host_in_dns.h"
#include "server/security/tls.h"

namespace capstan::server::peer {
namespace {

// What the verify callback checks, owned by the SSL_CTX.
struct CertChecks {
  bool dialing = false;
  std::string allowed_cn;
  std::string allowed_hostname;
  std::string crl_file;
  bool check_client_san = false;  // the listener's checkSAN
};

// One handshake's state, owned by the caller of SSL_accept/SSL_connect.
struct HandshakeState {
  std::string peer_host;  // listener: the client's address; dialer: the host dialed
  std::string reason;     // why this side refused the peer's certificate
  int alert = -1;         // the fatal alert the peer sent, if any
  std::vector<std::string> ip_sans, dns_sans;
  bool saw_certificate = false;
};

int ChecksIndex() {
  static const int index = SSL_CTX_get_ex_new_index(
      0, nullptr, nullptr, nullptr, [](void*, void* checks, CRYPTO_EX_DATA*, int, long, void*) {
        delete static_cast<CertChecks*>(checks);
      });
  return index;
}

int StateIndex() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

void AltNames(X509* cert, std::vector<std::string>* ips, std::vector<std::string>* dns) {
  auto* general = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; general && i < sk_GENERAL_NAME_num(general); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(general, i);
    if (name->type == GEN_DNS) {
      dns->emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(name->d.dNSName)),
                        ASN1_STRING_length(name->d.dNSName));
    } else if (name->type == GEN_IPADD) {
      const int len = ASN1_STRING_length(name->d.iPAddress);
      const unsigned char* data = ASN1_STRING_get0_data(name->d.iPAddress);
      if (len == 4) ips->push_back(IpText(data, AF_INET));
      if (len == 16) ips->push_back(IpText(data, AF_INET6));
    }
  }
  GENERAL_NAMES_free(general);
}

std::string CommonName(X509* cert) {
  X509_NAME* subject = X509_get_subject_name(cert);
  const int index = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (index < 0) return "";
  const ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, index));
  return std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(data)),
                     ASN1_STRING_length(data));
}

// Go's x509 text for a chain OpenSSL could not verify.
std::string ChainError(int error) {
  switch (error) {
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_VERIFY_LEAF_SIGNATURE:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_CERT_SIGNATURE_FAILURE:
      return "tls: failed to verify certificate: x509: certificate signed by unknown authority";
    case X509_V_ERR_CERT_HAS_EXPIRED:
    case X509_V_ERR_CERT_NOT_YET_VALID:
      return "tls: failed to verify certificate: x509: certificate has expired or is not yet "
             "valid";
    default:
      return absl::StrCat("tls: failed to verify certificate: x509: ",
                          X509_verify_cert_error_string(error));
  }
}

// Why etcd refuses the leaf of a verified chain, or "".
std::string Refusal(const CertChecks& checks, HandshakeState* state, X509_STORE_CTX* store) {
  X509* leaf = X509_STORE_CTX_get_current_cert(store);
  std::vector<std::string>& ips = state->ip_sans;
  std::vector<std::string>& dns = state->dns_sans;
  if (checks.dialing && !CertificateValidForHostname(ips, dns, state->peer_host)) {
    // Go's client checks the host dialed before etcd's callback runs.
    return absl::StrCat("tls: failed to verify certificate: x509: certificate is not valid for ",
                        state->peer_host);
  }
  // etcd's VerifyPeerCertificate, the same on both sides.
  if (!checks.allowed_cn.empty() && CommonName(leaf) != checks.allowed_cn) {
    return "client certificate authentication failed";
  }
  if (!checks.allowed_hostname.empty() &&
      !CertificateValidForHostname(ips, dns, checks.allowed_hostname)) {
    return "client certificate authentication failed";
  }
  if (checks.check_client_san && (!ips.empty() || !dns.empty())) {
    const std::string& host = state->peer_host;
    const bool ip_match = CertificateValidForHostname(ips, {}, host);
    if (!ip_match && dns.empty()) {
      return absl::StrCat("x509: certificate is valid for ", absl::StrJoin(ips, ", "), ", not ",
                          host);
    }
    if (!ip_match && !HostInDns(host, dns)) {
      return absl::StrCat("tls: \"", host, "\" does not match any of DNSNames [\"",
                          absl::StrJoin(dns, "\" \""), "\"]");
    }
  }
  if (!checks.crl_file.empty()) {
    STACK_OF(X509)* chain = X509_STORE_CTX_get0_chain(store);
    std::vector<const X509*> certs;
    for (int i = 0; i < sk_X509_num(chain); ++i) certs.push_back(sk_X509_value(chain, i));
    return RevokedByCrl(checks.crl_file, certs);
  }
  return "";
}

int VerifyPeer(int preverified, X509_STORE_CTX* store) {
  auto* ssl =
      static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  const auto* checks =
      static_cast<const CertChecks*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), ChecksIndex()));
  auto* state = static_cast<HandshakeState*>(SSL_get_ex_data(ssl, StateIndex()));
  if (checks == nullptr || state == nullptr) return preverified;
  if (!state->saw_certificate) {
    state->saw_certificate = true;
    STACK_OF(X509)* sent = X509_STORE_CTX_get0_untrusted(store);
    X509* leaf = X509_STORE_CTX_get0_cert(store);
    if (leaf == nullptr && sent != nullptr && sk_X509_num(sent) > 0) leaf = sk_X509_value(sent, 0);
    if (leaf != nullptr) AltNames(leaf, &state->ip_sans, &state->dns_sans);
  }
  std::string reason;
  if (!preverified) {
    reason = ChainError(X509_STORE_CTX_get_error(store));
  } else if (X509_STORE_CTX_get_error_depth(store) == 0) {
    reason = Refusal(*checks, state, store);
  }
  if (reason.empty()) return 1;
  if (state->reason.empty()) state->reason = std::move(reason);
  // OpenSSL answers this one with bad_certificate, as Go answers every
  // refusal.
  X509_STORE_CTX_set_error(store, X509_V_ERR_CERT_REJECTED);
  return 0;
}

void RecordAlert(const SSL* ssl, int where, int ret) {
  // The alerts this side sends come here too (SSL_CB_WRITE_ALERT shares the
  // SSL_CB_ALERT bit with SSL_CB_READ_ALERT): OpenSSL's own decode_error
  // after a client hung up mid-handshake is not the client's "remote error".
  if ((where & SSL_CB_READ_ALERT) != SSL_CB_READ_ALERT) return;
  if ((ret >> 8) != SSL3_AL_FATAL) return;  // close_notify and other warnings
  auto* state = static_cast<HandshakeState*>(SSL_get_ex_data(ssl, StateIndex()));
  if (state != nullptr && state->alert < 0) state->alert = ret & 0xff;
}

absl::Status CommonSetUp(const PeerTls& tls, SSL_CTX* ctx) {
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  // Send the certificates of the file only, as Go does.
  SSL_CTX_set_mode(ctx, SSL_MODE_NO_AUTO_CHAIN | SSL_MODE_ENABLE_PARTIAL_WRITE |
                            SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  int min = TLS1_2_VERSION, max = 0;
  if (tls.min_version == "TLS1.3") min = TLS1_3_VERSION;
  if (tls.max_version == "TLS1.2") max = TLS1_2_VERSION;
  if (tls.max_version == "TLS1.3") max = TLS1_3_VERSION;
  if (!SSL_CTX_set_min_proto_version(ctx, min) || !SSL_CTX_set_max_proto_version(ctx, max)) {
    return absl::InternalError("cannot set the TLS versions");
  }
  const std::vector<std::string> suites = DefaultCipherNames();
  if (SSL_CTX_set_cipher_list(ctx, absl::StrJoin(suites, ":").c_str()) != 1) {
    return absl::InternalError("no usable TLS 1.2 cipher suite");
  }
  return absl::OkStatus();
}

absl::Status LoadIdentity(SSL_CTX* ctx, const std::string& cert, const std::string& key,
                          const char* cert_flag, const char* key_flag) {
  if (SSL_CTX_use_certificate_chain_file(ctx, cert.c_str()) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("cannot read ", cert_flag, " ", cert));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(absl::StrCat("cannot use ", key_flag, " ", key));
  }
  return absl::OkStatus();
}

absl::Status AttachChecks(SSL_CTX* ctx, std::unique_ptr<CertChecks> checks) {
  if (SSL_CTX_set_ex_data(ctx, ChecksIndex(), checks.get()) != 1) {
    return absl::InternalError("cannot attach the peer certificate checks");
  }
  checks.release();  // owned by ctx now
  return absl::OkStatus();
}

// Why a handshake failed, in Go's words.
std::string FailureText(const HandshakeState& state, SSL* ssl, int ret, bool timed_out) {
  if (!state.reason.empty()) return state.reason;
  if (state.alert >= 0) return absl::StrCat("remote error: ", GoAlertText(state.alert));
  const int error = SSL_get_error(ssl, ret);
  const unsigned long queued = ERR_peek_error();
  ERR_clear_error();
  if (timed_out) return "i/o timeout";
  if (error == SSL_ERROR_SSL && queued != 0) {
    switch (ERR_GET_REASON(queued)) {
      case SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE:
        return "tls: client didn't provide a certificate";
      case SSL_R_UNEXPECTED_EOF_WHILE_READING:
        // The peer closed mid-handshake: Go's io.EOF between records,
        // io.ErrUnexpectedEOF inside one (its first bytes still buffered).
        return SSL_has_pending(ssl) ? "unexpected EOF" : "EOF";
      case SSL_R_WRONG_VERSION_NUMBER:
      case SSL_R_HTTP_REQUEST:
      case SSL_R_PACKET_LENGTH_TOO_LONG:
        return "tls: first record does not look like a TLS handshake";
      default:
        break;
    }
    const char* text = ERR_reason_error_string(queued);
    return absl::StrCat("tls: ", text ? text : "handshake failure");
  }
  return "EOF";
}

// What a non-blocking handshake step waits for next.
enum class HandshakeWait {
  kReady,     // the socket is ready: call the handshake again
  kDone,      // the step failed for another reason than a wait
  kTimedOut,  // the deadline passed first
  kStopped,   // the stop fd became readable first
};

// After a handshake step returned `ssl_error` (SSL_get_error): waits in
// poll(2) until fd is ready for what OpenSSL wants, stop_fd (if >= 0) is
// readable, or the deadline passes.
HandshakeWait AwaitSocket(int fd, int ssl_error, int stop_fd, absl::Time deadline) {
  short events;
  if (ssl_error == SSL_ERROR_WANT_READ) {
    events = POLLIN;
  } else if (ssl_error == SSL_ERROR_WANT_WRITE) {
    events = POLLOUT;
  } else {
    return HandshakeWait::kDone;
  }
  while (true) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return HandshakeWait::kTimedOut;
    // Rounded up, so that a wait never ends just before the deadline.
    const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(left, absl::Milliseconds(1)));
    pollfd fds[2] = {{fd, events, 0}, {stop_fd, POLLIN, 0}};
    const int n = poll(fds, stop_fd >= 0 ? 2 : 1, static_cast<int>(std::min<int64_t>(ms, 60000)));
    if (n < 0 && errno != EINTR) return HandshakeWait::kDone;
    if (n <= 0) continue;
    if (stop_fd >= 0 && fds[1].revents != 0) return HandshakeWait::kStopped;
    // An error or a hang-up on fd: the next step reports it.
    if (fds[0].revents != 0) return HandshakeWait::kReady;
  }
}

}  // namespace

void BlockSigpipeOnThisThread() {
  // Once per thread: a direct write calls this for every batch.
  static thread_local bool blocked = false;
  if (blocked) return;
  blocked = true;
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
}

std::string GoAlertText(int alert) {
  switch (alert) {
    case 0: return "tls: close notify";
    case 10: return "tls: unexpected message";
    case 20: return "tls: bad record MAC";
    case 40: return "tls: handshake failure";
    case 42: return "tls: bad certificate";
    case 43: return "tls: unsupported certificate";
    case 44: return "tls: revoked certificate";
    case 45: return "tls: expired certificate";
    case 46: return "tls: unknown certificate";
    case 47: return "tls: illegal parameter";
    case 48: return "tls: unknown certificate authority";
    case 49: return "tls: access denied";
    case 50: return "tls: error decoding message";
    case 51: return "tls: error decrypting message";
    case 70: return "tls: protocol version not supported";
    case 71: return "tls: insufficient security level";
    case 80: return "tls: internal error";
    case 112: return "tls: unrecognized name";
    case 116: return "tls: certificate required";
    case 120: return "tls: no application protocol";
    default: return absl::StrCat("tls: alert(", alert, ")");
  }
}

absl::StatusOr<SslCtxPtr> NewPeerServerContext(const PeerTls& tls) {
  SslCtxPtr ctx(SSL_CTX_new(TLS_server_method()));
  if (!ctx) return absl::InternalError("cannot create a TLS context");
  if (auto s = CommonSetUp(tls, ctx.get()); !s.ok()) return s;
  if (auto s = LoadIdentity(ctx.get(), tls.cert_file, tls.key_file, "--peer-cert-file",
                            "--peer-key-file");
      !s.ok()) {
    return s;
  }
  SSL_CTX_set_alpn_select_cb(
      ctx.get(),
      [](SSL*, const unsigned char** out, unsigned char* out_length, const unsigned char* in,
         unsigned int in_length, void*) {
        static constexpr unsigned char kH2[] = "\x02h2";
        unsigned char* selected = nullptr;
        if (SSL_select_next_proto(&selected, out_length, kH2, sizeof(kH2) - 1, in, in_length) !=
            OPENSSL_NPN_NEGOTIATED) {
          return SSL_TLSEXT_ERR_NOACK;
        }
        *out = selected;
        return SSL_TLSEXT_ERR_OK;
      },
      nullptr);
  SSL_CTX_set_info_callback(ctx.get(), RecordAlert);
  if (!tls.trusted_ca_file.empty()) {
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(tls.trusted_ca_file.c_str());
    if (!names || SSL_CTX_load_verify_locations(ctx.get(), tls.trusted_ca_file.c_str(), nullptr) != 1) {
      if (names) sk_X509_NAME_pop_free(names, X509_NAME_free);
      ERR_clear_error();
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read --peer-trusted-ca-file ", tls.trusted_ca_file));
    }
    SSL_CTX_set_client_CA_list(ctx.get(), names);  // takes ownership
  }
  if (!tls.crl_file.empty()) {
    if (auto crl = ReadCrl(tls.crl_file); !crl.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peer-crl-file ", tls.crl_file, ": not a readable revocation list"));
    }
  }
  if (!tls.require_client_cert) {
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
    return ctx;
  }
  auto checks = std::make_unique<CertChecks>();
  checks->allowed_cn = tls.allowed_cn;
  checks->allowed_hostname = tls.allowed_hostname;
  checks->crl_file = tls.crl_file;
  checks->check_client_san = tls.check_client_san;
  if (auto s = AttachChecks(ctx.get(), std::move(checks)); !s.ok()) return s;
  // etcd checks every connection; a resumed session would skip the checks.
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, VerifyPeer);
  return ctx;
}

absl::StatusOr<SslCtxPtr> NewPeerClientContext(const PeerTls& tls) {
  SslCtxPtr ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx) return absl::InternalError("cannot create a TLS context");
  if (auto s = CommonSetUp(tls, ctx.get()); !s.ok()) return s;
  const bool own = tls.client_cert_file == tls.cert_file;
  if (auto s = LoadIdentity(ctx.get(), tls.client_cert_file, tls.client_key_file,
                            own ? "--peer-cert-file" : "--peer-client-cert-file",
                            own ? "--peer-key-file" : "--peer-client-key-file");
      !s.ok()) {
    return s;
  }
  SSL_CTX_set_info_callback(ctx.get(), RecordAlert);
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  if (tls.self_signed) {
    // etcd's selfCert: InsecureSkipVerify.
    SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_NONE, nullptr);
    return ctx;
  }
  const int loaded = tls.trusted_ca_file.empty()
                         ? SSL_CTX_set_default_verify_paths(ctx.get())
                         : SSL_CTX_load_verify_locations(ctx.get(), tls.trusted_ca_file.c_str(), nullptr);
  if (loaded != 1) {
    ERR_clear_error();
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read --peer-trusted-ca-file ", tls.trusted_ca_file));
  }
  auto checks = std::make_unique<CertChecks>();
  checks->dialing = true;
  checks->allowed_cn = tls.allowed_cn;
  checks->allowed_hostname = tls.allowed_hostname;
  if (auto s = AttachChecks(ctx.get(), std::move(checks)); !s.ok()) return s;
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, VerifyPeer);
  return ctx;
}

HandshakeResult HandshakeAsServer(SSL_CTX* ctx, int fd, const std::string& remote_host,
                                  absl::Duration timeout, int stop_fd, SSL** out) {
  *out = nullptr;
  HandshakeResult result;
  HandshakeState state;
  state.peer_host = remote_host;
  SSL* ssl = SSL_new(ctx);
  if (ssl == nullptr) {
    result.error = "tls: cannot create a session";
    return result;
  }
  SSL_set_ex_data(ssl, StateIndex(), &state);
  SSL_set_fd(ssl, fd);
  const absl::Time deadline = absl::Now() + timeout;
  HandshakeWait wait = HandshakeWait::kDone;
  int ret;
  while (true) {
    ERR_clear_error();
    ret = SSL_accept(ssl);
    if (ret == 1) break;
    wait = AwaitSocket(fd, SSL_get_error(ssl, ret), stop_fd, deadline);
    if (wait != HandshakeWait::kReady) break;
  }
  SSL_set_ex_data(ssl, StateIndex(), nullptr);
  const char* sni = SSL_get_servername(ssl, TLSEXT_NAMETYPE_host_name);
  result.server_name = sni ? sni : "";
  result.peer_sent_certificate = state.saw_certificate;
  result.ip_sans = std::move(state.ip_sans);
  result.dns_sans = std::move(state.dns_sans);
  if (ret == 1) {
    *out = ssl;
    return result;
  }
  if (wait == HandshakeWait::kStopped) {
    ERR_clear_error();
    result.error = "use of closed network connection";
  } else {
    result.error = FailureText(state, ssl, ret, wait == HandshakeWait::kTimedOut);
  }
  SSL_free(ssl);
  return result;
}

namespace {

// DialPeer's work, with the handshake's state the caller's (ProbePeer keeps
// it attached for the read after the handshake): on success *fd and *ssl
// (null without ctx) are the caller's and ssl still points at *state.
std::string Dial(SSL_CTX* ctx, const std::string& host, int port, absl::Time deadline,
                 int stop_fd, HandshakeState* state, int* out_fd, SSL** out_ssl) {
  *out_fd = -1;
  *out_ssl = nullptr;
  const std::string address = host.find(':') != std::string::npos
                                  ? absl::StrCat("[", host, "]:", port)
                                  : absl::StrCat(host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0 || !found) {
    return absl::StrCat("dial tcp: lookup ", host, ": no such host");
  }
  // Each address in turn, as Go's dialer tries them, until one connects.
  int fd = -1;
  std::string error;
  for (const addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    const int candidate =
        socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (candidate < 0) {
      error = absl::StrCat("dial tcp ", address, ": socket: ", strerror(errno));
      continue;
    }
    int rc = connect(candidate, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p[2] = {{candidate, POLLOUT, 0}, {stop_fd, POLLIN, 0}};
      const int64_t ms =
          absl::ToInt64Milliseconds(absl::Ceil(deadline - absl::Now(), absl::Milliseconds(1)));
      rc = poll(p, stop_fd >= 0 ? 2 : 1, static_cast<int>(std::clamp<int64_t>(ms, 0, 60000)));
      if (rc > 0 && stop_fd >= 0 && p[1].revents != 0) {
        close(candidate);
        freeaddrinfo(found);
        return absl::StrCat("dial tcp ", address, ": operation was canceled");
      }
      if (rc == 0) {
        close(candidate);
        freeaddrinfo(found);
        return absl::StrCat("dial tcp ", address, ": i/o timeout");
      }
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(candidate, SOL_SOCKET, SO_ERROR, &err, &len);
      errno = err;
      rc = err == 0 ? 0 : -1;
    }
    if (rc != 0) {
      std::string text = strerror(errno);
      if (!text.empty()) text[0] = absl::ascii_tolower(text[0]);
      close(candidate);
      error = absl::StrCat("dial tcp ", address, ": connect: ", text);
      continue;
    }
    fd = candidate;
  }
  freeaddrinfo(found);
  if (fd < 0) return error;
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // as Go's dialer
  if (ctx == nullptr) {
    *out_fd = fd;
    return "";
  }
  state->peer_host = host;
  SSL* ssl = SSL_new(ctx);
  if (ssl == nullptr) {
    close(fd);
    return "tls: cannot create a session";
  }
  SSL_set_ex_data(ssl, StateIndex(), state);
  SSL_set_fd(ssl, fd);
  in6_addr ip{};
  if (inet_pton(AF_INET, host.c_str(), &ip) != 1 && inet_pton(AF_INET6, host.c_str(), &ip) != 1) {
    SSL_set_tlsext_host_name(ssl, host.c_str());  // Go sends SNI for names only
  }
  static constexpr unsigned char kH2[] = "\x02h2";
  SSL_set_alpn_protos(ssl, kH2, sizeof(kH2) - 1);
  // The socket stays non-blocking: each step waits for it until the deadline.
  HandshakeWait wait = HandshakeWait::kDone;
  int ret;
  while (true) {
    ERR_clear_error();
    ret = SSL_connect(ssl);
    if (ret == 1) break;
    wait = AwaitSocket(fd, SSL_get_error(ssl, ret), stop_fd, deadline);
    if (wait != HandshakeWait::kReady) break;
  }
  if (ret != 1) {
    std::string error = wait == HandshakeWait::kStopped
                            ? "use of closed network connection"
                            : FailureText(*state, ssl, ret, wait == HandshakeWait::kTimedOut);
    SSL_set_ex_data(ssl, StateIndex(), nullptr);
    SSL_free(ssl);
    close(fd);
    return error;
  }
  *out_fd = fd;
  *out_ssl = ssl;
  return "";
}

}  // namespace

std::string DialPeer(SSL_CTX* ctx, const std::string& host, int port, absl::Duration timeout,
                     int stop_fd, int* fd, SSL** ssl) {
  BlockSigpipeOnThisThread();
  HandshakeState state;
  std::string error = Dial(ctx, host, port, absl::Now() + timeout, stop_fd, &state, fd, ssl);
  if (*ssl != nullptr) SSL_set_ex_data(*ssl, StateIndex(), nullptr);
  return error;
}

std::string ProbePeer(SSL_CTX* ctx, const std::string& host, int port, absl::Duration timeout) {
  BlockSigpipeOnThisThread();
  // One deadline for the whole probe: connect, handshake and first read.
  const absl::Time deadline = absl::Now() + timeout;
  HandshakeState state;
  int fd = -1;
  SSL* ssl = nullptr;
  std::string error = Dial(ctx, host, port, deadline, -1, &state, &fd, &ssl);
  if (!error.empty()) return error;
  // Say it is a probe (kProbeByte): the listener closes at once. In TLS 1.3
  // the listener checks our certificate after we finished: its refusal is
  // the alert that comes instead of the close. Silence until the deadline
  // counts as accepted.
  ERR_clear_error();
  (void)SSL_write(ssl, &kProbeByte, 1);
  char byte;
  int ret;
  while (true) {
    ERR_clear_error();
    ret = SSL_read(ssl, &byte, 1);
    if (ret > 0) break;
    if (AwaitSocket(fd, SSL_get_error(ssl, ret), -1, deadline) != HandshakeWait::kReady) break;
  }
  if (ret <= 0 && (state.alert >= 0 || !state.reason.empty())) {
    error = FailureText(state, ssl, ret, false);
  }
  ERR_clear_error();
  SSL_set_ex_data(ssl, StateIndex(), nullptr);
  SSL_free(ssl);
  close(fd);
  return error;
}

bool LogLimiter::Allow(const std::string& key, absl::Time now, int64_t* suppressed) {
  util::MutexLock l(&mu_);
  Entry& e = entries_[key];
  if (now - e.last < interval_) {
    ++e.suppressed;
    return false;
  }
  e.last = now;
  *suppressed = e.suppressed;
  e.suppressed = 0;
  return true;
}

}  // namespace capstan::server::peer
