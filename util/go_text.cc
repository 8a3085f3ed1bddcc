#include "util/go_text.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"

namespace capstan::gotext {

// ===========================================================================
// Go-compatible text helpers. Each mirrors one Go standard library function
// closely enough that the error texts match byte for byte in the cases etcd
// users meet.
// ===========================================================================

// strconv.Quote, as used by fmt's %q.
std::string GoQuote(absl::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      switch (c) {
        case '"':
          out += "\\\"";
          break;
        case '\\':
          out += "\\\\";
          break;
        case '\a':
          out += "\\a";
          break;
        case '\b':
          out += "\\b";
          break;
        case '\f':
          out += "\\f";
          break;
        case '\n':
          out += "\\n";
          break;
        case '\r':
          out += "\\r";
          break;
        case '\t':
          out += "\\t";
          break;
        case '\v':
          out += "\\v";
          break;
        default:
          if (c < 0x20 || c == 0x7f) {
            out += "\\x";
            out += kHex[c >> 4];
            out += kHex[c & 0xf];
          } else {
            out += static_cast<char>(c);
          }
      }
      ++i;
      continue;
    }
    // Multi-byte UTF-8: copy a well-formed sequence, escape a stray byte.
    int len = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (int k = 1; ok && k < len; ++k) {
      ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    }
    if (ok) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
      ++i;
    }
  }
  out += '"';
  return out;
}

// The quote() of Go's time package, used in ParseDuration's errors.
std::string GoTimeQuote(absl::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c >= 0x80 || c < ' ') {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      if (c == '"' || c == '\\') out += '\\';
      out += ch;
    }
  }
  out += '"';
  return out;
}


char Lower(char c) { return static_cast<char>(c | ('x' - 'X')); }

// strconv's underscoreOK: underscores only between digits or after a prefix.
bool UnderscoreOk(absl::string_view s) {
  char saw = '^';
  size_t i = 0;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) s.remove_prefix(1);
  bool hex = false;
  if (s.size() >= 2 && s[0] == '0' &&
      (Lower(s[1]) == 'b' || Lower(s[1]) == 'o' || Lower(s[1]) == 'x')) {
    i = 2;
    saw = '0';
    hex = Lower(s[1]) == 'x';
  }
  for (; i < s.size(); ++i) {
    if ((s[i] >= '0' && s[i] <= '9') || (hex && Lower(s[i]) >= 'a' && Lower(s[i]) <= 'f')) {
      saw = '0';
      continue;
    }
    if (s[i] == '_') {
      if (saw != '0') return false;
      saw = '_';
      continue;
    }
    if (saw == '_') return false;
    saw = '!';
  }
  return saw != '_';
}

// strconv.ParseUint(s, base, bits) for base 0 or 10.
NumError ParseGoUint(absl::string_view s, int base, int bits, uint64_t* out) {
  *out = 0;
  if (s.empty()) return NumError::kSyntax;
  const absl::string_view s0 = s;
  const bool base0 = base == 0;
  if (base0) {
    base = 10;
    if (s[0] == '0') {
      if (s.size() >= 3 && Lower(s[1]) == 'b') {
        base = 2;
        s.remove_prefix(2);
      } else if (s.size() >= 3 && Lower(s[1]) == 'o') {
        base = 8;
        s.remove_prefix(2);
      } else if (s.size() >= 3 && Lower(s[1]) == 'x') {
        base = 16;
        s.remove_prefix(2);
      } else {
        base = 8;
        s.remove_prefix(1);
      }
    }
  }
  const uint64_t max_val = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  const uint64_t cutoff = ~uint64_t{0} / base + 1;
  bool underscores = false;
  uint64_t n = 0;
  for (char c : s) {
    int d;
    if (c == '_' && base0) {
      underscores = true;
      continue;
    } else if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (Lower(c) >= 'a' && Lower(c) <= 'z') {
      d = Lower(c) - 'a' + 10;
    } else {
      return NumError::kSyntax;
    }
    if (d >= base) return NumError::kSyntax;
    if (n >= cutoff) {
      *out = max_val;
      return NumError::kRange;
    }
    n *= base;
    uint64_t n1 = n + d;
    if (n1 < n || n1 > max_val) {
      *out = max_val;
      return NumError::kRange;
    }
    n = n1;
  }
  if (underscores && !UnderscoreOk(s0)) return NumError::kSyntax;
  *out = n;
  return NumError::kOk;
}

