#include "server/go_unmarshal.h"

#include <cstdint>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "server/grpc_buffers.h"

namespace capstan::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// The errors gogo's generated code returns (io.ErrUnexpectedEOF and the
// package's ErrIntOverflow and ErrInvalidLength).
constexpr char kUnexpectedEof[] = "unexpected EOF";
constexpr char kIntOverflow[] = "proto: integer overflow";
constexpr char kInvalidLength[] = "proto: negative length found during unmarshaling";

// The text C++ protobuf's own refusals get (a string that is not UTF-8,
// nesting deeper than it allows), as Go's newer protobuf words it.
constexpr char kCannotParse[] = "proto: cannot parse invalid wire-format data";

// C++ protobuf refuses messages nested deeper than this; the walk stops
// there and leaves the refusal to it.
constexpr int kMaxDepth = 100;

// Go's names for a message type and a field (protoc-gen-go's CamelCase).
std::string GoTypeName(const Descriptor& type) {
  std::string name = type.full_name();
  const std::string& package = type.file()->package();
  if (!package.empty()) name.erase(0, package.size() + 1);
  return absl::StrReplaceAll(name, {{".", "_"}});
}

bool IsLower(char c) { return c >= 'a' && c <= 'z'; }

std::string GoFieldName(const std::string& s) {
  std::string t;
  size_t i = 0;
  if (!s.empty() && s[0] == '_') {
    t.push_back('X');
    ++i;
  }
  for (; i < s.size(); ++i) {
    char c = s[i];
    if (c == '_' && i + 1 < s.size() && IsLower(s[i + 1])) continue;
    if (c >= '0' && c <= '9') {
      t.push_back(c);
      continue;
    }
    if (IsLower(c)) c = static_cast<char>(c - 'a' + 'A');
    t.push_back(c);
    while (i + 1 < s.size() && IsLower(s[i + 1])) t.push_back(s[++i]);
  }
  return t;
}

// One message's bytes read as gogo's loops read them: positions are Go
// ints, lengths may make them overflow, and every varint is at most 10
// bytes ("shift >= 64" overflows).
class Walker {
 public:
  // known_fields (null: not wanted) receives the fields the message knows,
  // as gogo read them, with the unknown ones left out.
  explicit Walker(std::string_view data, std::string* known_fields = nullptr)
      : data_(data), l_(static_cast<int64_t>(data.size())), known_(known_fields) {}

  // The generated Unmarshal of type.
  std::string Message(const Descriptor& type, int depth) {
    while (i_ < l_) {
      const int64_t pre = i_;
      uint64_t wire;
      if (std::string e = Varint(&wire); !e.empty()) return e;
      const auto field_num = static_cast<int32_t>(static_cast<uint32_t>(wire >> 3));
      const int wire_type = static_cast<int>(wire & 7);
      if (wire_type == 4) {
        return absl::StrCat("proto: ", GoTypeName(type), ": wiretype end group for non-group");
      }
      if (field_num <= 0) {
        return absl::StrCat("proto: ", GoTypeName(type), ": illegal tag ", field_num,
                            " (wire type ", wire, ")");
      }
      const FieldDescriptor* field = type.FindFieldByNumber(field_num);
      std::string e = field == nullptr ? Unknown(pre) : Known(*field, wire_type, depth);
      if (!e.empty()) return e;
    }
    if (i_ > l_) return kUnexpectedEof;
    return "";
  }

 private:
  static int WireTypeOf(const FieldDescriptor& f) {
    switch (f.type()) {
      case FieldDescriptor::TYPE_FIXED64:
      case FieldDescriptor::TYPE_SFIXED64:
      case FieldDescriptor::TYPE_DOUBLE:
        return 1;
      case FieldDescriptor::TYPE_STRING:
      case FieldDescriptor::TYPE_BYTES:
      case FieldDescriptor::TYPE_MESSAGE:
        return 2;
      case FieldDescriptor::TYPE_GROUP:
        return 3;
      case FieldDescriptor::TYPE_FIXED32:
      case FieldDescriptor::TYPE_SFIXED32:
      case FieldDescriptor::TYPE_FLOAT:
        return 5;
      default:
        return 0;
    }
  }

  // A field the message knows, from after its tag.
  std::string Known(const FieldDescriptor& f, int wire_type, int depth) {
    const int64_t start = i_;
    std::optional<std::string> nested;  // a walked message's known fields
    std::string e = KnownValue(f, wire_type, depth, &nested);
    if (!e.empty() || known_ == nullptr) return e;
    AppendVarint((static_cast<uint64_t>(f.number()) << 3) | static_cast<uint64_t>(wire_type));
    if (nested.has_value()) {
      AppendVarint(nested->size());
      known_->append(*nested);
    } else {
      known_->append(data_.substr(static_cast<size_t>(start), static_cast<size_t>(i_ - start)));
    }
    return "";
  }

  std::string KnownValue(const FieldDescriptor& f, int wire_type, int depth,
                         std::optional<std::string>* nested) {
    const int want = WireTypeOf(f);
    if (f.is_repeated() && want != 2 && wire_type == 2) return Packed(want);
    if (wire_type != want) {
      return absl::StrCat("proto: wrong wireType = ", wire_type, " for field ",
                          GoFieldName(f.name()));
    }
    switch (want) {
      case 0: {
        uint64_t v;
        return Varint(&v);
      }
      case 1:
      case 5:
        return Fixed(want == 1 ? 8 : 4);
      default:
        break;
    }
    int64_t end = 0;
    if (std::string e = Length(&end); !e.empty()) return e;
    if (f.type() == FieldDescriptor::TYPE_MESSAGE && depth < kMaxDepth) {
      Walker sub(data_.substr(static_cast<size_t>(i_), static_cast<size_t>(end - i_)),
                 known_ != nullptr ? &nested->emplace() : nullptr);
      if (std::string e = sub.Message(*f.message_type(), depth + 1); !e.empty()) return e;
    }
    i_ = end;
    return "";
  }

