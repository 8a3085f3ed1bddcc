#include "watchcache/absl_compat.h"
#include "watchcache/index_extractor.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_split.h"
#include "mvcc/kv_codec.h"

namespace capstan::watchcache {

// A trie of the wanted paths. Children are found by field number (proto)
// or by name (JSON); a leaf is a string field (field >= 0) or the labels
// map.
struct IndexExtractor::PathNode {
  int field = -1;
  bool labels = false;
  std::vector<std::pair<int, std::unique_ptr<PathNode>>> by_number;
  std::vector<std::pair<std::string, std::unique_ptr<PathNode>>> by_name;

  PathNode* Child(int n) const {
    for (auto& [k, c] : by_number) {
      if (k == n) return c.get();
    }
    return nullptr;
  }
  PathNode* Child(std::string_view n) const {
    for (auto& [k, c] : by_name) {
      if (k == n) return c.get();
    }
    return nullptr;
  }
  PathNode* AddNumber(int n) {
    if (auto* c = Child(n)) return c;
    by_number.emplace_back(n, std::make_unique<PathNode>());
    return by_number.back().second.get();
  }
  PathNode* AddName(std::string_view n) {
    if (auto* c = Child(n)) return c;
    by_name.emplace_back(std::string(n), std::make_unique<PathNode>());
    return by_name.back().second.get();
  }
};

namespace {

constexpr std::string_view kK8sMagic("k8s\0", 4);

FieldSpec Field(std::string name, std::vector<int> path, bool indexed) {
  return FieldSpec{std::move(name), std::move(path), indexed};
}

// ---------------------------------------------------------------------------
// Protobuf wire format.

// Calls visit(field, wire_type, varint, bytes) for each field of a message;
// false if the message is malformed.
template <typename Visit>
bool ForEachField(std::string_view msg, Visit visit) {
  const char* p = msg.data();
  const char* end = p + msg.size();
  while (p < end) {
    uint64_t tag;
    if (!util::ReadVarint(&p, end, &tag)) return false;
    const int field = static_cast<int>(tag >> 3);
    const int wt = static_cast<int>(tag & 7);
    if (field == 0) return false;
    uint64_t v = 0;
    std::string_view bytes;
    switch (wt) {
      case 0:
        if (!util::ReadVarint(&p, end, &v)) return false;
        break;
      case 1:
        if (end - p < 8) return false;
        p += 8;
        break;
      case 2: {
        uint64_t len;
        if (!util::ReadVarint(&p, end, &len) || len > static_cast<uint64_t>(end - p)) return false;
        bytes = std::string_view(p, len);
        p += len;
        break;
      }
      case 5:
        if (end - p < 4) return false;
        p += 4;
        break;
      default:
        return false;  // groups (3, 4) do not occur in Kubernetes objects
    }
    if (!visit(field, wt, v, bytes)) return false;
  }
  return true;
}

bool WalkProto(std::string_view msg, const IndexExtractor::PathNode& node, Extracted* out) {
  return ForEachField(msg, [&](int field, int wt, uint64_t, std::string_view bytes) {
    const IndexExtractor::PathNode* c = node.Child(field);
    if (c == nullptr) return true;
    if (wt != 2) return true;  // not a string or message: ignore (a schema we do not know)
    if (c->field >= 0) {
      out->fields[c->field] = bytes;  // the last occurrence wins, as in protobuf
      return true;
    }
    if (c->labels) {
      std::string_view k, v;
      bool ok = ForEachField(bytes, [&](int f, int w, uint64_t, std::string_view b) {
        if (w == 2 && f == 1) k = b;
        if (w == 2 && f == 2) v = b;
        return true;
      });
      if (!ok) return false;
      out->labels.emplace_back(k, v);
      return true;
    }
    // An embedded message: occurrences merge, so walk each.
    return WalkProto(bytes, *c, out);
  });
}

// ---------------------------------------------------------------------------
// JSON: a scanner that skips what is not wanted and unescapes only the
// strings it keeps.

class JsonScanner {
 public:
  JsonScanner(std::string_view s, Extracted* out) : p_(s.data()), end_(s.data() + s.size()), out_(out) {}

  bool Document(const IndexExtractor::PathNode& root) {
    SkipWs();
    if (!Value(&root)) return false;
    SkipWs();
    return p_ == end_;
  }

 private:
  void SkipWs() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\n' || *p_ == '\r' || *p_ == '\t')) ++p_;
  }