// strconv.ParseInt(s, base, 64) for base 0 or 10.
NumError ParseGoInt(absl::string_view s, int base, int64_t* out) {
  *out = 0;
  if (s.empty()) return NumError::kSyntax;
  bool neg = false;
  if (s[0] == '+' || s[0] == '-') {
    neg = s[0] == '-';
    s.remove_prefix(1);
  }
  uint64_t un;
  NumError e = ParseGoUint(s, base, 64, &un);
  if (e == NumError::kSyntax) return e;
  const uint64_t cutoff = uint64_t{1} << 63;
  if (e == NumError::kRange || (!neg && un >= cutoff) || (neg && un > cutoff)) {
    return NumError::kRange;
  }
  *out = neg ? static_cast<int64_t>(0 - un) : static_cast<int64_t>(un);
  return NumError::kOk;
}

// strconv.ParseBool.
std::optional<bool> ParseGoBool(absl::string_view s) {
  for (absl::string_view t : {"1", "t", "T", "TRUE", "true", "True"}) {
    if (s == t) return true;
  }
  for (absl::string_view f : {"0", "f", "F", "FALSE", "false", "False"}) {
    if (s == f) return false;
  }
  return std::nullopt;
}

// net.SplitHostPort.
absl::Status SplitHostPort(absl::string_view hostport, std::string* host, std::string* port) {
  auto addr_err = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("address ", hostport, ": ", why));
  };
  size_t i = hostport.rfind(':');
  if (i == absl::string_view::npos) return addr_err("missing port in address");
  size_t j = 0, k = 0;
  if (hostport[0] == '[') {
    size_t end = hostport.find(']');
    if (end == absl::string_view::npos) return addr_err("missing ']' in address");
    if (end + 1 == hostport.size()) return addr_err("missing port in address");
    if (end + 1 != i) {
      if (hostport[end + 1] == ':') return addr_err("too many colons in address");
      return addr_err("missing port in address");
    }
    *host = std::string(hostport.substr(1, end - 1));
    j = 1;
    k = end + 1;
  } else {
    *host = std::string(hostport.substr(0, i));
    if (host->find(':') != std::string::npos) return addr_err("too many colons in address");
  }
  if (hostport.find('[', j) != absl::string_view::npos) {
    return addr_err("unexpected '[' in address");
  }
  if (hostport.find(']', k) != absl::string_view::npos) {
    return addr_err("unexpected ']' in address");
  }
  *port = std::string(hostport.substr(i + 1));
  return absl::OkStatus();
}

// net.ParseIP(host) != nil.
bool IsIp(const std::string& host) {
  unsigned char buf[16];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 || inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

bool ValidOptionalPort(absl::string_view port) {
  if (port.empty()) return true;
  if (port[0] != ':') return false;
  for (char c : port.substr(1)) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

int Unhex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// url.unescape for hosts (is_host) and paths.
absl::StatusOr<std::string> UrlUnescape(absl::string_view s, bool is_host) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '%') {
      if (i + 2 >= s.size() || Unhex(s[i + 1]) < 0 || Unhex(s[i + 2]) < 0) {
        absl::string_view bad = s.substr(i, std::min<size_t>(3, s.size() - i));
        return absl::InvalidArgumentError(absl::StrCat("invalid URL escape ", GoQuote(bad)));
      }
      // In a host, %-encoding is only for non-ASCII bytes, and for "%25"
      // in IPv6 zones (RFC 3986 section 3.2.2, RFC 6874).
      if (is_host && Unhex(s[i + 1]) < 8 && s.substr(i, 3) != "%25") {
        return absl::InvalidArgumentError(
            absl::StrCat("invalid URL escape ", GoQuote(s.substr(i, 3))));
      }
      out += static_cast<char>(Unhex(s[i + 1]) * 16 + Unhex(s[i + 2]));
      i += 2;
      continue;
    }
    if (is_host && static_cast<unsigned char>(c) < 0x80 && !absl::ascii_isalnum(c) &&
        absl::string_view("-._~!$&'()*+,;=:[]<>\"").find(c) == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "invalid character ", GoQuote(absl::string_view(&s[i], 1)), " in host name"));
    }
    out += c;
  }
  return out;
}

