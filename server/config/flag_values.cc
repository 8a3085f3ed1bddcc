#include "server/config/flag_values.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "server/config/config.h"
#include "server/config/flags.h"
#include "util/go_text.h"

namespace capstan::server {
namespace config_internal {
namespace {

using gotext::GoQuote;
using gotext::NumError;
using gotext::ParseGoBool;
using gotext::ParseGoInt;
using gotext::ParseGoUint;
using gotext::Std;

absl::Status ParseErr() { return absl::InvalidArgumentError("parse error"); }
absl::Status RangeErr() { return absl::InvalidArgumentError("value out of range"); }

}  // namespace

Value Str(std::string ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    st.cfg.*field = std::string(v);
    return absl::OkStatus();
  }};
}

Value StrIn(std::string ParseState::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    st.*field = std::string(v);
    return absl::OkStatus();
  }};
}

Value Bool(bool ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
            std::optional<bool> b = ParseGoBool(v);
            if (!b) return ParseErr();
            st.cfg.*field = *b;
            return absl::OkStatus();
          },
          /*is_bool=*/true};
}

// Go's flag.Uint / flag.Uint64 (64-bit).
Value Uint(uint64_t ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    uint64_t n;
    switch (ParseGoUint(v, 0, 64, &n)) {
      case NumError::kSyntax:
        return ParseErr();
      case NumError::kRange:
        return RangeErr();
      case NumError::kOk:
        break;
    }
    st.cfg.*field = n;
    return absl::OkStatus();
  }};
}

// Go's flag.Int / flag.Int64 (64-bit).
Value Int(int64_t ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    int64_t n;
    switch (ParseGoInt(v, 0, &n)) {
      case NumError::kSyntax:
        return ParseErr();
      case NumError::kRange:
        return RangeErr();
      case NumError::kOk:
        break;
    }
    st.cfg.*field = n;
    return absl::OkStatus();
  }};
}

// etcd's flags.uint32Value, which reports strconv's own error text.
Value Uint32(uint32_t ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    uint64_t n;
    switch (ParseGoUint(v, 0, 32, &n)) {
      case NumError::kSyntax:
        return absl::InvalidArgumentError(
            absl::StrCat("strconv.ParseUint: parsing ", GoQuote(v), ": invalid syntax"));
      case NumError::kRange:
        return absl::InvalidArgumentError(
            absl::StrCat("strconv.ParseUint: parsing ", GoQuote(v), ": value out of range"));
      case NumError::kOk:
        break;
    }
    st.cfg.*field = static_cast<uint32_t>(n);
    return absl::OkStatus();
  }};
}

Value Dur(absl::Duration ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    absl::StatusOr<absl::Duration> d = gotext::ParseGoDuration(Std(v));
    if (!d.ok()) return ParseErr();
    st.cfg.*field = *d;
    return absl::OkStatus();
  }};
}

Value DurIn(absl::Duration ParseState::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    absl::StatusOr<absl::Duration> d = gotext::ParseGoDuration(Std(v));
    if (!d.ok()) return ParseErr();
    st.*field = *d;
    return absl::OkStatus();
  }};
}

Value GateFlag(absl::string_view flag_name) {
  return {[name = std::string(flag_name)](ParseState& st, absl::string_view v) {
            std::optional<bool> b = ParseGoBool(v);
            if (!b) return ParseErr();
            st.gate_flags[name] = *b;
            return absl::OkStatus();
          },
          /*is_bool=*/true};
}

Value FeatureGatesValue() {
  return {[](ParseState& st, absl::string_view v) {
    st.feature_gates_text = std::string(v);
    return st.cfg.feature_gates.Set(v);
  }};
}

// etcd's flags.UniqueURLs with the "" exception: an empty value leaves the
// list as it was (etcd keeps the default), any other value replaces it.
Value Urls(std::vector<Url> ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    if (v.empty()) return absl::OkStatus();
    absl::StatusOr<std::vector<Url>> urls = ParseUrlList(Std(v));
    if (!urls.ok()) return urls.status();
    st.cfg.*field = *std::move(urls);
    return absl::OkStatus();
  }};
}

// etcd's flags.UniqueStringsValue: split on ",", sorted, de-duplicated.
Value UniqueStrings(std::set<std::string> ServerConfig::*field) {
  return {[field](ParseState& st, absl::string_view v) {
    std::set<std::string> values;
    for (absl::string_view part : absl::StrSplit(v, ',')) values.insert(std::string(part));
    st.cfg.*field = std::move(values);
    return absl::OkStatus();
  }};
}

