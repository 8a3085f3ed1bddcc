#include "server/kv_service.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mvcc/kv_codec.h"
#include "server/auth_service.h"
#include "server/bulk_reads.h"
#include "server/errors.h"
#include "server/grpc_buffers.h"
#include "server/write_rpc.h"

namespace capstan::server {

namespace {

// A Range that may visit more keys than this runs on the bulk threads.
constexpr int64_t kBulkRangeKeys = 1000;

// Whether req may return many keys: decided from the current index, which
// stops counting at the threshold, so the check costs little.
bool IsBulkRange(const mvcc::KvStore& store, const etcdserverpb::RangeRequest& req) {
  if (req.range_end().empty() || req.count_only()) return false;
  if (req.limit() > 0 && req.limit() <= kBulkRangeKeys) return false;
  auto view = store.View();
  return view->index.Count(req.key(), req.range_end(), view->rev, kBulkRangeKeys + 1) >
         kBulkRangeKeys;
}

}  // namespace

grpc::ServerUnaryReactor* KvService::Range(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) {
  auto* reactor = ctx->DefaultReactor();
  std::string bytes;
  auto req = std::make_shared<etcdserverpb::RangeRequest>();
  if (!FlattenBuffer(*request, &bytes) || !req->ParseFromString(bytes)) {
    reactor->Finish(grpc::Status(grpc::INTERNAL, kUnmarshalError));
    return reactor;
  }
  if (auth_ != nullptr) {
    if (auto s = auth_->CheckRange(*ctx, *req); !s.ok()) {
      reactor->Finish(ToGrpcStatus(s));
      return reactor;
    }
  }
  if (cache_range_ != nullptr && cache_range_->TryServeRange(*req, response)) {
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  if (bulk_ != nullptr && IsBulkRange(*store_, *req)) {
    bulk_->Run([this, req, response, reactor] { ServeRange(*req, response, reactor); });
  } else {
    ServeRange(*req, response, reactor);
  }
  return reactor;
}

void KvService::ServeRange(const etcdserverpb::RangeRequest& req, grpc::ByteBuffer* response,
                           grpc::ServerUnaryReactor* reactor) {
  mvcc::RangeResult result;
  if (auto s = store_->Range(req, &result); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return;
  }
  // RangeResponse: header (1), kvs (2, already encoded), more (3), count
  // (4), sent as three slices so the kvs are never copied again.
  etcdserverpb::ResponseHeader header;
  FillHeader(*member_, &header);
  header.set_revision(result.rev);
  std::vector<std::string> parts(3);
  mvcc::AppendBytesField(1, header.SerializeAsString(), &parts[0]);
  parts[1] = std::move(result.kvs_wire);
  if (result.more) mvcc::AppendVarintField(3, 1, &parts[2]);
  mvcc::AppendVarintField(4, static_cast<uint64_t>(result.count), &parts[2]);
  if (bulk_ != nullptr) {
    bulk_->Hold(std::move(parts), response);
  } else {
    PartsToBuffer(std::move(parts), response);
  }
  reactor->Finish(grpc::Status::OK);
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
