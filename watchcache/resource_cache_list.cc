// ResourceCache: List (consistent, NotOlderThan, Exact and paginated reads
// from the per-revision snapshots, selective ones from the indexes).

#include "watchcache/absl_compat.h"
#include "watchcache/resource_cache.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "util/check.h"
#include "watchcache/continue_token.h"
#include "watchcache/errors.h"

namespace capstan::watchcache {

namespace {

// How long a consistent read waits between progress requests.
constexpr absl::Duration kProgressRetry = absl::Milliseconds(100);

}  // namespace

bool ResourceCache::ParseRv(std::string_view s, int64_t* rev) {
  uint64_t v;
  if (!absl::SimpleAtoi(AV(s), &v) || v > static_cast<uint64_t>(INT64_MAX)) return false;
  *rev = static_cast<int64_t>(v);
  return true;
}

bool ResourceCache::AwaitRevLocked(int64_t rev, absl::Duration timeout) {
  auto cond = [this, rev]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return rev_ >= rev || stopped_; };
  mu_.AwaitWithTimeout(absl::Condition(&cond), timeout);
  return rev_ >= rev && !stopped_;
}

absl::Status ResourceCache::WaitConsistent() {
  if (!current_rev_) return absl::OkStatus();
  const absl::StatusOr<int64_t> current = current_rev_();
  if (!current.ok()) return current.status();
  const int64_t want = *current;
  const absl::Time deadline = absl::Now() + options_.wait_timeout;
  for (;;) {
    {
      util::ReaderMutexLock l(&mu_);
      if (stopped_) return CacheStopped();
      if (rev_ >= want) return absl::OkStatus();
    }
    if (request_progress_) request_progress_();
    util::ReaderMutexLock l(&mu_);
    const absl::Duration left = deadline - absl::Now();
    if (AwaitRevLocked(want, std::min(left, kProgressRetry))) return absl::OkStatus();
    if (stopped_) return CacheStopped();
    if (absl::Now() >= deadline) return TooLargeResourceVersion(want, rev_);
  }
}

bool ResourceCache::IndexCandidatesLocked(const Selector& sel, std::vector<ObjectRef>* out) const {
  if (!use_indexes_.load(std::memory_order_relaxed)) return false;
  // The requirement with the fewest candidates.
  std::vector<const ObjectSet*> best;
  size_t best_size = SIZE_MAX;
  static const ObjectSet kEmpty;
  for (const auto& f : sel.fields()) {
    if (!f.equals || !spec().fields[f.field].indexed) continue;
    auto it = field_index_[f.field].find(f.value);
    const ObjectSet* s = it == field_index_[f.field].end() ? &kEmpty : &it->second;
    if (s->size() < best_size) {
      best_size = s->size();
      best = {s};
    }
  }
  if (spec().index_labels) {
    for (const auto& l : sel.labels()) {
      if (l.op != LabelRequirement::Op::kEquals && l.op != LabelRequirement::Op::kIn) continue;
      std::vector<const ObjectSet*> sets;
      size_t size = 0;
      for (const auto& v : l.values) {
        auto it = label_index_.find(LabelIndexValue(l.key, v));
        if (it == label_index_.end()) continue;
        sets.push_back(&it->second);
        size += it->second.size();
      }
      if (size < best_size) {
        best_size = size;
        best = std::move(sets);
      }
    }
  }
  if (best_size == SIZE_MAX) return false;
  out->reserve(out->size() + best_size);
  for (const ObjectSet* s : best) {
    for (const CachedObject* o : *s) out->push_back(ObjectRef::Share(o));
  }
  return true;
}

std::optional<TreeSnapshot> ResourceCache::SnapshotAt(int64_t rev, int64_t* cache_rev) const {
  util::ReaderMutexLock l(&mu_);
  if (cache_rev != nullptr) *cache_rev = rev_;
  if (!ready_ || stopped_ || rev > rev_ || rev < OldestRevLocked()) return std::nullopt;
  return SnapshotAtLocked(rev);
}