// etcd's flags.SelectiveStringValue.
Value Choice(std::string ServerConfig::*field, std::vector<absl::string_view> valid) {
  return {[field, valid](ParseState& st, absl::string_view v) {
    if (std::find(valid.begin(), valid.end(), v) == valid.end()) {
      return absl::InvalidArgumentError("invalid value");
    }
    st.cfg.*field = std::string(v);
    return absl::OkStatus();
  }};
}

Value ChoiceIn(std::string ParseState::*field, std::vector<absl::string_view> valid) {
  return {[field, valid](ParseState& st, absl::string_view v) {
    if (std::find(valid.begin(), valid.end(), v) == valid.end()) {
      return absl::InvalidArgumentError("invalid value");
    }
    st.*field = std::string(v);
    return absl::OkStatus();
  }};
}

// Flags etcd still swallows for compatibility with etcd 0.4/2.x command
// lines (etcd's flags.IgnoredFlag: bool-like, any value).
Value Legacy() {
  return {[](ParseState&, absl::string_view) { return absl::OkStatus(); }, /*is_bool=*/true};
}

// --cors: comma-separated origins, each a URL as etcd validates them, or "*".
Value Cors() {
  return {[](ParseState& st, absl::string_view v) {
    if (v == "*") {
      st.cfg.cors.insert("*");
      return absl::OkStatus();
    }
    absl::StatusOr<std::vector<Url>> urls = ParseUrlList(Std(v));
    if (!urls.ok()) return urls.status();
    st.cfg.cors.clear();
    for (const Url& u : *urls) st.cfg.cors.insert(u.String());
    return absl::OkStatus();
  }};
}

// --log-outputs: UniqueStringsValue into a sorted vector.
Value LogOutputs() {
  return {[](ParseState& st, absl::string_view v) {
    std::set<std::string> values;
    for (absl::string_view part : absl::StrSplit(v, ',')) values.insert(std::string(part));
    st.cfg.log_outputs.assign(values.begin(), values.end());
    return absl::OkStatus();
  }};
}

// --cipher-suites: StringsValue, split on "," as given.
Value CipherSuites() {
  return {[](ParseState& st, absl::string_view v) {
    st.cfg.cipher_suites = absl::StrSplit(v, ',');
    return absl::OkStatus();
  }};
}

// --v2-deprecation: SelectiveStringsValue.
Value V2Deprecation() {
  return {[](ParseState& st, absl::string_view v) {
    for (absl::string_view part : absl::StrSplit(v, ',')) {
      if (part != "not-yet" && part != "write-only" && part != "write-only-drop-data" &&
          part != "gone") {
        return absl::InvalidArgumentError(absl::StrCat("invalid value ", GoQuote(part)));
      }
    }
    st.cfg.v2_deprecation = std::string(v);
    return absl::OkStatus();
  }};
}

// --watch-cache-prefixes: comma list kept in order, empty entries dropped,
// duplicates removed.
Value Prefixes() {
  return {[](ParseState& st, absl::string_view v) {
    std::vector<std::string> prefixes;
    for (absl::string_view part : absl::StrSplit(v, ',', absl::SkipEmpty())) {
      std::string p(absl::StripAsciiWhitespace(part));
      if (!p.empty() && std::find(prefixes.begin(), prefixes.end(), p) == prefixes.end()) {
        prefixes.push_back(std::move(p));
      }
    }
    st.cfg.watch_cache_prefixes = std::move(prefixes);
    return absl::OkStatus();
  }};
}

}  // namespace config_internal

// etcd's types.NewURLs (config.h).
absl::StatusOr<std::vector<Url>> ParseUrlList(std::string_view text_in) {
  const absl::string_view text(text_in.data(), text_in.size());
  std::vector<Url> urls;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    absl::string_view in = absl::StripAsciiWhitespace(part);
    absl::StatusOr<Url> u = gotext::ParseGoUrl(in);
    if (!u.ok()) return u.status();
    if (u->scheme == "http" || u->scheme == "https") {
      std::string host, port;
      if (!gotext::SplitHostPort(u->host, &host, &port).ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("URL address does not have the form \"host:port\": ", in));
      }
      if (!u->path.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("URL must not contain a path: ", in));
      }
    } else if (u->scheme != "unix" && u->scheme != "unixs") {
      return absl::InvalidArgumentError(
          absl::StrCat("URL scheme must be http, https, unix, or unixs: ", in));
    }
    urls.push_back(*std::move(u));
  }
  std::sort(urls.begin(), urls.end(),
            [](const Url& a, const Url& b) { return a.String() < b.String(); });
  urls.erase(std::unique(urls.begin(), urls.end(),
                         [](const Url& a, const Url& b) { return a.String() == b.String(); }),
             urls.end());
  return urls;
}

}  // namespace capstan::server
