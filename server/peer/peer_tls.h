// TLS for the peer URLs, from etcd's peer flags: the member's certificate
// (--peer-cert-file, --peer-key-file, or a self-signed pair made by
// --peer-auto-tls), peers' certificates checked against
// --peer-trusted-ca-file when --peer-client-cert-auth is set, and then
// against --peer-cert-allowed-cn or --peer-cert-allowed-hostname and
// --peer-crl-file's revocation list. etcd resolves these flags into one
// transport.TLSInfo that serves both the peer listener and the connections
// the member opens to its peers; so does Capstan: the outgoing connections
// present the peer certificate (or --peer-client-cert-file) as their client
// certificate, trust --peer-trusted-ca-file, and apply the allowed CN or
// hostname to the certificate the peer presents, as etcd's
// VerifyPeerCertificate does on both sides.
//
// Thread safety: pure functions of their arguments (they read files), safe
// from any thread.

#ifndef CAPSTAN_SERVER_PEER_PEER_TLS_H_
#define CAPSTAN_SERVER_PEER_PEER_TLS_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "server/config/config.h"

namespace capstan::server {

// The peer TLS settings, resolved from the flags. Paths, not contents: the
// credentials below load the files when they are made.
struct PeerTls {
  std::string cert_file;         // this member's certificate (chain), PEM
  std::string key_file;          // its private key
  std::string client_cert_file;  // presented to peers; cert_file unless --peer-client-cert-file
  std::string client_key_file;
  std::string trusted_ca_file;       // CAs peer certificates must chain to; "" for the system's
  bool require_client_cert = false;  // refuse peers without a verified certificate
  std::string crl_file;              // --peer-crl-file; "" for none
  std::string allowed_cn;            // --peer-cert-allowed-cn; "" for any
  std::string allowed_hostname;      // --peer-cert-allowed-hostname; "" for any
  // --peer-auto-tls without certificates: peers' self-signed certificates
  // are not verified (etcd's selfCert: InsecureSkipVerify).
  bool self_signed = false;
  // etcd's checkSAN, on unless --peer-skip-client-san-verification: a
  // peer's client certificate naming addresses must name the one it
  // connects from (PeerAddressMismatch).
  bool check_client_san = true;
  std::string min_version = "TLS1.2";  // --tls-min-version
  std::string max_version;             // --tls-max-version
};

// True when the flags give the peer URLs a certificate: --peer-cert-file,
// --peer-key-file or --peer-auto-tls (etcd: the peer TLSInfo is not empty).
bool HasPeerCertificate(const ServerConfig& config);

// The peer TLS settings as etcd resolves them: a trusted CA requires client
// certificates even without --peer-client-cert-auth; with --peer-auto-tls
// and neither --peer-cert-file nor --peer-key-file, the self-signed pair in
// <data-dir>/fixtures/peer (made if missing, valid for the
// --listen-peer-urls hosts) and no certificate checks at all. Fails with
// etcd's text when --peer-cert-allowed-cn and --peer-cert-allowed-hostname
// are both set, and with a message naming the flag when a setting is
// unusable. REQUIRES: HasPeerCertificate(config).
absl::StatusOr<PeerTls> ResolvePeerTls(const ServerConfig& config);

// Credentials for the https peer URLs. Peer certificates are checked at
// every handshake: chain (when required), allowed CN or hostname, CRL.
// Fails with a message naming the flag when files are missing or unreadable.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> PeerServerCredentials(const PeerTls& tls);

// Credentials for connections to https peer URLs: the client certificate,
// the trusted CA (the system's roots when none), the peer's certificate
// valid for the URL's host and, when set, with the allowed CN or for the
// allowed hostname.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> PeerChannelCredentials(const PeerTls& tls);

// etcd's checkCertSAN for a peer's client certificate (PEM) and the address
// it connects from (an IP as text): "" when the certificate names no
// address, names that IP, or names a DNS name the address resolves back to
// or that resolves to the address (Go's reverse and forward lookups);
// otherwise why not. May do DNS lookups: call it outside locks.
std::string PeerAddressMismatch(std::string_view pem, const std::string& host);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_PEER_PEER_TLS_H_
