// Copyright 2025 The Capstan Authors.
//
// KeyIndex: the revisions of one key, grouped into generations, with exactly the
// semantics of etcd's keyIndex (server/mvcc/key_index.go).
//
// A generation is the life of a key from its creation to its deletion: the
// revisions of the puts and, last, of the tombstone that ended it. A tombstone
// appends itself to the current generation and then starts a new, empty one.
// For example put(1.0); put(2.0); tombstone(3.0); put(4.0); tombstone(5.0) gives
//
//   generations: {1.0, 2.0, 3.0(t)} {4.0, 5.0(t)} {empty}
//
// Compact(at) removes, from the generation alive at `at` (or ended by a
// tombstone at `at`), the revisions at or below `at` except the largest one,
// and removes the older generations. A KeyIndex whose only generation is
// empty IsEmpty() and must be dropped by its owner. E.g. on the example above:
// Compact(2) -> {2.0, 3.0(t)} {4.0, 5.0(t)} {empty}; Compact(4) -> {4.0,
// 5.0(t)} {empty}; Compact(5) -> {5.0(t)} {empty}; Compact(6) -> {empty}.
// As etcd 3.5.16 (3.4 dropped the tombstone at `at` as well), the tombstone
// at the compaction revision stays until the next compaction, so that a
// watch from the compaction revision still sees that delete; Keep leaves it
// out, so that hashes stay those of the versions that dropped it.

#ifndef CAPSTAN_INDEX_KEY_INDEX_H_
#define CAPSTAN_INDEX_KEY_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "index/revision.h"

namespace capstan::index {

// Thread-compatible: const methods may run concurrently with each other; a
// non-const method needs exclusive access. A KeyIndex reachable from a
// published IndexSnapshot is never modified (TreeIndex copies it first).
//
// Memory: all revisions of all generations live in one inlined vector (two
// inline), the generation headers in another (one inline), so a key with up to
// two revisions and one generation costs no heap allocation beyond the object.
// The lease of the latest put and the revision from which every put carried it
// take the place of a stored modified revision (the last of revs_), so the
// object is 96 bytes as it was before it knew leases.
//
// Leases: a keys_only Range is answered from the index alone, so the index
// knows the lease of the puts it can: every put from lease_since() on carries
// lease(). For an older put (a historical read of a key whose lease changed
// since) LeaseOf says it does not know, and the caller reads the record.
class KeyIndex {
 public:
  // A read-only view of one generation. `revs` is valid until the next
  // non-const call on the KeyIndex it came from.
  struct Generation {
    Revision created;                // the revision of the put that created the key
    int64_t version = 0;             // number of puts (and the tombstone) in the generation
    std::span<const Revision> revs;  // ascending; may be trimmed by Compact
  };

  KeyIndex() = default;
  KeyIndex(const KeyIndex&) = default;
  KeyIndex& operator=(const KeyIndex&) = default;
  KeyIndex(KeyIndex&&) noexcept = default;
  KeyIndex& operator=(KeyIndex&&) noexcept = default;

  // Records a put at `rev` carrying `lease` (0: none) in the current
  // generation (starting the generation if it is empty).
  // REQUIRES: rev > modified(). Crashes otherwise, as etcd panics on "'put'
  // with an unexpected smaller revision".
  void Put(Revision rev, int64_t lease = 0);

  // Rebuilds the index of a key from its latest stored revision at start-up,
  // like etcd's keyIndex.restore: one generation created at `created`, holding
  // only `modified`, with `version` versions; the put at `modified` carries
  // `lease`.
  // REQUIRES: the KeyIndex has no generation (is default-constructed).
  void Restore(Revision created, Revision modified, int64_t version, int64_t lease = 0);

  // Records the deletion of the key at `rev` and starts a new, empty
  // generation. Returns NotFound ("revision not found") when the key has no
  // live generation (etcd's ErrRevisionNotFound; etcd panics instead when the
  // whole keyIndex is empty, a state a TreeIndex never holds).
  // REQUIRES: rev > modified() when the key is live.
  absl::Status Tombstone(Revision rev);

  // The state of the key as of store revision `at_rev`: the revision of its
  // last change at or before `at_rev`, the revision that created it and its
  // version (1 for the creating put). NotFound when the key did not exist at
  // `at_rev` (never created yet, deleted, or compacted away).
  absl::Status Get(int64_t at_rev, Revision* modified, Revision* created, int64_t* version) const;
  // As Get, returning false instead of NotFound (no Status built: for scans).
  bool Lookup(int64_t at_rev, Revision* modified, Revision* created, int64_t* version) const;

  // The revisions with main >= `rev`, ascending, keeping only the largest sub
  // revision of each main revision (etcd's since). Empty for an empty index.
  std::vector<Revision> Since(int64_t rev) const;
  // As Since, appending to *out.
  void AppendSince(int64_t rev, std::vector<Revision>* out) const;

