#include "watchcache/absl_compat.h"
#include "watchcache/selector.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "watchcache/errors.h"

namespace capstan::watchcache {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// A lexer over a label selector, after k8s.io/apimachinery labels/selector.go.
class LabelLexer {
 public:
  explicit LabelLexer(std::string_view s) : s_(s) {}

  enum class Tok { kEnd, kIdent, kComma, kOpenParen, kCloseParen, kEq, kDoubleEq, kNotEq, kBang,
                   kIn, kNotIn, kGt, kLt, kError };

  Tok Next(std::string* text) {
    while (i_ < s_.size() && IsSpace(s_[i_])) ++i_;
    if (i_ >= s_.size()) return Tok::kEnd;
    char c = s_[i_];
    switch (c) {
      case ',': ++i_; return Tok::kComma;
      case '(': ++i_; return Tok::kOpenParen;
      case ')': ++i_; return Tok::kCloseParen;
      case '>': ++i_; return Tok::kGt;
      case '<': ++i_; return Tok::kLt;
      case '=':
        ++i_;
        if (i_ < s_.size() && s_[i_] == '=') {
          ++i_;
          return Tok::kDoubleEq;
        }
        return Tok::kEq;
      case '!':
        ++i_;
        if (i_ < s_.size() && s_[i_] == '=') {
          ++i_;
          return Tok::kNotEq;
        }
        return Tok::kBang;
      default: break;
    }
    size_t start = i_;
    while (i_ < s_.size() && !IsSpace(s_[i_]) && std::string_view(",()=!<>").find(s_[i_]) == std::string_view::npos) {
      ++i_;
    }
    *text = std::string(s_.substr(start, i_ - start));
    if (*text == "in") return Tok::kIn;
    if (*text == "notin") return Tok::kNotIn;
    return Tok::kIdent;
  }

  // Peeks without consuming.
  Tok Peek(std::string* text) {
    size_t save = i_;
    Tok t = Next(text);
    i_ = save;
    return t;
  }

 private:
  std::string_view s_;
  size_t i_ = 0;
};

absl::Status ParseLabels(std::string_view s, std::vector<LabelRequirement>* out) {
  LabelLexer lex(s);
  std::string text;
  auto bad = [&](std::string_view why) {
    return InvalidRequest(absl::StrCat("unable to parse requirement: ", AV(why), " in label selector \"", AV(s), "\""));
  };
  if (lex.Peek(&text) == LabelLexer::Tok::kEnd) return absl::OkStatus();
  for (;;) {
    LabelRequirement r;
    LabelLexer::Tok t = lex.Next(&text);
    bool negated = false;
    if (t == LabelLexer::Tok::kBang) {
      negated = true;
      t = lex.Next(&text);
    }
    if (t != LabelLexer::Tok::kIdent) return bad("found unexpected token, expected a key");
    r.key = text;
    LabelLexer::Tok op = lex.Peek(&text);
    if (negated) {
      r.op = LabelRequirement::Op::kDoesNotExist;
    } else if (op == LabelLexer::Tok::kComma || op == LabelLexer::Tok::kEnd) {
      r.op = LabelRequirement::Op::kExists;
    } else {
      lex.Next(&text);
      switch (op) {
        case LabelLexer::Tok::kEq:
        case LabelLexer::Tok::kDoubleEq:
        case LabelLexer::Tok::kNotEq: {
          r.op = op == LabelLexer::Tok::kNotEq ? LabelRequirement::Op::kNotEquals
                                                : LabelRequirement::Op::kEquals;
          std::string v;
          LabelLexer::Tok vt = lex.Peek(&v);
          if (vt == LabelLexer::Tok::kIdent) {
            lex.Next(&v);
          } else if (vt == LabelLexer::Tok::kComma || vt == LabelLexer::Tok::kEnd) {
            v.clear();  // `k=` selects an empty value
          } else {
            return bad("found unexpected token, expected a value");
          }
          r.values.push_back(v);
          break;
        }
        case LabelLexer::Tok::kIn:
        case LabelLexer::Tok::kNotIn: {
          r.op = op == LabelLexer::Tok::kIn ? LabelRequirement::Op::kIn : LabelRequirement::Op::kNotIn;
          if (lex.Next(&text) != LabelLexer::Tok::kOpenParen) return bad("expected '('");
          for (;;) {
            std::string v;
            LabelLexer::Tok vt = lex.Next(&v);
            if (vt == LabelLexer::Tok::kCloseParen) break;
            if (vt == LabelLexer::Tok::kComma) {
              r.values.push_back("");
              continue;
            }
            if (vt != LabelLexer::Tok::kIdent) return bad("expected a value in the set");
            r.values.push_back(v);
            LabelLexer::Tok sep = lex.Next(&text);
            if (sep == LabelLexer::Tok::kCloseParen) break;
            if (sep != LabelLexer::Tok::kComma) return bad("expected ',' or ')'");
          }
          if (r.values.empty()) return bad("for 'in', 'notin' operators, values set can't be empty");
          break;
        }
        case LabelLexer::Tok::kGt:
        case LabelLexer::Tok::kLt:
          return bad("the '<' and '>' operators are not supported by the watch cache");
        default:
          return bad("found unexpected token, expected an operator");
      }
    }
    std::sort(r.values.begin(), r.values.end());
    r.values.erase(std::unique(r.values.begin(), r.values.end()), r.values.end());
    out->push_back(std::move(r));
    t = lex.Next(&text);
    if (t == LabelLexer::Tok::kEnd) return absl::OkStatus();
    if (t != LabelLexer::Tok::kComma) return bad("expected ','");
  }
}

// Splits a field selector term on its first unescaped operator.
absl::Status ParseFields(std::string_view s, const IndexExtractor& ex, std::vector<FieldRequirement>* out) {
  // Terms are split on unescaped commas.
  std::vector<std::string> terms;
  std::string cur;
  bool any = false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      cur.push_back(s[i]);
      cur.push_back(s[++i]);
      continue;
    }
    if (s[i] == ',') {
      terms.push_back(cur);
      cur.clear();
      continue;
    }
    cur.push_back(s[i]);
    any = true;
  }
  if (!any && terms.empty()) return absl::OkStatus();
  terms.push_back(cur);
  for (const std::string& term : terms) {
    if (term.empty()) continue;
    FieldRequirement r;
    size_t op_at = std::string::npos, op_len = 0;
    for (size_t i = 0; i < term.size(); ++i) {
      if (term[i] == '\\') {
        ++i;
        continue;
      }
      if (term.compare(i, 2, "!=") == 0) {
        op_at = i, op_len = 2, r.equals = false;
      } else if (term.compare(i, 2, "==") == 0) {
        op_at = i, op_len = 2;
      } else if (term[i] == '=') {
        op_at = i, op_len = 1;
      } else {
        continue;
      }
      break;
    }
    if (op_at == std::string::npos) {
      return InvalidRequest(absl::StrCat("invalid selector: '", AV(s), "'; can't understand '", term, "'"));
    }
    std::string key(term.substr(0, op_at));
    while (!key.empty() && IsSpace(key.back())) key.pop_back();
    while (!key.empty() && IsSpace(key.front())) key.erase(key.begin());
    std::string value;
    for (size_t i = op_at + op_len; i < term.size(); ++i) {
      if (term[i] == '\\' && i + 1 < term.size()) ++i;
      value.push_back(term[i]);
    }
    r.field = ex.FieldIndex(key);
    if (r.field < 0) return InvalidRequest(absl::StrCat("field label not supported: ", key));
    r.name = key;
    r.value = value;
    out->push_back(std::move(r));
  }
  return absl::OkStatus();
}

}  // namespace

