#include "mvcc/kv_codec.h"

namespace capstan::mvcc {

std::string EncodeKeyValue(const KeyValueView& kv) {
  std::string out;
  out.reserve(kv.key.size() + kv.value.size() + 40);
  if (!kv.key.empty()) util::AppendBytesField(1, kv.key, &out);
  util::AppendVarintField(2, static_cast<uint64_t>(kv.create_revision), &out);
  util::AppendVarintField(3, static_cast<uint64_t>(kv.mod_revision), &out);
  util::AppendVarintField(4, static_cast<uint64_t>(kv.version), &out);
  if (!kv.value.empty()) util::AppendBytesField(5, kv.value, &out);
  util::AppendVarintField(6, static_cast<uint64_t>(kv.lease), &out);
  return out;
}

namespace {

// Walks the fields of a record, calling visit(field, wire_type, start, end,
// varint) for each; start/end delimit the whole field including its tag.
template <typename Visit>
bool WalkFields(std::string_view bytes, Visit visit) {
  const char* p = bytes.data();
  const char* end = p + bytes.size();
  while (p < end) {
    const char* start = p;
    uint64_t tag;
    if (!util::ReadVarint(&p, end, &tag)) return false;
    const int field = static_cast<int>(tag >> 3);
    const int wire = static_cast<int>(tag & 7);
    uint64_t v = 0;
    std::string_view payload;
    switch (wire) {
      case 0:
        if (!util::ReadVarint(&p, end, &v)) return false;
        break;
      case 1:
        if (end - p < 8) return false;
        p += 8;
        break;
      case 2: {
        uint64_t len;
        if (!util::ReadVarint(&p, end, &len) || static_cast<uint64_t>(end - p) < len) return false;
        payload = std::string_view(p, len);
        p += len;
        break;
      }
      case 5:
        if (end - p < 4) return false;
        p += 4;
        break;
      default:
        return false;
    }
    visit(field, wire, std::string_view(start, p - start), v, payload);
  }
  return true;
}

}  // namespace

bool DecodeKeyValue(std::string_view bytes, KeyValueView* kv) {
  *kv = KeyValueView();
  return WalkFields(bytes, [kv](int field, int wire, std::string_view, uint64_t v,
                                std::string_view payload) {
    switch (field) {
      case 1: kv->key = payload; break;
      case 2: kv->create_revision = static_cast<int64_t>(v); break;
      case 3: kv->mod_revision = static_cast<int64_t>(v); break;
      case 4: kv->version = static_cast<int64_t>(v); break;
      case 5: kv->value = payload; break;
      case 6: kv->lease = static_cast<int64_t>(v); break;
      default: break;
    }
  });
}

namespace {

// The record without its value field (keys_only).
std::string StripValue(std::string_view record) {
  std::string stripped;
  stripped.reserve(record.size());
  WalkFields(record, [&stripped](int f, int, std::string_view whole, uint64_t, std::string_view) {
    if (f != 5) stripped.append(whole);
  });
  return stripped;
}

}  // namespace

namespace {

// The size of a varint field of KeyValue (tag < 128: one byte), 0 when
// omitted.
size_t VarintFieldSize(int64_t v) {
  return v == 0 ? 0 : 1 + util::VarintSize(static_cast<uint64_t>(v));
}

// The keys_only KeyValue of kv, prefixed by its tag and length as field
// `field`, appended to out.
void AppendKeysOnly(int field, const KeyValueView& kv, std::string* out) {
  size_t size = VarintFieldSize(kv.create_revision) + VarintFieldSize(kv.mod_revision) +
                VarintFieldSize(kv.version) + VarintFieldSize(kv.lease);
  if (!kv.key.empty()) size += 1 + util::VarintSize(kv.key.size()) + kv.key.size();
  util::AppendTag(field, 2, out);
  util::AppendVarint(size, out);
  if (!kv.key.empty()) util::AppendBytesField(1, kv.key, out);
  util::AppendVarintField(2, static_cast<uint64_t>(kv.create_revision), out);
  util::AppendVarintField(3, static_cast<uint64_t>(kv.mod_revision), out);
  util::AppendVarintField(4, static_cast<uint64_t>(kv.version), out);
  util::AppendVarintField(6, static_cast<uint64_t>(kv.lease), out);
}

}  // namespace

void AppendKeysOnlyField(int field, const KeyValueView& kv, std::string* out) {
  AppendKeysOnly(field, kv, out);
}

void AppendRecordField(int field, std::string_view record, bool strip_value, std::string* out) {
  if (!strip_value) {
    util::AppendBytesField(field, record, out);
    return;
  }
  util::AppendBytesField(field, StripValue(record), out);
}

void AppendRecordField(int field, std::string_view record, bool strip_value, ByteSink* out) {
  std::string stripped;
  if (strip_value) {
    stripped = StripValue(record);
    record = stripped;
  }
  std::string prefix;  // tag and length: at most 1 + 10 bytes here
  util::AppendTag(field, 2, &prefix);
  util::AppendVarint(record.size(), &prefix);
  out->Append(prefix);
  out->Append(record);
}

}  // namespace capstan::mvcc
