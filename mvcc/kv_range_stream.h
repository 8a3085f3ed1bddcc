// RangeStream (etcd 3.7): a Range read in chunks at one pinned revision.
//
// etcd 3.7 serves KV.RangeStream (server/etcdserver/v3_server.go
// rangeStream) as a loop of ordinary Ranges: the first at the request's
// revision (0: the current one) pins the revision for the rest; each next
// chunk starts after the last key sent; the chunk's key limit starts at 10
// and doubles while a chunk's encoded RangeResponse is under half of
// --max-request-bytes and halves while it is over twice that (never below
// one key). Header, more and count go on the last chunk only, so that
// merging the chunks gives the RangeResponse Range would. Each chunk is a
// read of its own: a compaction past the pinned revision between two chunks
// ends the stream with ErrCompacted, and nothing holds the store between
// chunks.
//
// RangeChunkLimiter is that sizing rule, shared by every source of chunks
// (the store here, the watch cache in server/api); RangeStreamReader reads
// the chunks from a KvStore.

#ifndef CAPSTAN_MVCC_KV_RANGE_STREAM_H_
#define CAPSTAN_MVCC_KV_RANGE_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "etcdserverpb/rpc.pb.h"
#include "mvcc/kv_codec.h"
#include "mvcc/kv_store.h"

namespace capstan::mvcc {

// Why RangeStream refuses a request that Range would serve (etcd 3.7
// v3rpc checkRangeStreamRequest): a sort order other than none or
// ascending by key, and min/max revision filters. Empty when it is served.
// REQUIRES: ValidateRange(req) is OK.
std::string RangeStreamUnsupported(const etcdserverpb::RangeRequest& req);

// The size etcd measures a chunk by: proto.Size of the RangeResponse its
// Range returned (header with the store's revision only, the kvs, more, and
// count = the keys it fetched, at most the limit plus one).
size_t EtcdChunkSize(int64_t store_rev, size_t kvs_bytes, bool more, int64_t fetched);

// The key limit of each chunk of a RangeStream. Not thread-safe.
class RangeChunkLimiter {
 public:
  static constexpr int64_t kInitialLimit = 10;

  // request_limit: the request's limit (0: none; negative: one chunk of
  // everything, as etcd's loop does). target_bytes: --max-request-bytes.
  RangeChunkLimiter(int64_t request_limit, int64_t target_bytes);

  // The next chunk's key limit; <= 0 means no limit.
  int64_t limit() const { return limit_; }
  // Records a chunk of `size` bytes (EtcdChunkSize) that returned n keys
  // and whether more keys followed it; true if it was the last chunk.
  bool Advance(size_t size, int64_t n, bool more);
  // Keys sent so far.
  int64_t sent() const { return sent_; }

 private:
  const int64_t total_;  // the request's limit; INT64_MAX for none
  const int64_t target_;
  int64_t limit_;
  int64_t sent_ = 0;
};

// What a chunk carries besides its kvs.
struct RangeStreamChunk {
  int64_t num_kvs = 0;
  bool last = false;
  // Set on the last chunk only: the store's revision when the stream began,
  // more and count as Range would answer.
  int64_t header_rev = 0;
  bool more = false;
  int64_t count = 0;
};

// Reads a RangeStream's chunks from a store. Holds nothing of the store
// between calls (each chunk takes the published view and drops it).
// Thread-compatible: one call at a time. store must outlive it.
class RangeStreamReader {
 public:
  // REQUIRES: ValidateRange(req) is OK and RangeStreamUnsupported(req) is
  // empty. count_only answers in one chunk.
  RangeStreamReader(const KvStore* store, etcdserverpb::RangeRequest req);

  // Writes the next chunk's kvs to *kvs, each as field 2 of a RangeResponse
  // (the stored record, its value dropped with keys_only), and fills
  // *chunk. Errors: ErrFutureRev or ErrCompacted for the first chunk as
  // Range; ErrCompacted once a compaction passed the pinned revision.
  // REQUIRES: !done().
  absl::Status Next(ByteSink* kvs, RangeStreamChunk* chunk);

  bool done() const { return done_; }
  // The revision every chunk reads at; 0 before the first chunk.
  int64_t pinned_rev() const { return pinned_; }

 private:
  const KvStore* const store_;
  const etcdserverpb::RangeRequest req_;
  RangeChunkLimiter limiter_;
  std::string next_key_;
  int64_t pinned_ = 0;
  int64_t header_rev_ = 0;
  bool done_ = false;
};

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_KV_RANGE_STREAM_H_
