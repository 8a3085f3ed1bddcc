#include "server/config/config_file.h"

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "server/config/config.h"

namespace capstan::server {

YamlNode::YamlNode() = default;
YamlNode::~YamlNode() = default;
YamlNode::YamlNode(const YamlNode&) = default;
YamlNode::YamlNode(YamlNode&&) noexcept = default;
YamlNode& YamlNode::operator=(const YamlNode&) = default;
YamlNode& YamlNode::operator=(YamlNode&&) noexcept = default;

namespace {

absl::Status YamlError(int line, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("yaml: line ", line, ": ", what));
}

// One non-blank line: its indentation and its text without the comment.
struct Line {
  int number = 0;
  size_t indent = 0;
  std::string text;
};

// Strips a comment: '#' at the start or after a blank, outside quotes.
std::string WithoutComment(std::string_view s) {
  char quote = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (quote != 0) {
      if (c == '\\' && quote == '"') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '#' && (i == 0 || s[i - 1] == ' ' || s[i - 1] == '\t')) {
      return std::string(s.substr(0, i));
    }
  }
  return std::string(s);
}

absl::StatusOr<std::vector<Line>> SplitLines(std::string_view text) {
  std::vector<Line> lines;
  int number = 0;
  for (absl::string_view raw : absl::StrSplit(absl::string_view(text.data(), text.size()), '\n')) {
    ++number;
    std::string s = WithoutComment(std::string_view(raw.data(), raw.size()));
    while (!s.empty() && (s.back() == '\r' || s.back() == ' ' || s.back() == '\t')) s.pop_back();
    size_t indent = 0;
    while (indent < s.size() && s[indent] == ' ') ++indent;
    if (indent == s.size()) continue;
    if (s[indent] == '\t') return YamlError(number, "found character that cannot start any token");
    if (indent == 0 && (s == "---" || s == "...")) continue;
    lines.push_back({number, indent, s.substr(indent)});
  }
  return lines;
}

// A scalar: quoted or plain; sets *quoted.
absl::StatusOr<std::string> Scalar(std::string_view s, int line, bool* quoted) {
  *quoted = false;
  if (s.empty()) return std::string();
  if (s[0] == '\'' || s[0] == '"') {
    const char q = s[0];
    std::string out;
    size_t i = 1;
    for (; i < s.size(); ++i) {
      const char c = s[i];
      if (q == '\'' && c == '\'') {
        if (i + 1 < s.size() && s[i + 1] == '\'') {
          out += '\'';
          ++i;
          continue;
        }
        break;
      }
      if (q == '"' && c == '"') break;
      if (q == '"' && c == '\\' && i + 1 < s.size()) {
        const char e = s[++i];
        switch (e) {
          case 'n': out += '\n'; break;
          case 't': out += '\t'; break;
          case '"': out += '"'; break;
          case '\\': out += '\\'; break;
          case '/': out += '/'; break;
          default: return YamlError(line, "found unknown escape character while parsing a quoted scalar");
        }
        continue;
      }
      out += c;
    }
    if (i >= s.size()) return YamlError(line, "found unexpected end of stream");
    if (i + 1 != s.size()) {
      return YamlError(line, "did not find expected key");
    }
    *quoted = true;
    return out;
  }
  if (s[0] == '&' || s[0] == '*' || s[0] == '!' || s[0] == '|' || s[0] == '>' || s[0] == '{') {
    return YamlError(line, absl::StrCat("'", std::string(1, s[0]),
                                        "' (anchors, aliases, tags, block scalars and flow "
                                        "mappings) is not supported in a Capstan config file"));
  }
  return std::string(s);
}

// The value after "key:" on the same line.
absl::StatusOr<YamlNode> InlineValue(std::string_view s, int line) {
  YamlNode node;
  node.line = line;
  if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return node;
  if (s[0] == '[') {
    if (s.back() != ']') return YamlError(line, "did not find expected ',' or ']'");
    node.kind = YamlNode::Kind::kList;
    absl::string_view inner(s.data() + 1, s.size() - 2);
    if (absl::StripAsciiWhitespace(inner).empty()) return node;
    for (absl::string_view item : absl::StrSplit(inner, ',')) {
      item = absl::StripAsciiWhitespace(item);
      bool quoted;
      auto v = Scalar(std::string_view(item.data(), item.size()), line, &quoted);
      if (!v.ok()) return v.status();
      node.list.push_back(*std::move(v));
    }
    return node;
  }
  node.kind = YamlNode::Kind::kScalar;
  auto v = Scalar(s, line, &node.quoted);
  if (!v.ok()) return v.status();
  node.scalar = *std::move(v);
  return node;
}

// "key: rest" -> key and rest; false if the line is not a mapping entry.
bool SplitKey(const std::string& text, std::string* key, std::string* rest) {
  size_t colon = std::string::npos;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == ':' && (i + 1 == text.size() || text[i + 1] == ' ')) {
      colon = i;
      break;
    }
  }
  if (colon == std::string::npos || colon == 0) return false;
  *key = std::string(absl::StripAsciiWhitespace(text.substr(0, colon)));
  if (key->size() >= 2 && (key->front() == '"' || key->front() == '\'') &&
      key->back() == key->front()) {
    *key = key->substr(1, key->size() - 2);
  }
  *rest = std::string(absl::StripAsciiWhitespace(text.substr(colon + 1)));
  return true;
}

