// Copyright 2025 The Capstan Authors.

#include "index/tree_node.h"

#include <algorithm>

namespace capstan::index::internal {

void FreeNode(Node* n) {
  if (n->leaf) {
    Leaf* leaf = static_cast<Leaf*>(n);
    for (int i = 0; i < leaf->count; ++i) Unref(leaf->entries[i]);
    delete leaf;
    return;
  }
  Inner* inner = static_cast<Inner*>(n);
  for (int i = 0; i < inner->count; ++i) {
    if (i > 0) Unref(inner->separators[i]);
    Unref(inner->children[i]);
  }
  delete inner;
}

Node* CloneNode(const Node* n, uint64_t epoch) {
  if (n->leaf) {
    const Leaf* from = static_cast<const Leaf*>(n);
    Leaf* to = new Leaf(epoch);
    to->count = from->count;
    for (int i = 0; i < from->count; ++i) {
      to->entries[i] = from->entries[i];
      Ref(to->entries[i]);
    }
    return to;
  }
  const Inner* from = static_cast<const Inner*>(n);
  Inner* to = new Inner(epoch);
  to->count = from->count;
  to->separators[0] = nullptr;
  for (int i = 0; i < from->count; ++i) {
    if (i > 0) {
      to->separators[i] = from->separators[i];
      Ref(to->separators[i]);
    }
    to->children[i] = from->children[i];
    Ref(to->children[i]);
  }
  return to;
}

int LeafLowerBound(const Leaf* leaf, std::string_view key) {
  Entry* const* begin = leaf->entries;
  Entry* const* it = std::lower_bound(
      begin, begin + leaf->count, key,
      [](const Entry* e, std::string_view k) { return std::string_view(e->key) < k; });
  return static_cast<int>(it - begin);
}

int ChildIndex(const Inner* inner, std::string_view key) {
  // The number of separators <= key.
  Entry* const* begin = inner->separators + 1;
  Entry* const* it = std::upper_bound(
      begin, inner->separators + inner->count, key,
      [](std::string_view k, const Entry* e) { return k < std::string_view(e->key); });
  return static_cast<int>(it - begin);
}

const Entry* FindEntry(const Node* root, std::string_view key) {
  const Node* n = root;
  if (n == nullptr) return nullptr;
  while (!n->leaf) {
    const Inner* inner = static_cast<const Inner*>(n);
    n = inner->children[ChildIndex(inner, key)];
  }
  const Leaf* leaf = static_cast<const Leaf*>(n);
  const int pos = LeafLowerBound(leaf, key);
  if (pos < leaf->count && leaf->entries[pos]->key == key) return leaf->entries[pos];
  return nullptr;
}

int Height(const Node* root) {
  int h = 0;
  for (const Node* n = root; n != nullptr;
       n = n->leaf ? nullptr : static_cast<const Inner*>(n)->children[0]) {
    ++h;
  }
  return h;
}

}  // namespace capstan::index::internal
