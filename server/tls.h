// TLS for the client URLs: certificates from --cert-file/--key-file (or a
// self-signed pair made by --auto-tls), client certificates checked against
// --trusted-ca-file when --client-cert-auth is set and against
// --client-crl-file's revocation list and, with
// --client-cert-allowed-hostname, for that hostname; cipher suites from
// --cipher-suites.

#ifndef CAPSTAN_SERVER_TLS_H_
#define CAPSTAN_SERVER_TLS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"
#include "server/config.h"

namespace capstan::server {

// The credentials for https/unixs client URLs. Fails with a message naming
// the flag when files are missing or unreadable, and refuses TLS version
// limits the installed gRPC cannot enforce (see CheckTlsVersions).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ClientTlsCredentials(
    const ServerConfig& config);

// Ok for --tls-min-version/--tls-max-version values gRPC 1.51 honours (the
// default range TLS1.2..TLS1.3); UNIMPLEMENTED with a message naming the
// flag for TLS1.3-only or TLS1.2-only. REQUIRES: values passed config
// validation ("", "TLS1.2" or "TLS1.3").
absl::Status CheckTlsVersions(const std::string& min_version, const std::string& max_version);

// Writes --client-crl-file (PEM or DER) into dir, emptied first, under the
// hashed name gRPC's CRL directory lookup expects; returns dir.
absl::StatusOr<std::string> CrlDirectory(const std::string& crl_file, const std::string& dir);

// Writes a self-signed ECDSA P-256 certificate valid for `hosts` (IPs or DNS
// names) for `years` into dir/cert.pem and dir/key.pem, as etcd's --auto-tls
// does under <data-dir>/fixtures/client. Reuses an existing pair.
absl::Status SelfSignedCertificate(const std::string& dir, const std::vector<std::string>& hosts,
                                   int years);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_TLS_H_
