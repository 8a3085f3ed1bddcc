// Records of the `meta` column family written by the KV store.

#ifndef CAPSTAN_MVCC_META_KEYS_H_
#define CAPSTAN_MVCC_META_KEYS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "mvcc/revision_key.h"

namespace capstan::mvcc {

// etcd's names for the compaction marks.
inline constexpr std::string_view kScheduledCompactKey = "scheduledCompactRev";
inline constexpr std::string_view kFinishedCompactKey = "finishedCompactRev";
// Write requests applied, as 8 big-endian bytes (etcd's consistent_index).
inline constexpr std::string_view kConsistentIndexKey = "consistent_index";
// The Raft term of the entry at the consistent index, as 8 big-endian bytes
// (etcd 3.5's `term`), written with it by a cluster member.
inline constexpr std::string_view kConsistentTermKey = "term";

// Compaction marks are stored as revision keys of {rev, 0}, as etcd does.
inline std::string EncodeMetaRevision(int64_t rev) { return RevisionKey(Revision{rev, 0}); }
inline int64_t DecodeMetaRevision(std::string_view bytes) {
  Revision rev;
  bool tombstone;
  return ParseRevisionKey(bytes, &rev, &tombstone) ? rev.main : 0;
}

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_META_KEYS_H_
