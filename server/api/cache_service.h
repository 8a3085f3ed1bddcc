// capstan.v1.Cache over the gRPC callback API: the Kubernetes watch cache
// (watchcache/cache.h) as List and Watch RPCs.
//
// Both methods are raw: requests are parsed here and responses are
// assembled from the cached mvccpb.KeyValue records without re-encoding;
// records of 512 bytes or more are not even copied (the response's slices
// reference the cached blocks, holding a reference until gRPC has sent
// them).
//
// A List or a Watch start may wait (up to the cache's wait_timeout) for the
// cache to reach a revision; that waiting runs on the service's own small
// thread pool, never on a gRPC thread. A Watch stream has one write in
// flight; the cache's notify function starts the next write when events
// arrive while the stream is idle.
//
// Thread-safe. cache and member must outlive the service, and the gRPC
// server must be shut down (every call finished) before the cache is
// destroyed, because responses in flight reference cached objects.

#ifndef CAPSTAN_SERVER_API_CACHE_SERVICE_H_
#define CAPSTAN_SERVER_API_CACHE_SERVICE_H_

#include <functional>
#include <string>
#include <vector>

#include "capstan/v1/cache.grpc.pb.h"
#include "membership/member.h"
#include "util/work_queue.h"
#include "watchcache/cache.h"

namespace capstan::server {

class AuthGate;

// Builds a response as slices: small pieces are copied into one pending
// run, cached records of 512 bytes or more are referenced (the slice holds
// a reference on the block until gRPC has sent it). Not thread-safe.
class ResponseSlices {
 public:
  // Bytes appended here precede the next AppendObject.
  std::string* bytes() { return &pending_; }
  // Appends o's KeyValue record (without a field header).
  void AppendObject(const watchcache::CachedObject* o);
  // Moves what was built into *out and starts over.
  void Finish(grpc::ByteBuffer* out);

 private:
  void Flush();
  std::string pending_;
  std::vector<grpc::Slice> slices_;
};

using CacheServiceBase = capstan::v1::Cache::WithRawCallbackMethod_List<
    capstan::v1::Cache::WithRawCallbackMethod_Watch<capstan::v1::Cache::Service>>;

class CacheService final : public CacheServiceBase {
 public:
  // auth may be null (no checks); else List and Watch need read permission
  // on the requested prefix, as an etcd Range or Watch of it would.
  CacheService(watchcache::Cache* cache, const membership::MemberInfo* member, int threads = 4,
               const AuthGate* auth = nullptr);
  // Runs the work already queued, then stops the pool.
  ~CacheService() override = default;

  grpc::ServerUnaryReactor* List(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Watch(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* request) override;

  // Runs fn on the service's pool (for work that may wait).
  void Run(std::function<void()> fn) { work_.Run(std::move(fn)); }

  watchcache::Cache* cache() const { return cache_; }
  const membership::MemberInfo* member() const { return member_; }

 private:
  // Read permission on [prefix, prefix end) for the caller.
  absl::Status CheckPrefix(const grpc::ServerContextBase& ctx, const std::string& prefix) const;

  watchcache::Cache* const cache_;
  const membership::MemberInfo* const member_;
  const AuthGate* const auth_;
  util::WorkQueue work_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_CACHE_SERVICE_H_
