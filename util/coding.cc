#include "util/coding.h"

namespace capstan::util {

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void AppendVarint(uint64_t v, std::string* out) {
  char buf[10];
  int n = 0;
  while (v >= 0x80) {
    buf[n++] = static_cast<char>(v | 0x80);
    v >>= 7;
  }
  buf[n++] = static_cast<char>(v);
  out->append(buf, n);
}

void AppendTag(int field, int wire_type, std::string* out) {
  AppendVarint((static_cast<uint64_t>(field) << 3) | wire_type, out);
}

void AppendVarintField(int field, uint64_t v, std::string* out) {
  if (v == 0) return;
  AppendTag(field, 0, out);
  AppendVarint(v, out);
}

void AppendBytesField(int field, std::string_view bytes, std::string* out) {
  AppendTag(field, 2, out);
  AppendVarint(bytes.size(), out);
  out->append(bytes);
}

bool ReadVarint(const char** p, const char* end, uint64_t* v) {
  uint64_t result = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    uint8_t b = static_cast<uint8_t>(*(*p)++);
    result |= static_cast<uint64_t>(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = result;
      return true;
    }
  }
  return false;
}

void AppendBigEndian64(uint64_t v, std::string* out) {
  char buf[8];
  for (int i = 7; i >= 0; --i) {
    buf[i] = static_cast<char>(v & 0xff);
    v >>= 8;
  }
  out->append(buf, 8);
}

uint64_t ReadBigEndian64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace capstan::util
