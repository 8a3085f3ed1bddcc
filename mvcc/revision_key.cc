#include "mvcc/revision_key.h"

namespace capstan::mvcc {

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

void AppendRevisionKey(Revision rev, bool tombstone, std::string* out) {
  AppendBigEndian64(static_cast<uint64_t>(rev.main), out);
  out->push_back('_');
  AppendBigEndian64(static_cast<uint64_t>(rev.sub), out);
  if (tombstone) out->push_back(kTombstoneMark);
}

std::string RevisionKey(Revision rev, bool tombstone) {
  std::string out;
  out.reserve(kRevisionKeySize + 1);
  AppendRevisionKey(rev, tombstone, &out);
  return out;
}

bool ParseRevisionKey(std::string_view bytes, Revision* rev, bool* tombstone) {
  if (bytes.size() != kRevisionKeySize && bytes.size() != kRevisionKeySize + 1) return false;
  if (bytes[8] != '_') return false;
  if (bytes.size() == kRevisionKeySize + 1 && bytes[kRevisionKeySize] != kTombstoneMark) return false;
  rev->main = static_cast<int64_t>(ReadBigEndian64(bytes.data()));
  rev->sub = static_cast<int64_t>(ReadBigEndian64(bytes.data() + 9));
  *tombstone = bytes.size() == kRevisionKeySize + 1;
  return true;
}

}  // namespace capstan::mvcc
