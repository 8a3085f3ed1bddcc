#include "bench/loadgen/response_summary.h"

#include <climits>
#include <string>
#include <vector>

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

namespace capstan::bench {

namespace {

using google::protobuf::io::CodedInputStream;
using google::protobuf::internal::WireFormatLite;

// Field numbers from etcd's rpc.proto and kv.proto.
constexpr int kResponseWatchId = 2;
constexpr int kResponseCreated = 3;
constexpr int kResponseCanceled = 4;
constexpr int kResponseCompactRevision = 5;
constexpr int kResponseCancelReason = 6;
constexpr int kResponseEvents = 11;
constexpr int kEventType = 1;
constexpr int kEventKv = 2;
constexpr int kEventPrevKv = 3;
constexpr int kKvKey = 1;
constexpr int kKvModRevision = 3;
constexpr int kKvVersion = 4;
constexpr int kKvValue = 5;
constexpr int kRangeHeader = 1;
constexpr int kRangeKvs = 2;
constexpr int kRangeMore = 3;
constexpr int kRangeCount = 4;
constexpr int kHeaderRevision = 3;

bool IsVarint(uint32_t tag) {
  return WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_VARINT;
}
bool IsLengthDelimited(uint32_t tag) {
  return WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
}

bool ReadInt64(CodedInputStream* in, int64_t* out) {
  uint64_t v;
  if (!in->ReadVarint64(&v)) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

// Runs parse_field(tag) for every field of the length-delimited message at
// the stream's position; parse_field returns false on malformed input.
template <typename ParseField>
bool ParseNested(CodedInputStream* in, ParseField parse_field) {
  int length;
  if (!in->ReadVarintSizeAsInt(&length)) return false;
  // A length past the end of the input (the stream would clamp the limit to it).
  if (length > in->BytesUntilLimit()) return false;
  const auto limit = in->PushLimit(length);
  while (const uint32_t tag = in->ReadTag()) {
    if (!parse_field(tag)) return false;
  }
  if (!in->ConsumedEntireMessage()) return false;
  in->PopLimit(limit);
  return true;
}

// A protobuf wire reader over contiguous bytes, for the watch summary: a
// watch response is small and arrives whole, and CodedInputStream's limit
// stack cost more than the decoding itself at millions of events a second.
// Groups (wire types 3 and 4), which no etcd message has, are refused.
class FlatReader {
 public:
  FlatReader() = default;
  FlatReader(const uint8_t* p, const uint8_t* end) : p_(p), end_(end) {}

  bool done() const { return p_ == end_; }
  const uint8_t* data() const { return p_; }
  size_t size() const { return static_cast<size_t>(end_ - p_); }

  bool Varint(uint64_t* v) {
    uint64_t r = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p_ == end_) return false;
      const uint8_t b = *p_++;
      r |= uint64_t{b & 0x7fu} << shift;
      if (b < 0x80) {
        *v = r;
        return true;
      }
    }
    return false;  // more than 10 bytes
  }
  bool Int64(int64_t* v) {
    uint64_t u;
    if (!Varint(&u)) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }
  // A field's tag; false at a malformed one or field number 0.
  bool Tag(uint32_t* field, uint32_t* wire_type) {
    uint64_t t;
    if (!Varint(&t) || t > UINT32_MAX) return false;
    *field = static_cast<uint32_t>(t >> 3);
    *wire_type = static_cast<uint32_t>(t & 7);
    return *field != 0;
  }
  // The body of a length-delimited field, as a reader of its own.
  bool Bytes(FlatReader* body) {
    uint64_t n;
    if (!Varint(&n) || n > size()) return false;
    *body = FlatReader(p_, p_ + n);
    p_ += n;
    return true;
  }
  bool Skip(uint32_t wire_type) {
    switch (wire_type) {
      case WireFormatLite::WIRETYPE_VARINT: {
        uint64_t v;
        return Varint(&v);
      }
      case WireFormatLite::WIRETYPE_FIXED64:
        return Advance(8);
      case WireFormatLite::WIRETYPE_LENGTH_DELIMITED: {
        FlatReader body;
        return Bytes(&body);
      }
      case WireFormatLite::WIRETYPE_FIXED32:
        return Advance(4);
      default:
        return false;
    }
  }

