// Copyright 2025 The Capstan Authors.

#include "index/tree_index.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace capstan::index {
namespace {

using internal::Entry;
using internal::Inner;
using internal::Leaf;
using internal::Node;
using internal::NodeRef;

[[noreturn]] void Panic(const std::string& message) {
  std::fprintf(stderr, "capstan/index: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

int Minimum(const Node* n) { return n->leaf ? internal::kLeafMinimum : internal::kInnerMinimum; }

// How many of `total` items the left half keeps when a full node splits. An
// insertion at the end of the rightmost node (ascending keys, as in a bulk
// restore) leaves the left node full instead of half empty.
int SplitPoint(int total, bool append) { return append ? total - 1 : total / 2; }

}  // namespace

TreeIndex::TreeIndex() : chain_(std::make_shared<internal::VersionChain>()) {}

TreeIndex::~TreeIndex() {
  // Entries still in the tree hold the tree's reference: published versions
  // (snapshots may outlive the index) may reach them.
  std::vector<Node*> stack;
  if (root_.get() != nullptr) stack.push_back(root_.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (n->leaf) {
      Leaf* leaf = static_cast<Leaf*>(n);
      for (int i = 0; i < leaf->count; ++i) Retire(leaf->entries[i]);
    } else {
      Inner* inner = static_cast<Inner*>(n);
      stack.insert(stack.end(), inner->children, inner->children + inner->count);
    }
  }
  root_ = NodeRef();
  mu_.Lock();
  internal::VersionRef published = std::move(published_);
  mu_.Unlock();
}

void TreeIndex::Retire(Entry* e) {
  // Published versions reach only what was stamped before the current epoch.
  if (e->epoch == epoch_ || latest_.get() == nullptr) {
    internal::Unref(e);
  } else {
    latest_.get()->retired.push_back(e);
  }
}

void TreeIndex::MakeMutable(Node** slot) {
  Node* n = *slot;
  if (n->epoch == epoch_) return;
  *slot = internal::CloneNode(n, epoch_);
  internal::Unref(n);
  ++stats_.nodes_copied;
}

Entry* TreeIndex::MakeMutable(Entry** slot) {
  Entry* e = *slot;
  if (e->epoch == epoch_) return e;
  Entry* copy = Entry::Copy(epoch_, *e);
  *slot = copy;
  Retire(e);
  ++stats_.entries_copied;
  return copy;
}

void TreeIndex::Put(std::string_view key, Revision rev, int64_t lease) {
  FindOrInsert(key, [rev, lease](KeyIndex* index) { index->Put(rev, lease); });
}

absl::Status TreeIndex::Tombstone(std::string_view key, Revision rev) {
  // Check first, so that a failed tombstone copies nothing.
  const Entry* e = internal::FindEntry(root_.get(), key);
  if (e == nullptr || !e->index.IsLive()) return absl::NotFoundError("revision not found");
  // The aggregates change on the way down, so the tombstone must not fail
  // now; it cannot, the key being live.
  absl::Status s = FindMutable(key, KeyChange{-1, rev.main})->index.Tombstone(rev);
  if (!s.ok()) Panic(absl::StrCat("Tombstone of a live key failed: ", s.ToString()));
  return s;
}

void TreeIndex::Restore(std::string_view key, Revision created, Revision modified,
                        int64_t version, int64_t lease) {
  FindOrInsert(key, [&](KeyIndex* index) {
    if (index->generation_count() == 0) {
      index->Restore(created, modified, version, lease);
    } else {
      index->Put(modified, lease);
    }
  });
}

void TreeIndex::FindOrInsert(std::string_view key, absl::FunctionRef<void(KeyIndex*)> edit) {
  if (root_.get() == nullptr) {
    root_ = NodeRef::Adopt(new Leaf(epoch_));
    ++stats_.nodes_created;
  }
  MakeMutable(root_.slot());
  Split split;
  KeyChange change;
  FindOrInsertIn(root_.get(), key, /*rightmost=*/true, edit, &split, &change);
  if (split.right != nullptr) {
    Inner* root = new Inner(epoch_);
    ++stats_.nodes_created;
    root->count = 2;
    root->separators[0] = nullptr;
    root->children[0] = root_.release();
    root->separators[1] = split.separator;
    root->children[1] = split.right;
    internal::RecomputeHints(root);
    internal::RecomputeAggregates(root);
    root_ = NodeRef::Adopt(root);
  }
}

void TreeIndex::FindOrInsertIn(Node* node, std::string_view key, bool rightmost,
                               absl::FunctionRef<void(KeyIndex*)> edit, Split* split,
                               KeyChange* change) {
  // Applies the edit to `e` and the change it made to `n`'s aggregates.
  auto apply = [&](Entry* e, Node* n) {
    const bool was_live = e->index.IsLive();
    edit(&e->index);
    change->live_delta = (e->index.IsLive() ? 1 : 0) - (was_live ? 1 : 0);
    change->modified = e->index.modified().main;
    n->live += change->live_delta;
    n->max_modified = std::max(n->max_modified, change->modified);
  };
  if (node->leaf) {
    Leaf* leaf = static_cast<Leaf*>(node);
    const int pos = internal::LeafLowerBound(leaf, key);
    if (pos < leaf->count && leaf->entries[pos]->key() == key) {
      apply(MakeMutable(&leaf->entries[pos]), leaf);
      return;
    }
    Entry* e = Entry::New(epoch_, key);
    ++size_;
    if (leaf->count < internal::kLeafCapacity) {
      internal::LeafInsertAt(leaf, pos, e);
      apply(e, leaf);
      return;
    }
    apply(e, leaf);  // the split below recomputes both halves
    // Split a full leaf.
    constexpr int kTotal = internal::kLeafCapacity + 1;
    Entry* all[kTotal];
    std::copy(leaf->entries, leaf->entries + pos, all);
    all[pos] = e;
    std::copy(leaf->entries + pos, leaf->entries + leaf->count, all + pos + 1);
    const int left_count = SplitPoint(kTotal, rightmost && pos == leaf->count);
    Leaf* right = new Leaf(epoch_);
    ++stats_.nodes_created;
    std::copy(all, all + left_count, leaf->entries);
    leaf->count = left_count;
    std::copy(all + left_count, all + kTotal, right->entries);
    right->count = kTotal - left_count;
    internal::RecomputeHints(leaf);
    internal::RecomputeHints(right);
    internal::RecomputeAggregates(leaf);
    internal::RecomputeAggregates(right);
    split->separator = right->entries[0];
    internal::Ref(split->separator);
    split->right = right;
    return;
  }

  Inner* inner = static_cast<Inner*>(node);
  const int i = internal::ChildIndex(inner, key);
  MakeMutable(&inner->children[i]);
  Split child_split;
  FindOrInsertIn(inner->children[i], key, rightmost && i == inner->count - 1, edit, &child_split,
                 change);
  // A split only moves keys between children: the subtree changes as its key.
  inner->live += change->live_delta;
  inner->max_modified = std::max(inner->max_modified, change->modified);
  if (child_split.right == nullptr) return;

  // Insert the new child at i + 1.
  const int pos = i + 1;
  if (inner->count < internal::kInnerCapacity) {
    std::copy_backward(inner->separators + pos, inner->separators + inner->count,
                       inner->separators + inner->count + 1);
    std::copy_backward(inner->children + pos, inner->children + inner->count,
                       inner->children + inner->count + 1);
    inner->separators[pos] = child_split.separator;
    inner->children[pos] = child_split.right;
    ++inner->count;
    internal::RecomputeHints(inner);
    return;
  }
  // Split a full inner node; the separator at the split point moves up.
  constexpr int kTotal = internal::kInnerCapacity + 1;
  Entry* seps[kTotal];
  Node* children[kTotal];
  std::copy(inner->separators, inner->separators + pos, seps);
  std::copy(inner->children, inner->children + pos, children);
  seps[pos] = child_split.separator;
  children[pos] = child_split.right;
  std::copy(inner->separators + pos, inner->separators + inner->count, seps + pos + 1);
  std::copy(inner->children + pos, inner->children + inner->count, children + pos + 1);
  const int left_count = SplitPoint(kTotal, rightmost && pos == inner->count);
  Inner* right = new Inner(epoch_);
  ++stats_.nodes_created;
  std::copy(seps, seps + left_count, inner->separators);
  std::copy(children, children + left_count, inner->children);
  inner->count = left_count;
  right->separators[0] = nullptr;
  std::copy(seps + left_count + 1, seps + kTotal, right->separators + 1);
  std::copy(children + left_count, children + kTotal, right->children);
  right->count = kTotal - left_count;
  internal::RecomputeHints(inner);
  internal::RecomputeHints(right);
  internal::RecomputeAggregates(inner);
  internal::RecomputeAggregates(right);
  split->separator = seps[left_count];  // its reference moves up
  split->right = right;
}

Entry* TreeIndex::FindMutable(std::string_view key, KeyChange change) {
  MakeMutable(root_.slot());
  Node* n = root_.get();
  for (;;) {
    n->live += change.live_delta;
    n->max_modified = std::max(n->max_modified, change.modified);
    if (n->leaf) break;
    Inner* inner = static_cast<Inner*>(n);
    const int i = internal::ChildIndex(inner, key);
    MakeMutable(&inner->children[i]);
    n = inner->children[i];
  }
  Leaf* leaf = static_cast<Leaf*>(n);
  const int pos = internal::LeafLowerBound(leaf, key);
  if (pos == leaf->count || leaf->entries[pos]->key() != key) {
    Panic(absl::StrCat("FindMutable: key not in the index: ", std::string(key)));
  }
  return MakeMutable(&leaf->entries[pos]);
}

void TreeIndex::CompactKeys(std::span<const std::string> keys, int64_t at_rev,
                            RevisionSet* available) {
  for (const std::string& key : keys) {
    const Entry* e = internal::FindEntry(root_.get(), key);
    if (e == nullptr) continue;
    if (!e->index.NeedsCompaction(at_rev)) {
      // Compact would only report what it keeps: no copy needed. (Not Keep:
      // on a key already compacted at at_rev it leaves out the tombstone at
      // at_rev that the compaction kept.)
      if (available != nullptr) e->index.Retained(at_rev, available);
      continue;
    }
    // Compaction keeps the latest revision of a live key, so it changes
    // neither whether a key is live nor, for a live key, its last revision;
    // a dead key compacted to nothing is erased, which may leave
    // max_modified above the rest (allowed). No aggregate changes.
    Entry* m = FindMutable(key, KeyChange{});  // makes the whole path mutable
    const bool was_live = m->index.IsLive();
    m->index.Compact(at_rev, available);
    if (m->index.IsLive() != was_live) {
      Panic(absl::StrCat("CompactKeys: compaction changed whether a key is live: ", key));
    }
    if (!m->index.IsEmpty()) continue;
    EraseIn(root_.get(), key);
    --size_;
    // Shrink the root.
    while (!root_.get()->leaf && root_.get()->count == 1) {
      Inner* root = static_cast<Inner*>(root_.get());
      Node* child = root->children[0];
      root->count = 0;  // the child's reference moves to root_
      root_ = NodeRef::Adopt(child);
    }
    if (root_.get()->count == 0) root_ = NodeRef();
  }
}

void TreeIndex::EraseIn(Node* node, std::string_view key) {
  if (node->leaf) {
    Leaf* leaf = static_cast<Leaf*>(node);
    const int pos = internal::LeafLowerBound(leaf, key);
    if (pos == leaf->count || leaf->entries[pos]->key() != key) {
      Panic(absl::StrCat("EraseIn: key not in the index: ", std::string(key)));
    }
    Retire(leaf->entries[pos]);
    internal::LeafEraseAt(leaf, pos);
    return;
  }
  Inner* inner = static_cast<Inner*>(node);
  const int i = internal::ChildIndex(inner, key);
  MakeMutable(&inner->children[i]);
  EraseIn(inner->children[i], key);
  const Node* child = inner->children[i];
  if (child->count == 0) {
    // Only possible under a one-child node (see SplitPoint): drop the child.
    RemoveChild(inner, i);
  } else if (child->count < Minimum(child) && inner->count > 1) {
    Rebalance(inner, i);
  }
}

void TreeIndex::RemoveChild(Inner* inner, int i) {
  internal::Unref(inner->children[i]);
  // Child i's separator goes with it; for child 0 the next child's separator
  // goes instead, as the first child needs none.
  const int sep = i > 0 ? i : 1;
  if (sep < inner->count) {
    internal::Unref(inner->separators[sep]);
    std::copy(inner->separators + sep + 1, inner->separators + inner->count,
              inner->separators + sep);
  }
  std::copy(inner->children + i + 1, inner->children + inner->count, inner->children + i);
  --inner->count;
  inner->separators[0] = nullptr;
  internal::RecomputeHints(inner);
}

void TreeIndex::Rebalance(Inner* inner, int i) {
  const int l = i > 0 ? i - 1 : i;
  const int r = l + 1;
  MakeMutable(&inner->children[l]);
  MakeMutable(&inner->children[r]);
  Node* left = inner->children[l];
  Node* right = inner->children[r];
  const int total = left->count + right->count;

  if (left->leaf) {
    Leaf* ll = static_cast<Leaf*>(left);
    Leaf* rl = static_cast<Leaf*>(right);
    if (total <= internal::kLeafCapacity) {
      std::copy(rl->entries, rl->entries + rl->count, ll->entries + ll->count);
      ll->count = total;
      rl->count = 0;
    } else {
      const int want_left = total / 2;
      if (ll->count < want_left) {
        const int move = want_left - ll->count;
        std::copy(rl->entries, rl->entries + move, ll->entries + ll->count);
        std::copy(rl->entries + move, rl->entries + rl->count, rl->entries);
      } else {
        const int move = ll->count - want_left;
        std::copy_backward(rl->entries, rl->entries + rl->count, rl->entries + rl->count + move);
        std::copy(ll->entries + want_left, ll->entries + ll->count, rl->entries);
      }
      ll->count = want_left;
      rl->count = total - want_left;
      internal::Unref(inner->separators[r]);
      inner->separators[r] = rl->entries[0];
      internal::Ref(inner->separators[r]);
      internal::RecomputeHints(ll);
      internal::RecomputeHints(rl);
      internal::RecomputeHints(inner);
      internal::RecomputeAggregates(ll);
      internal::RecomputeAggregates(rl);
      return;
    }
  } else {
    Inner* li = static_cast<Inner*>(left);
    Inner* ri = static_cast<Inner*>(right);
    if (total <= internal::kInnerCapacity) {
      // The parent's separator comes down in front of right's first child.
      li->separators[li->count] = inner->separators[r];
      li->children[li->count] = ri->children[0];
      std::copy(ri->separators + 1, ri->separators + ri->count, li->separators + li->count + 1);
      std::copy(ri->children + 1, ri->children + ri->count, li->children + li->count + 1);
      li->count = total;
      ri->count = 0;
      inner->separators[r] = nullptr;  // moved into left
    } else {
      // Rotate children one at a time through the parent's separator.
      const int want_left = total / 2;
      while (li->count < want_left) {
        li->separators[li->count] = inner->separators[r];
        li->children[li->count] = ri->children[0];
        ++li->count;
        inner->separators[r] = ri->separators[1];
        std::copy(ri->separators + 2, ri->separators + ri->count, ri->separators + 1);
        std::copy(ri->children + 1, ri->children + ri->count, ri->children);
        --ri->count;
      }
      while (li->count > want_left) {
        std::copy_backward(ri->separators + 1, ri->separators + ri->count,
                           ri->separators + ri->count + 1);
        std::copy_backward(ri->children, ri->children + ri->count, ri->children + ri->count + 1);
        ri->children[0] = li->children[li->count - 1];
        ri->separators[1] = inner->separators[r];
        inner->separators[r] = li->separators[li->count - 1];
        --li->count;
        ++ri->count;
      }
      internal::RecomputeHints(li);
      internal::RecomputeHints(ri);
      internal::RecomputeHints(inner);
      internal::RecomputeAggregates(li);
      internal::RecomputeAggregates(ri);
      return;
    }
  }

  // Merged: drop the now empty right node and its separator.
  internal::RecomputeHints(left);
  internal::RecomputeAggregates(left);
  if (inner->separators[r] != nullptr) internal::Unref(inner->separators[r]);
  internal::Unref(right);
  std::copy(inner->separators + r + 1, inner->separators + inner->count, inner->separators + r);
  std::copy(inner->children + r + 1, inner->children + inner->count, inner->children + r);
  --inner->count;
  internal::RecomputeHints(inner);
}

void TreeIndex::LoadSorted(std::vector<std::pair<std::string, KeyIndex>> entries) {
  if (root_.get() != nullptr || size_ != 0) Panic("LoadSorted on a non-empty index");
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].second.IsEmpty()) {
      Panic(absl::StrCat("LoadSorted: empty KeyIndex for key ", entries[i].first));
    }
    if (i > 0 && !(entries[i - 1].first < entries[i].first)) {
      Panic(absl::StrCat("LoadSorted: keys not strictly ascending at ", entries[i].first));
    }
  }
  if (entries.empty()) return;

  // Splits n items into nodes of about `fill` items, evenly.
  auto plan = [](size_t n, size_t fill, size_t* nodes, size_t* base, size_t* extra) {
    *nodes = (n + fill - 1) / fill;
    *base = n / *nodes;
    *extra = n % *nodes;
  };
  // Leave room in every node so that the first inserts do not split at once.
  constexpr size_t kLeafFill = internal::kLeafCapacity * 7 / 8;
  constexpr size_t kInnerFill = internal::kInnerCapacity * 7 / 8;

  std::vector<Node*> level;
  std::vector<Entry*> firsts;  // the first entry under each node of `level`
  size_t nodes, base, extra;
  plan(entries.size(), kLeafFill, &nodes, &base, &extra);
  level.reserve(nodes);
  firsts.reserve(nodes);
  size_t next = 0;
  for (size_t k = 0; k < nodes; ++k) {
    Leaf* leaf = new Leaf(epoch_);
    const size_t count = base + (k < extra ? 1 : 0);
    for (size_t j = 0; j < count; ++j, ++next) {
      leaf->entries[j] = Entry::New(epoch_, entries[next].first, std::move(entries[next].second));
      std::string().swap(entries[next].first);  // free as we go
    }
    leaf->count = static_cast<uint16_t>(count);
    internal::RecomputeHints(leaf);
    internal::RecomputeAggregates(leaf);
    level.push_back(leaf);
    firsts.push_back(leaf->entries[0]);
  }
  stats_.nodes_created += nodes;
  size_ = entries.size();
  entries.clear();

  while (level.size() > 1) {
    std::vector<Node*> up;
    std::vector<Entry*> up_firsts;
    plan(level.size(), kInnerFill, &nodes, &base, &extra);
    next = 0;
    for (size_t k = 0; k < nodes; ++k) {
      Inner* inner = new Inner(epoch_);
      const size_t count = base + (k < extra ? 1 : 0);
      inner->separators[0] = nullptr;
      for (size_t j = 0; j < count; ++j, ++next) {
        inner->children[j] = level[next];
        if (j > 0) {
          inner->separators[j] = firsts[next];
          internal::Ref(firsts[next]);
        }
      }
      inner->count = static_cast<uint16_t>(count);
      internal::RecomputeHints(inner);
      internal::RecomputeAggregates(inner);
      up.push_back(inner);
      up_firsts.push_back(firsts[next - count]);
    }
    stats_.nodes_created += nodes;
    level = std::move(up);
    firsts = std::move(up_firsts);
  }
  root_ = NodeRef::Adopt(level[0]);
}

void TreeIndex::Publish() {
  latest_ = internal::VersionRef::Adopt(internal::PublishVersion(chain_, root_, size_));
  internal::VersionRef old;  // released after the lock, so nothing is freed under it
  mu_.Lock();
  old = std::move(published_);
  published_ = latest_;
  mu_.Unlock();
  ++epoch_;
}

IndexSnapshot TreeIndex::Snapshot() const {
  internal::VersionRef version;
  mu_.Lock();
  version = published_;
  mu_.Unlock();
  return IndexSnapshot(std::move(version));
}

}  // namespace capstan::index
