// Byte encodings shared by the stored records: protobuf's wire format (the
// records are etcd's protobuf messages, written and read without a protobuf
// object) and the big-endian fixed 64-bit integers of revision, lease and
// meta keys, whose byte order is their numeric order.
//
// Thread safety: pure functions.

#ifndef CAPSTAN_UTIL_CODING_H_
#define CAPSTAN_UTIL_CODING_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace capstan::util {

// Protobuf wire helpers.
void AppendVarint(uint64_t v, std::string* out);
// The bytes AppendVarint writes for v.
size_t VarintSize(uint64_t v);
void AppendTag(int field, int wire_type, std::string* out);
void AppendVarintField(int field, uint64_t v, std::string* out);  // omitted when v == 0
void AppendBytesField(int field, std::string_view bytes, std::string* out);
// Reads a varint at *p (< end), advancing *p. Returns false on malformed input.
bool ReadVarint(const char** p, const char* end, uint64_t* v);

// Big-endian fixed 64-bit encoding used by revision keys and meta records.
void AppendBigEndian64(uint64_t v, std::string* out);
uint64_t ReadBigEndian64(const char* p);

}  // namespace capstan::util

#endif  // CAPSTAN_UTIL_CODING_H_
