#include "server/kv_service.h"

#include <string>
#include <vector>

#include "mvcc/kv_codec.h"
#include "server/auth_service.h"
#include "server/errors.h"
#include "server/grpc_buffers.h"
#include "server/write_rpc.h"

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
  if (cache_range_ != nullptr && cache_range_->TryServeRange(req, response)) {
    reactor->Finish(grpc::Status::OK);
    return reactor;
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

template <typename Response>
grpc::ServerUnaryReactor* KvService::SubmitWrite(grpc::CallbackServerContext* ctx,
                                                 mvcc::WriteRequest::Kind kind,
                                                 const google::protobuf::Message* request,
                                                 Response* response) {
  auto* reactor = ctx->DefaultReactor();
  SubmitAndFinish(store_, member_, reactor, kind, request, response);
  return reactor;
}

grpc::ServerUnaryReactor* KvService::Put(grpc::CallbackServerContext* ctx,
                                         const etcdserverpb::PutRequest* request,
                                         etcdserverpb::PutResponse* response) {
  if (auth_ != nullptr) {
    if (auto s = auth_->CheckPut(*ctx, *request); !s.ok()) {
      auto* reactor = ctx->DefaultReactor();
      reactor->Finish(ToGrpcStatus(s));
      return reactor;
    }
  }
  return SubmitWrite(ctx, mvcc::WriteRequest::Kind::kPut, request, response);
}

grpc::ServerUnaryReactor* KvService::DeleteRange(grpc::CallbackServerContext* ctx,
                                                 const etcdserverpb::DeleteRangeRequest* request,
                                                 etcdserverpb::DeleteRangeResponse* response) {
  if (auth_ != nullptr) {
    if (auto s = auth_->CheckDeleteRange(*ctx, *request); !s.ok()) {
      auto* reactor = ctx->DefaultReactor();
      reactor->Finish(ToGrpcStatus(s));
      return reactor;
    }
  }
  return SubmitWrite(ctx, mvcc::WriteRequest::Kind::kDeleteRange, request, response);
}

grpc::ServerUnaryReactor* KvService::Txn(grpc::CallbackServerContext* ctx,
                                         const etcdserverpb::TxnRequest* request,
                                         etcdserverpb::TxnResponse* response) {
  if (auth_ != nullptr) {
    if (auto s = auth_->CheckTxn(*ctx, *request); !s.ok()) {
      auto* reactor = ctx->DefaultReactor();
      reactor->Finish(ToGrpcStatus(s));
      return reactor;
    }
  }
  return SubmitWrite(ctx, mvcc::WriteRequest::Kind::kTxn, request, response);
}

grpc::ServerUnaryReactor* KvService::Compact(grpc::CallbackServerContext* ctx,
                                             const etcdserverpb::CompactionRequest* request,
                                             etcdserverpb::CompactionResponse* response) {
  if (auth_ != nullptr) {
    if (auto s = auth_->CheckIdentity(*ctx); !s.ok()) {
      auto* reactor = ctx->DefaultReactor();
      reactor->Finish(ToGrpcStatus(s));
      return reactor;
    }
  }
  return SubmitWrite(ctx, mvcc::WriteRequest::Kind::kCompact, request, response);
}

}  // namespace capstan::server