  // A JSON string at p_; *out is a view into the input when it has no
  // escapes, else an unescaped copy in out_->owned.
  bool String(std::string_view* out) {
    if (p_ >= end_ || *p_ != '"') return false;
    ++p_;
    const char* start = p_;
    bool escaped = false;
    while (p_ < end_ && *p_ != '"') {
      if (*p_ == '\\') {
        escaped = true;
        if (++p_ >= end_) return false;
      }
      ++p_;
    }
    if (p_ >= end_) return false;
    std::string_view raw(start, p_ - start);
    ++p_;
    if (!escaped) {
      if (out) *out = raw;
      return true;
    }
    if (!out) return true;
    std::string s;
    s.reserve(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) {
      char c = raw[i];
      if (c != '\\') {
        s.push_back(c);
        continue;
      }
      char e = raw[++i];
      switch (e) {
        case 'b': s.push_back('\b'); break;
        case 'f': s.push_back('\f'); break;
        case 'n': s.push_back('\n'); break;
        case 'r': s.push_back('\r'); break;
        case 't': s.push_back('\t'); break;
        case 'u': {
          if (i + 4 >= raw.size()) return false;
          uint32_t cp = 0;
          for (int k = 0; k < 4; ++k) {
            char h = raw[++i];
            cp <<= 4;
            if (h >= '0' && h <= '9') cp |= h - '0';
            else if (h >= 'a' && h <= 'f') cp |= h - 'a' + 10;
            else if (h >= 'A' && h <= 'F') cp |= h - 'A' + 10;
            else return false;
          }
          // Surrogate pairs.
          if (cp >= 0xd800 && cp <= 0xdbff && i + 6 < raw.size() && raw[i + 1] == '\\' &&
              raw[i + 2] == 'u') {
            uint32_t lo = 0;
            bool ok = true;
            for (int k = 0; k < 4; ++k) {
              char h = raw[i + 3 + k];
              lo <<= 4;
              if (h >= '0' && h <= '9') lo |= h - '0';
              else if (h >= 'a' && h <= 'f') lo |= h - 'a' + 10;
              else if (h >= 'A' && h <= 'F') lo |= h - 'A' + 10;
              else ok = false;
            }
            if (ok && lo >= 0xdc00 && lo <= 0xdfff) {
              cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
              i += 6;
            }
          }
          if (cp < 0x80) {
            s.push_back(static_cast<char>(cp));
          } else if (cp < 0x800) {
            s.push_back(static_cast<char>(0xc0 | (cp >> 6)));
            s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
          } else if (cp < 0x10000) {
            s.push_back(static_cast<char>(0xe0 | (cp >> 12)));
            s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
            s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
          } else {
            s.push_back(static_cast<char>(0xf0 | (cp >> 18)));
            s.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
            s.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
            s.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
          }
          break;
        }
        default: s.push_back(e); break;  // \" \\ \/
      }
    }
    out_->owned.push_back(std::move(s));
    *out = out_->owned.back();
    return true;
  }

  bool Literal(std::string_view lit) {
    if (static_cast<size_t>(end_ - p_) < lit.size() || std::memcmp(p_, lit.data(), lit.size()) != 0) {
      return false;
    }
    p_ += lit.size();
    return true;
  }

  // A value; node is what is wanted inside it (null: skip it).
  bool Value(const IndexExtractor::PathNode* node) {
    if (++depth_ > 512) return false;
    bool ok = ValueInner(node);
    --depth_;
    return ok;
  }

  bool ValueInner(const IndexExtractor::PathNode* node) {
    SkipWs();
    if (p_ >= end_) return false;
    switch (*p_) {
      case '{': return Object(node);
      case '[': {
        ++p_;
        SkipWs();
        if (p_ < end_ && *p_ == ']') {
          ++p_;
          return true;
        }
        for (;;) {
          if (!Value(nullptr)) return false;
          SkipWs();
          if (p_ >= end_) return false;
          if (*p_ == ',') {
            ++p_;
            continue;
          }
          if (*p_ == ']') {
            ++p_;
            return true;
          }
          return false;
        }
      }
      case '"': {
        std::string_view s;
        if (!String(node && node->field >= 0 ? &s : nullptr)) return false;
        if (node && node->field >= 0) out_->fields[node->field] = s;
        return true;
      }
      case 't': return Literal("true");
      case 'f': return Literal("false");
      case 'n': return Literal("null");
      default: {
        const char* start = p_;
        while (p_ < end_ && (std::strchr("+-0123456789.eE", *p_) != nullptr)) ++p_;
        return p_ > start;
      }
    }
  }

  bool Object(const IndexExtractor::PathNode* node) {
    ++p_;  // '{'
    SkipWs();
    if (p_ < end_ && *p_ == '}') {
      ++p_;
      return true;
    }
    const bool labels = node && node->labels;
    for (;;) {
      SkipWs();
      std::string_view key;
      if (!String(&key)) return false;
      SkipWs();
      if (p_ >= end_ || *p_ != ':') return false;
      ++p_;
      if (labels) {
        SkipWs();
        std::string_view v;
        if (p_ < end_ && *p_ == '"') {
          if (!String(&v)) return false;
          out_->labels.emplace_back(key, v);
        } else if (!Value(nullptr)) {
          return false;
        }
      } else {
        const IndexExtractor::PathNode* child = node ? node->Child(key) : nullptr;
        if (!Value(child)) return false;
      }
      SkipWs();
      if (p_ >= end_) return false;
      if (*p_ == ',') {
        ++p_;
        continue;
      }
      if (*p_ == '}') {
        ++p_;
        return true;
      }
      return false;
    }
  }

