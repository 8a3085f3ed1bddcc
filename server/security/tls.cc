#include "server/security/tls.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "openssl/bio.h"
#include "openssl/conf.h"
#include "openssl/ec.h"
#include "openssl/err.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "openssl/ssl.h"
#include "openssl/x509v3.h"

namespace capstan::server {
namespace fs = std::filesystem;

namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read ", flag, " ", path));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Go's cipher suite names (etcd's --cipher-suites) as OpenSSL names.
const std::map<std::string, std::string>& CipherNames() {
  static const auto* names = new std::map<std::string, std::string>{
      {"TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "ECDHE-ECDSA-AES128-GCM-SHA256"},
      {"TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", "ECDHE-RSA-AES128-GCM-SHA256"},
      {"TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", "ECDHE-ECDSA-AES256-GCM-SHA384"},
      {"TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", "ECDHE-RSA-AES256-GCM-SHA384"},
      {"TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305", "ECDHE-ECDSA-CHACHA20-POLY1305"},
      {"TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305", "ECDHE-RSA-CHACHA20-POLY1305"},
      {"TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA", "ECDHE-ECDSA-AES128-SHA"},
      {"TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA", "ECDHE-RSA-AES128-SHA"},
      {"TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA", "ECDHE-ECDSA-AES256-SHA"},
      {"TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA", "ECDHE-RSA-AES256-SHA"},
      {"TLS_RSA_WITH_AES_128_GCM_SHA256", "AES128-GCM-SHA256"},
      {"TLS_RSA_WITH_AES_256_GCM_SHA384", "AES256-GCM-SHA384"},
      {"TLS_RSA_WITH_AES_128_CBC_SHA", "AES128-SHA"},
      {"TLS_RSA_WITH_AES_256_CBC_SHA", "AES256-SHA"},
  };
  return *names;
}

std::string SerialHex(const ASN1_INTEGER* serial) {
  BIGNUM* bn = ASN1_INTEGER_to_BN(serial, nullptr);
  char* hex = bn ? BN_bn2hex(bn) : nullptr;
  std::string text = hex ? absl::AsciiStrToLower(hex) : "";
  OPENSSL_free(hex);
  BN_free(bn);
  return text;
}

// The checks etcd's TLS listener makes after the chain is verified:
// --client-cert-allowed-hostname (the client certificate must be valid for
// the hostname) and --client-crl-file (RevokedByCrl).
class ClientCertVerifier : public grpc::experimental::ExternalCertificateVerifier {
 public:
  ClientCertVerifier(std::string hostname, std::string crl_file)
      : hostname_(std::move(hostname)), crl_file_(std::move(crl_file)) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)>, grpc::Status* sync_status) override {
    *sync_status = Check(*request);
    return true;  // answered synchronously
  }
  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {}

 private:
  grpc::Status Check(const grpc::experimental::TlsCustomVerificationCheckRequest& request) const {
    if (!hostname_.empty()) {
      std::vector<std::string> ips, names;
      for (const auto& ip : request.ip_names()) ips.emplace_back(ip.data(), ip.size());
      for (const auto& dns : request.dns_names()) names.emplace_back(dns.data(), dns.size());
      if (!CertificateValidForHostname(ips, names, hostname_)) {
        return grpc::Status(grpc::UNAUTHENTICATED, "client certificate authentication failed");
      }
    }
    if (std::string reason = HandshakeRevokedByCrl(crl_file_, request); !reason.empty()) {
      return grpc::Status(grpc::UNAUTHENTICATED, reason);
    }
    return grpc::Status::OK;
  }

  const std::string hostname_;
  const std::string crl_file_;
};

}  // namespace

