// KV.RangeStream (etcd 3.7): a Range sent as a stream of chunks at one
// pinned revision (mvcc/kv_range_stream.h has the semantics, and
// docs/COMPATIBILITY.md "RangeStream" their sources).
//
// Each chunk is read on the bulk-read threads (server/api/bulk_reads.h), one
// chunk per task, so a stream never holds a bulk thread while its client is
// slow: at most kQueuedChunks chunks wait for the client beside the one gRPC
// is writing, and the next chunk is read only once one of them has been
// written. A cancelled or broken stream drops its queued chunks at once and
// its reader when the chunk being read (if any) is done. Ranges on the
// prefixes the watch cache holds are served from it (server/api/cache_range.h),
// chunked and sized exactly as from the store.

#ifndef CAPSTAN_SERVER_API_RANGE_STREAM_H_
#define CAPSTAN_SERVER_API_RANGE_STREAM_H_

#include <cstdint>

#include "etcdserverpb/rpc.pb.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "membership/member.h"
#include "mvcc/kv_store.h"

namespace capstan::server {

class BulkReads;
class CacheRange;

// The RangeStreams of this process, for tests and metrics.
struct RangeStreamStats {
  int64_t active = 0;           // calls not yet done
  int64_t buffered_chunks = 0;  // read, not yet written to gRPC (queued or in flight)
  int64_t buffered_bytes = 0;   // their bytes
  uint64_t started = 0;         // calls since the process started
  uint64_t chunks = 0;          // chunks read since the process started
};
RangeStreamStats GetRangeStreamStats();

// Chunks a stream reads ahead of the one being written.
inline constexpr int kQueuedChunks = 2;

// Serves one RangeStream call for req, which passed the request checks and
// the permission check. bulk and cache may be null (read on the calling
// thread; nothing from the cache). store, member, bulk and cache must
// outlive the call. Deletes itself when done.
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewRangeStreamReactor(
    mvcc::KvStore* store, const membership::MemberInfo* member, BulkReads* bulk,
    CacheRange* cache, etcdserverpb::RangeRequest req);

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_RANGE_STREAM_H_