  const char* p_;
  const char* end_;
  Extracted* out_;
  int depth_ = 0;
};

void SortLabels(Extracted* out) {
  auto& l = out->labels;
  // Stable: of duplicate keys the last one wins, as when decoding a map.
  std::stable_sort(l.begin(), l.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t w = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    if (i + 1 < l.size() && l[i + 1].first == l[i].first) continue;
    l[w++] = l[i];
  }
  l.resize(w);
}

}  // namespace

ResourceSpec PodResource(std::string prefix) {
  ResourceSpec r;
  r.prefix = std::move(prefix);
  r.fields = {
      Field("metadata.name", {1, 1}, false),
      Field("metadata.namespace", {1, 3}, true),
      Field("spec.nodeName", {2, 10}, true),
      Field("status.phase", {3, 1}, true),
  };
  return r;
}

ResourceSpec NodeResource(std::string prefix) {
  ResourceSpec r;
  r.prefix = std::move(prefix);
  r.fields = {Field("metadata.name", {1, 1}, false)};
  return r;
}

ResourceSpec LeaseResource(std::string prefix) {
  ResourceSpec r;
  r.prefix = std::move(prefix);
  r.fields = {
      Field("metadata.name", {1, 1}, false),
      Field("metadata.namespace", {1, 3}, true),
      Field("spec.holderIdentity", {2, 1}, true),
  };
  return r;
}

std::vector<ResourceSpec> DefaultResources() {
  return {PodResource(), NodeResource(), LeaseResource()};
}

ResourceSpec ResourceForPrefix(const std::string& prefix) {
  if (prefix.find("/pods/") != std::string::npos) return PodResource(prefix);
  if (prefix.find("/minions/") != std::string::npos) return NodeResource(prefix);
  if (prefix.find("/leases/") != std::string::npos) return LeaseResource(prefix);
  ResourceSpec r;
  r.prefix = prefix;
  return r;
}

IndexExtractor::IndexExtractor(const ResourceSpec& spec)
    : spec_(spec), proto_root_(std::make_unique<PathNode>()), json_root_(std::make_unique<PathNode>()) {
  for (size_t i = 0; i < spec_.fields.size(); ++i) {
    const FieldSpec& f = spec_.fields[i];
    PathNode* n = proto_root_.get();
    for (int num : f.proto_path) n = n->AddNumber(num);
    n->field = static_cast<int>(i);
    n = json_root_.get();
    for (absl::string_view part : absl::StrSplit(f.name, '.')) n = n->AddName(SV(part));
    n->field = static_cast<int>(i);
  }
  if (spec_.labels) {
    proto_root_->AddNumber(1)->AddNumber(11)->labels = true;
    json_root_->AddName("metadata")->AddName("labels")->labels = true;
  }
}

IndexExtractor::~IndexExtractor() = default;

int IndexExtractor::FieldIndex(std::string_view name) const {
  for (size_t i = 0; i < spec_.fields.size(); ++i) {
    if (spec_.fields[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

bool IndexExtractor::Extract(std::string_view value, Extracted* out) const {
  out->Clear();
  out->fields.assign(spec_.fields.size(), std::nullopt);
  bool ok = false;
  if (value.substr(0, 4) == kK8sMagic) {
    ok = ExtractProto(value.substr(4), out);
  } else {
    size_t i = 0;
    while (i < value.size() && (value[i] == ' ' || value[i] == '\n' || value[i] == '\t' || value[i] == '\r')) {
      ++i;
    }
    if (i < value.size() && value[i] == '{') ok = ExtractJson(value, out);
  }
  if (!ok) {
    out->Clear();
    out->fields.assign(spec_.fields.size(), std::nullopt);
    return false;
  }
  SortLabels(out);
  out->decoded = true;
  return true;
}

bool IndexExtractor::ExtractProto(std::string_view envelope, Extracted* out) const {
  std::string_view raw;
  bool has_raw = false, encoded = false;
  bool ok = ForEachField(envelope, [&](int field, int wt, uint64_t, std::string_view bytes) {
    if (field == 2 && wt == 2) {
      raw = bytes;
      has_raw = true;
    }
    if (field == 3 && wt == 2 && !bytes.empty()) encoded = true;  // contentEncoding
    if (field == 4 && wt == 2 && !bytes.empty() && bytes != "application/vnd.kubernetes.protobuf") {
      encoded = true;  // raw in another content type
    }
    return true;
  });
  if (!ok || !has_raw || encoded) return false;
  return WalkProto(raw, *proto_root_, out);
}

bool IndexExtractor::ExtractJson(std::string_view value, Extracted* out) const {
  JsonScanner s(value, out);
  return s.Document(*json_root_);
}

std::string K8sProtobufEnvelope(std::string_view api_version, std::string_view kind,
                                std::string_view raw) {
  std::string type_meta;
  util::AppendBytesField(1, api_version, &type_meta);
  util::AppendBytesField(2, kind, &type_meta);
  std::string out(kK8sMagic);
  util::AppendBytesField(1, type_meta, &out);
  util::AppendBytesField(2, raw, &out);
  return out;
}

}  // namespace capstan::watchcache