 private:
  bool Advance(size_t n) {
    if (n > size()) return false;
    p_ += n;
    return true;
  }

  const uint8_t* p_ = nullptr;
  const uint8_t* end_ = nullptr;
};

// Runs on_field(field, wire_type, in) for each field of a message; on_field
// reads or skips the field's value from `in` and returns false on malformed
// input.
template <typename OnField>
bool ForEachField(FlatReader in, OnField on_field) {
  uint32_t field, wire;
  while (!in.done()) {
    if (!in.Tag(&field, &wire) || !on_field(field, wire, in)) return false;
  }
  return true;
}

constexpr uint32_t kVarint = WireFormatLite::WIRETYPE_VARINT;
constexpr uint32_t kBytes = WireFormatLite::WIRETYPE_LENGTH_DELIMITED;

// A KeyValue: keeps mod_revision and version. A repeated KeyValue field
// merges into the one before it, as protobuf's parsers do.
bool ParseKeyValue(FlatReader body, EventSummary* ev) {
  return ForEachField(body, [ev](uint32_t field, uint32_t wire, FlatReader& in) {
    if (field == kKvModRevision && wire == kVarint) return in.Int64(&ev->mod_revision);
    if (field == kKvVersion && wire == kVarint) return in.Int64(&ev->version);
    return in.Skip(wire);
  });
}

bool ParseEvent(FlatReader body, EventSummary* ev) {
  return ForEachField(body, [ev](uint32_t field, uint32_t wire, FlatReader& in) {
    if (field == kEventType && wire == kVarint) {
      int64_t type = 0;
      if (!in.Int64(&type)) return false;
      ev->type = static_cast<int>(type);
      return true;
    }
    if ((field == kEventKv || field == kEventPrevKv) && wire == kBytes) {
      FlatReader kv;
      if (!in.Bytes(&kv)) return false;
      if (field == kEventPrevKv) {
        ev->has_prev_kv = true;
        return true;
      }
      return ParseKeyValue(kv, ev);
    }
    return in.Skip(wire);
  });
}

// A RangeResponse's KeyValue: counts it, adds its value's size and keeps
// its key as the last one seen.
bool ParseRangeKeyValue(CodedInputStream* in, RangeResponseSummary* out) {
  ++out->kvs;
  return ParseNested(in, [&](uint32_t tag) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    if (field == kKvKey && IsLengthDelimited(tag)) return WireFormatLite::ReadBytes(in, &out->last_key);
    if (field == kKvValue && IsLengthDelimited(tag)) {
      uint32_t size;
      if (!in->ReadVarint32(&size) || !in->Skip(static_cast<int>(size))) return false;
      out->value_bytes += size;
      return true;
    }
    return WireFormatLite::SkipField(in, tag);
  });
}

}  // namespace

const std::string& WatchMethod() {
  static const std::string* const method = new std::string("/etcdserverpb.Watch/Watch");
  return *method;
}

const std::string& RangeMethod() {
  static const std::string* const method = new std::string("/etcdserverpb.KV/Range");
  return *method;
}

void WatchResponseSummary::Clear() {
  watch_id = 0;
  created = false;
  canceled = false;
  compact_revision = 0;
  cancel_reason.clear();
  events.clear();
}

