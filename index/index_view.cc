// Copyright 2025 The Capstan Authors.

#include "index/index_view.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace capstan::index {
namespace {

using internal::Entry;
using internal::Inner;
using internal::Leaf;
using internal::Node;

absl::Status RevisionNotFound() { return absl::NotFoundError("revision not found"); }

// [start, end) or [start, +inf).
struct Bounds {
  std::string_view start;
  std::string_view end;
  bool unbounded;

  bool BeforeEnd(std::string_view k) const { return unbounded || k < end; }
};

// Calls f(const Entry*) for the entries of `n` from b.start (when `seek`) or
// from the first one, while their keys are before b.end. Returns false when
// the walk must stop (f returned false or the end was passed).
template <typename F>
bool Walk(const Node* n, const Bounds& b, bool seek, F& f) {
  if (n->leaf) {
    const Leaf* leaf = static_cast<const Leaf*>(n);
    int i = seek ? internal::LeafLowerBound(leaf, b.start) : 0;
    if (leaf->count > 0 && b.BeforeEnd(leaf->entries[leaf->count - 1]->key())) {
      // The whole leaf is before the end: no key to compare (nor to load
      // from memory, when f does not read it).
      for (; i < leaf->count; ++i) {
        if (!f(leaf->entries[i])) return false;
      }
      return true;
    }
    for (; i < leaf->count; ++i) {
      const Entry* e = leaf->entries[i];
      if (!b.BeforeEnd(e->key())) return false;
      if (!f(e)) return false;
    }
    return true;
  }
  const Inner* inner = static_cast<const Inner*>(n);
  const int first = seek ? internal::ChildIndex(inner, b.start) : 0;
  for (int i = first; i < inner->count; ++i) {
    // Every key under children[i] is >= separators[i].
    if (i > 0 && !b.BeforeEnd(inner->separators[i]->key())) return false;
    if (!Walk(inner->children[i], b, seek && i == first, f)) return false;
  }
  return true;
}

// Calls f(const Entry*) for the entries of the etcd range (key, range_end).
template <typename F>
void WalkRange(const Node* root, std::string_view key, std::string_view range_end, F&& f) {
  if (root == nullptr) return;
  if (range_end.empty()) {
    if (const Entry* e = internal::FindEntry(root, key)) f(e);
    return;
  }
  const Bounds b{key, range_end, range_end == kRangeEndAll};
  if (!b.BeforeEnd(key)) return;
  Walk(root, b, /*seek=*/true, f);
}

// Adds to *total the keys under `n` alive at `at_rev` within `b`, stopping
// once *total reaches `limit` (when limit > 0); returns false when the walk
// must stop. `seek`: begin at b.start, not at the first key of `n`;
// `before_end`: every key under `n` is known to be before b.end. A subtree
// wholly inside the range and unchanged since `at_rev` is counted from its
// aggregates without visiting it.
bool CountIn(const Node* n, const Bounds& b, bool seek, bool before_end, int64_t at_rev,
             int64_t limit, int64_t* total) {
  if (!seek && before_end && n->max_modified <= at_rev &&
      (limit <= 0 || *total + n->live < limit)) {
    *total += n->live;
    return true;
  }
  if (n->leaf) {
    const Leaf* leaf = static_cast<const Leaf*>(n);
    int i = seek ? internal::LeafLowerBound(leaf, b.start) : 0;
    if (!before_end && leaf->count > 0 && b.BeforeEnd(leaf->entries[leaf->count - 1]->key())) {
      before_end = true;
    }
    for (; i < leaf->count; ++i) {
      const Entry* e = leaf->entries[i];
      if (!before_end && !b.BeforeEnd(e->key())) return false;
      if (e->index.AliveAt(at_rev) && ++*total == limit) return false;
    }
    return true;
  }
  const Inner* inner = static_cast<const Inner*>(n);
  const int first = seek ? internal::ChildIndex(inner, b.start) : 0;
  for (int i = first; i < inner->count; ++i) {
    // Every key under children[i] is >= separators[i] and < separators[i + 1].
    if (i > 0 && !before_end && !b.BeforeEnd(inner->separators[i]->key())) return false;
    const bool child_before_end =
        before_end || (i + 1 < inner->count && !(b.end < inner->separators[i + 1]->key()));
    if (!CountIn(inner->children[i], b, seek && i == first, child_before_end, at_rev, limit,
                 total)) {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status IndexView::Get(std::string_view key, int64_t at_rev, Revision* modified,
                            Revision* created, int64_t* version) const {
  const Entry* e = internal::FindEntry(root_, key);
  if (e == nullptr) {
    *modified = Revision{};
    *created = Revision{};
    *version = 0;
    return RevisionNotFound();
  }
  return e->index.Get(at_rev, modified, created, version);
}

const KeyIndex* IndexView::Find(std::string_view key) const {
  const Entry* e = internal::FindEntry(root_, key);
  return e == nullptr ? nullptr : &e->index;
}

void IndexView::Range(
    std::string_view key, std::string_view range_end, int64_t at_rev,
    absl::FunctionRef<bool(std::string_view key, const RangeHit& hit)> visit) const {
  WalkRange(root_, key, range_end, [&](const Entry* e) {
    RangeHit hit;
    if (!e->index.Lookup(at_rev, &hit.modified, &hit.created, &hit.version)) return true;
    hit.lease_known = e->index.LeaseOf(hit.modified, &hit.lease);
    return visit(e->key(), hit);
  });
}

int64_t IndexView::Count(std::string_view key, std::string_view range_end, int64_t at_rev,
                         int64_t limit) const {
  if (root_ == nullptr) return 0;
  if (range_end.empty()) {
    const Entry* e = internal::FindEntry(root_, key);
    return e != nullptr && e->index.AliveAt(at_rev) ? 1 : 0;
  }
  const Bounds b{key, range_end, range_end == kRangeEndAll};
  if (!b.BeforeEnd(key)) return 0;
  int64_t total = 0;
  CountIn(root_, b, /*seek=*/true, /*before_end=*/b.unbounded, at_rev, limit, &total);
  return total;
}

void IndexView::RangeSince(
    std::string_view key, std::string_view range_end, int64_t rev,
    absl::FunctionRef<bool(std::string_view key, std::span<const Revision> revs)> visit) const {
  std::vector<Revision> revs;
  WalkRange(root_, key, range_end, [&](const Entry* e) {
    revs.clear();
    e->index.AppendSince(rev, &revs);
    if (revs.empty()) return true;
    return visit(e->key(), std::span<const Revision>(revs));
  });
}

std::vector<Revision> IndexView::RangeSince(std::string_view key, std::string_view range_end,
                                            int64_t rev) const {
  std::vector<Revision> revs;
  WalkRange(root_, key, range_end, [&](const Entry* e) {
    e->index.AppendSince(rev, &revs);
    return true;
  });
  std::sort(revs.begin(), revs.end());
  return revs;
}

void IndexView::ForEach(
    std::string_view key, std::string_view range_end,
    absl::FunctionRef<bool(std::string_view key, const KeyIndex& index)> visit) const {
  WalkRange(root_, key, range_end, [&](const Entry* e) { return visit(e->key(), e->index); });
}

void IndexView::Keep(int64_t at_rev, RevisionSet* available) const {
  WalkRange(root_, "", kRangeEndAll, [&](const Entry* e) {
    e->index.Keep(at_rev, available);
    return true;
  });
}

void IndexView::Retained(int64_t at_rev, RevisionSet* available) const {
  WalkRange(root_, "", kRangeEndAll, [&](const Entry* e) {
    e->index.Retained(at_rev, available);
    return true;
  });
}

std::vector<std::string> IndexView::KeysToCompact(int64_t at_rev) const {
  std::vector<std::string> keys;
  WalkRange(root_, "", kRangeEndAll, [&](const Entry* e) {
    if (e->index.NeedsCompaction(at_rev)) keys.emplace_back(e->key());
    return true;
  });
  return keys;
}

size_t IndexView::live() const { return root_ == nullptr ? 0 : root_->live; }

int IndexView::TEST_Height() const { return internal::Height(root_); }

namespace {

// Checks the aggregates of `n` against its entries or (already validated)
// children: `live` exact, `max_modified` an upper bound.
absl::Status ValidateAggregates(const Node* n) {
  int64_t live = 0;
  int64_t max_modified = 0;
  for (int i = 0; i < n->count; ++i) {
    if (n->leaf) {
      const KeyIndex& k = static_cast<const Leaf*>(n)->entries[i]->index;
      live += k.IsLive() ? 1 : 0;
      max_modified = std::max(max_modified, k.modified().main);
    } else {
      const Node* c = static_cast<const Inner*>(n)->children[i];
      live += c->live;
      max_modified = std::max(max_modified, c->max_modified);
    }
  }
  if (n->live != live) {
    return absl::InternalError(absl::StrCat("node counts ", n->live, " live keys, holds ", live));
  }
  if (n->max_modified < max_modified) {
    return absl::InternalError(absl::StrCat("node's max_modified ", n->max_modified,
                                            " below its keys' ", max_modified));
  }
  return absl::OkStatus();
}

// Validates the subtree `n` whose keys must lie in [lo, hi) (has_lo/has_hi
// false: unbounded), at `depth`.
absl::Status ValidateNode(const Node* n, bool is_root, bool has_lo, std::string_view lo,
                          bool has_hi, std::string_view hi, int depth, int* leaf_depth,
                          size_t* entries, const std::string** prev, std::string* prev_storage) {
  const int cap = n->leaf ? internal::kLeafCapacity : internal::kInnerCapacity;
  if (n->count > cap) return absl::InternalError("node over capacity");
  if (n->count == 0) return absl::InternalError("empty node");
  if (!is_root && !n->leaf && n->count < 1) return absl::InternalError("inner without child");
  if (n->refs.load(std::memory_order_relaxed) == 0) return absl::InternalError("dead node");
  if (n->leaf) {
    if (*leaf_depth < 0) *leaf_depth = depth;
    if (*leaf_depth != depth) return absl::InternalError("leaves at different depths");
    const Leaf* leaf = static_cast<const Leaf*>(n);
    const std::string_view prefix = leaf->entries[0]->key().substr(0, leaf->prefix_len);
    for (int i = 0; i < leaf->count; ++i) {
      const std::string_view k = leaf->entries[i]->key();
      if (k.substr(0, leaf->prefix_len) != prefix || prefix.size() != leaf->prefix_len ||
          leaf->hints[i] != internal::KeyHint(k, leaf->prefix_len)) {
        return absl::InternalError("stale key hint in a leaf at " + std::string(k));
      }
      if (*prev != nullptr && !(**prev < k)) {
        return absl::InternalError("keys not strictly ascending at " + std::string(k));
      }
      if ((has_lo && k < lo) || (has_hi && !(k < hi))) {
        return absl::InternalError("key outside its separators: " + std::string(k));
      }
      if (leaf->entries[i]->index.IsEmpty()) {
        return absl::InternalError("empty KeyIndex for " + std::string(k));
      }
      prev_storage->assign(k);
      *prev = prev_storage;
      ++*entries;
    }
    return ValidateAggregates(n);
  }
  const Inner* inner = static_cast<const Inner*>(n);
  for (int i = 1; i < inner->count; ++i) {
    const std::string_view k = inner->separators[i]->key();
    const std::string_view prefix = inner->separators[1]->key().substr(0, inner->prefix_len);
    if (k.substr(0, inner->prefix_len) != prefix || prefix.size() != inner->prefix_len ||
        inner->hints[i] != internal::KeyHint(k, inner->prefix_len)) {
      return absl::InternalError("stale key hint in an inner node at " + std::string(k));
    }
  }
  if (inner->count < 2 && inner->prefix_len != 0) {
    return absl::InternalError("prefix in an inner node without separators");
  }
  for (int i = 0; i < inner->count; ++i) {
    const bool c_has_lo = i > 0 || has_lo;
    const std::string_view c_lo = i > 0 ? inner->separators[i]->key() : lo;
    const bool c_has_hi = i + 1 < inner->count || has_hi;
    const std::string_view c_hi = i + 1 < inner->count ? inner->separators[i + 1]->key() : hi;
    if (i > 0 && ((has_lo && c_lo < lo) || (has_hi && !(c_lo < hi)))) {
      return absl::InternalError("separator outside its parent's range");
    }
    absl::Status s = ValidateNode(inner->children[i], false, c_has_lo, c_lo, c_has_hi, c_hi,
                                  depth + 1, leaf_depth, entries, prev, prev_storage);
    if (!s.ok()) return s;
  }
  return ValidateAggregates(n);
}

}  // namespace

absl::Status IndexView::TEST_Validate() const {
  if (root_ == nullptr) {
    return size_ == 0 ? absl::OkStatus() : absl::InternalError("size of an empty tree");
  }
  int leaf_depth = -1;
  size_t entries = 0;
  const std::string* prev = nullptr;
  std::string prev_storage;
  absl::Status s = ValidateNode(root_, true, false, "", false, "", 0, &leaf_depth, &entries, &prev,
                                &prev_storage);
  if (!s.ok()) return s;
  if (entries != size_) return absl::InternalError("size does not match the entries");
  return absl::OkStatus();
}

}  // namespace capstan::index
