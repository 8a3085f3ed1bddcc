// TLS for the client URLs and the https metrics URLs: certificates from
// --cert-file/--key-file (or a self-signed pair made by --auto-tls), client
// certificates checked against --trusted-ca-file when --client-cert-auth is
// set and against --client-crl-file's revocation list and, with
// --client-cert-allowed-hostname, for that hostname; cipher suites from
// --cipher-suites. etcd resolves these flags into one set of client TLS
// settings (its transport.TLSInfo) that both kinds of listener use.

#ifndef CAPSTAN_SERVER_SECURITY_TLS_H_
#define CAPSTAN_SERVER_SECURITY_TLS_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "openssl/x509.h"
#include "server/config/config.h"

namespace capstan::server {

// The client TLS settings, resolved from the flags. Paths, not contents:
// each listener loads the files when it starts.
struct ClientTls {
  std::string cert_file;  // the server certificate (chain), PEM
  std::string key_file;   // its private key, PEM
  std::string trusted_ca_file;     // CAs client certificates must chain to; "" for none
  bool require_client_cert = false;  // refuse clients without a verified certificate
  std::string crl_file;            // --client-crl-file, PEM or DER; "" for none
  std::string allowed_hostname;    // --client-cert-allowed-hostname; "" for any
  std::vector<std::string> cipher_suites;  // --cipher-suites as OpenSSL names
  std::string min_version = "TLS1.2";  // --tls-min-version
  std::string max_version;             // --tls-max-version; "" for the newest
};

// True when the flags give TLS listeners a certificate: --cert-file,
// --key-file or --auto-tls (etcd: the client TLSInfo is not empty).
bool HasClientCertificate(const ServerConfig& config);

// The client TLS settings, as etcd resolves them: a trusted CA requires
// client certificates even without --client-cert-auth; with --auto-tls and
// neither --cert-file nor --key-file, the self-signed pair in
// <data-dir>/fixtures/client (made if missing) with no client certificate
// checks at all, whatever the other flags say. Fails with a message naming
// the flag when a setting is unusable. REQUIRES: HasClientCertificate(config).
absl::StatusOr<ClientTls> ResolveClientTls(const ServerConfig& config);

// The credentials for https/unixs client URLs. Fails with a message naming
// the flag when files are missing or unreadable; applies TLS version limits
// (see RestrictTlsVersions). Client certificates are checked against the CRL
// at every handshake (see RevokedByCrl).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ClientTlsCredentials(const ClientTls& tls);

// Whether a certificate with these subject alternative names (IPs as text,
// DNS names) is valid for hostname, as Go's x509.Certificate.VerifyHostname
// decides: an IP matches an IP SAN; a name matches a DNS SAN,
// case-insensitively, a leading "*." matching one label; the common name is
// not consulted.
bool CertificateValidForHostname(const std::vector<std::string>& ip_sans,
                                 const std::vector<std::string>& dns_sans,
                                 const std::string& hostname);

// Go cipher suite names (etcd's --cipher-suites) as OpenSSL names; names
// without an OpenSSL equivalent are left out.
std::vector<std::string> OpenSslCipherNames(const std::vector<std::string>& go_names);

// The TLS 1.2 cipher suites that Go offers by default and OpenSSL also has,
// as OpenSSL names.
std::vector<std::string> DefaultCipherNames();

// Makes every TLS context the process creates from now on refuse the
// versions outside --tls-min-version..--tls-max-version. gRPC 1.51 has no
// API for a version range (it always offers TLS1.2 and TLS1.3), so the limit
// goes through OpenSSL's system-default SSL configuration, which OpenSSL
// applies to each new SSL_CTX, gRPC's included: the versions outside the
// range are disabled there. Nothing changes for the default range. Process
// wide, as etcd's flags apply to all its listeners. REQUIRES: the values
// passed config validation ("", "TLS1.2" or "TLS1.3"); called before the
// servers that should honour it are built.
absl::Status RestrictTlsVersions(const std::string& min_version, const std::string& max_version);

// A TLS identity's PEM files, read for gRPC's static certificate
// provider: the certificate, its key and the trusted CA (empty when ca's
// path is). A file that cannot be read fails naming its flag ("cannot read
// --cert-file /path").
struct TlsPemFile {
  const std::string& path;
  const char* flag;
};
struct TlsPem {
  std::string cert, key, ca;
};
absl::StatusOr<TlsPem> ReadTlsPem(TlsPemFile cert, TlsPemFile key, TlsPemFile ca);

struct CrlFree {
  void operator()(X509_CRL* crl) const { X509_CRL_free(crl); }
};
using CrlPtr = std::unique_ptr<X509_CRL, CrlFree>;

// Reads a revocation list, PEM or DER (as Go's x509.ParseCRL); fails with a
// message naming --client-crl-file.
absl::StatusOr<CrlPtr> ReadCrl(const std::string& crl_file);

// etcd's checkCRL: why crl_file refuses a client presenting certs (its
// certificate and the chain it sent), or "" when it does not. Only serial
// numbers count: neither the list's issuer nor its dates are looked at, so
// an expired list still revokes what it names and admits the rest. The file
// is read at every call, as etcd reads it at every handshake; a file that
// cannot be read refuses everyone.
std::string RevokedByCrl(const std::string& crl_file, const std::vector<const X509*>& certs);
// RevokedByCrl for what a TLS peer presented in a gRPC handshake: its
// certificate, then the chain it sent; "" without a list (crl_file empty).
std::string HandshakeRevokedByCrl(
    const std::string& crl_file,
    const grpc::experimental::TlsCustomVerificationCheckRequest& request);

struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;
// Every certificate in PEM text, in order.
std::vector<X509Ptr> ReadPemCertificates(std::string_view pem);

// Writes a self-signed ECDSA P-256 certificate valid for `hosts` (IPs or DNS
// names) for `years` into dir/cert.pem and dir/key.pem, as etcd's --auto-tls
// does under <data-dir>/fixtures/client. Reuses an existing pair.
absl::Status SelfSignedCertificate(const std::string& dir, const std::vector<std::string>& hosts,
                                   int years);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_SECURITY_TLS_H_
