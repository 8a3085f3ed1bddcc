#include "server/security/metrics_tls.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "openssl/bn.h"
#include "openssl/x509v3.h"
#include "server/security/host_in_dns.h"
#include "spdlog/spdlog.h"

namespace capstan::server {
namespace {

// The settings the verify callback needs, owned by the SSL_CTX.
struct ClientCertChecks {
  std::string allowed_hostname;
  std::string crl_file;
  bool check_client_address = true;  // etcd's checkSAN
};

int ChecksIndex() {
  static const int index = SSL_CTX_get_ex_new_index(
      0, nullptr, nullptr, nullptr,
      [](void*, void* checks, CRYPTO_EX_DATA*, int, long, void*) {
        delete static_cast<ClientCertChecks*>(checks);
      });
  return index;
}


// The address of the connection's peer as text ("127.0.0.1", "::1").
std::string PeerHost(SSL* ssl) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  if (getpeername(SSL_get_fd(ssl), reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "";
  if (addr.ss_family == AF_INET) {
    return IpText(&reinterpret_cast<const sockaddr_in*>(&addr)->sin_addr, AF_INET);
  }
  if (addr.ss_family == AF_INET6) {
    const in6_addr& ip = reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr;
    // An IPv4 client of a dual-stack socket, shown as Go shows it.
    if (IN6_IS_ADDR_V4MAPPED(&ip)) return IpText(&ip.s6_addr[12], AF_INET);
    return IpText(&ip, AF_INET6);
  }
  return "";
}

struct SubjectAltNames {
  std::vector<std::string> ips;
  std::vector<std::string> dns;
};

SubjectAltNames AltNames(X509* cert) {
  SubjectAltNames names;
  auto* general = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; general && i < sk_GENERAL_NAME_num(general); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(general, i);
    if (name->type == GEN_DNS) {
      names.dns.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(name->d.dNSName)),
                             ASN1_STRING_length(name->d.dNSName));
    } else if (name->type == GEN_IPADD) {
      const int len = ASN1_STRING_length(name->d.iPAddress);
      const unsigned char* data = ASN1_STRING_get0_data(name->d.iPAddress);
      if (len == 4) names.ips.push_back(IpText(data, AF_INET));
      if (len == 16) names.ips.push_back(IpText(data, AF_INET6));
    }
  }
  GENERAL_NAMES_free(general);
  return names;
}


// Why etcd refuses the verified client certificate chain, or "".
std::string RefusalReason(const ClientCertChecks& checks, X509_STORE_CTX* store, SSL* ssl) {
  X509* leaf = X509_STORE_CTX_get_current_cert(store);
  const SubjectAltNames sans = AltNames(leaf);
  // Go's VerifyPeerCertificate, set by etcd for an allowed hostname.
  if (!checks.allowed_hostname.empty() &&
      !CertificateValidForHostname(sans.ips, sans.dns, checks.allowed_hostname)) {
    return "client certificate authentication failed";
  }
  // etcd's checkSAN.
  if (checks.check_client_address && (!sans.ips.empty() || !sans.dns.empty())) {
    const std::string host = PeerHost(ssl);
    const bool ip_match = CertificateValidForHostname(sans.ips, {}, host);
    if (!ip_match && sans.dns.empty()) {
      return absl::StrCat("x509: certificate is valid for ", absl::StrJoin(sans.ips, ", "),
                          ", not ", host);
    }
    if (!ip_match && !HostInDns(host, sans.dns)) {
      return absl::StrCat("tls: \"", host, "\" does not match any of DNSNames [\"",
                          absl::StrJoin(sans.dns, "\" \""), "\"]");
    }
  }
  if (!checks.crl_file.empty()) {
    STACK_OF(X509)* chain = X509_STORE_CTX_get0_chain(store);
    std::vector<const X509*> certs;
    for (int i = 0; i < sk_X509_num(chain); ++i) certs.push_back(sk_X509_value(chain, i));
    if (std::string reason = RevokedByCrl(checks.crl_file, certs); !reason.empty()) return reason;
  }
  return "";
}

int VerifyClientCertificate(int preverified, X509_STORE_CTX* store) {
  auto* ssl = static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  const auto* checks =
      static_cast<const ClientCertChecks*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), ChecksIndex()));
  std::string reason;
  if (!preverified) {
    reason = X509_verify_cert_error_string(X509_STORE_CTX_get_error(store));
  } else if (X509_STORE_CTX_get_error_depth(store) == 0) {
    reason = RefusalReason(*checks, store, ssl);
  }
  if (reason.empty()) return 1;
  SPDLOG_WARN("rejected connection on a metrics URL from {}: {}", PeerHost(ssl), reason);
  // Mapped by OpenSSL to the bad_certificate alert.
  X509_STORE_CTX_set_error(store, X509_V_ERR_CERT_REJECTED);
  return 0;
}

