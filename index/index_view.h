// Copyright 2025 The Capstan Authors.
//
// Read access to one version of a TreeIndex: IndexView (non-owning) and
// IndexSnapshot (owning, valid forever). Both come from TreeIndex
// (tree_index.h).
//
// Key ranges follow etcd's Range: an empty `range_end` names the single key
// `key`; a `range_end` of one zero byte ("\0", kRangeEndAll) means every key
// >= `key`; any other `range_end` means [key, range_end). Keys compare as
// unsigned bytes, like Go's bytes.Compare.

#ifndef CAPSTAN_INDEX_INDEX_VIEW_H_
#define CAPSTAN_INDEX_INDEX_VIEW_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "index/key_index.h"
#include "index/revision.h"
#include "index/tree_node.h"

namespace capstan::index {

// The `range_end` that selects every key >= `key`.
inline constexpr std::string_view kRangeEndAll("\0", 1);

// What Range reports for a key alive at the requested revision.
struct RangeHit {
  Revision modified;  // the key's last change at or before the revision
  Revision created;   // the put that created it
  int64_t version = 0;
  // The lease of the put at `modified`, when lease_known (KeyIndex::LeaseOf);
  // otherwise only that put's record holds it.
  int64_t lease = 0;
  bool lease_known = false;
};

// A non-owning, read-only view of one version of the index. An IndexView
// copied out of an IndexSnapshot does not keep that version alive: keep the
// snapshot for as long as the view is used.
//
// Thread-safety: all methods are const. On a view of a published version (an
// IndexSnapshot, or a view taken from one) they may run on any number of
// threads at once, without locks. A view of the writer's unpublished state
// (TreeIndex::Unpublished) may be used by the writer thread only, and only
// until its next write call.
//
// Keys and KeyIndex references handed to a visitor or returned by Find are
// valid while the version they come from is (for a snapshot: while it lives;
// for Unpublished(): until the next writer call). RangeSince's `revs` span is
// valid only during the call.
class IndexView {
 public:
  IndexView() = default;  // an empty index

  // The state of `key` at store revision `at_rev` (see KeyIndex::Get).
  // NotFound ("revision not found") when the key does not exist at `at_rev`.
  absl::Status Get(std::string_view key, int64_t at_rev, Revision* modified, Revision* created,
                   int64_t* version) const;

  // The KeyIndex of `key`, or null when the key is not in the index.
  const KeyIndex* Find(std::string_view key) const;

  // Calls `visit` in key order for each key of the range that exists at
  // `at_rev`, until `visit` returns false (etcd's treeIndex.Range/Revisions).
  void Range(std::string_view key, std::string_view range_end, int64_t at_rev,
             absl::FunctionRef<bool(std::string_view key, const RangeHit& hit)> visit) const;

  // The number of keys Range would visit, stopping at `limit` when limit > 0
  // (etcd's CountRevisions).
  int64_t Count(std::string_view key, std::string_view range_end, int64_t at_rev,
                int64_t limit = 0) const;

  // For each key of the range in key order, calls `visit` with KeyIndex::Since
  // (`rev`) when that is not empty, until `visit` returns false.
  void RangeSince(
      std::string_view key, std::string_view range_end, int64_t rev,
      absl::FunctionRef<bool(std::string_view key, std::span<const Revision> revs)> visit) const;
  // etcd's treeIndex.RangeSince: the same revisions, all keys together, sorted.
  std::vector<Revision> RangeSince(std::string_view key, std::string_view range_end,
                                   int64_t rev) const;

  // Calls `visit` in key order with the raw KeyIndex of every key of the
  // range, whether or not it is alive, until `visit` returns false.
  void ForEach(std::string_view key, std::string_view range_end,
               absl::FunctionRef<bool(std::string_view key, const KeyIndex& index)> visit) const;

  // Adds to *available KeyIndex::Keep(at_rev) of every key (etcd's
  // treeIndex.Keep, for hashes): what etcd's treeIndex.Compact returns but a
  // tombstone at `at_rev`.
  void Keep(int64_t at_rev, RevisionSet* available) const;

  // Adds to *available KeyIndex::Retained(at_rev) of every key: the
  // revisions a compaction at `at_rev` keeps in storage (what etcd's
  // treeIndex.Compact returns), the same whether the keys of this view are
  // compacted at `at_rev` already, in part, or not at all.
  void Retained(int64_t at_rev, RevisionSet* available) const;

  // The keys whose KeyIndex a compaction at `at_rev` changes
  // (KeyIndex::NeedsCompaction), in key order: input for
  // TreeIndex::CompactKeys.
  std::vector<std::string> KeysToCompact(int64_t at_rev) const;

  // Number of keys in the index, dead (tombstoned, not yet compacted) or alive.
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  // Number of keys alive at their latest revision (etcd's keys gauge). O(1).
  size_t live() const;

  // Levels of the tree (0 when empty); for tests and benchmarks.
  int TEST_Height() const;
  // Checks the tree's invariants (key order, separators, leaf depth, node
  // counts, size, no empty KeyIndex); for tests. O(n).
  absl::Status TEST_Validate() const;

 protected:
  IndexView(const internal::Node* root, size_t size) : root_(root), size_(size) {}

  const internal::Node* root_ = nullptr;
  size_t size_ = 0;

 private:
  friend class TreeIndex;
};

// An immutable version of the index, as of a TreeIndex::Publish: what it holds
// never changes, whatever the writer does later, and it stays valid for as
// long as it lives. Copying is O(1) (one atomic increment).
//
// Thread-safety: thread-safe; a snapshot may be copied, read and destroyed on
// any thread. Destroying the last snapshot of a version frees, on the
// destroying thread, the nodes only that version used and, once no older
// version lives, the entries the writer retired after publishing it and any
// newer version already gone (internal::Version).
class IndexSnapshot : public IndexView {
 public:
  IndexSnapshot() = default;
  IndexSnapshot(const IndexSnapshot& o) = default;
  IndexSnapshot(IndexSnapshot&& o) noexcept : IndexView(o.root_, o.size_), ref_(std::move(o.ref_)) {
    o.root_ = nullptr;
    o.size_ = 0;
  }
  IndexSnapshot& operator=(IndexSnapshot o) noexcept {
    std::swap(root_, o.root_);
    std::swap(size_, o.size_);
    std::swap(ref_, o.ref_);
    return *this;
  }

 private:
  friend class TreeIndex;
  explicit IndexSnapshot(internal::VersionRef ref)
      : IndexView(ref.get() != nullptr ? ref.get()->root.get() : nullptr,
                  ref.get() != nullptr ? ref.get()->size : 0),
        ref_(std::move(ref)) {}

  internal::VersionRef ref_;  // owns the version of root_ and its entries
};

}  // namespace capstan::index

#endif  // CAPSTAN_INDEX_INDEX_VIEW_H_