absl::StatusOr<std::string> QueryUnescape(absl::string_view s) {
  // A literal '+' is a space; an escaped one ("%2B") stays a '+'.
  return UrlUnescape(absl::StrReplaceAll(s, {{"+", " "}}), /*is_host=*/false);
}

// url.Parse, for the absolute URLs etcd flags take. Errors read like Go's
// *url.Error: `parse "http://[::1": missing ']' in host`.
absl::StatusOr<Url> ParseGoUrl(absl::string_view raw) {
  absl::string_view rest = raw;
  absl::string_view fragment;
  if (size_t h = rest.find('#'); h != absl::string_view::npos) {
    fragment = rest.substr(h + 1);
    rest = rest.substr(0, h);
  }
  const absl::string_view without_fragment = rest;
  auto fail = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("parse ", GoQuote(without_fragment), ": ", why));
  };
  for (char c : raw) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      return fail("net/url: invalid control character in URL");
    }
  }
  Url url;
  url.fragment = std::string(fragment);
  // getScheme
  for (size_t i = 0; i < rest.size(); ++i) {
    char c = rest[i];
    if (absl::ascii_isalpha(c)) continue;
    if (absl::ascii_isdigit(c) || c == '+' || c == '-' || c == '.') {
      if (i == 0) break;
      continue;
    }
    if (c == ':') {
      if (i == 0) return fail("missing protocol scheme");
      url.scheme = absl::AsciiStrToLower(rest.substr(0, i));
      rest.remove_prefix(i + 1);
    }
    break;
  }
  if (absl::EndsWith(rest, "?") && std::count(rest.begin(), rest.end(), '?') == 1) {
    rest.remove_suffix(1);
  } else if (size_t q = rest.find('?'); q != absl::string_view::npos) {
    url.raw_query = std::string(rest.substr(q + 1));
    rest = rest.substr(0, q);
  }
  if (!absl::StartsWith(rest, "/")) {
    if (!url.scheme.empty()) {
      // A rootless URL such as "http:foo" is opaque: it has no host.
      url.path = std::string(rest);
      url.opaque = true;
      return url;
    }
    absl::string_view segment = rest.substr(0, rest.find('/'));
    if (segment.find(':') != absl::string_view::npos) {
      return fail("first path segment in URL cannot contain colon");
    }
  }
  if ((!url.scheme.empty() || !absl::StartsWith(rest, "///")) && absl::StartsWith(rest, "//")) {
    absl::string_view authority = rest.substr(2);
    rest = {};
    if (size_t slash = authority.find('/'); slash != absl::string_view::npos) {
      rest = authority.substr(slash);
      authority = authority.substr(0, slash);
    }
    absl::string_view host = authority;
    if (size_t at = authority.rfind('@'); at != absl::string_view::npos) {
      url.userinfo = std::string(authority.substr(0, at));
      host = authority.substr(at + 1);
    }
    if (absl::StartsWith(host, "[")) {
      size_t close = host.rfind(']');
      if (close == absl::string_view::npos) return fail("missing ']' in host");
      absl::string_view colon_port = host.substr(close + 1);
      if (!ValidOptionalPort(colon_port)) {
        return fail(absl::StrCat("invalid port ", GoQuote(colon_port), " after host"));
      }
    } else if (size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
      absl::string_view colon_port = host.substr(colon);
      if (!ValidOptionalPort(colon_port)) {
        return fail(absl::StrCat("invalid port ", GoQuote(colon_port), " after host"));
      }
    }
    absl::StatusOr<std::string> unescaped = UrlUnescape(host, /*is_host=*/true);
    if (!unescaped.ok()) return fail(unescaped.status().message());
    url.host = *std::move(unescaped);
  }
  absl::StatusOr<std::string> path = UrlUnescape(rest, /*is_host=*/false);
  if (!path.ok()) return fail(path.status().message());
  url.path = *std::move(path);
  return url;
}


