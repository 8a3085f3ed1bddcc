// TLS for the client URLs: certificates from --cert-file/--key-file (or a
// self-signed pair made by --auto-tls), client certificates checked against
// --trusted-ca-file when --client-cert-auth is set.

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
// the flag when files are missing or unreadable.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> ClientTlsCredentials(
    const ServerConfig& config);

// Writes a self-signed ECDSA P-256 certificate valid for `hosts` (IPs or DNS
// names) for `years` into dir/cert.pem and dir/key.pem, as etcd's --auto-tls
// does under <data-dir>/fixtures/client. Reuses an existing pair.
absl::Status SelfSignedCertificate(const std::string& dir, const std::vector<std::string>& hosts,
                                   int years);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_TLS_H_
