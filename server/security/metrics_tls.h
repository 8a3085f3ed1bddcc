// TLS for HTTP on https metrics and client URLs: an OpenSSL server context
// set up with the client TLS settings, checking client certificates as
// etcd's TLS listener (Go's crypto/tls plus etcd's transport package) does:
//
//   - a client certificate is requested only when one is required; it must
//     chain to the trusted CAs and, with an allowed hostname, be valid for
//     that hostname;
//   - when the certificate names IPs or DNS names, one of them must be the
//     client's own address: an IP SAN equal to it, or a DNS SAN that the
//     address resolves back to or that resolves to the address (etcd's
//     checkSAN, made on metrics URLs only);
//   - no certificate of the verified chain may be listed by serial number in
//     the revocation list, which is read again at every handshake.
//
// A refused certificate fails the handshake with a bad_certificate alert, as
// Go answers all of them; etcd makes the last two checks just after the
// handshake and closes the connection instead. A missing certificate gets
// OpenSSL's alert (handshake_failure, or certificate_required in TLS 1.3)
// where Go sends bad_certificate. Either way the client gets no HTTP
// response.

#ifndef CAPSTAN_SERVER_SECURITY_METRICS_TLS_H_
#define CAPSTAN_SERVER_SECURITY_METRICS_TLS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "openssl/ssl.h"
#include "server/security/tls.h"

namespace capstan::server {

// Sets up ctx, a fresh server context, to serve with tls: the certificate
// and key, TLS versions, TLS 1.2 cipher suites (Go's defaults unless given)
// and the client certificate checks above, the client's address checked
// only if check_client_address (metrics URLs). The checks' settings are
// copied into ctx. Fails with a message naming the flag when a file cannot
// be loaded.
absl::Status SetUpHttpsTls(const ClientTls& tls, bool check_client_address, SSL_CTX* ctx);

// The context of HTTP on https client URLs: SetUpHttpsTls without the
// client address check (etcd's client listener skips it), and HTTP/1.1
// chosen by ALPN when the client offers it. The caller owns the result
// (SSL_CTX_free); it may serve connections on any number of threads.
absl::StatusOr<SSL_CTX*> NewHttpsContext(const ClientTls& tls);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_SECURITY_METRICS_TLS_H_
