// Revision keys: how a revision is spelled in the `key` column family.
//
// etcd's layout: 8-byte big-endian main revision, '_', 8-byte big-endian sub
// revision, and a trailing 't' when the revision is a tombstone. Byte order
// equals revision order, so a RocksDB scan of the family walks history.

#ifndef CAPSTAN_MVCC_REVISION_KEY_H_
#define CAPSTAN_MVCC_REVISION_KEY_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "index/revision.h"
#include "util/coding.h"

namespace capstan::mvcc {

using index::Revision;

inline constexpr size_t kRevisionKeySize = 17;
inline constexpr char kTombstoneMark = 't';

// Appends the 17 bytes of rev (and the tombstone mark if asked) to out.
void AppendRevisionKey(Revision rev, bool tombstone, std::string* out);
std::string RevisionKey(Revision rev, bool tombstone = false);

// Parses a revision key. Returns false if bytes is not one.
bool ParseRevisionKey(std::string_view bytes, Revision* rev, bool* tombstone);

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_REVISION_KEY_H_
