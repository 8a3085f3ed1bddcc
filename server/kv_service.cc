#include "server/kv_service.h"

#include <memory>
#include <string>
#include <vector>

#include "mvcc/kv_codec.h"
#include "server/auth_service.h"
#include "server/errors.h"
#include "server/grpc_buffers.h"

namespace capstan::server {

grpc::ServerUnaryReactor* KvService::Range(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) {
  auto* reactor = ctx->DefaultReactor();
  std::string bytes;
  etcdserverpb::RangeRequest req;
  if (!FlattenBuffer(*request, &bytes) || !req.ParseFromString(bytes)) {
    reactor->Finish(grpc::Status(grpc::INTERNAL, kUnmarshalError));
    return reactor;
  }
  if (auth_ != nullptr) {
    if (auto s = auth_->CheckRange(*ctx, req); !s.ok()) {
      reactor->Finish(ToGrpcStatus(s));
      return reactor;
    }
  }
  mvcc::RangeResult result;
  if (auto s = store_->Range(req, &result); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }
  // RangeResponse: header (1), kvs (2, already encoded), more (3), count (4).
  etcdserverpb::ResponseHeader header;
  FillHeader(*member_, &header);
  header.set_revision(result.rev);
  std::string wire;
  wire.reserve(result.kvs_wire.size() + 64);
  mvcc::AppendBytesField(1, header.SerializeAsString(), &wire);
  wire.append(result.kvs_wire);
  if (result.more) mvcc::AppendVarintField(3, 1, &wire);
  mvcc::AppendVarintField(4, static_cast<uint64_t>(result.count), &wire);
  result.kvs_wire.clear();
  result.kvs_wire.shrink_to_fit();
  StringToBuffer(std::move(wire), response);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

namespace {

// A write RPC received as bytes: its decoded request and the response, alive
// until the committer is done with the write.
template <typename Request, typename Response>
struct RawWriteCall {
  Request request;
  Response response;
};

}  // namespace

// Writes are raw methods so that a request that does not parse gets Go gRPC's
// INTERNAL "error unmarshalling request" as from etcd: gRPC's callback API
// answers UNIMPLEMENTED with no message when it cannot decode a request.
template <typename Request, typename Response>
grpc::ServerUnaryReactor* KvService::SubmitWrite(
    grpc::CallbackServerContext* ctx, mvcc::WriteRequest::Kind kind, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out,
    absl::Status (AuthGate::*check)(const grpc::ServerContextBase&, const Request&) const) {
  auto* reactor = ctx->DefaultReactor();
  auto call = std::make_unique<RawWriteCall<Request, Response>>();
  std::string bytes;
  if (!FlattenBuffer(*in, &bytes) || !call->request.ParseFromString(bytes)) {
    reactor->Finish(grpc::Status(grpc::INTERNAL, kUnmarshalError));
    return reactor;
  }
  if (auth_ != nullptr) {
    absl::Status s = check != nullptr ? (auth_->*check)(*ctx, call->request)
                                      : auth_->CheckIdentity(*ctx);
    if (!s.ok()) {
      reactor->Finish(ToGrpcStatus(s));
      return reactor;
    }
  }
  auto* c = call.release();
  mvcc::WriteRequest w;
  w.kind = kind;
  w.request = &c->request;
  w.response = &c->response;
  w.done = [c, reactor, out, member = member_](absl::Status s) {
    std::unique_ptr<RawWriteCall<Request, Response>> owned(c);
    if (s.ok()) {
      FillHeader(*member, c->response.mutable_header());
      StringToBuffer(c->response.SerializeAsString(), out);
    }
    reactor->Finish(ToGrpcStatus(s));
  };
  store_->Submit(std::move(w));
  return reactor;
}

grpc::ServerUnaryReactor* KvService::Put(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) {
  return SubmitWrite<etcdserverpb::PutRequest, etcdserverpb::PutResponse>(
      ctx, mvcc::WriteRequest::Kind::kPut, request, response, &AuthGate::CheckPut);
}

grpc::ServerUnaryReactor* KvService::DeleteRange(grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  return SubmitWrite<etcdserverpb::DeleteRangeRequest, etcdserverpb::DeleteRangeResponse>(
      ctx, mvcc::WriteRequest::Kind::kDeleteRange, request, response, &AuthGate::CheckDeleteRange);
}

grpc::ServerUnaryReactor* KvService::Txn(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) {
  return SubmitWrite<etcdserverpb::TxnRequest, etcdserverpb::TxnResponse>(
      ctx, mvcc::WriteRequest::Kind::kTxn, request, response, &AuthGate::CheckTxn);
}

grpc::ServerUnaryReactor* KvService::Compact(grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) {
  // Compaction needs an authenticated user, no key permission.
  return SubmitWrite<etcdserverpb::CompactionRequest, etcdserverpb::CompactionResponse>(
      ctx, mvcc::WriteRequest::Kind::kCompact, request, response, nullptr);
}

}  // namespace capstan::server
