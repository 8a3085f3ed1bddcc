// Go-compatible text: the standard library functions whose behaviour and
// error texts etcd's flags inherit (strconv.Quote, ParseUint/ParseInt/
// ParseBool, net.SplitHostPort, url.Parse). Each mirrors its Go function
// closely enough that the error texts match byte for byte in the cases etcd
// users meet; also time.ParseDuration, Duration.String and url.URL. etcd's
// types.NewURLs is ParseUrlList in server/config/config.h.
//
// Thread safety: pure functions.

#ifndef CAPSTAN_UTIL_GO_TEXT_H_
#define CAPSTAN_UTIL_GO_TEXT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace capstan::gotext {

// A URL as Go's net/url splits it (etcd's URL-list flags).
struct Url {
  std::string scheme;  // lower case: http, https, unix or unixs
  std::string host;    // "host:port", "[v6]:port", or for unix URLs any text
  std::string path;    // empty for http(s); the socket path may sit here for unix
  std::string raw_query;
  std::string fragment;
  std::string userinfo;  // "user:password" before '@', rarely used
  bool opaque = false;   // "scheme:text" without "//": the text is in path

  // The URL as Go's url.URL.String() prints it ("http://127.0.0.1:2379").
  std::string String() const;
  // The host without the port and without IPv6 brackets.
  std::string Hostname() const;
  // The port text after the last ':' of host, "" when there is none.
  std::string Port() const;

  friend bool operator==(const Url& a, const Url& b) = default;
};


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

// Go's time.ParseDuration: "300ms", "-1.5h", "2h45m", "0". Errors read like
// Go's: `time: invalid duration "abc"`, `time: missing unit in duration "5"`,
// `time: unknown unit "d" in duration "1d"`.
absl::StatusOr<absl::Duration> ParseGoDuration(std::string_view text);
// Go's time.Duration.String(): "1h0m0s", "100ms", "0s".
std::string FormatGoDuration(absl::Duration d);

// Escapes text for use inside a JSON string, as etcd's logs (zap) and its
// JSON gateway write strings: quote, backslash, \n, \t, \r, other control
// bytes as \u00XX, everything else as it is.
std::string JsonEscape(std::string_view text);

}  // namespace capstan::gotext

#endif  // CAPSTAN_UTIL_GO_TEXT_H_
