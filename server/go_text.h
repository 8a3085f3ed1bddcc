// Go-compatible text: the standard library functions whose behaviour and
// error texts etcd's flags inherit (strconv.Quote, ParseUint/ParseInt/
// ParseBool, net.SplitHostPort, url.Parse). Each mirrors its Go function
// closely enough that the error texts match byte for byte in the cases etcd
// users meet. time.ParseDuration, Duration.String and etcd's types.NewURLs
// are declared in server/config.h and defined in go_text.cc.
//
// Thread safety: pure functions.

#ifndef CAPSTAN_SERVER_GO_TEXT_H_
#define CAPSTAN_SERVER_GO_TEXT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/config.h"

namespace capstan::server::gotext {

// This Abseil build keeps absl::string_view distinct from std::string_view:
// the parsers work in absl::string_view and convert at the public API.
inline std::string_view Std(absl::string_view s) { return std::string_view(s.data(), s.size()); }

// strconv.Quote, as used by fmt's %q.
std::string GoQuote(absl::string_view s);

enum class NumError { kOk, kSyntax, kRange };
// strconv.ParseUint (base 0: prefixes 0x, 0o, 0b, 0 and '_' separators).
NumError ParseGoUint(absl::string_view s, int base, int bits, uint64_t* out);
// strconv.ParseInt, 64-bit.
NumError ParseGoInt(absl::string_view s, int base, int64_t* out);
// strconv.ParseBool.
std::optional<bool> ParseGoBool(absl::string_view s);
// net.SplitHostPort.
absl::Status SplitHostPort(absl::string_view hostport, std::string* host, std::string* port);
// True if host is an IPv4 or IPv6 address literal (net.ParseIP != nil).
bool IsIp(const std::string& host);
// url.QueryUnescape: %XX escapes, and '+' for a space.
absl::StatusOr<std::string> QueryUnescape(absl::string_view s);
// url.Parse, for the absolute URLs etcd flags take.
absl::StatusOr<Url> ParseGoUrl(absl::string_view raw);

}  // namespace capstan::server::gotext

#endif  // CAPSTAN_SERVER_GO_TEXT_H_