namespace {

// url.escape for hosts (is_host) and paths: bytes outside the allowed set
// become %XX.
std::string UrlEscape(const std::string& s, bool is_host) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  const absl::string_view keep = is_host ? "-_.~!$&'()*+,;=:[]<>\"" : "-_.~$&+,/:;=@";
  std::string out;
  for (char c : s) {
    if (absl::ascii_isalnum(c) || keep.find(c) != absl::string_view::npos) {
      out += c;
    } else {
      unsigned char b = static_cast<unsigned char>(c);
      out += '%';
      out += kHex[b >> 4];
      out += kHex[b & 0xf];
    }
  }
  return out;
}

}  // namespace

std::string Url::String() const {
  std::string out;
  if (!scheme.empty()) absl::StrAppend(&out, scheme, ":");
  if (opaque) {
    absl::StrAppend(&out, path);
  } else {
    if (!scheme.empty() || !host.empty() || !userinfo.empty()) {
      if (!host.empty() || !path.empty() || !userinfo.empty()) out += "//";
      if (!userinfo.empty()) absl::StrAppend(&out, userinfo, "@");
      out += UrlEscape(host, /*is_host=*/true);
    }
    out += UrlEscape(path, /*is_host=*/false);
  }
  if (!raw_query.empty()) absl::StrAppend(&out, "?", raw_query);
  if (!fragment.empty()) absl::StrAppend(&out, "#", fragment);
  return out;
}

std::string Url::Hostname() const {
  std::string h, p;
  if (SplitHostPort(host, &h, &p).ok()) return h;
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]")) {
    return host.substr(1, host.size() - 2);
  }
  return host;
}

std::string Url::Port() const {
  std::string h, p;
  if (SplitHostPort(host, &h, &p).ok()) return p;
  return "";
}

