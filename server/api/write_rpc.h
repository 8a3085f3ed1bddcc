// The one way a unary RPC submits a write: hand it to the KV store's
// committer and finish the RPC from the completion callback, once the write
// is durable, with the member's header fields and etcd's status.

#ifndef CAPSTAN_SERVER_API_WRITE_RPC_H_
#define CAPSTAN_SERVER_API_WRITE_RPC_H_

#include <optional>

#include "grpcpp/support/server_callback.h"
#include "membership/member.h"
#include "mvcc/kv_store.h"
#include "server/api/errors.h"

namespace capstan::server {

// REQUIRES: op's request and response belong to the RPC of reactor (they
// live until it finishes); store and member outlive it. Op is one of
// mvcc's client writes (mvcc/write_request.h).
// caller: who makes the write, checked again when it is applied
// (AuthGate::CallerOf).
template <typename Op>
void SubmitAndFinish(mvcc::KvStore* store, const membership::MemberInfo* member,
                     grpc::ServerUnaryReactor* reactor, Op op,
                     std::optional<mvcc::Caller> caller = std::nullopt) {
  auto* response = op.response;
  mvcc::WriteRequest w{std::move(op), [reactor, response, member](absl::Status s) {
                         if (s.ok()) membership::FillHeader(*member, response->mutable_header());
                         reactor->Finish(ToGrpcStatus(s));
                       }};
  w.caller = std::move(caller);
  store->Submit(std::move(w));
}

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_WRITE_RPC_H_
