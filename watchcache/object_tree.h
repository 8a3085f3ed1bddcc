// ObjectTree: the cache's current objects in key order, as a persistent
// (path-copying) B+tree of ObjectRefs with O(1) snapshots.
//
// The writer changes the tree in place where a node is referenced by the
// writer's tree alone, and copies the path from the root otherwise, so a
// TreeSnapshot taken before a change never sees it. Taking a snapshot is one
// atomic increment; it costs memory only for the nodes the writer copies
// afterwards (about depth x node size per change) and keeps the objects it
// references alive. Inner nodes hold the subtree sizes, so counting the
// keys of a range is O(log n).
//
// Separators are the first object of each child, kept up to date on every
// change, so a separator never keeps a replaced or deleted object alive.
//
// Thread safety: ObjectTree is not thread-safe: one writer at a time, and
// Snapshot() must not run concurrently with a write. TreeSnapshot is
// immutable: any number of threads may read, copy and destroy snapshots at
// once, concurrently with the writer.

#ifndef CAPSTAN_WATCHCACHE_OBJECT_TREE_H_
#define CAPSTAN_WATCHCACHE_OBJECT_TREE_H_

#include <cstddef>
#include <string_view>

#include "absl/functional/function_ref.h"
#include "watchcache/cached_object.h"

namespace capstan::watchcache {

namespace tree_internal {
struct Node;
void Ref(Node* n);
void Unref(Node* n);
}  // namespace tree_internal

class TreeSnapshot {
 public:
  TreeSnapshot() = default;
  TreeSnapshot(const TreeSnapshot& o) : root_(o.root_) {
    if (root_) tree_internal::Ref(root_);
  }
  TreeSnapshot(TreeSnapshot&& o) noexcept : root_(o.root_) { o.root_ = nullptr; }
  TreeSnapshot& operator=(TreeSnapshot o) noexcept {
    std::swap(root_, o.root_);
    return *this;
  }
  ~TreeSnapshot() {
    if (root_) tree_internal::Unref(root_);
  }

  size_t size() const;
  bool empty() const { return size() == 0; }

  // The object stored under key, or null. Valid while this snapshot lives.
  const CachedObject* Find(std::string_view key) const;
  // Calls visit in key order for each object with start <= key < end (an
  // empty end: no upper bound) until visit returns false. The references
  // are valid while this snapshot lives.
  void Scan(std::string_view start, std::string_view end,
            absl::FunctionRef<bool(const ObjectRef&)> visit) const;
  // Number of keys < key, and of keys in [start, end); O(log n).
  size_t Rank(std::string_view key) const;
  size_t Count(std::string_view start, std::string_view end) const;

 private:
  friend class ObjectTree;
  explicit TreeSnapshot(tree_internal::Node* root) : root_(root) {
    if (root_) tree_internal::Ref(root_);
  }
  tree_internal::Node* root_ = nullptr;
};

class ObjectTree {
 public:
  ObjectTree() = default;
  ~ObjectTree();
  ObjectTree(const ObjectTree&) = delete;
  ObjectTree& operator=(const ObjectTree&) = delete;

  // Inserts obj under obj->key(), replacing the object stored there; returns
  // the replaced object (null if the key was new).
  ObjectRef Put(ObjectRef obj);
  // Removes key; returns the removed object (null if absent).
  ObjectRef Erase(std::string_view key);
  void Clear();

  const CachedObject* Find(std::string_view key) const;
  size_t size() const;

  // The tree as it is now. O(1).
  TreeSnapshot Snapshot() const { return TreeSnapshot(root_); }

  // Checks the tree's invariants (order, separators, sizes, fill); for tests.
  bool TEST_Validate() const;

 private:
  tree_internal::Node* root_ = nullptr;
};

}  // namespace capstan::watchcache

#endif  // CAPSTAN_WATCHCACHE_OBJECT_TREE_H_