absl::StatusOr<ListResult> ResourceCache::List(const ListOptions& opts) {
  CHECK(opts.prefix.starts_with(spec().prefix));
  auto sel = Selector::Parse(opts.label_selector, opts.field_selector, extractor_);
  if (!sel.ok()) return sel.status();
  if (opts.limit < 0) return InvalidRequest("limit must not be negative");

  // What state to list: the latest (after waiting as the request says) or
  // exactly the state at `exact`.
  int64_t exact = 0;
  int64_t min_rev = 0;
  std::string start_rel;
  bool from_continue = false;
  if (!opts.continue_token.empty()) {
    if (!opts.resource_version.empty() && opts.resource_version != "0") {
      return InvalidRequest("specifying resource version is not allowed when using continue");
    }
    auto cp = DecodeContinue(opts.continue_token);
    if (!cp.ok()) return cp.status();
    exact = cp->rev;
    start_rel = std::move(cp->start);
    from_continue = true;
  } else if (opts.resource_version.empty()) {
    if (opts.match != ResourceVersionMatch::kUnset) {
      return InvalidRequest("resourceVersionMatch is forbidden unless resourceVersion is provided");
    }
  } else {
    int64_t rv;
    if (!ParseRv(opts.resource_version, &rv)) {
      return InvalidRequest(absl::StrCat("invalid resource version: ", opts.resource_version));
    }
    if (opts.match == ResourceVersionMatch::kExact) {
      if (rv == 0) return InvalidRequest("resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"");
      exact = rv;
    } else {
      min_rev = rv;
    }
  }

  if (!WaitReady(options_.wait_timeout)) return NotReady();
  if (opts.resource_version.empty() && !from_continue) {
    if (auto s = WaitConsistent(); !s.ok()) return s;
  }

  ListResult result;
  TreeSnapshot snap;
  std::vector<ObjectRef> candidates;
  bool indexed = false;
  bool historical = false;  // snap is older than the index
  {
    util::ReaderMutexLock l(&mu_);
    const int64_t need = std::max(exact, min_rev);
    if (need > rev_ && !AwaitRevLocked(need, options_.wait_timeout)) {
      if (stopped_) return CacheStopped();
      return TooLargeResourceVersion(need, rev_);
    }
    if (exact > 0) {
      if (exact < OldestRevLocked()) {
        return from_continue ? ContinueExpired() : TooOldResourceVersion(exact, OldestRevLocked());
      }
      snap = SnapshotAtLocked(exact);
      result.revision = exact;
    } else {
      snap = snapshots_.back().snap;
      result.revision = rev_;
    }
    indexed = IndexCandidatesLocked(*sel, &candidates);
    historical = exact > 0 && exact < snapshots_.back().rev;
    if (indexed && historical) {
      // The index is of the latest state: add every key changed since
      // `exact`, and read each candidate from the snapshot below.
      auto it = std::upper_bound(ring_.begin(), ring_.end(), exact,
                                 [](int64_t r, const auto& ev) { return r < ev->rev; });
      const size_t changed = ring_.end() - it;
      if (changed > snap.size() / 4 + 64) {
        indexed = false;  // scanning the snapshot is cheaper
      } else {
        for (; it != ring_.end(); ++it) candidates.push_back((*it)->object ? (*it)->object : (*it)->prev);
      }
    }
  }

  const std::string start = from_continue ? absl::StrCat(opts.prefix, start_rel) : opts.prefix;
  const std::string end = PrefixEnd(opts.prefix);
  const size_t want = opts.limit > 0 ? static_cast<size_t>(opts.limit) + 1 : SIZE_MAX;
  if (indexed) {
    std::sort(candidates.begin(), candidates.end(),
              [](const ObjectRef& a, const ObjectRef& b) { return a->key() < b->key(); });
    std::string_view prev_key;  // its object stays alive in candidates or result
    for (size_t i = 0; i < candidates.size() && result.objects.size() < want; ++i) {
      std::string_view key = candidates[i]->key();
      if (i > 0 && prev_key == key) continue;
      prev_key = key;
      if (key < start || (!end.empty() && key >= end)) continue;
      if (!historical) {
        // Taken from the index under the same lock as snap: the object itself.
        if (sel->Matches(*candidates[i])) result.objects.push_back(std::move(candidates[i]));
        continue;
      }
      const CachedObject* o = snap.Find(key);
      if (o != nullptr && sel->Matches(*o)) result.objects.push_back(ObjectRef::Share(o));
    }
  } else {
    snap.Scan(start, end, [&](const ObjectRef& o) {
      if (sel->Matches(*o)) result.objects.push_back(o);
      return result.objects.size() < want;
    });
  }
  if (result.objects.size() == want && opts.limit > 0) {
    result.objects.pop_back();
    const std::string_view last = result.objects.back()->key();
    std::string next(last.substr(opts.prefix.size()));
    next.push_back('\0');
    result.continue_token = EncodeContinue(result.revision, next);
    if (sel->empty()) {
      result.remaining_item_count =
          static_cast<int64_t>(snap.Count(absl::StrCat(opts.prefix, next), end));
    }
  }
  return result;
}

}  // namespace capstan::watchcache
