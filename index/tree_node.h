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
// Ownership: each pointer stored in a node owns one reference. Unref() of the
// last reference frees the object and releases what it holds, on whatever
// thread drops it.

#ifndef CAPSTAN_INDEX_TREE_NODE_H_
#define CAPSTAN_INDEX_TREE_NODE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "index/key_index.h"

namespace capstan::index::internal {

inline constexpr int kLeafCapacity = 64;
inline constexpr int kInnerCapacity = 64;
// A non-root node below these counts is merged with or refilled from a sibling.
inline constexpr int kLeafMinimum = kLeafCapacity / 4;
inline constexpr int kInnerMinimum = kInnerCapacity / 4;

// One key of the tree. `key` never changes; `index` changes only while `epoch`
// is the writer's current epoch.
struct Entry {
  Entry(uint64_t epoch_in, std::string_view key_in) : epoch(epoch_in), key(key_in) {}
  Entry(uint64_t epoch_in, const Entry& from)
      : epoch(epoch_in), key(from.key), index(from.index) {}
  Entry(uint64_t epoch_in, std::string&& key_in, KeyIndex&& index_in)
      : epoch(epoch_in), key(std::move(key_in)), index(std::move(index_in)) {}

  std::atomic<uint32_t> refs{1};
  uint64_t epoch;
  const std::string key;
  KeyIndex index;
};

struct Node {
  Node(bool leaf_in, uint64_t epoch_in) : leaf(leaf_in), epoch(epoch_in) {}

  std::atomic<uint32_t> refs{1};
  const bool leaf;
  uint16_t count = 0;  // entries in a leaf, children in an inner node
  uint64_t epoch;
};

struct Leaf : Node {
  explicit Leaf(uint64_t epoch_in) : Node(true, epoch_in) {}
  Entry* entries[kLeafCapacity];  // [0, count), ascending by key
};

struct Inner : Node {
  explicit Inner(uint64_t epoch_in) : Node(false, epoch_in) {}
  // separators[i] (1 <= i < count) holds a key <= every key under children[i]
  // and > every key under children[i - 1]; separators[0] is unused (null).
  // A separator is a reference to an entry, possibly one no longer in the
  // tree or an older copy of one: only its immutable key is used.
  Entry* separators[kInnerCapacity];
  Node* children[kInnerCapacity];
};

inline void Ref(Entry* e) { e->refs.fetch_add(1, std::memory_order_relaxed); }
inline void Ref(Node* n) { n->refs.fetch_add(1, std::memory_order_relaxed); }
inline void Unref(Entry* e) {
  if (e->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) delete e;
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

// An owning reference to a node (null allowed). Copying adds a reference.
class NodeRef {
 public:
  NodeRef() = default;
  // Adopts one reference already held by the caller.
  static NodeRef Adopt(Node* n) {
    NodeRef r;
    r.node_ = n;
    return r;
  }
  NodeRef(const NodeRef& o) : node_(o.node_) {
    if (node_ != nullptr) Ref(node_);
  }
  NodeRef(NodeRef&& o) noexcept : node_(o.node_) { o.node_ = nullptr; }
  NodeRef& operator=(NodeRef o) noexcept {
    std::swap(node_, o.node_);
    return *this;
  }
  ~NodeRef() { Unref(node_); }

  Node* get() const { return node_; }
  // Gives up the reference to the caller.
  Node* release() { return std::exchange(node_, nullptr); }
  // For the writer, which replaces the root it owns in place.
  Node** slot() { return &node_; }

 private:
  Node* node_ = nullptr;
};

}  // namespace capstan::index::internal

#endif  // CAPSTAN_INDEX_TREE_NODE_H_
