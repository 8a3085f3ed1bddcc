#include "server/api/go_unmarshal.h"

#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "server/api/client_traffic.h"
#include "server/api/grpc_buffers.h"

namespace capstan::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

// The errors gogo's generated code returns (io.ErrUnexpectedEOF and the
// package's ErrIntOverflow and ErrInvalidLength).
constexpr char kUnexpectedEof[] = "unexpected EOF";
constexpr char kIntOverflow[] = "proto: integer overflow";
constexpr char kInvalidLength[] = "proto: negative length found during unmarshaling";

// What a message nested deeper than C++ protobuf allows gets (Go's newer
// protobuf words its refusals so).
constexpr char kCannotParse[] = "proto: cannot parse invalid wire-format data";

// C++ protobuf's limit on nested messages; a request nested deeper is
// refused.
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
  // into (null: none) receives the values of the fields its type knows, as
  // gogo's Unmarshal sets them.
  explicit Walker(std::string_view data, google::protobuf::Message* into = nullptr)
      : data_(data), l_(static_cast<int64_t>(data.size())), into_(into) {}

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
    const int want = WireTypeOf(f);
    if (f.is_repeated() && want != 2 && wire_type == 2) return Packed(f, want);
    if (wire_type != want) {
      return absl::StrCat("proto: wrong wireType = ", wire_type, " for field ",
                          GoFieldName(f.name()));
    }
    if (want != 2) return Scalar(f, want);
    int64_t end = 0;
    if (std::string e = Length(&end); !e.empty()) return e;
    const std::string_view value =
        data_.substr(static_cast<size_t>(i_), static_cast<size_t>(end - i_));
    if (f.type() == FieldDescriptor::TYPE_MESSAGE) {
      if (depth >= kMaxDepth) {
        // Deeper than C++ protobuf nests: not checked; not decoded either.
        if (into_ != nullptr) return kCannotParse;
      } else {
        google::protobuf::Message* sub = nullptr;
        if (into_ != nullptr) {
          const auto* r = into_->GetReflection();
          sub = f.is_repeated() ? r->AddMessage(into_, &f) : r->MutableMessage(into_, &f);
        }
        if (std::string e = Walker(value, sub).Message(*f.message_type(), depth + 1); !e.empty()) {
          return e;
        }
      }
    } else if (into_ != nullptr) {
      // As bytes: gogo does not check that a string is UTF-8.
      const auto* r = into_->GetReflection();
      if (f.is_repeated()) {
        r->AddString(into_, &f, std::string(value));
      } else {
        r->SetString(into_, &f, std::string(value));
      }
    }
    i_ = end;
    return "";
  }

  // One varint or fixed-size value of f, stored if wanted.
  std::string Scalar(const FieldDescriptor& f, int wire_type) {
    uint64_t v = 0;
    if (wire_type == 0) {
      if (std::string e = Varint(&v); !e.empty()) return e;
    } else {
      const int size = wire_type == 1 ? 8 : 4;
      if (std::string e = Fixed(size); !e.empty()) return e;
      for (int b = size - 1; b >= 0; --b) {
        v = (v << 8) | static_cast<uint8_t>(data_[static_cast<size_t>(i_ - size + b)]);
      }
    }
    if (into_ != nullptr) Store(f, v);
    return "";
  }

  // Sets (or adds to) f the value v read from the wire, converted as Go's
  // generated code converts it.
  void Store(const FieldDescriptor& f, uint64_t v) {
    const auto* r = into_->GetReflection();
    const bool add = f.is_repeated();
    switch (f.cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32: {
        auto x = static_cast<int32_t>(static_cast<uint32_t>(v));
        if (f.type() == FieldDescriptor::TYPE_SINT32) {
          x = static_cast<int32_t>((static_cast<uint32_t>(v) >> 1) ^ -(static_cast<uint32_t>(v) & 1));
        }
        add ? r->AddInt32(into_, &f, x) : r->SetInt32(into_, &f, x);
        break;
      }
      case FieldDescriptor::CPPTYPE_INT64: {
        auto x = static_cast<int64_t>(v);
        if (f.type() == FieldDescriptor::TYPE_SINT64) {
          x = static_cast<int64_t>((v >> 1) ^ -(v & 1));
        }
        add ? r->AddInt64(into_, &f, x) : r->SetInt64(into_, &f, x);
        break;
      }
      case FieldDescriptor::CPPTYPE_UINT32:
        add ? r->AddUInt32(into_, &f, static_cast<uint32_t>(v))
            : r->SetUInt32(into_, &f, static_cast<uint32_t>(v));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        add ? r->AddUInt64(into_, &f, v) : r->SetUInt64(into_, &f, v);
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        add ? r->AddBool(into_, &f, v != 0) : r->SetBool(into_, &f, v != 0);
        break;
      case FieldDescriptor::CPPTYPE_ENUM: {
        const auto x = static_cast<int32_t>(static_cast<uint32_t>(v));
        add ? r->AddEnumValue(into_, &f, x) : r->SetEnumValue(into_, &f, x);
        break;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE: {
        double d;
        std::memcpy(&d, &v, sizeof d);
        add ? r->AddDouble(into_, &f, d) : r->SetDouble(into_, &f, d);
        break;
      }
      case FieldDescriptor::CPPTYPE_FLOAT: {
        float x;
        const auto bits = static_cast<uint32_t>(v);
        std::memcpy(&x, &bits, sizeof x);
        add ? r->AddFloat(into_, &f, x) : r->SetFloat(into_, &f, x);
        break;
      }
      default:
        break;
    }
  }

  // A packed repeated scalar: its elements are read up to the end of the
  // field, each checked against the end of the whole message as gogo does.
  std::string Packed(const FieldDescriptor& f, int element_wire_type) {
    int64_t end = 0;
    if (std::string e = Length(&end); !e.empty()) return e;
    while (i_ < end) {
      if (std::string e = Scalar(f, element_wire_type); !e.empty()) return e;
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
  google::protobuf::Message* const into_;
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
  // Gogo took bytes C++ protobuf refuses: a string that is not UTF-8, an
  // unknown group closed by another field's end tag, a tag beyond C++'s
  // field numbers (Go keeps its low 32 bits). Decode them as gogo does.
  return DecodeLikeGogo(data, message);
}

std::string DecodeLikeGogo(std::string_view data, google::protobuf::Message* message) {
  message->Clear();
  return Walker(data, message).Message(*message->GetDescriptor(), 0);
}

std::string DecodeReceived(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  ClientTraffic::Received(buffer.Length());
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
                      absl::StrCat("grpc: failed to unmarshal the received message: ", error));
}

}  // namespace capstan::server
