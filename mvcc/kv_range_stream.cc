#include "mvcc/kv_range_stream.h"

#include <algorithm>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mvcc/kv_range.h"
#include "mvcc/revision_key.h"
#include "storage/backend.h"
#include "util/coding.h"
#include "util/go_sort.h"

namespace capstan::mvcc {

using etcdserverpb::RangeRequest;

std::string RangeStreamUnsupported(const RangeRequest& req) {
  const bool default_order =
      req.sort_order() == RangeRequest::NONE ||
      (req.sort_target() == RangeRequest::KEY && req.sort_order() == RangeRequest::ASCEND);
  if (!default_order) return "RangeStream does not support custom sort orders";
  if (req.min_mod_revision() != 0 || req.max_mod_revision() != 0 ||
      req.min_create_revision() != 0 || req.max_create_revision() != 0) {
    return "RangeStream does not support revision filters";
  }
  return "";
}

size_t EtcdChunkSize(int64_t store_rev, size_t kvs_bytes, bool more, int64_t fetched) {
  // ResponseHeader{revision (3)} as field 1, kvs, more (3), count (4).
  size_t header = store_rev != 0 ? 1 + util::VarintSize(static_cast<uint64_t>(store_rev)) : 0;
  size_t size = 1 + util::VarintSize(header) + header + kvs_bytes;
  if (more) size += 2;
  if (fetched != 0) size += 1 + util::VarintSize(static_cast<uint64_t>(fetched));
  return size;
}

RangeChunkLimiter::RangeChunkLimiter(int64_t request_limit, int64_t target_bytes)
    : total_(request_limit == 0 ? std::numeric_limits<int64_t>::max() : request_limit),
      target_(target_bytes),
      limit_(std::min(kInitialLimit, total_)) {}

bool RangeChunkLimiter::Advance(size_t size, int64_t n, bool more) {
  sent_ += n;
  if (!more || sent_ == total_) return true;
  // etcd's adjustChunkLimit: double below half the target, halve above
  // twice it, never below one key; then no further than the request's limit.
  const auto bytes = static_cast<int64_t>(size);
  if (bytes < target_ / 2) {
    limit_ *= 2;
  } else if (bytes > target_ * 2) {
    limit_ /= 2;
  }
  if (limit_ == 0) limit_ = 1;
  limit_ = std::min(limit_, total_ - sent_);
  return false;
}

RangeStreamReader::RangeStreamReader(const KvStore* store, RangeRequest req)
    : store_(store),
      req_(std::move(req)),
      limiter_(req_.limit(), store->options().max_request_bytes),
      next_key_(req_.key()) {}

namespace {

// Visits the stored records at revs in order, as KvStore reads a Range's:
// one walk through the key family when the revisions lie close together,
// else one lookup each. REQUIRES: a view at or above a compaction that
// keeps revs is held.
absl::Status VisitStored(const storage::Backend& backend, const std::vector<Revision>& revs,
                         absl::FunctionRef<void(size_t i, std::string_view record)> visit) {
  if (revs.empty()) return absl::OkStatus();
  std::vector<std::string> keys;
  keys.reserve(revs.size());
  for (const auto& r : revs) keys.push_back(RevisionKey(r));
  std::vector<std::string_view> views(keys.begin(), keys.end());
  constexpr int64_t kScanDensity = 4;
  auto [lo, hi] = std::minmax_element(
      revs.begin(), revs.end(), [](const Revision& a, const Revision& b) { return a.main < b.main; });
  const bool dense =
      revs.size() >= 2 && (hi->main - lo->main + 1) <= kScanDensity * static_cast<int64_t>(revs.size());
  auto s = dense ? backend.ScanVisit(storage::Cf::kKey, views, visit)
                 : backend.MultiGetVisit(storage::Cf::kKey, views, visit);
  if (!s.ok()) {
    return absl::InternalError(absl::StrCat("a record of revisions ", lo->main, " to ", hi->main,
                                            " is missing from storage: ", s.ToString()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RangeStreamReader::Next(ByteSink* kvs, RangeStreamChunk* chunk) {
  *chunk = RangeStreamChunk();
  // A view of its own for each chunk: held while the chunk is read, so a
  // compaction scheduled meanwhile waits for it, and dropped after.
  std::shared_ptr<const ReadView> view = store_->View();
  const bool first = pinned_ == 0;
  int64_t rev = 0;
  if (auto s = ResolveReadRevision(first ? req_.revision() : pinned_, view->rev,
                                   view->compact_rev, &rev);
      !s.ok()) {
    done_ = true;
    return s;
  }
  if (first) {
    pinned_ = rev;
    header_rev_ = view->rev;
  }
  const std::string& end = req_.range_end();
  if (req_.count_only()) {
    done_ = true;
    chunk->last = true;
    chunk->header_rev = header_rev_;
    chunk->count = view->index.Count(next_key_, end, rev);
    return absl::OkStatus();
  }

  // The keys of this chunk, one more than the limit to tell whether more
  // follow (etcd's Range fetches limit + 1).
  const int64_t limit = limiter_.limit();
  const size_t fetch =
      limit > 0 ? static_cast<size_t>(limit) + 1 : std::numeric_limits<size_t>::max();
  std::vector<std::string> keys;
  std::vector<index::RangeHit> hits;
  view->index.Range(next_key_, end, rev, [&](std::string_view key, const index::RangeHit& hit) {
    keys.emplace_back(key);
    hits.push_back(hit);
    return keys.size() < fetch;
  });
  const auto fetched = static_cast<int64_t>(keys.size());
  const bool more = limit > 0 && fetched > limit;
  const size_t n = more ? static_cast<size_t>(limit) : keys.size();

  size_t kvs_bytes = 0;
  auto emit = [&](std::string_view record) {
    std::string field;
    AppendRecordField(2, record, req_.keys_only(), &field);
    kvs_bytes += field.size();
    kvs->Append(field);
  };
  // The order the chunk goes out in: key order, or, for a sort target other
  // than the key with no order, ascending by that target over the keys
  // fetched (limit + 1) before the cut, as etcd's Range sorts them.
  std::vector<size_t> order(keys.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const RangeRequest::SortTarget target = req_.sort_target();
  if (target == RangeRequest::KEY) {
    std::vector<Revision> revs(n);
    for (size_t i = 0; i < n; ++i) revs[i] = hits[i].modified;
    if (auto s = VisitStored(*store_->backend(), revs,
                             [&](size_t, std::string_view record) { emit(record); });
        !s.ok()) {
      done_ = true;
      return s;
    }
  } else {
    std::vector<Revision> revs(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) revs[i] = hits[i].modified;
    std::vector<std::string> records(keys.size());
    if (auto s = VisitStored(*store_->backend(), revs,
                             [&](size_t i, std::string_view record) { records[i].assign(record); });
        !s.ok()) {
      done_ = true;
      return s;
    }
    std::vector<KeyValueView> decoded(records.size());
    for (size_t i = 0; i < records.size(); ++i) {
      if (!DecodeKeyValue(records[i], &decoded[i])) {
        done_ = true;
        return absl::DataLossError("stored record is not a KeyValue");
      }
    }
    auto less = [&](size_t a, size_t b) { return SortsBefore(target, decoded[a], decoded[b]); };
    util::GoSort(
        static_cast<int>(order.size()), [&](int i, int j) { return less(order[i], order[j]); },
        [&](int i, int j) { std::swap(order[i], order[j]); });
    for (size_t i = 0; i < n; ++i) emit(records[order[i]]);
  }
  chunk->num_kvs = static_cast<int64_t>(n);
  if (n > 0) next_key_ = keys[order[n - 1]] + std::string(1, '\0');

  const size_t size = EtcdChunkSize(view->rev, kvs_bytes, more, fetched);
  if (!limiter_.Advance(size, static_cast<int64_t>(n), more)) return absl::OkStatus();
  done_ = true;
  chunk->last = true;
  chunk->header_rev = header_rev_;
  chunk->more = more;
  chunk->count = limiter_.sent();
  // Stopped at the request's limit: the keys after it count too, at the
  // pinned revision.
  if (more) chunk->count += view->index.Count(next_key_, end, rev);
  return absl::OkStatus();
}

}  // namespace capstan::mvcc