bool WatchResponseSummary::Parse(const uint8_t* data, size_t size) {
  Clear();
  return ForEachField(FlatReader(data, data + size), [this](uint32_t field, uint32_t wire,
                                                             FlatReader& in) {
    if (wire == kVarint && (field == kResponseWatchId || field == kResponseCreated ||
                            field == kResponseCanceled || field == kResponseCompactRevision)) {
      int64_t v = 0;
      if (!in.Int64(&v)) return false;
      if (field == kResponseWatchId) watch_id = v;
      if (field == kResponseCreated) created = v != 0;
      if (field == kResponseCanceled) canceled = v != 0;
      if (field == kResponseCompactRevision) compact_revision = v;
      return true;
    }
    if ((field == kResponseCancelReason || field == kResponseEvents) && wire == kBytes) {
      FlatReader body;
      if (!in.Bytes(&body)) return false;
      if (field == kResponseEvents) return ParseEvent(body, &events.emplace_back());
      cancel_reason.assign(reinterpret_cast<const char*>(body.data()), body.size());
      return true;
    }
    return in.Skip(wire);
  });
}

void RangeResponseSummary::Clear() {
  revision = 0;
  more = false;
  count = 0;
  kvs = 0;
  value_bytes = 0;
  last_key.clear();
}

bool RangeResponseSummary::Parse(const uint8_t* data, size_t size) {
  CodedInputStream in(data, static_cast<int>(size));
  return Parse(&in);
}

bool RangeResponseSummary::Parse(CodedInputStream* stream) {
  Clear();
  CodedInputStream& in = *stream;
  while (const uint32_t tag = in.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    bool ok;
    if (field == kRangeHeader && IsLengthDelimited(tag)) {
      ok = ParseNested(&in, [&](uint32_t t) {
        if (WireFormatLite::GetTagFieldNumber(t) == kHeaderRevision && IsVarint(t)) {
          return ReadInt64(&in, &revision);
        }
        return WireFormatLite::SkipField(&in, t);
      });
    } else if (field == kRangeKvs && IsLengthDelimited(tag)) {
      ok = ParseRangeKeyValue(&in, this);
    } else if (field == kRangeMore && IsVarint(tag)) {
      uint64_t v = 0;
      ok = in.ReadVarint64(&v);
      more = v != 0;
    } else if (field == kRangeCount && IsVarint(tag)) {
      ok = ReadInt64(&in, &count);
    } else {
      ok = WireFormatLite::SkipField(&in, tag);
    }
    if (!ok) return false;
  }
  return in.ConsumedEntireMessage();
}

}  // namespace capstan::bench

namespace grpc::internal {

Status DeserializeSummary(ByteBuffer* buffer, capstan::bench::WatchResponseSummary* msg) {
  // A watch response is small: read it whole, in place when it came in one
  // slice.
  std::vector<Slice> slices;
  Status dumped = buffer->Dump(&slices);
  buffer->Clear();
  if (!dumped.ok()) return dumped;
  bool parsed;
  if (slices.size() == 1) {
    parsed = msg->Parse(slices[0].begin(), slices[0].size());
  } else {
    thread_local std::string flat;
    flat.clear();
    for (const Slice& s : slices) flat.append(reinterpret_cast<const char*>(s.begin()), s.size());
    parsed = msg->Parse(reinterpret_cast<const uint8_t*>(flat.data()), flat.size());
  }
  if (!parsed) return Status(StatusCode::INTERNAL, "a response that does not decode");
  return Status::OK;
}

Status DeserializeSummary(ByteBuffer* buffer, capstan::bench::RangeResponseSummary* msg) {
  // Read in place, slice by slice: a full list is hundreds of megabytes.
  const size_t length = buffer->Length();
  bool parsed;
  {
    ProtoBufferReader reader(buffer);
    if (!reader.status().ok()) return reader.status();
    google::protobuf::io::CodedInputStream in(&reader);
    in.SetTotalBytesLimit(INT_MAX);
    // With a limit at the message's end, a nested length past it is caught.
    in.PushLimit(static_cast<int>(length));
    parsed = msg->Parse(&in);
  }
  buffer->Clear();
  if (!parsed) return Status(StatusCode::INTERNAL, "a response that does not decode");
  return Status::OK;
}

}  // namespace grpc::internal
