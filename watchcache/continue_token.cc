#include "watchcache/absl_compat.h"
#include "watchcache/continue_token.h"

#include <cstdio>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "watchcache/errors.h"

namespace capstan::watchcache {
namespace {

constexpr char kVersion[] = "meta.k8s.io/v1";

void AppendJsonString(std::string_view s, std::string* out) {
  out->push_back('"');
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out->append(buf);
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
  out->push_back('"');
}

// A parser for the token's flat JSON object.
class FlatJson {
 public:
  explicit FlatJson(std::string_view s) : s_(s) {}

  bool Parse(std::string* v, std::string* rv, std::string* start) {
    Ws();
    if (!Eat('{')) return false;
    Ws();
    if (Eat('}')) return true;
    for (;;) {
      Ws();
      std::string key, value;
      if (!String(&key)) return false;
      Ws();
      if (!Eat(':')) return false;
      Ws();
      if (i_ < s_.size() && s_[i_] == '"') {
        if (!String(&value)) return false;
      } else {
        size_t b = i_;
        while (i_ < s_.size() && (s_[i_] == '-' || (s_[i_] >= '0' && s_[i_] <= '9'))) ++i_;
        if (i_ == b) return false;
        value = std::string(s_.substr(b, i_ - b));
      }
      if (key == "v") *v = value;
      if (key == "rv") *rv = value;
      if (key == "start") *start = value;
      Ws();
      if (Eat(',')) continue;
      if (Eat('}')) break;
      return false;
    }
    Ws();
    return i_ == s_.size();
  }

 private:
  void Ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  bool Eat(char c) {
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool String(std::string* out) {
    if (!Eat('"')) return false;
    while (i_ < s_.size() && s_[i_] != '"') {
      char c = s_[i_++];
      if (c != '\\') {
        out->push_back(c);
        continue;
      }
      if (i_ >= s_.size()) return false;
      char e = s_[i_++];
      if (e == 'u') {
        if (i_ + 4 > s_.size()) return false;
        unsigned cp = 0;
        if (!absl::SimpleHexAtoi(AV(s_.substr(i_, 4)), &cp)) return false;
        i_ += 4;
        if (cp < 0x80) {
          out->push_back(static_cast<char>(cp));
        } else if (cp < 0x800) {
          out->push_back(static_cast<char>(0xc0 | (cp >> 6)));
          out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
        } else {
          out->push_back(static_cast<char>(0xe0 | (cp >> 12)));
          out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
          out->push_back(static_cast<char>(0x80 | (cp & 0x3f)));
        }
      } else if (e == 'n') {
        out->push_back('\n');
      } else if (e == 't') {
        out->push_back('\t');
      } else if (e == 'r') {
        out->push_back('\r');
      } else {
        out->push_back(e);
      }
    }
    return Eat('"');
  }

  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

std::string EncodeContinue(int64_t rev, std::string_view relative_start) {
  std::string json = absl::StrCat("{\"v\":\"", kVersion, "\",\"rv\":", rev, ",\"start\":");
  AppendJsonString(relative_start, &json);
  json.push_back('}');
  return absl::WebSafeBase64Escape(json);
}

absl::StatusOr<ContinuePoint> DecodeContinue(std::string_view token) {
  std::string json;
  if (!absl::WebSafeBase64Unescape(AV(token), &json)) {
    return InvalidRequest("continue key is not valid: illegal base64 data");
  }
  std::string v, rv, start;
  FlatJson p(json);
  if (!p.Parse(&v, &rv, &start)) return InvalidRequest("continue key is not valid: malformed JSON");
  if (v != kVersion) {
    return InvalidRequest(absl::StrCat("continue key is not valid: server does not recognize this encoded version \"", v, "\""));
  }
  ContinuePoint cp;
  if (!absl::SimpleAtoi(rv, &cp.rev) || cp.rev <= 0) {
    return InvalidRequest(absl::StrCat("continue key is not valid: incorrect encoded start resourceVersion (version ", kVersion, ")"));
  }
  if (start.empty()) return InvalidRequest("continue key is not valid: encoded start key empty");
  // Kubernetes refuses keys that path.Clean would change, so a token cannot
  // walk out of the prefix it was issued for.
  std::string_view s = start;
  if (!s.empty() && s.back() == '\0') s.remove_suffix(1);
  if (s.find("//") != std::string_view::npos || s == ".." || s.substr(0, 3) == "../" ||
      s.find("/../") != std::string_view::npos || s.find("/./") != std::string_view::npos ||
      (s.size() >= 3 && s.substr(s.size() - 3) == "/..") || s.substr(0, 1) == "/") {
    return InvalidRequest(absl::StrCat("continue key is not valid: ", start));
  }
  cp.start = std::move(start);
  return cp;
}

}  // namespace capstan::watchcache
