// Copyright 2025 The Capstan Authors.
//
// Internal: the nodes of TreeIndex's persistent B+tree. Not for use outside
// index/.
//
// The tree maps a key to an Entry (the key and its KeyIndex). Leaves hold
// pointers to entries, inner nodes hold child pointers and separator keys. Every
// node and entry is reference-counted (intrusively, atomically) and stamped with
// the edit epoch of the writer that created it. Once the writer publishes a root
// it starts a new epoch, so everything reachable from a published root is
// immutable from then on; the writer only mutates objects stamped with its
// current epoch, which no published root can reach, and copies the others
// (path copying). Copying a leaf copies its entry pointers, not the entries, so
// changing one key copies only that key's entry.
//
// Ownership: a child pointer of an inner node owns one reference to the child,
// and a separator one reference to its entry. A leaf's entry pointers own
// nothing: an entry holds one more reference, the tree's, which the writer
// gives up when it replaces the entry by a copy or erases it (retires it), and
// which is released once no published version that may reach the entry lives
// (see Version). So copying or freeing a leaf touches none of its entries.
// Unref() of the last reference frees the object and releases what it holds,
// on whatever thread drops it.

#ifndef CAPSTAN_INDEX_TREE_NODE_H_
#define CAPSTAN_INDEX_TREE_NODE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "index/key_index.h"
#include "util/mutex.h"

namespace capstan::index::internal {

inline constexpr int kLeafCapacity = 64;
inline constexpr int kInnerCapacity = 64;
// A non-root node below these counts is merged with or refilled from a sibling.
inline constexpr int kLeafMinimum = kLeafCapacity / 4;
inline constexpr int kInnerMinimum = kInnerCapacity / 4;

// One key of the tree: a single allocation holding the KeyIndex and, right
// after the object, the key's bytes (one cache miss per key comparison, not
// two). The key never changes; `index` changes only while `epoch` is the
// writer's current epoch. Create with New/Copy, free with Unref.
struct Entry {
  static Entry* New(uint64_t epoch, std::string_view key, KeyIndex index = KeyIndex());
  static Entry* Copy(uint64_t epoch, const Entry& from) {
    return New(epoch, from.key(), from.index);
  }
  static void Delete(Entry* e);

  std::string_view key() const {
    return std::string_view(reinterpret_cast<const char*>(this + 1), key_size);
  }

  std::atomic<uint32_t> refs{1};
  const uint32_t key_size;
  uint64_t epoch;
  KeyIndex index;

 private:
  Entry(uint64_t epoch_in, uint32_t key_size_in, KeyIndex&& index_in)
      : key_size(key_size_in), epoch(epoch_in), index(std::move(index_in)) {}
  ~Entry() = default;
};

// Key hints: every node keeps, for each key it holds (a leaf's entries, an
// inner node's separators), the 8 bytes that follow the prefix common to all
// of the node's keys, big-endian and zero-padded. hint(a) < hint(b) implies
// a < b, so a search compares hints inside the node and dereferences entries
// only to check the prefix, to break ties and to confirm a match: one or two
// cache misses per node instead of one per probe. The prefix is that of the
// node's first and last key when the hints were last recomputed; removing keys
// keeps it valid.
//
// Subtree aggregates let a count skip whole subtrees: `live` is the number of
// keys under the node that exist at their latest revision (KeyIndex::IsLive),
// `max_modified` is at least the main revision of the last change of every key
// under it (exact, except that keys erased by compaction may leave it higher).
// A key whose last change is at or below revision R exists at R exactly when it
// IsLive, so a subtree with max_modified <= R holds `live` keys alive at R.
struct Node {
  Node(bool leaf_in, uint64_t epoch_in) : leaf(leaf_in), epoch(epoch_in) {}

