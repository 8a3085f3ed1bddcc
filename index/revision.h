// Copyright 2025 The Capstan Authors.
//
// Revision: the (main, sub) pair that names one change of one key, as in etcd's
// mvcc package. `main` is the store revision of the write request (one per Put,
// DeleteRange or Txn), `sub` numbers the changes inside that request.

#ifndef CAPSTAN_INDEX_REVISION_H_
#define CAPSTAN_INDEX_REVISION_H_

#include <compare>
#include <cstdint>
#include <ostream>
#include <utility>

#include "absl/container/flat_hash_set.h"

namespace capstan::index {

// A plain value; thread-compatible. Ordered by main, then sub, like etcd's
// revision.GreaterThan.
struct Revision {
  int64_t main = 0;
  int64_t sub = 0;

  friend auto operator<=>(const Revision&, const Revision&) = default;
  friend bool operator==(const Revision&, const Revision&) = default;

  template <typename H>
  friend H AbslHashValue(H h, const Revision& rev) {
    return H::combine(std::move(h), rev.main, rev.sub);
  }

  friend std::ostream& operator<<(std::ostream& os, const Revision& rev) {
    return os << "{" << rev.main << "," << rev.sub << "}";
  }
};

// The revisions that survive a compaction (etcd's `available` map).
using RevisionSet = absl::flat_hash_set<Revision>;

}  // namespace capstan::index

#endif  // CAPSTAN_INDEX_REVISION_H_