absl::StatusOr<absl::Duration> ParseGoDuration(std::string_view text_in) {
  const absl::string_view text(text_in.data(), text_in.size());
  const absl::string_view orig = text;
  auto invalid = [&] {
    return absl::InvalidArgumentError(absl::StrCat("time: invalid duration ", GoTimeQuote(orig)));
  };
  absl::string_view s = text;
  bool neg = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    neg = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s == "0") return absl::ZeroDuration();
  if (s.empty()) return invalid();
  constexpr uint64_t kLimit = uint64_t{1} << 63;
  static const std::pair<absl::string_view, uint64_t> kUnits[] = {
      {"ns", 1},
      {"us", 1000},
      {"\xc2\xb5s", 1000},  // U+00B5 micro sign
      {"\xce\xbcs", 1000},  // U+03BC Greek mu
      {"ms", 1000000},
      {"s", 1000000000},
      {"m", uint64_t{60} * 1000000000},
      {"h", uint64_t{3600} * 1000000000},
  };
  uint64_t d = 0;
  while (!s.empty()) {
    if (!(s[0] == '.' || absl::ascii_isdigit(s[0]))) return invalid();
    // leadingInt
    uint64_t v = 0;
    size_t i = 0;
    for (; i < s.size() && absl::ascii_isdigit(s[i]); ++i) {
      if (v > kLimit / 10) return invalid();
      v = v * 10 + (s[i] - '0');
      if (v > kLimit) return invalid();
    }
    const bool pre = i > 0;
    s.remove_prefix(i);
    // leadingFraction
    uint64_t f = 0;
    double scale = 1;
    bool post = false;
    if (!s.empty() && s[0] == '.') {
      s.remove_prefix(1);
      size_t j = 0;
      bool overflow = false;
      for (; j < s.size() && absl::ascii_isdigit(s[j]); ++j) {
        if (overflow) continue;
        if (f > (kLimit - 1) / 10) {
          overflow = true;
          continue;
        }
        uint64_t y = f * 10 + (s[j] - '0');
        if (y > kLimit) {
          overflow = true;
          continue;
        }
        f = y;
        scale *= 10;
      }
      post = j > 0;
      s.remove_prefix(j);
    }
    if (!pre && !post) return invalid();
    size_t u = 0;
    while (u < s.size() && s[u] != '.' && !absl::ascii_isdigit(s[u])) ++u;
    if (u == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("time: missing unit in duration ", GoTimeQuote(orig)));
    }
    absl::string_view unit_name = s.substr(0, u);
    s.remove_prefix(u);
    uint64_t unit = 0;
    for (const auto& [name, value] : kUnits) {
      if (name == unit_name) unit = value;
    }
    if (unit == 0) {
      return absl::InvalidArgumentError(absl::StrCat("time: unknown unit ", GoTimeQuote(unit_name),
                                                     " in duration ", GoTimeQuote(orig)));
    }
    if (v > kLimit / unit) return invalid();
    v *= unit;
    if (f > 0) {
      v += static_cast<uint64_t>(static_cast<double>(f) * (static_cast<double>(unit) / scale));
      if (v > kLimit) return invalid();
    }
    d += v;
    if (d > kLimit) return invalid();
  }
  if (neg) {
    if (d == kLimit) return absl::Nanoseconds(std::numeric_limits<int64_t>::min());
    return -absl::Nanoseconds(static_cast<int64_t>(d));
  }
  if (d > kLimit - 1) return invalid();
  return absl::Nanoseconds(static_cast<int64_t>(d));
}

std::string FormatGoDuration(absl::Duration duration) {
  const int64_t ns = absl::ToInt64Nanoseconds(duration);
  uint64_t u = ns < 0 ? 0 - static_cast<uint64_t>(ns) : static_cast<uint64_t>(ns);
  if (u == 0) return "0s";
  // The fraction u % 10^prec without trailing zeros, as ".123", or "".
  auto frac = [&u](int prec) {
    uint64_t div = 1;
    for (int k = 0; k < prec; ++k) div *= 10;
    uint64_t f = u % div;
    u /= div;
    if (f == 0) return std::string();
    std::string digits = absl::StrFormat("%0*d", prec, f);
    while (!digits.empty() && digits.back() == '0') digits.pop_back();
    return absl::StrCat(".", digits);
  };
  std::string out;
  if (u < 1000000000) {
    std::string unit;
    int prec;
    if (u < 1000) {
      prec = 0;
      unit = "ns";
    } else if (u < 1000000) {
      prec = 3;
      unit = "\xc2\xb5s";
    } else {
      prec = 6;
      unit = "ms";
    }
    std::string f = frac(prec);
    out = absl::StrCat(u, f, unit);
  } else {
    std::string f = frac(9);
    out = absl::StrCat(u % 60, f, "s");
    u /= 60;
    if (u > 0) {
      out = absl::StrCat(u % 60, "m", out);
      u /= 60;
      if (u > 0) out = absl::StrCat(u, "h", out);
    }
  }
  return ns < 0 ? "-" + out : out;
}

std::string JsonEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
        } else {
          out += c;
        }
    }
  }
  return out;
}

}  // namespace capstan::gotext