absl::Status SelfSignedCertificate(const std::string& dir, const std::vector<std::string>& hosts,
                                   int years) {
  const std::string cert_path = dir + "/cert.pem", key_path = dir + "/key.pem";
  std::error_code ec;
  if (fs::exists(cert_path, ec) && fs::exists(key_path, ec)) return absl::OkStatus();
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir, ": ", ec.message()));

  EVP_PKEY* key = EVP_EC_gen("P-256");
  if (!key) return absl::InternalError("cannot generate a key for --auto-tls");
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), static_cast<long>(std::rand()) + 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), 0);
  X509_gmtime_adj(X509_getm_notAfter(cert), static_cast<long>(years) * 365 * 24 * 3600);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("capstan"), -1, -1, 0);
  X509_set_issuer_name(cert, name);
  std::vector<std::string> sans;
  for (const auto& h : hosts) {
    const bool ip = !h.empty() && (std::isdigit(static_cast<unsigned char>(h[0])) || h[0] == ':');
    sans.push_back(absl::StrCat(ip ? "IP:" : "DNS:", h));
  }
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
  const std::string san = absl::StrJoin(sans, ",");
  for (auto [nid, value] : {std::pair<int, std::string>{NID_subject_alt_name, san},
                            {NID_key_usage, "critical,digitalSignature,keyEncipherment"},
                            {NID_ext_key_usage, "serverAuth,clientAuth"}}) {
    if (value.empty()) continue;
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    if (ext) {
      X509_add_ext(cert, ext, -1);
      X509_EXTENSION_free(ext);
    }
  }
  X509_sign(cert, key, EVP_sha256());

  absl::Status status;
  FILE* cf = std::fopen(cert_path.c_str(), "w");
  FILE* kf = std::fopen(key_path.c_str(), "w");
  if (!cf || !kf || !PEM_write_X509(cf, cert) ||
      !PEM_write_PrivateKey(kf, key, nullptr, nullptr, 0, nullptr, nullptr)) {
    status = absl::InternalError(absl::StrCat("cannot write the --auto-tls pair into ", dir));
  }
  if (cf) std::fclose(cf);
  if (kf) std::fclose(kf);
  ::chmod(key_path.c_str(), 0600);
  X509_free(cert);
  EVP_PKEY_free(key);
  return status;
}

