#include "bench/loadgen/response_summary.h"

#include <climits>

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

// A KeyValue: keeps mod_revision and version. A repeated KeyValue field
// merges into the one before it, as protobuf's parsers do.
bool ParseKeyValue(CodedInputStream* in, EventSummary* ev) {
  return ParseNested(in, [&](uint32_t tag) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    if (field == kKvModRevision && IsVarint(tag)) return ReadInt64(in, &ev->mod_revision);
    if (field == kKvVersion && IsVarint(tag)) return ReadInt64(in, &ev->version);
    return WireFormatLite::SkipField(in, tag);
  });
}

bool ParseEvent(CodedInputStream* in, EventSummary* ev) {
  return ParseNested(in, [&](uint32_t tag) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    if (field == kEventType && IsVarint(tag)) {
      uint32_t type;
      if (!in->ReadVarint32(&type)) return false;
      ev->type = static_cast<int>(type);
      return true;
    }
    if (field == kEventKv && IsLengthDelimited(tag)) return ParseKeyValue(in, ev);
    if (field == kEventPrevKv && IsLengthDelimited(tag)) {
      ev->has_prev_kv = true;
      return WireFormatLite::SkipField(in, tag);
    }
    return WireFormatLite::SkipField(in, tag);
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

void WatchResponseSummary::Clear() {
  watch_id = 0;
  created = false;
  canceled = false;
  compact_revision = 0;
  cancel_reason.clear();
  events.clear();
}

bool WatchResponseSummary::Parse(const uint8_t* data, size_t size) {
  CodedInputStream in(data, static_cast<int>(size));
  return Parse(&in);
}

bool WatchResponseSummary::Parse(CodedInputStream* stream) {
  Clear();
  CodedInputStream& in = *stream;
  while (const uint32_t tag = in.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    bool ok;
    if (field == kResponseWatchId && IsVarint(tag)) {
      ok = ReadInt64(&in, &watch_id);
    } else if ((field == kResponseCreated || field == kResponseCanceled) && IsVarint(tag)) {
      uint64_t v;
      ok = in.ReadVarint64(&v);
      (field == kResponseCreated ? created : canceled) = v != 0;
    } else if (field == kResponseCompactRevision && IsVarint(tag)) {
      ok = ReadInt64(&in, &compact_revision);
    } else if (field == kResponseCancelReason && IsLengthDelimited(tag)) {
      ok = WireFormatLite::ReadString(&in, &cancel_reason);
    } else if (field == kResponseEvents && IsLengthDelimited(tag)) {
      ok = ParseEvent(&in, &events.emplace_back());
    } else {
      ok = WireFormatLite::SkipField(&in, tag);
    }
    if (!ok) return false;
  }
  return in.ConsumedEntireMessage();
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
      uint64_t v;
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

template <typename Summary>
Status DeserializeSummary(ByteBuffer* buffer, Summary* msg) {
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

template Status DeserializeSummary(ByteBuffer*, capstan::bench::WatchResponseSummary*);
template Status DeserializeSummary(ByteBuffer*, capstan::bench::RangeResponseSummary*);

}  // namespace grpc::internal
