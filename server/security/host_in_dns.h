// Go's crypto/tls address checks that etcd applies to a client certificate
// (pkg/transport's isHostInDNS): whether the address a connection comes
// from is one a certificate's DNS names stand for. Used by the HTTPS client
// URLs and by the peer URLs.
//
// Thread safety: plain functions; they may block on DNS lookups.

#ifndef CAPSTAN_SERVER_SECURITY_HOST_IN_DNS_H_
#define CAPSTAN_SERVER_SECURITY_HOST_IN_DNS_H_

#include <string>
#include <vector>

namespace capstan::server {

// An address (a struct in_addr or in6_addr, by family) as text ("127.0.0.1",
// "::1"); empty if it cannot be printed.
std::string IpText(const void* addr, int family);

// etcd's isHostInDNS: a name the host's address resolves back to matches a
// DNS name ("*.example.com" by suffix), or a DNS name resolves to the
// address. host is an address in text form.
bool HostInDns(const std::string& host, const std::vector<std::string>& dns);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_SECURITY_HOST_IN_DNS_H_