  // Removes the revisions a compaction at `at_rev` makes unreachable and adds
  // the revision it keeps (if any) to *available (etcd's keyIndex.compact).
  // `available` may be null.
  // REQUIRES: !IsEmpty(). Crashes otherwise, as etcd panics.
  void Compact(int64_t at_rev, RevisionSet* available);

  // Adds to *available what Compact(at_rev, available) would, without changing
  // anything, except a tombstone at at_rev, which Compact keeps and Keep
  // leaves out (etcd's keyIndex.keep, for hashes). No-op on an empty index.
  // Not for deciding what storage keeps: on an index already compacted at
  // at_rev it leaves out the tombstone at at_rev that Compact kept.
  // REQUIRES: available != nullptr.
  void Keep(int64_t at_rev, RevisionSet* available) const;

  // Adds to *available exactly what Compact(at_rev, available) would (the
  // revision etcd's keyIndex.compact keeps, a tombstone at at_rev included),
  // without changing anything. The answer is the same before and after
  // Compact(at_rev), so it says what storage keeps whether or not this index
  // was compacted at at_rev yet. No-op on an empty index.
  // REQUIRES: available != nullptr.
  void Retained(int64_t at_rev, RevisionSet* available) const;

  // True when Compact(at_rev) would change this index (drop a revision or a
  // generation). Compact on an index for which this is false only adds to
  // `available`, which Retained does as well.
  bool NeedsCompaction(int64_t at_rev) const;

  // True when no generation holds a revision: a new index, or one compacted to
  // nothing. An empty index must not stay in a TreeIndex.
  bool IsEmpty() const { return revs_.empty(); }

  // True when the key exists at at_rev: what Lookup(at_rev, ...) returns,
  // without filling in its revisions (a Range's count).
  bool AliveAt(int64_t at_rev) const { return FindGeneration(at_rev) >= 0; }

  // True when the key exists at its latest revision (the last generation is
  // not empty), i.e. Tombstone would succeed.
  bool IsLive() const { return !gens_.empty() && !GenerationIsEmpty(gens_.size() - 1); }

  // The revision of the last Put or Tombstone ({0,0} if none, or once
  // compacted to nothing).
  Revision modified() const { return revs_.empty() ? Revision{} : revs_.back(); }

  // The lease of the put at `put` (a revision Lookup returned) in *lease,
  // when the index knows it: true for every put from lease_since() on (all
  // of them for a key whose lease never changed). False for an older put,
  // whose record holds its lease.
  bool LeaseOf(Revision put, int64_t* lease) const {
    if (put.main < lease_since_) return false;
    *lease = lease_;
    return true;
  }
  // The lease of the latest put (0: none; the tombstone that may follow it
  // leaves it as it is).
  int64_t lease() const { return lease_; }
  // The main revision of the first put of the latest run of puts with lease()
  // (0 while no put carried a lease).
  int64_t lease_since() const { return lease_since_; }

  size_t generation_count() const { return gens_.size(); }
  // REQUIRES: i < generation_count().
  Generation generation(size_t i) const;

  // Total number of revisions held, over all generations.
  size_t revision_count() const { return revs_.size(); }

  // E.g. "modified={16,0} [created={14,0} ver=3 revs={14,0}{15,1}{16,0}] []".
  std::string DebugString() const;

  // Same generations (created, version, revisions) and lease marks.
  friend bool operator==(const KeyIndex& a, const KeyIndex& b);

 private:
  struct GenerationHeader {
    Revision created;
    int64_t version = 0;
    uint32_t begin = 0;  // index in revs_ of the first revision
  };

  // Appends `rev` to the current generation (starting it if empty): a put's
  // or a tombstone's revision. Crashes unless rev > modified().
  void Append(Revision rev);

  size_t GenerationBegin(size_t g) const { return gens_[g].begin; }
  size_t GenerationEnd(size_t g) const {
    return g + 1 < gens_.size() ? gens_[g + 1].begin : revs_.size();
  }
  bool GenerationIsEmpty(size_t g) const { return GenerationBegin(g) == GenerationEnd(g); }

  // Index of the generation alive at `rev` or -1 (etcd's findGeneration).
  ptrdiff_t FindGeneration(int64_t rev) const;

  // etcd's doCompact: the first generation whose tombstone is above `at_rev`
  // (or the last one) in *gen, and the position inside it of its largest
  // revision <= at_rev (or -1) in *rev_index, which is added to *available
  // when `available` is not null.
  void FindCompactionPoint(int64_t at_rev, RevisionSet* available, size_t* gen,
                           ptrdiff_t* rev_index) const;

  // All revisions of all generations, oldest first. Generation g owns
  // revs_[GenerationBegin(g), GenerationEnd(g)).
  absl::InlinedVector<Revision, 2> revs_;
  absl::InlinedVector<GenerationHeader, 1> gens_;
  // See LeaseOf.
  int64_t lease_ = 0;
  int64_t lease_since_ = 0;
};

}  // namespace capstan::index

#endif  // CAPSTAN_INDEX_KEY_INDEX_H_