  void AppendVarint(uint64_t v) {
    while (v >= 0x80) {
      known_->push_back(static_cast<char>(v | 0x80));
      v >>= 7;
    }
    known_->push_back(static_cast<char>(v));
  }

  // A packed repeated scalar: its elements are read up to the end of the
  // field, each checked against the end of the whole message as gogo does.
  std::string Packed(int element_wire_type) {
    int64_t end = 0;
    if (std::string e = Length(&end); !e.empty()) return e;
    while (i_ < end) {
      if (element_wire_type == 0) {
        uint64_t v;
        if (std::string e = Varint(&v); !e.empty()) return e;
      } else if (std::string e = Fixed(element_wire_type == 1 ? 8 : 4); !e.empty()) {
        return e;
      }
    }
    return "";
  }

  // A field the message does not know: skipRpc from its tag, then the
  // caller's checks.
  std::string Unknown(int64_t pre) {
    i_ = pre;
    int64_t skippy = 0;
    if (std::string e = Skip(&skippy); !e.empty()) return e;
    if (skippy < 0) return kInvalidLength;
    if (Add(i_, skippy) > l_) return kUnexpectedEof;
    i_ += skippy;
    return "";
  }

  // skipRpc on the bytes from i_: one field, a group with all it holds;
  // *n is where it ends, relative to i_. Groups are followed with a depth
  // count instead of gogo's recursion.
  std::string Skip(int64_t* n) {
    Walker w(data_.substr(static_cast<size_t>(i_)));
    int groups = 0;
    for (;;) {
      uint64_t wire;
      if (std::string e = w.Varint(&wire); !e.empty()) return e;
      const int wire_type = static_cast<int>(wire & 7);
      switch (wire_type) {
        case 0: {
          uint64_t v;
          if (std::string e = w.Varint(&v); !e.empty()) return e;
          break;
        }
        case 1:
          w.i_ = Add(w.i_, 8);
          break;
        case 2: {
          uint64_t length;
          if (std::string e = w.Varint(&length); !e.empty()) return e;
          w.i_ = Add(w.i_, static_cast<int64_t>(length));
          if (static_cast<int64_t>(length) < 0) return kInvalidLength;
          break;
        }
        case 3:
          ++groups;
          continue;
        case 4:
          if (groups > 0) --groups;
          break;
        case 5:
          w.i_ = Add(w.i_, 4);
          break;
        default:
          return absl::StrCat("proto: illegal wireType ", wire_type);
      }
      if (groups == 0) {
        *n = w.i_;
        return "";
      }
    }
  }

  // Go's int addition, which wraps.
  static int64_t Add(int64_t a, int64_t b) {
    return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
  }

  std::string Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0;; shift += 7) {
      if (shift >= 64) return kIntOverflow;
      if (i_ < 0 || i_ >= l_) return kUnexpectedEof;
      const auto b = static_cast<uint8_t>(data_[static_cast<size_t>(i_++)]);
      *v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (b < 0x80) return "";
    }
  }

  std::string Fixed(int size) {
    if (Add(i_, size) > l_) return kUnexpectedEof;
    i_ += size;
    return "";
  }

  // A length prefix and the end it gives.
  std::string Length(int64_t* end) {
    uint64_t raw;
    if (std::string e = Varint(&raw); !e.empty()) return e;
    const auto length = static_cast<int64_t>(raw);
    if (length < 0) return kInvalidLength;
    *end = Add(i_, length);
    if (*end < 0) return kInvalidLength;
    if (*end > l_) return kUnexpectedEof;
    return "";
  }

  std::string_view data_;
  int64_t l_;
  int64_t i_ = 0;
  std::string* const known_;
};

}  // namespace

std::string GoUnmarshalError(const Descriptor& type, std::string_view data) {
  return Walker(data).Message(type, 0);
}

std::string DecodeAsEtcd(std::string_view data, google::protobuf::Message* message) {
  std::string error = GoUnmarshalError(*message->GetDescriptor(), data);
  if (!error.empty() || message->ParseFromArray(data.data(), static_cast<int>(data.size()))) {
    return error;
  }
  // Gogo took bytes C++ protobuf refuses: an unknown group whose end tag
  // names another field, a tag beyond C++'s field numbers (Go keeps its
  // low 32 bits). Decode what gogo read: the known fields alone.
  std::string known;
  Walker(data, &known).Message(*message->GetDescriptor(), 0);
  if (message->ParseFromString(known)) return "";
  return kCannotParse;
}

std::string DecodeAsEtcd(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  std::string bytes;
  if (!FlattenBuffer(buffer, &bytes)) return kCannotParse;
  return DecodeAsEtcd(bytes, message);
}

grpc::Status UnmarshalStatus(const std::string& error) {
  return grpc::Status(grpc::StatusCode::INTERNAL,
                      absl::StrCat("grpc: error unmarshalling request: ", error));
}

grpc::Status StreamUnmarshalStatus(const std::string& error) {
  return grpc::Status(grpc::StatusCode::INTERNAL,
                      absl::StrCat("grpc: failed to unmarshal the received message ", error));
}

}  // namespace capstan::server
