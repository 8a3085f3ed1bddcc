#include "mvcc/revision_key.h"

namespace capstan::mvcc {

void AppendRevisionKey(Revision rev, bool tombstone, std::string* out) {
  util::AppendBigEndian64(static_cast<uint64_t>(rev.main), out);
  out->push_back('_');
  util::AppendBigEndian64(static_cast<uint64_t>(rev.sub), out);
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
  rev->main = static_cast<int64_t>(util::ReadBigEndian64(bytes.data()));
  rev->sub = static_cast<int64_t>(util::ReadBigEndian64(bytes.data() + 9));
  *tombstone = bytes.size() == kRevisionKeySize + 1;
  return true;
}

}  // namespace capstan::mvcc
