#include "watchcache/object_tree.h"

#include <atomic>
#include <utility>

#include "util/check.h"

namespace capstan::watchcache {
namespace tree_internal {

constexpr int kMax = 32;      // items per leaf, children per inner node
constexpr int kMinFill = 8;   // below this a node is merged with a neighbor when they fit

struct Node {
  explicit Node(bool is_leaf) : leaf(is_leaf) {}
  std::atomic<uint32_t> refs{1};
  const bool leaf;
  int n = 0;          // items (leaf) or children (inner)
  size_t total = 0;   // keys in the subtree
};

struct Leaf : Node {
  Leaf() : Node(true) {}
  ObjectRef items[kMax];
};

struct Inner : Node {
  Inner() : Node(false) {}
  Node* child[kMax] = {};
  size_t count[kMax] = {};
  ObjectRef sep[kMax];  // sep[i]: the first object of child[i]
};

Leaf* AsLeaf(Node* n) { return static_cast<Leaf*>(n); }
Inner* AsInner(Node* n) { return static_cast<Inner*>(n); }
const Leaf* AsLeaf(const Node* n) { return static_cast<const Leaf*>(n); }
const Inner* AsInner(const Node* n) { return static_cast<const Inner*>(n); }

void Ref(Node* n) { n->refs.fetch_add(1, std::memory_order_relaxed); }

void Unref(Node* n) {
  if (n->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (n->leaf) {
    delete AsLeaf(n);
    return;
  }
  Inner* in = AsInner(n);
  for (int i = 0; i < in->n; ++i) Unref(in->child[i]);
  delete in;
}

namespace {

Node* Copy(const Node* n) {
  if (n->leaf) {
    const Leaf* l = AsLeaf(n);
    Leaf* c = new Leaf();
    for (int i = 0; i < l->n; ++i) c->items[i] = l->items[i];
    c->n = l->n;
    c->total = l->total;
    return c;
  }
  const Inner* in = AsInner(n);
  Inner* c = new Inner();
  for (int i = 0; i < in->n; ++i) {
    c->child[i] = in->child[i];
    Ref(c->child[i]);
    c->count[i] = in->count[i];
    c->sep[i] = in->sep[i];
  }
  c->n = in->n;
  c->total = in->total;
  return c;
}

// The node in *slot, made safe to change: the node itself when only the
// writer's tree references it, else a copy that replaces it in *slot.
// REQUIRES: the parent holding slot is itself mutable (or slot is the root).
Node* MakeMutable(Node** slot) {
  Node* n = *slot;
  if (n->refs.load(std::memory_order_acquire) == 1) return n;
  Node* c = Copy(n);
  Unref(n);
  *slot = c;
  return c;
}

const ObjectRef& MinOf(const Node* n) {
  return n->leaf ? AsLeaf(n)->items[0] : AsInner(n)->sep[0];
}

int LeafLowerBound(const Leaf* l, std::string_view key) {
  int lo = 0, hi = l->n;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (l->items[mid]->key() < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

// The child whose range holds key: the last i with sep[i] <= key, or 0.
int ChildIndex(const Inner* in, std::string_view key) {
  int lo = 1, hi = in->n;
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (in->sep[mid]->key() <= key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo - 1;
}

void RefreshChild(Inner* in, int i) {
  in->count[i] = in->child[i]->total;
  if (in->sep[i].get() != MinOf(in->child[i]).get()) in->sep[i] = MinOf(in->child[i]);
}

void RecomputeTotal(Inner* in) {
  size_t t = 0;
  for (int i = 0; i < in->n; ++i) t += in->count[i];
  in->total = t;
}

void InsertChildAt(Inner* in, int at, Node* c) {
  for (int k = in->n; k > at; --k) {
    in->child[k] = in->child[k - 1];
    in->count[k] = in->count[k - 1];
    in->sep[k] = std::move(in->sep[k - 1]);
  }
  in->child[at] = c;
  in->count[at] = c->total;
  in->sep[at] = MinOf(c);
  ++in->n;
}

void RemoveChildAt(Inner* in, int at) {
  for (int k = at; k + 1 < in->n; ++k) {
    in->child[k] = in->child[k + 1];
    in->count[k] = in->count[k + 1];
    in->sep[k] = std::move(in->sep[k + 1]);
  }
  --in->n;
  in->child[in->n] = nullptr;
  in->count[in->n] = 0;
  in->sep[in->n].reset();
}

// Inserts or replaces obj below *slot. Returns the replaced object; a new
// right sibling from a split goes to *split.
ObjectRef InsertRec(Node** slot, ObjectRef& obj, std::string_view key, Node** split) {
  Node* n = MakeMutable(slot);
  if (n->leaf) {
    Leaf* l = AsLeaf(n);
    int i = LeafLowerBound(l, key);
    if (i < l->n && l->items[i]->key() == key) {
      ObjectRef old = std::move(l->items[i]);
      l->items[i] = std::move(obj);
      return old;
    }
    Leaf* target = l;
    if (l->n == kMax) {
      Leaf* r = new Leaf();
      const int half = kMax / 2;
      for (int k = half; k < kMax; ++k) r->items[k - half] = std::move(l->items[k]);
      r->n = kMax - half;
      l->n = half;
      r->total = r->n;
      l->total = l->n;
      *split = r;
      if (i > half) {
        target = r;
        i -= half;
      }
    }
    for (int k = target->n; k > i; --k) target->items[k] = std::move(target->items[k - 1]);
    target->items[i] = std::move(obj);
    ++target->n;
    ++target->total;
    return ObjectRef();
  }
  Inner* in = AsInner(n);
  const int i = ChildIndex(in, key);
  Node* child_split = nullptr;
  ObjectRef old = InsertRec(&in->child[i], obj, key, &child_split);
  RefreshChild(in, i);
  if (child_split != nullptr) {
    if (in->n == kMax) {
      Inner* r = new Inner();
      const int half = kMax / 2;
      for (int k = half; k < kMax; ++k) {
        r->child[k - half] = in->child[k];
        r->count[k - half] = in->count[k];
        r->sep[k - half] = std::move(in->sep[k]);
        in->child[k] = nullptr;
        in->count[k] = 0;
      }
      r->n = kMax - half;
      in->n = half;
      if (i + 1 > half) {
        InsertChildAt(r, i + 1 - half, child_split);
      } else {
        InsertChildAt(in, i + 1, child_split);
      }
      RecomputeTotal(r);
      *split = r;
    } else {
      InsertChildAt(in, i + 1, child_split);
    }
  }
  RecomputeTotal(in);
  return old;
}

// Appends the contents of right to left. REQUIRES: left is mutable, both
// are of the same kind and fit in one node.
void Absorb(Node* left, Node* right) {
  if (left->leaf) {
    Leaf* l = AsLeaf(left);
    const Leaf* r = AsLeaf(right);
    for (int k = 0; k < r->n; ++k) l->items[l->n + k] = r->items[k];
    l->n += r->n;
    l->total = l->n;
    return;
  }
  Inner* l = AsInner(left);
  const Inner* r = AsInner(right);
  for (int k = 0; k < r->n; ++k) {
    l->child[l->n + k] = r->child[k];
    Ref(r->child[k]);
    l->count[l->n + k] = r->count[k];
    l->sep[l->n + k] = r->sep[k];
  }
  l->n += r->n;
  RecomputeTotal(l);
}

ObjectRef EraseRec(Node** slot, std::string_view key) {
  Node* n = MakeMutable(slot);
  if (n->leaf) {
    Leaf* l = AsLeaf(n);
    int i = LeafLowerBound(l, key);
    CHECK(i < l->n && l->items[i]->key() == key);
    ObjectRef old = std::move(l->items[i]);
    for (int k = i; k + 1 < l->n; ++k) l->items[k] = std::move(l->items[k + 1]);
    --l->n;
    --l->total;
    return old;
  }
  Inner* in = AsInner(n);
  const int i = ChildIndex(in, key);
  ObjectRef old = EraseRec(&in->child[i], key);
  Node* c = in->child[i];
  if (c->n == 0) {
    Unref(c);
    RemoveChildAt(in, i);
  } else {
    RefreshChild(in, i);
    if (c->n < kMinFill && in->n > 1) {
      const int left = i > 0 ? i - 1 : i;
      const int right = left + 1;
      if (in->child[left]->n + in->child[right]->n <= kMax) {
        Node* l = MakeMutable(&in->child[left]);
        Absorb(l, in->child[right]);
        Unref(in->child[right]);
        RemoveChildAt(in, right);
        RefreshChild(in, left);
      }
    }
  }
  RecomputeTotal(in);
  return old;
}

const CachedObject* FindIn(const Node* n, std::string_view key) {
  while (n != nullptr) {
    if (n->leaf) {
      const Leaf* l = AsLeaf(n);
      int i = LeafLowerBound(l, key);
      if (i < l->n && l->items[i]->key() == key) return l->items[i].get();
      return nullptr;
    }
    const Inner* in = AsInner(n);
    n = in->child[ChildIndex(in, key)];
  }
  return nullptr;
}

bool ScanRec(const Node* n, std::string_view start, std::string_view end,
             absl::FunctionRef<bool(const ObjectRef&)> visit) {
  if (n->leaf) {
    const Leaf* l = AsLeaf(n);
    for (int i = LeafLowerBound(l, start); i < l->n; ++i) {
      if (!end.empty() && l->items[i]->key() >= end) return false;
      if (!visit(l->items[i])) return false;
    }
    return true;
  }
  const Inner* in = AsInner(n);
  for (int i = ChildIndex(in, start); i < in->n; ++i) {
    if (!end.empty() && in->sep[i]->key() >= end) return false;
    if (!ScanRec(in->child[i], start, end, visit)) return false;
  }
  return true;
}

size_t RankIn(const Node* n, std::string_view key) {
  size_t r = 0;
  while (n != nullptr) {
    if (n->leaf) return r + LeafLowerBound(AsLeaf(n), key);
    const Inner* in = AsInner(n);
    int i = ChildIndex(in, key);
    for (int k = 0; k < i; ++k) r += in->count[k];
    n = in->child[i];
  }
  return r;
}

// Checks n's subtree; *depth gets its height, *min/*max its key bounds.
bool Validate(const Node* n, bool is_root, int* depth, std::string_view* min, std::string_view* max) {
  if (n->n <= 0 || n->n > kMax) return false;
  if (n->leaf) {
    const Leaf* l = AsLeaf(n);
    for (int i = 0; i < l->n; ++i) {
      if (!l->items[i]) return false;
      if (i > 0 && !(l->items[i - 1]->key() < l->items[i]->key())) return false;
    }
    if (l->total != static_cast<size_t>(l->n)) return false;
    *depth = 1;
    *min = l->items[0]->key();
    *max = l->items[l->n - 1]->key();
    return true;
  }
  const Inner* in = AsInner(n);
  if (!is_root && in->n < 1) return false;
  size_t total = 0;
  int d0 = -1;
  std::string_view prev_max;
  for (int i = 0; i < in->n; ++i) {
    int d;
    std::string_view mn, mx;
    if (!Validate(in->child[i], false, &d, &mn, &mx)) return false;
    if (d0 >= 0 && d != d0) return false;
    d0 = d;
    if (in->count[i] != in->child[i]->total) return false;
    if (in->sep[i].get() != MinOf(in->child[i]).get()) return false;
    if (i > 0 && !(prev_max < mn)) return false;
    prev_max = mx;
    if (i == 0) *min = mn;
    *max = mx;
    total += in->count[i];
  }
  if (total != in->total) return false;
  *depth = d0 + 1;
  return true;
}

}  // namespace
}  // namespace tree_internal

using namespace tree_internal;  // NOLINT: this file's own internals

size_t TreeSnapshot::size() const { return root_ ? root_->total : 0; }

const CachedObject* TreeSnapshot::Find(std::string_view key) const { return FindIn(root_, key); }

void TreeSnapshot::Scan(std::string_view start, std::string_view end,
                        absl::FunctionRef<bool(const ObjectRef&)> visit) const {
  if (root_) ScanRec(root_, start, end, visit);
}

size_t TreeSnapshot::Rank(std::string_view key) const { return RankIn(root_, key); }

size_t TreeSnapshot::Count(std::string_view start, std::string_view end) const {
  const size_t hi = end.empty() ? size() : Rank(end);
  const size_t lo = Rank(start);
  return hi > lo ? hi - lo : 0;
}

ObjectTree::~ObjectTree() { Clear(); }

void ObjectTree::Clear() {
  if (root_) Unref(root_);
  root_ = nullptr;
}

size_t ObjectTree::size() const { return root_ ? root_->total : 0; }

const CachedObject* ObjectTree::Find(std::string_view key) const { return FindIn(root_, key); }

ObjectRef ObjectTree::Put(ObjectRef obj) {
  CHECK(obj);
  const std::string_view key = obj->key();
  if (root_ == nullptr) {
    Leaf* l = new Leaf();
    l->items[0] = std::move(obj);
    l->n = 1;
    l->total = 1;
    root_ = l;
    return ObjectRef();
  }
  Node* split = nullptr;
  ObjectRef old = InsertRec(&root_, obj, key, &split);
  if (split != nullptr) {
    Inner* r = new Inner();
    InsertChildAt(r, 0, root_);
    InsertChildAt(r, 1, split);
    RecomputeTotal(r);
    root_ = r;
  }
  return old;
}

ObjectRef ObjectTree::Erase(std::string_view key) {
  if (FindIn(root_, key) == nullptr) return ObjectRef();
  ObjectRef old = EraseRec(&root_, key);
  if (root_->n == 0) {
    Unref(root_);
    root_ = nullptr;
  } else if (!root_->leaf && root_->n == 1) {
    Node* c = AsInner(root_)->child[0];
    Ref(c);
    Unref(root_);
    root_ = c;
  }
  return old;
}

bool ObjectTree::TEST_Validate() const {
  if (root_ == nullptr) return true;
  int depth;
  std::string_view mn, mx;
  return Validate(root_, true, &depth, &mn, &mx);
}

}  // namespace capstan::watchcache
