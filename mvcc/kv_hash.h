// etcd's kvHasher, shared by HashKV (kv_store_maintenance.cc) and the hash a
// compaction stores of the history it compacts (kv_store_compaction.cc): the
// CRC-32C, seeded with "key", of the key family's records in revision order,
// and the rule of which records it covers.
//
// Thread safety: KvHasher is a plain value; HashCovers is a pure function.

#ifndef CAPSTAN_MVCC_KV_HASH_H_
#define CAPSTAN_MVCC_KV_HASH_H_

#include <cstdint>
#include <string_view>

#include "index/revision.h"
#include "util/crc32c.h"

namespace capstan::mvcc {

// Whether the record at r (a tombstone or not) counts in a hash from the
// compaction at compact_rev on (0 or -1: none). keep: the revisions a
// compaction at the hash's revision keeps (empty: no compaction, all count).
// Left out: revisions at or below compact_rev that compaction does not keep
// (they are about to be deleted), and a tombstone at compact_rev, which etcd
// 3.5.16 keeps until the next compaction and earlier versions removed.
inline bool HashCovers(const index::Revision& r, bool tombstone, int64_t compact_rev,
                       const index::RevisionSet& keep) {
  if (r.main <= compact_rev && !keep.empty() && !keep.contains(r)) return false;
  return !(tombstone && r.main == compact_rev);
}

class KvHasher {
 public:
  void Add(std::string_view key, std::string_view value) {
    hash_ = util::Crc32cExtend(hash_, key);
    hash_ = util::Crc32cExtend(hash_, value);
  }
  uint32_t hash() const { return hash_; }

 private:
  uint32_t hash_ = util::Crc32cExtend(0, "key");
};

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_KV_HASH_H_
