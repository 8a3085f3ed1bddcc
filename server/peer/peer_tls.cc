#include "server/peer/peer_tls.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_format.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "openssl/bio.h"
#include "openssl/err.h"
#include "openssl/pem.h"
#include "openssl/x509v3.h"
#include "server/security/host_in_dns.h"
#include "server/security/tls.h"

namespace capstan::server {
namespace {

// The host of a gRPC target name ("127.0.0.1:2380", "[::1]:2380", "host").
std::string TargetHost(grpc::string_ref target) {
  std::string t(target.data(), target.size());
  if (!t.empty() && t[0] == '[') {
    const size_t close = t.find(']');
    return close == std::string::npos ? t : t.substr(1, close - 1);
  }
  const size_t colon = t.rfind(':');
  if (colon != std::string::npos && t.find(':') == colon) return t.substr(0, colon);
  return t;
}

// What etcd checks after the chain is verified, on either side of a peer
// connection: the allowed CN or hostname (VerifyPeerCertificate), the CRL
// (the peer listener's checkCRL), and on the dialing side that the peer's
// certificate is valid for the host dialed (Go's tls client).
class PeerCertVerifier : public grpc::experimental::ExternalCertificateVerifier {
 public:
  PeerCertVerifier(bool dialing, std::string allowed_cn, std::string allowed_hostname,
                   std::string crl_file)
      : dialing_(dialing),
        allowed_cn_(std::move(allowed_cn)),
        allowed_hostname_(std::move(allowed_hostname)),
        crl_file_(std::move(crl_file)) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)>, grpc::Status* sync_status) override {
    *sync_status = Check(*request);
    return true;  // answered synchronously
  }
  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {}

 private:
  grpc::Status Check(const grpc::experimental::TlsCustomVerificationCheckRequest& request) const {
    std::vector<std::string> ips, names;
    for (const auto& ip : request.ip_names()) ips.emplace_back(ip.data(), ip.size());
    for (const auto& dns : request.dns_names()) names.emplace_back(dns.data(), dns.size());
    if (dialing_) {
      const std::string host = TargetHost(request.target_name());
      if (!CertificateValidForHostname(ips, names, host)) {
        return grpc::Status(grpc::UNAUTHENTICATED,
                            absl::StrCat("x509: certificate is not valid for ", host));
      }
    }
    if (!allowed_cn_.empty()) {
      const grpc::string_ref cn = request.common_name();
      if (std::string(cn.data(), cn.size()) != allowed_cn_) {
        return grpc::Status(grpc::UNAUTHENTICATED, "client certificate authentication failed");
      }
    }
    if (!allowed_hostname_.empty() && !CertificateValidForHostname(ips, names, allowed_hostname_)) {
      return grpc::Status(grpc::UNAUTHENTICATED, "client certificate authentication failed");
    }
    if (std::string reason = HandshakeRevokedByCrl(crl_file_, request); !reason.empty()) {
      return grpc::Status(grpc::UNAUTHENTICATED, reason);
    }
    return grpc::Status::OK;
  }

  const bool dialing_;
  const std::string allowed_cn_;
  const std::string allowed_hostname_;
  const std::string crl_file_;
};

}  // namespace