  std::atomic<uint32_t> refs{1};
  const bool leaf;
  uint16_t count = 0;       // entries in a leaf, children in an inner node
  uint32_t prefix_len = 0;  // bytes every key of the node starts with
  uint32_t live = 0;        // keys under the node alive at their latest revision
  uint64_t epoch;
  int64_t max_modified = 0;  // >= the last main revision of every key under it
};

struct Leaf : Node {
  explicit Leaf(uint64_t epoch_in) : Node(true, epoch_in) {}
  uint64_t hints[kLeafCapacity];  // hints[i]: hint of entries[i]
  Entry* entries[kLeafCapacity];  // [0, count), ascending by key
};

struct Inner : Node {
  explicit Inner(uint64_t epoch_in) : Node(false, epoch_in) {}
  uint64_t hints[kInnerCapacity];  // hints[i]: hint of separators[i], i >= 1
  // separators[i] (1 <= i < count) holds a key <= every key under children[i]
  // and > every key under children[i - 1]; separators[0] is unused (null).
  // A separator is a reference to an entry, possibly one no longer in the
  // tree or an older copy of one: only its immutable key is used.
  Entry* separators[kInnerCapacity];
  Node* children[kInnerCapacity];
};

// The 8 bytes of `key` after its first `prefix_len`, big-endian, zero-padded.
uint64_t KeyHint(std::string_view key, size_t prefix_len);

// Recomputes the prefix and every hint of `n` from its keys (O(count) entry
// reads). REQUIRES: `n` is mutable (stamped with the writer's epoch).
void RecomputeHints(Node* n);

// Recomputes `live` and `max_modified` of `n` from its entries or children
// (O(count)). REQUIRES: `n` is mutable; a child's aggregates are up to date.
void RecomputeAggregates(Node* n);

// Inserts `e` at `pos` of the mutable, non-full `leaf`, keeping its hints.
void LeafInsertAt(Leaf* leaf, int pos, Entry* e);
// Removes entry `pos` of the mutable `leaf` (the caller owns its reference).
void LeafEraseAt(Leaf* leaf, int pos);

inline void Ref(Entry* e) { e->refs.fetch_add(1, std::memory_order_relaxed); }
inline void Ref(Node* n) { n->refs.fetch_add(1, std::memory_order_relaxed); }
inline void Unref(Entry* e) {
  if (e->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) Entry::Delete(e);
}
void FreeNode(Node* n);
inline void Unref(Node* n) {
  if (n != nullptr && n->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) FreeNode(n);
}

// A copy of `n` stamped with `epoch`, holding new references to what `n`
// holds. The copy has one reference, owned by the caller.
Node* CloneNode(const Node* n, uint64_t epoch);

// Position of the first entry of `leaf` with key >= `key`.
int LeafLowerBound(const Leaf* leaf, std::string_view key);
// Index of the child of `inner` whose range holds `key`.
int ChildIndex(const Inner* inner, std::string_view key);

// The entry for `key` under `root`, or null.
const Entry* FindEntry(const Node* root, std::string_view key);

// Number of levels (0 for an empty tree).
int Height(const Node* root);

// An owning reference to a reference-counted T (a Node or a Version; null
// allowed), through the Ref(T*)/Unref(T*) of this namespace. Copying adds a
// reference, destruction drops it.
template <typename T>
class RefPtr {
 public:
  RefPtr() = default;
  // Adopts one reference already held by the caller.
  static RefPtr Adopt(T* p) {
    RefPtr r;
    r.p_ = p;
    return r;
  }
  RefPtr(const RefPtr& o) : p_(o.p_) {
    if (p_ != nullptr) Ref(p_);
  }
  RefPtr(RefPtr&& o) noexcept : p_(std::exchange(o.p_, nullptr)) {}
  RefPtr& operator=(RefPtr o) noexcept {
    std::swap(p_, o.p_);
    return *this;
  }
  ~RefPtr() {
    if (p_ != nullptr) Unref(p_);
  }

  T* get() const { return p_; }
  // Gives up the reference to the caller.
  T* release() { return std::exchange(p_, nullptr); }
  // For the writer, which replaces the root it owns in place.
  T** slot() { return &p_; }

 private:
  T* p_ = nullptr;
};

using NodeRef = RefPtr<Node>;

struct VersionChain;

// One published version of the tree: its root and size, plus the entries the
// writer retired after publishing it. A retired entry is reachable only from
// versions published before its retirement, so its tree reference is dropped
// when this version and every older one are gone. Reference-counted by the
// IndexSnapshots of it and, while it is the latest, by its TreeIndex. The
// root is released as soon as the version dies; the retired entries wait for
// the older versions (VersionChain).
struct Version {
  Version(NodeRef root_in, size_t size_in, std::shared_ptr<VersionChain> chain_in)
      : root(std::move(root_in)), size(size_in), chain(std::move(chain_in)) {}

  std::atomic<uint32_t> refs{1};
  NodeRef root;
  const size_t size;
  // Appended to only by the writer, while this is the latest version and the
  // TreeIndex holds a reference; read once the version is dead.
  std::vector<Entry*> retired;
  const std::shared_ptr<VersionChain> chain;
  // Guarded by chain->mu. (Not ABSL_GUARDED_BY: the versions of a chain
  // are reached through each other, v->newer->..., a path the analysis
  // cannot equate with the chain->mu that PublishVersion and Unref hold.)
  Version* newer = nullptr;
  bool dead = false;
};

// The versions of one TreeIndex, oldest first, until their retired entries
// are released. Shared by the TreeIndex and its versions, so that snapshots
// may outlive the index.
struct VersionChain {
  // A leaf lock: nothing is freed or called out under it. It also guards
  // each version's newer and dead.
  util::Mutex mu;
  Version* oldest ABSL_GUARDED_BY(mu) = nullptr;
  Version* newest ABSL_GUARDED_BY(mu) = nullptr;
};

// Links a new version (one reference, owned by the caller) after the newest.
Version* PublishVersion(const std::shared_ptr<VersionChain>& chain, NodeRef root, size_t size);

inline void Ref(Version* v) { v->refs.fetch_add(1, std::memory_order_relaxed); }
// Drops a reference; the last one releases the version's root and, once no
// older version lives, the retired entries of it and of every newer dead one.
void Unref(Version* v);

using VersionRef = RefPtr<Version>;

}  // namespace capstan::index::internal

#endif  // CAPSTAN_INDEX_TREE_NODE_H_