bool LabelRequirement::Matches(const CachedObject& o) const {
  auto v = o.FindLabel(key);
  switch (op) {
    case Op::kExists: return v.has_value();
    case Op::kDoesNotExist: return !v.has_value();
    case Op::kEquals: return v.has_value() && *v == values[0];
    case Op::kNotEquals: return !v.has_value() || *v != values[0];
    case Op::kIn: return v.has_value() && std::binary_search(values.begin(), values.end(), *v);
    case Op::kNotIn: return !v.has_value() || !std::binary_search(values.begin(), values.end(), *v);
  }
  return false;
}

absl::StatusOr<Selector> Selector::Parse(std::string_view label_selector,
                                         std::string_view field_selector,
                                         const IndexExtractor& extractor) {
  Selector s;
  if (auto st = ParseLabels(label_selector, &s.labels_); !st.ok()) return st;
  if (auto st = ParseFields(field_selector, extractor, &s.fields_); !st.ok()) return st;
  return s;
}

bool Selector::Matches(const CachedObject& o) const {
  if (empty()) return true;
  if (!o.decoded()) return false;
  for (const auto& f : fields_) {
    if (!f.Matches(o)) return false;
  }
  for (const auto& l : labels_) {
    if (!l.Matches(o)) return false;
  }
  return true;
}

std::string Selector::ToString() const {
  std::vector<std::string> parts;
  for (const auto& l : labels_) {
    switch (l.op) {
      case LabelRequirement::Op::kExists: parts.push_back(l.key); break;
      case LabelRequirement::Op::kDoesNotExist: parts.push_back("!" + l.key); break;
      case LabelRequirement::Op::kEquals: parts.push_back(l.key + "=" + l.values[0]); break;
      case LabelRequirement::Op::kNotEquals: parts.push_back(l.key + "!=" + l.values[0]); break;
      case LabelRequirement::Op::kIn:
        parts.push_back(absl::StrCat(l.key, " in (", absl::StrJoin(l.values, ","), ")"));
        break;
      case LabelRequirement::Op::kNotIn:
        parts.push_back(absl::StrCat(l.key, " notin (", absl::StrJoin(l.values, ","), ")"));
        break;
    }
  }
  for (const auto& f : fields_) parts.push_back(f.name + (f.equals ? "=" : "!=") + f.value);
  return absl::StrJoin(parts, ",");
}

std::string LabelIndexValue(std::string_view key, std::string_view value) {
  std::string s;
  s.reserve(key.size() + value.size() + 1);
  s.append(key);
  s.push_back('=');
  s.append(value);
  return s;
}

}  // namespace capstan::watchcache
