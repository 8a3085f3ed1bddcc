// CacheRange: serves etcd Range requests on cached prefixes from the watch
// cache, with results identical to the store's (same kvs, count, more and
// header revision), and declines the rest so that the store serves them.
//
// A request is served from the cache when:
//  - [key, range_end) (a single key, or a range) lies inside one cached
//    resource prefix;
//  - it has no revision filters (min/max mod/create revision) and sorts by
//    key ascending or not at all (any limit, count_only, keys_only);
//  - the store could answer it (its revision is neither compacted nor in
//    the future), and the cache holds the state at that revision: either
//    exactly (its history reaches it), or the cache is behind by at most
//    kMaxLagRevisions and the store's log shows no change inside the
//    requested range between the cache's revision and the one requested.
// The header revision is the store's revision when the request arrived, as
// the store's own Range reports. Records are sent from the cached blocks
// without copying (except with keys_only, which drops each value).
//
// Why it is faster: the store's Range walks its key index and reads every
// record from RocksDB; the cache holds the records in memory in key order,
// counts a range in O(log n) and lists it without any read.
//
// Thread-safe. store, cache and member must outlive it, and the gRPC server
// must be shut down before the cache is destroyed (responses reference
// cached blocks).

#ifndef CAPSTAN_SERVER_API_CACHE_RANGE_H_
#define CAPSTAN_SERVER_API_CACHE_RANGE_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "etcdserverpb/rpc.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "membership/member.h"
#include "mvcc/kv_store.h"
#include "watchcache/cache.h"

namespace capstan::server {

// A Range answered from the cache, before encoding.
struct CachedRange {
  int64_t header_rev = 0;
  int64_t count = 0;
  bool more = false;
  std::vector<watchcache::ObjectRef> objects;  // in key order
};

class CacheRange {
 public:
  // How far the cache may be behind the requested revision and still answer
  // (after checking the store's log for changes in the range).
  static constexpr int64_t kMaxLagRevisions = 256;

  CacheRange(mvcc::KvStore* store, watchcache::Cache* cache, const membership::MemberInfo* member)
      : store_(store), cache_(cache), member_(member) {}

  // Answers req from the cache: fills *response with the encoded
  // RangeResponse and returns true; false (response untouched) when the
  // store must serve it.
  bool TryServeRange(const etcdserverpb::RangeRequest& req, grpc::ByteBuffer* response);

  // The cache's answer to req, if it can give one (as above).
  bool TryRange(const etcdserverpb::RangeRequest& req, CachedRange* out);
  // The encoded RangeResponse for r.
  void Encode(const CachedRange& r, bool keys_only, grpc::ByteBuffer* response) const;

  // Ranges whose key lies in a cached prefix: answered here, or left to the
  // store.
  uint64_t served() const { return served_.load(std::memory_order_relaxed); }
  uint64_t declined() const { return declined_.load(std::memory_order_relaxed); }

 private:
  // True if any key in [start, end) changed at a revision in (from, to]
  // according to the store's log. REQUIRES: view (held by the caller) has
  // compact_rev <= from.
  bool ChangedBetween(int64_t from, int64_t to, const std::string& start, const std::string& end) const;

  mvcc::KvStore* const store_;
  watchcache::Cache* const cache_;
  const membership::MemberInfo* const member_;
  std::atomic<uint64_t> served_{0}, declined_{0};
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_CACHE_RANGE_H_