// Parses the mapping whose entries sit at exactly `indent`, from lines[*i].
absl::StatusOr<YamlNode> ParseMap(const std::vector<Line>& lines, size_t* i, size_t indent,
                                  int depth) {
  YamlNode map;
  map.kind = YamlNode::Kind::kMap;
  while (*i < lines.size() && lines[*i].indent >= indent) {
    const Line& l = lines[*i];
    if (l.indent != indent) return YamlError(l.number, "mapping values are not allowed in this context");
    std::string key, rest;
    if (!SplitKey(l.text, &key, &rest)) {
      return YamlError(l.number, "could not find expected ':'");
    }
    for (const auto& [seen, unused] : map.entries) {
      if (seen == key) return YamlError(l.number, absl::StrCat("key \"", key, "\" already set in map"));
    }
    ++*i;
    YamlNode value;
    if (!rest.empty() || *i >= lines.size() || lines[*i].indent < indent ||
        (lines[*i].indent == indent && lines[*i].text[0] != '-')) {
      auto v = InlineValue(rest, l.number);
      if (!v.ok()) return v.status();
      value = *std::move(v);
    } else if (lines[*i].text[0] == '-') {
      // A block list: "- item" lines, at this indent or deeper.
      const size_t item_indent = lines[*i].indent;
      value.kind = YamlNode::Kind::kList;
      while (*i < lines.size() && lines[*i].indent == item_indent && lines[*i].text[0] == '-') {
        const std::string& t = lines[*i].text;
        if (t.size() > 1 && t[1] != ' ') return YamlError(lines[*i].number, "did not find expected '-' indicator");
        bool quoted;
        auto item = Scalar(std::string(absl::StripAsciiWhitespace(t.substr(1))), lines[*i].number,
                           &quoted);
        if (!item.ok()) return item.status();
        value.list.push_back(*std::move(item));
        ++*i;
      }
    } else {
      if (depth >= 1) {
        return YamlError(lines[*i].number, "mappings nested more than one level are not supported");
      }
      auto nested = ParseMap(lines, i, lines[*i].indent, depth + 1);
      if (!nested.ok()) return nested.status();
      value = *std::move(nested);
    }
    value.line = l.number;
    map.entries.emplace_back(std::move(key), std::move(value));
  }
  return map;
}

// Duration fields of etcd's embed.Config: JSON numbers in nanoseconds.
bool IsDurationKey(std::string_view key) {
  static constexpr std::string_view kKeys[] = {
      "grpc-keepalive-min-time",
      "grpc-keepalive-interval",
      "grpc-keepalive-timeout",
      "experimental-corrupt-check-time",
      "experimental-compaction-sleep-interval",
      "experimental-downgrade-check-time",
      "experimental-wait-cluster-ready-timeout",
      "experimental-warning-apply-duration",
      "experimental-watch-progress-notify-interval",
      "experimental-warning-unary-request-duration",
      "experimental-compact-hash-check-time",
      // etcd 3.6's names.
      "corrupt-check-time",
      "compact-hash-check-time",
      "compaction-sleep-interval",
      "downgrade-check-time",
      "warning-apply-duration",
      "watch-progress-notify-interval",
      "warning-unary-request-duration",
  };
  for (std::string_view k : kKeys) {
    if (k == key) return true;
  }
  return false;
}

// Flag text for one scalar.
std::string FlagText(std::string_view key, const YamlNode& node) {
  if (node.quoted) return node.scalar;
  const std::string lower = absl::AsciiStrToLower(node.scalar);
  if (lower == "yes" || lower == "on") return "true";
  if (lower == "no" || lower == "off") return "false";
  int64_t ns;
  if (IsDurationKey(key) && absl::SimpleAtoi(node.scalar, &ns)) {
    return gotext::FormatGoDuration(absl::Nanoseconds(ns));
  }
  return node.scalar;
}

}  // namespace

absl::StatusOr<YamlNode> ParseYamlSubset(std::string_view text) {
  auto lines = SplitLines(text);
  if (!lines.ok()) return lines.status();
  size_t i = 0;
  if (!lines->empty() && (*lines)[0].indent != 0) {
    return YamlError((*lines)[0].number, "did not find expected <document start>");
  }
  auto map = ParseMap(*lines, &i, 0, 0);
  if (!map.ok()) return map.status();
  if (i != lines->size()) {
    return YamlError((*lines)[i].number, "did not find expected key");
  }
  return map;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ConfigFileSettings(
    std::string_view text) {
  auto doc = ParseYamlSubset(text);
  if (!doc.ok()) return doc.status();
  std::vector<std::pair<std::string, std::string>> out;
  auto add = [&out](const std::string& flag, std::string_view key, const YamlNode& v) {
    switch (v.kind) {
      case YamlNode::Kind::kNull:
      case YamlNode::Kind::kMap:
        break;  // null keeps the default; an unknown nested map is ignored
      case YamlNode::Kind::kScalar:
        out.emplace_back(flag, FlagText(key, v));
        break;
      case YamlNode::Kind::kList:
        out.emplace_back(flag, absl::StrJoin(v.list, ","));
        break;
    }
  };
  for (const auto& [key, value] : doc->entries) {
    if ((key == "client-transport-security" || key == "peer-transport-security") &&
        value.kind == YamlNode::Kind::kMap) {
      const std::string prefix = key == "peer-transport-security" ? "peer-" : "";
      for (const auto& [sub, sub_value] : value.entries) add(prefix + sub, sub, sub_value);
    } else {
      add(key, key, value);
    }
  }
  return out;
}

}  // namespace capstan::server