absl::StatusOr<int> ProtocolVersion(const std::string& version, int unset) {
  if (version.empty()) return unset;
  if (version == "TLS1.2") return TLS1_2_VERSION;
  if (version == "TLS1.3") return TLS1_3_VERSION;
  return absl::InvalidArgumentError(absl::StrCat("unexpected TLS version \"", version, "\""));
}

}  // namespace

absl::Status SetUpHttpsTls(const ClientTls& tls, bool check_client_address, SSL_CTX* ctx) {
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  // Send the certificates of --cert-file only, as Go does, not a chain
  // completed from the trusted CAs.
  SSL_CTX_set_mode(ctx, SSL_MODE_NO_AUTO_CHAIN);
  auto min = ProtocolVersion(tls.min_version, TLS1_2_VERSION);
  if (!min.ok()) return min.status();
  auto max = ProtocolVersion(tls.max_version, 0);  // 0: the newest
  if (!max.ok()) return max.status();
  if (!SSL_CTX_set_min_proto_version(ctx, *min) || !SSL_CTX_set_max_proto_version(ctx, *max)) {
    return absl::InternalError("cannot set the TLS versions");
  }
  // TLS 1.3 suites stay OpenSSL's, as Go's cannot be configured either.
  const std::vector<std::string> suites =
      tls.cipher_suites.empty() ? DefaultCipherNames() : tls.cipher_suites;
  if (SSL_CTX_set_cipher_list(ctx, absl::StrJoin(suites, ":").c_str()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--cipher-suites: OpenSSL has none of ", absl::StrJoin(suites, ", ")));
  }
  if (SSL_CTX_use_certificate_chain_file(ctx, tls.cert_file.c_str()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read --cert-file ", tls.cert_file));
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, tls.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read --key-file ", tls.key_file));
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--key-file ", tls.key_file, " does not match --cert-file ", tls.cert_file));
  }
  if (!tls.trusted_ca_file.empty()) {
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(tls.trusted_ca_file.c_str());
    if (!names || SSL_CTX_load_verify_locations(ctx, tls.trusted_ca_file.c_str(), nullptr) != 1) {
      if (names) sk_X509_NAME_pop_free(names, X509_NAME_free);
      return absl::InvalidArgumentError(
          absl::StrCat("cannot read --trusted-ca-file ", tls.trusted_ca_file));
    }
    SSL_CTX_set_client_CA_list(ctx, names);  // takes ownership
  }
  if (!tls.require_client_cert) {
    SSL_CTX_set_verify(ctx, SSL_VERIFY_NONE, nullptr);
    return absl::OkStatus();
  }
  auto checks = std::make_unique<ClientCertChecks>();
  checks->allowed_hostname = tls.allowed_hostname;
  checks->crl_file = tls.crl_file;
  checks->check_client_address = check_client_address;
  if (SSL_CTX_set_ex_data(ctx, ChecksIndex(), checks.get()) != 1) {
    return absl::InternalError("cannot attach the client certificate checks");
  }
  checks.release();  // owned by ctx, freed by ChecksIndex()'s free function
  // etcd checks every connection, a resumed session too; OpenSSL would not
  // verify the certificate of a resumed session again.
  SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(ctx, 0);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                     VerifyClientCertificate);
  return absl::OkStatus();
}

absl::StatusOr<SSL_CTX*> NewHttpsContext(const ClientTls& tls) {
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return absl::InternalError("cannot create a TLS context");
  if (auto s = SetUpHttpsTls(tls, /*check_client_address=*/false, ctx); !s.ok()) {
    SSL_CTX_free(ctx);
    return s;
  }
  SSL_CTX_set_alpn_select_cb(
      ctx,
      [](SSL*, const unsigned char** out, unsigned char* out_length, const unsigned char* in,
         unsigned int in_length, void*) {
        static constexpr unsigned char kHttp11[] = "\x08http/1.1";
        unsigned char* selected = nullptr;
        if (SSL_select_next_proto(&selected, out_length, kHttp11, sizeof(kHttp11) - 1, in,
                                  in_length) != OPENSSL_NPN_NEGOTIATED) {
          return SSL_TLSEXT_ERR_NOACK;
        }
        *out = selected;
        return SSL_TLSEXT_ERR_OK;
      },
      nullptr);
  return ctx;
}

}  // namespace capstan::server
