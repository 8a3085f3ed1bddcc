// Copyright 2025 The Capstan Authors.

#include "index/tree_node.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>

namespace capstan::index::internal {

Entry* Entry::New(uint64_t epoch, std::string_view key, KeyIndex index) {
  if (key.size() > std::numeric_limits<uint32_t>::max()) {
    std::fprintf(stderr, "capstan/index: key of %zu bytes\n", key.size());
    std::abort();
  }
  void* mem = ::operator new(sizeof(Entry) + key.size());
  Entry* e = new (mem) Entry(epoch, static_cast<uint32_t>(key.size()), std::move(index));
  if (!key.empty()) std::memcpy(reinterpret_cast<char*>(e + 1), key.data(), key.size());
  return e;
}

void Entry::Delete(Entry* e) {
  e->~Entry();
  ::operator delete(e);
}

void FreeNode(Node* n) {
  if (n->leaf) {
    delete static_cast<Leaf*>(n);  // its entries are not its own
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
    to->prefix_len = from->prefix_len;
    to->live = from->live;
    to->max_modified = from->max_modified;
    std::copy(from->hints, from->hints + from->count, to->hints);
    std::copy(from->entries, from->entries + from->count, to->entries);
    return to;
  }
  const Inner* from = static_cast<const Inner*>(n);
  Inner* to = new Inner(epoch);
  to->count = from->count;
  to->prefix_len = from->prefix_len;
  to->live = from->live;
  to->max_modified = from->max_modified;
  std::copy(from->hints, from->hints + from->count, to->hints);
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

Version* PublishVersion(const std::shared_ptr<VersionChain>& chain, NodeRef root, size_t size) {
  Version* v = new Version(std::move(root), size, chain);
  util::MutexLock l(&chain->mu);
  if (chain->newest != nullptr) {
    chain->newest->newer = v;
  } else {
    chain->oldest = v;
  }
  chain->newest = v;
  return v;
}

void Unref(Version* v) {
  if (v->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // Dead: nothing reads through it any more. Its nodes go now (leaves own no
  // entries); entries retired after it was published wait for older versions.
  NodeRef root = std::move(v->root);
  const std::shared_ptr<VersionChain> chain = v->chain;  // may be the last owner
  Version* reclaim = nullptr;  // a run of dead versions, oldest first
  Version* last = nullptr;
  {
    util::MutexLock l(&chain->mu);
    v->dead = true;
    while (chain->oldest != nullptr && chain->oldest->dead) {
      Version* d = chain->oldest;
      chain->oldest = d->newer;
      if (reclaim == nullptr) reclaim = d;
      last = d;
    }
    if (chain->oldest == nullptr) chain->newest = nullptr;
  }
  for (Version* d = reclaim; d != nullptr;) {
    // Versions in the run stay linked: the chain no longer points into it.
    Version* next = d == last ? nullptr : d->newer;
    for (Entry* e : d->retired) Unref(e);
    delete d;
    d = next;
  }
}

namespace {

size_t CommonPrefix(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

// Compares the first `prefix_len` bytes of `key` with the node's prefix,
// taken from `sample`, one of the node's keys.
int ComparePrefix(std::string_view key, std::string_view sample, size_t prefix_len) {
  return key.substr(0, prefix_len).compare(sample.substr(0, prefix_len));
}

}  // namespace

uint64_t KeyHint(std::string_view key, size_t prefix_len) {
  if (key.size() <= prefix_len) return 0;
  const size_t n = std::min<size_t>(8, key.size() - prefix_len);
  const unsigned char* p = reinterpret_cast<const unsigned char*>(key.data()) + prefix_len;
  uint64_t h = 0;
  if (n == 8) {
    std::memcpy(&h, p, 8);
    return __builtin_bswap64(h);
  }
  for (size_t i = 0; i < n; ++i) h |= static_cast<uint64_t>(p[i]) << (56 - 8 * i);
  return h;
}

void RecomputeHints(Node* n) {
  if (n->leaf) {
    Leaf* leaf = static_cast<Leaf*>(n);
    leaf->prefix_len = 0;
    if (leaf->count == 0) return;
    leaf->prefix_len = static_cast<uint32_t>(
        CommonPrefix(leaf->entries[0]->key(), leaf->entries[leaf->count - 1]->key()));
    for (int i = 0; i < leaf->count; ++i) {
      leaf->hints[i] = KeyHint(leaf->entries[i]->key(), leaf->prefix_len);
    }
    return;
  }
  Inner* inner = static_cast<Inner*>(n);
  inner->prefix_len = 0;
  inner->hints[0] = 0;
  if (inner->count < 2) return;
  inner->prefix_len = static_cast<uint32_t>(
      CommonPrefix(inner->separators[1]->key(), inner->separators[inner->count - 1]->key()));
  for (int i = 1; i < inner->count; ++i) {
    inner->hints[i] = KeyHint(inner->separators[i]->key(), inner->prefix_len);
  }
}

void RecomputeAggregates(Node* n) {
  uint32_t live = 0;
  int64_t max_modified = 0;
  if (n->leaf) {
    const Leaf* leaf = static_cast<const Leaf*>(n);
    for (int i = 0; i < leaf->count; ++i) {
      const KeyIndex& k = leaf->entries[i]->index;
      live += k.IsLive() ? 1 : 0;
      max_modified = std::max(max_modified, k.modified().main);
    }
  } else {
    const Inner* inner = static_cast<const Inner*>(n);
    for (int i = 0; i < inner->count; ++i) {
      live += inner->children[i]->live;
      max_modified = std::max(max_modified, inner->children[i]->max_modified);
    }
  }
  n->live = live;
  n->max_modified = max_modified;
}

void LeafInsertAt(Leaf* leaf, int pos, Entry* e) {
  std::copy_backward(leaf->entries + pos, leaf->entries + leaf->count,
                     leaf->entries + leaf->count + 1);
  std::copy_backward(leaf->hints + pos, leaf->hints + leaf->count, leaf->hints + leaf->count + 1);
  leaf->entries[pos] = e;
  ++leaf->count;
  // A key in the middle shares the prefix of its neighbours; a new first or
  // last key may shorten it.
  if (leaf->count == 1 ||
      ((pos == 0 || pos == leaf->count - 1) &&
       ComparePrefix(e->key(), leaf->entries[pos == 0 ? 1 : 0]->key(), leaf->prefix_len) != 0)) {
    RecomputeHints(leaf);
    return;
  }
  leaf->hints[pos] = KeyHint(e->key(), leaf->prefix_len);
}

void LeafEraseAt(Leaf* leaf, int pos) {
  std::copy(leaf->entries + pos + 1, leaf->entries + leaf->count, leaf->entries + pos);
  std::copy(leaf->hints + pos + 1, leaf->hints + leaf->count, leaf->hints + pos);
  --leaf->count;
}

int LeafLowerBound(const Leaf* leaf, std::string_view key) {
  const int n = leaf->count;
  if (n == 0) return 0;
  const size_t p = leaf->prefix_len;
  if (p > 0) {
    const int c = ComparePrefix(key, leaf->entries[0]->key(), p);
    if (c < 0) return 0;
    if (c > 0) return n;
  }
  const uint64_t h = KeyHint(key, p);
  const uint64_t* lo = std::lower_bound(leaf->hints, leaf->hints + n, h);
  const uint64_t* hi = std::upper_bound(lo, leaf->hints + n, h);
  // Keys with a smaller hint are smaller, with a larger hint larger.
  Entry* const* it =
      std::lower_bound(leaf->entries + (lo - leaf->hints), leaf->entries + (hi - leaf->hints), key,
                       [](const Entry* e, std::string_view k) { return e->key() < k; });
  return static_cast<int>(it - leaf->entries);
}

int ChildIndex(const Inner* inner, std::string_view key) {
  const int n = inner->count;
  if (n < 2) return 0;
  const size_t p = inner->prefix_len;
  if (p > 0) {
    const int c = ComparePrefix(key, inner->separators[1]->key(), p);
    if (c < 0) return 0;
    if (c > 0) return n - 1;
  }
  // The number of separators <= key.
  const uint64_t h = KeyHint(key, p);
  const uint64_t* lo = std::lower_bound(inner->hints + 1, inner->hints + n, h);
  const uint64_t* hi = std::upper_bound(lo, inner->hints + n, h);
  Entry* const* it = std::upper_bound(
      inner->separators + (lo - inner->hints), inner->separators + (hi - inner->hints), key,
      [](std::string_view k, const Entry* e) { return k < e->key(); });
  return static_cast<int>(it - inner->separators) - 1;
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
  if (pos < leaf->count && leaf->entries[pos]->key() == key) return leaf->entries[pos];
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
