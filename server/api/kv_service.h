// etcdserverpb.KV over the gRPC callback API.
//
// Range is served raw: the request is parsed here and the response is
// assembled from the stored KeyValue bytes (mvcc::RangeResult::kvs_wire)
// without building a RangeResponse message. A Range that may return more
// than a thousand keys runs on the bulk-read threads (server/api/bulk_reads.h),
// at a lower CPU priority and within their memory bound; the rest run on
// gRPC's thread. Writes are submitted to the KV
// store's committer and answered from its completion callback, after the
// write is durable; no thread waits on them. RangeStream (etcd 3.7) sends a
// Range in chunks (server/api/range_stream.h).

#ifndef CAPSTAN_SERVER_API_KV_SERVICE_H_
#define CAPSTAN_SERVER_API_KV_SERVICE_H_

#include <chrono>
#include <memory>
#include <type_traits>

#include "etcdserverpb/rpc.grpc.pb.h"
#include "membership/member.h"
#include "mvcc/kv_store.h"
#include "server/api/cache_range.h"
#include "server/api/counted_call.h"

namespace capstan::server {
class AuthGate;
class BulkReads;
}  // namespace capstan::server

namespace capstan::server {

// Every method is raw (bytes in, bytes out): requests that do not parse get
// etcd's answer, not gRPC's UNIMPLEMENTED (kv_service.cc).
using KvServiceBase = etcdserverpb::KV::WithRawCallbackMethod_Range<
    etcdserverpb::KV::WithRawCallbackMethod_RangeStream<
        etcdserverpb::KV::WithRawCallbackMethod_Put<etcdserverpb::KV::WithRawCallbackMethod_DeleteRange<
            etcdserverpb::KV::WithRawCallbackMethod_Txn<
                etcdserverpb::KV::WithRawCallbackMethod_Compact<etcdserverpb::KV::Service>>>>>>;

class KvService final : public KvServiceBase {
 public:
  // auth: permission checks (null: none). bulk: where big Ranges run (null:
  // on gRPC's thread). Both must outlive the service.
  KvService(mvcc::KvStore* store, const membership::MemberInfo* member, const AuthGate* auth = nullptr,
            BulkReads* bulk = nullptr)
      : store_(store), member_(member), auth_(auth), bulk_(bulk) {}

  // Ranges on cached prefixes are answered from the watch cache when it can
  // (server/api/cache_range.h). Call before serving.
  void ServeCachedRanges(std::unique_ptr<CacheRange> r) { cache_range_ = std::move(r); }

  // Range, Put, DeleteRange, Txn and Compact count their calls into counter
  // themselves (server/api/counted_call.h). Call before serving; counter
  // must outlive the service.
  void CountCalls(CallCounter* counter);

  grpc::ServerUnaryReactor* Range(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  // etcd 3.7's streamed Range (server/api/range_stream.h): refused as etcd
  // refuses it (sort orders other than by key ascending, revision filters:
  // Unimplemented), checked as Range, then read in chunks on the bulk-read
  // threads or from the watch cache.
  grpc::ServerWriteReactor<grpc::ByteBuffer>* RangeStream(grpc::CallbackServerContext* ctx,
                                                          const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Put(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DeleteRange(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Txn(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Compact(grpc::CallbackServerContext* ctx,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;

 private:
  // Reads the range and finishes the RPC with its response. A big range
  // (on a bulk-read thread) is built into the bulk reads' reusable blocks.
  void ServeRange(const etcdserverpb::RangeRequest& req, grpc::ByteBuffer* response,
                  CountedUnary* reactor, bool big, std::chrono::steady_clock::time_point start);
  // A Range's answer is ready, `start` being when it arrived: counts its
  // bytes, and warns of it (etcd's "apply request took too long", prefix
  // "read-only range ") and counts it slow past --warning-apply-duration.
  void Answered(const etcdserverpb::RangeRequest& req, const grpc::ByteBuffer& response,
                std::chrono::steady_clock::time_point start);

  // Decodes a write request, checks it with `check` (null: an authenticated
  // user is enough) when auth is on, submits it and finishes the RPC with the
  // encoded response when the committer is done with it. Op is the write's
  // kind (mvcc/write_request.h).
  template <typename Op,
            typename Request = std::remove_const_t<std::remove_pointer_t<decltype(Op::request)>>,
            typename Response = std::remove_pointer_t<decltype(Op::response)>>
  grpc::ServerUnaryReactor* SubmitWrite(
      const CountedMethod& counted, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
      grpc::ByteBuffer* out,
      std::type_identity_t<absl::Status (AuthGate::*)(const grpc::ServerContextBase&,
                                                      const Request&) const> check);

  mvcc::KvStore* const store_;
  const membership::MemberInfo* const member_;
  const AuthGate* const auth_;
  BulkReads* const bulk_;
  std::unique_ptr<CacheRange> cache_range_;
  CountedMethod range_calls_;
  CountedMethod put_calls_;
  CountedMethod delete_range_calls_;
  CountedMethod txn_calls_;
  CountedMethod compact_calls_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_KV_SERVICE_H_
