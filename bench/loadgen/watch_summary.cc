#include "bench/loadgen/watch_summary.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>

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
constexpr int kKvModRevision = 3;
constexpr int kKvVersion = 4;

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
  Clear();
  CodedInputStream in(data, static_cast<int>(size));
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

}  // namespace capstan::bench

namespace grpc {

Status SerializationTraits<capstan::bench::WatchResponseSummary>::Deserialize(
    ByteBuffer* buffer, capstan::bench::WatchResponseSummary* msg) {
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
  if (!parsed) return Status(StatusCode::INTERNAL, "not a WatchResponse");
  return Status::OK;
}

}  // namespace grpc
