// Wire codec for stored mvccpb.KeyValue records.
//
// Values are stored already encoded as mvccpb.KeyValue so Range responses are
// assembled from stored bytes: a record is copied into the response as a
// length-delimited field without being decoded and re-encoded.

#ifndef CAPSTAN_MVCC_KV_CODEC_H_
#define CAPSTAN_MVCC_KV_CODEC_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "util/coding.h"

namespace capstan::mvcc {

// A decoded view of a stored KeyValue. Views point into the record's bytes
// and are valid while those bytes are.
struct KeyValueView {
  std::string_view key;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  std::string_view value;
  int64_t lease = 0;
};

// Encodes a KeyValue exactly as protobuf (and etcd, in Go) does: fields in
// number order, zero values omitted.
std::string EncodeKeyValue(const KeyValueView& kv);

// Decodes a stored record. Returns false if the bytes are not a KeyValue.
bool DecodeKeyValue(std::string_view bytes, KeyValueView* kv);

// Takes encoded bytes in order: a message built outside one string (a big
// Range's kvs, written into reusable blocks).
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void Append(std::string_view bytes) = 0;
};

// Appends `record` to out as field `field` of wire type 2; with strip_value
// the record's value field (5) is left out (keys_only).
void AppendRecordField(int field, std::string_view record, bool strip_value, std::string* out);
void AppendRecordField(int field, std::string_view record, bool strip_value, ByteSink* out);

// Appends, as field `field` of wire type 2, the KeyValue a keys_only Range
// returns for `kv` (its value ignored): key, create_revision, mod_revision,
// version and lease, encoded as EncodeKeyValue does, so the bytes equal those
// AppendRecordField(field, record, /*strip_value=*/true, ...) gives for the
// key's stored record. No record is needed: the key index holds these fields.
void AppendKeysOnlyField(int field, const KeyValueView& kv, std::string* out);

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_KV_CODEC_H_