absl::Status RestrictTlsVersions(const std::string& min_version, const std::string& max_version) {
  std::string disabled;
  if (min_version == "TLS1.3") disabled = "-TLSv1.2";
  if (max_version == "TLS1.2") disabled = "-TLSv1.3";
  if (disabled.empty()) return absl::OkStatus();
  // The default configuration first (it is loaded only once, and loading it
  // later would replace this one). Then an SSL configuration module whose
  // system_default section disables the versions out of range; it keeps
  // Debian's default security level.
  if (OPENSSL_init_ssl(OPENSSL_INIT_LOAD_CONFIG, nullptr) != 1) {
    return absl::InternalError("cannot initialise OpenSSL");
  }
  const std::string text = absl::StrCat(
      "capstan_tls = capstan_tls_modules\n"
      "[capstan_tls_modules]\n"
      "ssl_conf = capstan_tls_ssl\n"
      "[capstan_tls_ssl]\n"
      "system_default = capstan_tls_versions\n"
      "[capstan_tls_versions]\n"
      "CipherString = DEFAULT:@SECLEVEL=2\n"
      "Protocol = ",
      disabled, "\n");
  BIO* bio = BIO_new_mem_buf(text.data(), static_cast<int>(text.size()));
  CONF* conf = NCONF_new(nullptr);
  long error_line = 0;
  const bool loaded = bio != nullptr && conf != nullptr &&
                      NCONF_load_bio(conf, bio, &error_line) == 1 &&
                      CONF_modules_load(conf, "capstan_tls", 0) == 1;
  NCONF_free(conf);
  BIO_free(bio);
  if (!loaded) {
    return absl::InternalError(absl::StrCat("cannot apply --tls-min-version=", min_version,
                                            " --tls-max-version=", max_version,
                                            " to OpenSSL's configuration"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CrlPtr> ReadCrl(const std::string& crl_file) {
  auto data = ReadFile(crl_file, "--client-crl-file");
  if (!data.ok()) return data.status();
  BIO* bio = BIO_new_mem_buf(data->data(), static_cast<int>(data->size()));
  CrlPtr crl(PEM_read_bio_X509_CRL(bio, nullptr, nullptr, nullptr));
  if (!crl) {
    BIO_free(bio);
    bio = BIO_new_mem_buf(data->data(), static_cast<int>(data->size()));
    crl.reset(d2i_X509_CRL_bio(bio, nullptr));
  }
  BIO_free(bio);
  if (!crl) {
    return absl::InvalidArgumentError(
        absl::StrCat("--client-crl-file ", crl_file, ": not a PEM or DER certificate revocation list"));
  }
  return crl;
}

std::string RevokedByCrl(const std::string& crl_file, const std::vector<const X509*>& certs) {
  auto crl = ReadCrl(crl_file);
  if (!crl.ok()) return std::string(crl.status().message());
  for (const X509* cert : certs) {
    const ASN1_INTEGER* serial = X509_get0_serialNumber(cert);
    X509_REVOKED* revoked = nullptr;
    if (X509_CRL_get0_by_serial(crl->get(), &revoked, serial) == 1) {
      return absl::StrCat("transport: certificate with serial ", SerialHex(serial), " revoked");
    }
  }
  return "";
}

std::string HandshakeRevokedByCrl(
    const std::string& crl_file,
    const grpc::experimental::TlsCustomVerificationCheckRequest& request) {
  if (crl_file.empty()) return "";
  // Without its own certificate on a server, as OpenSSL keeps the chain.
  const grpc::string_ref leaf_pem = request.peer_cert();
  const grpc::string_ref chain_pem = request.peer_cert_full_chain();
  auto leaf = ReadPemCertificates(std::string_view(leaf_pem.data(), leaf_pem.size()));
  auto chain = ReadPemCertificates(std::string_view(chain_pem.data(), chain_pem.size()));
  std::vector<const X509*> certs;
  for (const auto* list : {&leaf, &chain}) {
    for (const auto& cert : *list) certs.push_back(cert.get());
  }
  return RevokedByCrl(crl_file, certs);
}

std::vector<X509Ptr> ReadPemCertificates(std::string_view pem) {
  std::vector<X509Ptr> certs;
  if (pem.empty()) return certs;
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  while (X509* cert = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr)) certs.emplace_back(cert);
  BIO_free(bio);
  ERR_clear_error();  // the read that ends the loop leaves "no start line"
  return certs;
}

bool CertificateValidForHostname(const std::vector<std::string>& ip_sans,
                                 const std::vector<std::string>& dns_sans,
                                 const std::string& hostname) {
  const std::string host = absl::AsciiStrToLower(hostname);
  for (const auto& ip : ip_sans) {
    if (ip == host) return true;
  }
  for (const auto& dns : dns_sans) {
    const std::string name = absl::AsciiStrToLower(dns);
    if (name == host) return true;
    if (absl::StartsWith(name, "*.")) {
      const size_t dot = host.find('.');
      if (dot != std::string::npos && dot > 0 && host.substr(dot) == name.substr(1)) return true;
    }
  }
  return false;
}

std::vector<std::string> OpenSslCipherNames(const std::vector<std::string>& go_names) {
  std::vector<std::string> names;
  for (const auto& c : go_names) {
    auto it = CipherNames().find(c);
    if (it != CipherNames().end()) names.push_back(it->second);
  }
  return names;
}

std::vector<std::string> DefaultCipherNames() {
  std::vector<std::string> names;
  for (const auto& [go, openssl] : CipherNames()) names.push_back(openssl);
  return names;
}

bool HasClientCertificate(const ServerConfig& config) {
  return !config.cert_file.empty() || !config.key_file.empty() || config.auto_tls;
}

absl::StatusOr<ClientTls> ResolveClientTls(const ServerConfig& config) {
  ClientTls tls;
  tls.cert_file = config.cert_file;
  tls.key_file = config.key_file;
  tls.cipher_suites = OpenSslCipherNames(config.cipher_suites);
  tls.min_version = config.tls_min_version;
  tls.max_version = config.tls_max_version;
  if (tls.cert_file.empty() && tls.key_file.empty() && config.auto_tls) {
    const std::string dir = config.data_dir + "/fixtures/client";
    std::vector<std::string> hosts;
    for (const auto& u : config.listen_client_urls) hosts.push_back(u.Hostname());
    if (auto s = SelfSignedCertificate(dir, hosts, static_cast<int>(config.self_signed_cert_validity_years));
        !s.ok()) {
      return s;
    }
    tls.cert_file = dir + "/cert.pem";
    tls.key_file = dir + "/key.pem";
    // etcd's ClientSelfCert replaces its whole client TLSInfo with the
    // self-signed pair: no trusted CA, no client certificate required, no
    // CRL, no allowed hostname.
    return tls;
  }
  if (tls.cert_file.empty() || tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        "TLS key/cert (--cert-file, --key-file) must both be provided for https URLs (or use "
        "--auto-tls)");
  }
  tls.trusted_ca_file = config.trusted_ca_file;
  // etcd's TLSInfo.ServerConfig: a trusted CA alone also requires a
  // verified client certificate.
  tls.require_client_cert = config.client_cert_auth || !tls.trusted_ca_file.empty();
  if (config.client_cert_auth && tls.trusted_ca_file.empty()) {
    return absl::InvalidArgumentError("--client-cert-auth requires --trusted-ca-file");
  }
  tls.crl_file = config.client_crl_file;
  tls.allowed_hostname = config.client_cert_allowed_hostname;
  return tls;
}

absl::StatusOr<TlsPem> ReadTlsPem(TlsPemFile cert, TlsPemFile key, TlsPemFile ca) {
  TlsPem pem;
  auto read_cert = ReadFile(cert.path, cert.flag);
  if (!read_cert.ok()) return read_cert.status();
  pem.cert = *std::move(read_cert);
  auto read_key = ReadFile(key.path, key.flag);
  if (!read_key.ok()) return read_key.status();
  pem.key = *std::move(read_key);
  if (!ca.path.empty()) {
    auto read_ca = ReadFile(ca.path, ca.flag);
    if (!read_ca.ok()) return read_ca.status();
    pem.ca = *std::move(read_ca);
  }
  return pem;
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ClientTlsCredentials(const ClientTls& tls) {
  if (auto s = RestrictTlsVersions(tls.min_version, tls.max_version); !s.ok()) return s;
  auto pem = ReadTlsPem({tls.cert_file, "--cert-file"}, {tls.key_file, "--key-file"},
                        {tls.trusted_ca_file, "--trusted-ca-file"});
  if (!pem.ok()) return pem.status();
  const std::string& ca = pem->ca;

  // The experimental TLS credentials: the only ones in gRPC 1.51 that take
  // a verifier of their own.
  auto provider = std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
      ca, std::vector<grpc::experimental::IdentityKeyCertPair>{{pem->key, pem->cert}});
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!ca.empty()) options.watch_root_certs();
  options.set_cert_request_type(tls.require_client_cert
                                    ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                                    : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  if (!tls.crl_file.empty()) {
    // Refuse an unusable list at start rather than every client later.
    if (auto crl = ReadCrl(tls.crl_file); !crl.ok()) return crl.status();
  }
  if (!tls.allowed_hostname.empty() || !tls.crl_file.empty()) {
    // OpenSSL's own CRL checking would also refuse every client once the
    // list's next update has passed, which etcd does not.
    options.set_certificate_verifier(
        grpc::experimental::ExternalCertificateVerifier::Create<ClientCertVerifier>(
            tls.allowed_hostname, tls.crl_file));
  }
  if (!tls.cipher_suites.empty()) {
    // gRPC reads its cipher list from the environment when it first builds
    // TLS credentials.
    ::setenv("GRPC_SSL_CIPHER_SUITES", absl::StrJoin(tls.cipher_suites, ":").c_str(), 1);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

}  // namespace capstan::server
