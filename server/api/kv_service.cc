#include "server/api/kv_service.h"

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "mvcc/kv_codec.h"
#include "mvcc/kv_range.h"
#include "mvcc/kv_range_stream.h"
#include "mvcc/kv_store.h"
#include "server/api/auth_service.h"
#include "server/api/bulk_reads.h"
#include "server/api/client_traffic.h"
#include "server/api/errors.h"
#include "server/api/go_unmarshal.h"
#include "server/api/grpc_buffers.h"
#include "server/api/range_stream.h"
#include "spdlog/spdlog.h"

namespace capstan::server {

namespace {

// A Range that may visit more keys than this runs on the bulk threads.
constexpr int64_t kBulkRangeKeys = 1000;

// A Range answer of at most this many bytes is copied into one slice.
constexpr size_t kCopiedResponseBytes = 4096;

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

void KvService::CountCalls(CallCounter* counter) {
  using Type = grpc::internal::RpcMethod::RpcType;
  range_calls_.Count(counter, "/etcdserverpb.KV/Range", Type::NORMAL_RPC);
  put_calls_.Count(counter, "/etcdserverpb.KV/Put", Type::NORMAL_RPC);
  delete_range_calls_.Count(counter, "/etcdserverpb.KV/DeleteRange", Type::NORMAL_RPC);
  txn_calls_.Count(counter, "/etcdserverpb.KV/Txn", Type::NORMAL_RPC);
  compact_calls_.Count(counter, "/etcdserverpb.KV/Compact", Type::NORMAL_RPC);
}

grpc::ServerUnaryReactor* KvService::Range(grpc::CallbackServerContext* ctx,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) {
  const auto start = std::chrono::steady_clock::now();
  auto* reactor = new CountedUnary(range_calls_);
  auto req = std::make_shared<etcdserverpb::RangeRequest>();
  if (std::string error = DecodeReceived(*request, req.get()); !error.empty()) {
    reactor->Finish(UnmarshalStatus(error));
    return reactor->reactor();
  }
  if (!req->serializable()) {
    if (absl::Status s = LearnerRefusal(member_); !s.ok()) {
      reactor->Finish(ToGrpcStatus(s));
      return reactor->reactor();
    }
  }
  if (auth_ != nullptr) {
    // A malformed request gets its own error first, as from etcd's gRPC
    // layer, then the auth checks.
    absl::Status s = mvcc::ValidateRange(*req);
    if (s.ok()) s = auth_->CheckRange(*ctx, *req);
    if (!s.ok()) {
      reactor->Finish(ToGrpcStatus(s));
      return reactor->reactor();
    }
  }
  auto serve = [this, req, response, reactor, start](absl::Status barrier) {
    if (!barrier.ok()) {
      reactor->Finish(ToGrpcStatus(barrier));
      return;
    }
    // A range of many keys runs on the bulk threads, from the cache as
    // from the store: encoding a list of 100,000 cached objects on gRPC's
    // callback threads held them, and with them every put's request.
    const bool big = bulk_ != nullptr && IsBulkRange(*store_, *req);
    auto run = [this, req, response, reactor, big, start] {
      if (cache_range_ != nullptr && cache_range_->TryServeRange(*req, response)) {
        Answered(*req, *response, start);
        reactor->Finish(grpc::Status::OK);
        return;
      }
      ServeRange(*req, response, reactor, big, start);
    };
    if (big) {
      bulk_->Run(std::move(run));
    } else {
      run();
    }
  };
  // A linearizable Range waits until this member has applied every write
  // committed before it arrived (in a cluster; at once on a single member).
  if (req->serializable()) {
    serve(absl::OkStatus());
  } else {
    store_->ReadBarrier(std::move(serve));
  }
  return reactor->reactor();
}

void KvService::Answered(const etcdserverpb::RangeRequest& req, const grpc::ByteBuffer& response,
                         std::chrono::steady_clock::time_point start) {
  const size_t size = response.Length();
  ClientTraffic::Sent(size);
  const absl::Duration took = absl::FromChrono(std::chrono::steady_clock::now() - start);
  const absl::Duration warning = store_->options().warning_apply_duration;
  if (took <= warning) return;
  // etcd's warnOfExpensiveReadOnlyRangeRequest, counted with the slow
  // applies as etcd counts it.
  store_->CountSlowApply();
  SPDLOG_WARN(
      "apply request took too long (took {}, expected-duration {}, prefix read-only range , "
      "request key:\"{}\" range_end:\"{}\" limit:{}, response size:{})",
      absl::FormatDuration(took), absl::FormatDuration(warning), absl::CEscape(req.key()),
      absl::CEscape(req.range_end()), req.limit(), size);
}

void KvService::ServeRange(const etcdserverpb::RangeRequest& req, grpc::ByteBuffer* response,
                           CountedUnary* reactor, bool big,
                           std::chrono::steady_clock::time_point start) {
  mvcc::RangeResult result;
  std::unique_ptr<mvcc::ByteSink> blocks;
  if (big) {
    blocks = bulk_->NewSink();
    result.kvs_sink = blocks.get();
    result.parallel = &bulk_->parallel_read();
  }
  if (auto s = store_->Range(req, &result); !s.ok()) {
    reactor->Finish(ToGrpcStatus(s));
    return;
  }
  // RangeResponse: header (1), kvs (2, already encoded), more (3), count
  // (4), sent as three slices so the kvs are never copied again.
  etcdserverpb::ResponseHeader header;
  membership::FillHeader(*member_, &header);
  header.set_revision(result.rev);
  std::vector<std::string> parts(3);
  util::AppendBytesField(1, header.SerializeAsString(), &parts[0]);
  parts[1] = std::move(result.kvs_wire);
  if (result.more) util::AppendVarintField(3, 1, &parts[2]);
  util::AppendVarintField(4, static_cast<uint64_t>(result.count), &parts[2]);
  const size_t bytes = parts[0].size() + parts[1].size() + parts[2].size();
  if (blocks == nullptr && bytes <= kCopiedResponseBytes) {
    // A small answer (a key or a few) is copied into one slice: fewer
    // allocations than a held part each, and too small to count against
    // the bulk reads' bound on memory waiting to be sent.
    CopyPartsToBuffer(parts, response);
  } else if (blocks != nullptr) {
    std::vector<std::unique_ptr<mvcc::ByteSink>> kvs;
    kvs.push_back(std::move(blocks));
    for (auto& part : result.kvs_parts) kvs.push_back(std::move(part));
    bulk_->Hold(std::move(parts[0]), std::move(kvs), std::move(parts[2]), response);
  } else if (bulk_ != nullptr) {
    bulk_->Hold(std::move(parts), response);
  } else {
    PartsToBuffer(std::move(parts), response);
  }
  Answered(req, *response, start);
  reactor->Finish(grpc::Status::OK);
}

namespace {

// A server stream refused before its first message.
class RefusedStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* KvService::RangeStream(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  etcdserverpb::RangeRequest req;
  if (std::string error = DecodeReceived(*request, &req); !error.empty()) {
    return new RefusedStream(UnmarshalStatus(error));
  }
  // etcd 3.7's order: the Range checks, what the stream refuses, then
  // permission.
  if (auto s = mvcc::ValidateRange(req); !s.ok()) return new RefusedStream(ToGrpcStatus(s));
  if (std::string why = mvcc::RangeStreamUnsupported(req); !why.empty()) {
    return new RefusedStream(grpc::Status(grpc::UNIMPLEMENTED, why));
  }
  if (auth_ != nullptr) {
    if (auto s = auth_->CheckRange(*ctx, req); !s.ok()) return new RefusedStream(ToGrpcStatus(s));
  }
  return NewRangeStreamReactor(store_, member_, bulk_, cache_range_.get(), std::move(req));
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

// Writes are raw methods: a request is decoded here, so that one that does
// not decode gets etcd's answer (server/api/decoded.h), and handed to the
// committer with its response in one allocation.
template <typename Op, typename Request, typename Response>
grpc::ServerUnaryReactor* KvService::SubmitWrite(
    const CountedMethod& counted, grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* in,
    grpc::ByteBuffer* out,
    std::type_identity_t<absl::Status (AuthGate::*)(const grpc::ServerContextBase&, const Request&)
                             const> check) {
  auto* reactor = new CountedUnary(counted);
  auto call = std::make_unique<RawWriteCall<Request, Response>>();
  if (std::string error = DecodeReceived(*in, &call->request); !error.empty()) {
    reactor->Finish(UnmarshalStatus(error));
    return reactor->reactor();
  }
  // The committer need not check its shape again.
  absl::Status refused = LearnerRefusal(member_);
  if (refused.ok()) {
    refused = CheckWrite(auth_, *ctx, call->request, store_->options().max_txn_ops, check);
  }
  if (!refused.ok()) {
    reactor->Finish(ToGrpcStatus(refused));
    return reactor->reactor();
  }
  auto* c = call.release();
  mvcc::WriteRequest w;
  w.op = Op{&c->request, &c->response};
  w.validated = true;
  // Checked again as it is applied, by the user who made it.
  if (auth_ != nullptr) w.caller = auth_->CallerOf(*ctx);
  w.done = [c, reactor, out, member = member_](absl::Status s) {
    std::unique_ptr<RawWriteCall<Request, Response>> owned(c);
    if (s.ok()) {
      membership::FillHeader(*member, c->response.mutable_header());
      StringToBuffer(c->response.SerializeAsString(), out);
      ClientTraffic::Sent(out->Length());
    }
    reactor->Finish(ToGrpcStatus(s));
  };
  store_->Submit(std::move(w));
  return reactor->reactor();
}

grpc::ServerUnaryReactor* KvService::Put(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) {
  return SubmitWrite<mvcc::PutOp>(put_calls_, ctx, request, response, &AuthGate::CheckPut);
}

grpc::ServerUnaryReactor* KvService::DeleteRange(grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  return SubmitWrite<mvcc::DeleteRangeOp>(delete_range_calls_, ctx, request, response,
                                          &AuthGate::CheckDeleteRange);
}

grpc::ServerUnaryReactor* KvService::Txn(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) {
  return SubmitWrite<mvcc::TxnOp>(txn_calls_, ctx, request, response, &AuthGate::CheckTxn);
}

grpc::ServerUnaryReactor* KvService::Compact(grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) {
  // Compaction needs an authenticated user, no key permission.
  return SubmitWrite<mvcc::CompactOp>(compact_calls_, ctx, request, response, nullptr);
}

}  // namespace capstan::server