std::string PeerAddressMismatch(std::string_view pem, const std::string& host) {
  auto certs = ReadPemCertificates(pem);
  if (certs.empty()) return "";
  std::vector<std::string> ips, dns;
  auto* general = static_cast<GENERAL_NAMES*>(
      X509_get_ext_d2i(certs[0].get(), NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; general && i < sk_GENERAL_NAME_num(general); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(general, i);
    if (name->type == GEN_DNS) {
      dns.emplace_back(reinterpret_cast<const char*>(ASN1_STRING_get0_data(name->d.dNSName)),
                       ASN1_STRING_length(name->d.dNSName));
    } else if (name->type == GEN_IPADD) {
      const int len = ASN1_STRING_length(name->d.iPAddress);
      const unsigned char* data = ASN1_STRING_get0_data(name->d.iPAddress);
      if (len == 4) ips.push_back(IpText(data, AF_INET));
      if (len == 16) ips.push_back(IpText(data, AF_INET6));
    }
  }
  GENERAL_NAMES_free(general);
  if (ips.empty() && dns.empty()) return "";
  if (!ips.empty()) {
    if (CertificateValidForHostname(ips, {}, host)) return "";
    if (dns.empty()) {
      return absl::StrCat("x509: certificate is valid for ", absl::StrJoin(ips, ", "), ", not ",
                          host);
    }
  }
  if (HostInDns(host, dns)) return "";
  return absl::StrCat("tls: \"", host, "\" does not match any of DNSNames [\"",
                      absl::StrJoin(dns, "\" \""), "\"]");
}

bool HasPeerCertificate(const ServerConfig& config) {
  return !config.peer_cert_file.empty() || !config.peer_key_file.empty() || config.peer_auto_tls;
}

absl::StatusOr<PeerTls> ResolvePeerTls(const ServerConfig& config) {
  PeerTls tls;
  tls.min_version = config.tls_min_version;
  tls.max_version = config.tls_max_version;
  if (config.peer_cert_file.empty() && config.peer_key_file.empty() && config.peer_auto_tls) {
    // etcd's PeerSelfCert: the whole peer TLSInfo becomes the self-signed
    // pair, valid for the listen peer URLs' hosts.
    const std::string dir = config.data_dir + "/fixtures/peer";
    std::vector<std::string> hosts;
    for (const auto& u : config.listen_peer_urls) hosts.push_back(u.Hostname());
    if (auto s = SelfSignedCertificate(dir, hosts,
                                       static_cast<int>(config.self_signed_cert_validity_years));
        !s.ok()) {
      return s;
    }
    tls.cert_file = tls.client_cert_file = dir + "/cert.pem";
    tls.key_file = tls.client_key_file = dir + "/key.pem";
    tls.self_signed = true;
    return tls;
  }
  if (config.peer_cert_file.empty() || config.peer_key_file.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "KeyFile and CertFile must both be present[key: %s, cert: %s]", config.peer_key_file,
        config.peer_cert_file));
  }
  if ((config.peer_client_cert_file.empty()) != (config.peer_client_key_file.empty())) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ClientKeyFile and ClientCertFile must both be present or both absent: key: %s, cert: %s]",
        config.peer_client_key_file, config.peer_client_cert_file));
  }
  if (!config.peer_cert_allowed_cn.empty() && !config.peer_cert_allowed_hostname.empty()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "AllowedCN and AllowedHostname are mutually exclusive (cn=\"%s\", hostname=\"%s\")",
        config.peer_cert_allowed_cn, config.peer_cert_allowed_hostname));
  }
  tls.cert_file = config.peer_cert_file;
  tls.key_file = config.peer_key_file;
  tls.client_cert_file =
      config.peer_client_cert_file.empty() ? config.peer_cert_file : config.peer_client_cert_file;
  tls.client_key_file =
      config.peer_client_key_file.empty() ? config.peer_key_file : config.peer_client_key_file;
  tls.trusted_ca_file = config.peer_trusted_ca_file;
  // etcd's TLSInfo.ServerConfig: a trusted CA alone also requires a
  // verified client certificate.
  tls.require_client_cert = config.peer_client_cert_auth || !tls.trusted_ca_file.empty();
  if (config.peer_client_cert_auth && tls.trusted_ca_file.empty()) {
    return absl::InvalidArgumentError("--peer-client-cert-auth requires --peer-trusted-ca-file");
  }
  tls.crl_file = config.peer_crl_file;
  tls.check_client_san = !config.peer_skip_client_san_verification;
  tls.allowed_cn = config.peer_cert_allowed_cn;
  tls.allowed_hostname = config.peer_cert_allowed_hostname;
  return tls;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PeerServerCredentials(const PeerTls& tls) {
  if (auto s = RestrictTlsVersions(tls.min_version, tls.max_version); !s.ok()) return s;
  auto pem = ReadTlsPem({tls.cert_file, "--peer-cert-file"}, {tls.key_file, "--peer-key-file"},
                        {tls.trusted_ca_file, "--peer-trusted-ca-file"});
  if (!pem.ok()) return pem.status();
  const std::string& ca = pem->ca;
  if (!tls.crl_file.empty()) {
    // Refuse an unusable list at start rather than every peer later.
    if (auto crl = ReadCrl(tls.crl_file); !crl.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peer-crl-file ", tls.crl_file, ": not a readable revocation list"));
    }
  }
  auto provider = std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
      ca, std::vector<grpc::experimental::IdentityKeyCertPair>{{pem->key, pem->cert}});
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!ca.empty()) options.watch_root_certs();
  options.set_cert_request_type(tls.require_client_cert
                                    ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                    : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!tls.allowed_cn.empty() || !tls.allowed_hostname.empty() || !tls.crl_file.empty()) {
    options.set_certificate_verifier(
        grpc::experimental::ExternalCertificateVerifier::Create<PeerCertVerifier>(
            /*dialing=*/false, tls.allowed_cn, tls.allowed_hostname, tls.crl_file));
  }
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PeerChannelCredentials(const PeerTls& tls) {
  if (auto s = RestrictTlsVersions(tls.min_version, tls.max_version); !s.ok()) return s;
  const bool client_is_peer_cert = tls.client_cert_file == tls.cert_file;
  auto pem = ReadTlsPem(
      {tls.client_cert_file, client_is_peer_cert ? "--peer-cert-file" : "--peer-client-cert-file"},
      {tls.client_key_file, client_is_peer_cert ? "--peer-key-file" : "--peer-client-key-file"},
      {tls.trusted_ca_file, "--peer-trusted-ca-file"});
  if (!pem.ok()) return pem.status();
  const std::string& ca = pem->ca;
  auto provider = std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
      ca, std::vector<grpc::experimental::IdentityKeyCertPair>{{pem->key, pem->cert}});
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_identity_key_cert_pairs();
  if (!ca.empty()) options.watch_root_certs();
  if (tls.self_signed) {
    // etcd's selfCert: peers' self-signed certificates are taken as they are.
    options.set_verify_server_certs(false);
    options.set_certificate_verifier(
        grpc::experimental::ExternalCertificateVerifier::Create<PeerCertVerifier>(
            /*dialing=*/false, "", "", ""));
  } else {
    options.set_certificate_verifier(
        grpc::experimental::ExternalCertificateVerifier::Create<PeerCertVerifier>(
            /*dialing=*/true, tls.allowed_cn, tls.allowed_hostname, ""));
  }
  options.set_check_call_host(false);  // the verifier checks the host
  return grpc::experimental::TlsCredentials(options);
}

}  // namespace capstan::server
