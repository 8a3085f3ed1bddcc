#include "server/api/cache_range.h"

#include <string>
#include <utility>

#include "mvcc/kv_codec.h"
#include "mvcc/kv_range.h"
#include "mvcc/revision_key.h"
#include "server/api/cache_service.h"
#include "storage/backend.h"

namespace capstan::server {

using etcdserverpb::RangeRequest;

bool CacheRange::TryServeRange(const RangeRequest& req, grpc::ByteBuffer* response) {
  CachedRange r;
  if (!TryRange(req, &r)) return false;
  Encode(r, req.keys_only(), response);
  return true;
}

bool CacheRange::TryRange(const RangeRequest& req, CachedRange* out) {
  if (req.key().empty()) return false;
  // Ranges outside the cached prefixes are the store's, and not counted.
  const std::string& start = req.key();
  watchcache::ResourceCache* rc = cache_->ResourceFor(start);
  if (rc == nullptr) return false;
  auto decline = [this] {
    declined_.fetch_add(1, std::memory_order_relaxed);
    return false;
  };
  const bool filtered = req.min_mod_revision() != 0 || req.max_mod_revision() != 0 ||
                        req.min_create_revision() != 0 || req.max_create_revision() != 0;
  const bool key_order = req.sort_target() == RangeRequest::KEY &&
                         (req.sort_order() == RangeRequest::NONE || req.sort_order() == RangeRequest::ASCEND);
  if (filtered || !key_order) return decline();

  // [start, end): a single key is [key, key + "\0").
  std::string end = req.range_end();
  if (end.empty()) end = start + std::string(1, '\0');
  const std::string prefix_end = watchcache::PrefixEnd(rc->spec().prefix);
  // "\0" (from key) and ranges past the prefix are not all cached.
  if (mvcc::IsFromKey(req.range_end()) || prefix_end.empty() || end > prefix_end || start >= end) {
    return decline();
  }

  // The revision the store would read, from its published view (held until
  // the answer is built, so compaction leaves its log alone meanwhile).
  std::shared_ptr<const mvcc::ReadView> view = store_->View();
  const int64_t at = req.revision() > 0 ? req.revision() : view->rev;
  if (at > view->rev || at < view->compact_rev) return decline();  // the store's errors
  int64_t cache_rev = 0;
  std::optional<watchcache::TreeSnapshot> snap = rc->SnapshotAt(at, &cache_rev);
  if (!snap) {
    // Behind: the cache's latest state answers if the range did not change
    // since, by the store's log.
    if (cache_rev >= at || cache_rev < view->compact_rev || at - cache_rev > kMaxLagRevisions) {
      return decline();
    }
    snap = rc->SnapshotAt(cache_rev);
    if (!snap || ChangedBetween(cache_rev, at, start, end)) return decline();
  }

  out->header_rev = view->rev;
  out->count = static_cast<int64_t>(snap->Count(start, end));
  out->more = false;
  out->objects.clear();
  if (!req.count_only()) {
    const int64_t limit = req.limit() > 0 ? req.limit() : 0;
    out->more = limit > 0 && out->count > limit;
    const size_t want = out->more ? static_cast<size_t>(limit) : static_cast<size_t>(out->count);
    out->objects.reserve(want);
    snap->Scan(start, end, [&](const watchcache::ObjectRef& o) {
      out->objects.push_back(o);
      return out->objects.size() < want;
    });
  }
  served_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

bool CacheRange::ChangedBetween(int64_t from, int64_t to, const std::string& start,
                                const std::string& end) const {
  auto it = store_->backend()->NewIterator(storage::Cf::kKey);
  const std::string stop = mvcc::RevisionKey(mvcc::Revision{to + 1, 0});
  for (it->Seek(mvcc::RevisionKey(mvcc::Revision{from + 1, 0})); it->Valid() && it->key() < stop; it->Next()) {
    mvcc::KeyValueView kv;
    // An unreadable record: assume it changed the range.
    if (!mvcc::DecodeKeyValue(it->value(), &kv)) return true;
    if (kv.key >= start && kv.key < end) return true;
  }
  return false;
}

void CacheRange::Encode(const CachedRange& r, bool keys_only, grpc::ByteBuffer* response) const {
  // RangeResponse: header (1), kvs (2), more (3), count (4).
  etcdserverpb::ResponseHeader header;
  membership::FillHeader(*member_, &header);
  header.set_revision(r.header_rev);
  ResponseSlices b;
  util::AppendBytesField(1, header.SerializeAsString(), b.bytes());
  for (const auto& o : r.objects) {
    if (keys_only) {
      mvcc::AppendRecordField(2, o->kv(), /*strip_value=*/true, b.bytes());
      continue;
    }
    util::AppendTag(2, 2, b.bytes());
    util::AppendVarint(o->kv().size(), b.bytes());
    b.AppendObject(o.get());
  }
  if (r.more) util::AppendVarintField(3, 1, b.bytes());
  util::AppendVarintField(4, static_cast<uint64_t>(r.count), b.bytes());
  b.Finish(response);
}

}  // namespace capstan::server
