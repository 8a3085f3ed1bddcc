// The one way a unary RPC submits a write: hand it to the KV store's
// committer and finish the RPC from the completion callback, once the write
// is durable, with the member's header fields and etcd's status.

#ifndef CAPSTAN_SERVER_API_WRITE_RPC_H_
#define CAPSTAN_SERVER_API_WRITE_RPC_H_

#include "grpcpp/support/server_callback.h"
#include "membership/member.h"
#include "mvcc/kv_store.h"
#include "server/api/errors.h"

namespace capstan::server {

// REQUIRES: op's request and response belong to the RPC of reactor (they
// live until it finishes); store and member outlive it. Op is one of
// mvcc's client writes (mvcc/write_request.h).
template <typename Op>
void SubmitAndFinish(mvcc::KvStore* store, const membership::MemberInfo* member,
                     grpc::ServerUnaryReactor* reactor, Op op) {
  auto* response = op.response;
  store->Submit({std::move(op), [reactor, response, member](absl::Status s) {
                   if (s.ok()) membership::FillHeader(*member, response->mutable_header());
                   reactor->Finish(ToGrpcStatus(s));
                 }});
}

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_WRITE_RPC_H_
