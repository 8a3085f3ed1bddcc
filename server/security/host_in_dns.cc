#include "server/security/host_in_dns.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "absl/strings/match.h"

namespace capstan::server {

std::string IpText(const void* addr, int family) {
  char text[INET6_ADDRSTRLEN] = {};
  if (!inet_ntop(family, addr, text, sizeof text)) return "";
  return text;
}

bool HostInDns(const std::string& host, const std::vector<std::string>& dns) {
  addrinfo hints{};
  hints.ai_flags = AI_NUMERICHOST;
  addrinfo* numeric = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &numeric) == 0) {
    char name[NI_MAXHOST] = {};
    const bool named = getnameinfo(numeric->ai_addr, numeric->ai_addrlen, name, sizeof name,
                                   nullptr, 0, NI_NAMEREQD) == 0;
    freeaddrinfo(numeric);
    std::string reverse = named ? name : "";
    if (absl::EndsWith(reverse, ".")) reverse.pop_back();
    for (const auto& d : dns) {
      if (reverse.empty()) break;
      if (absl::StartsWith(d, "*.") ? absl::EndsWith(reverse, d.substr(1)) : reverse == d) {
        return true;
      }
    }
  }
  for (const auto& d : dns) {
    if (absl::StartsWith(d, "*.")) continue;
    addrinfo forward_hints{};
    forward_hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(d.c_str(), nullptr, &forward_hints, &found) != 0) continue;
    bool match = false;
    for (addrinfo* a = found; a && !match; a = a->ai_next) {
      if (a->ai_family == AF_INET) {
        match = IpText(&reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr, AF_INET) == host;
      } else if (a->ai_family == AF_INET6) {
        match = IpText(&reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr, AF_INET6) ==
                host;
      }
    }
    freeaddrinfo(found);
    if (match) return true;
  }
  return false;
}

}  // namespace capstan::server
