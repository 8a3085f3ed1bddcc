// Unary etcd calls over the gRPC callback API. The request, response and
// context live in one heap block owned by the completion callback; `done`
// runs once, on a gRPC thread, and must not block.

#ifndef CAPSTAN_BENCH_LOADGEN_ASYNC_CALL_H_
#define CAPSTAN_BENCH_LOADGEN_ASYNC_CALL_H_

#include <chrono>
#include <functional>
#include <memory>
#include <utility>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "bench/loadgen/client_security.h"
#include "bench/loadgen/response_summary.h"
#include "etcdserverpb/rpc.grpc.pb.h"

namespace capstan::bench {

// The deadline of every request; 0 (the default, as in etcd's benchmark):
// none. Set once by main (--request-timeout) before any load starts.
inline std::chrono::milliseconds& RequestTimeout() {
  static std::chrono::milliseconds timeout{0};
  return timeout;
}

// Sets a deadline of RequestTimeout() on a context (none when it is 0).
inline void SetDeadline(grpc::ClientContext* ctx) {
  if (RequestTimeout().count() > 0) {
    ctx->set_deadline(std::chrono::system_clock::now() + RequestTimeout());
  }
}

template <typename Req, typename Resp>
struct UnaryCall {
  grpc::ClientContext ctx;
  Req req;
  Resp resp;
};

// start(ctx, req, resp, callback) begins the call, e.g. stub.async()->Put.
// A call rejected for an invalid auth token (expired, or the server
// restarted) is sent once more, as clientv3 does; the token interceptor
// has fetched a new token by then (client_security.h).
template <typename Resp, typename Req, typename Start, typename Done>
void CallAsync(Start start, Req req, Done done, bool retry_auth = true) {
  auto call = std::make_shared<UnaryCall<Req, Resp>>();
  call->req = std::move(req);
  SetDeadline(&call->ctx);
  auto* raw = call.get();
  start(&raw->ctx, &raw->req, &raw->resp,
        [start, retry_auth, call = std::move(call), done = std::move(done)](grpc::Status s) mutable {
          if (retry_auth && IsInvalidAuthToken(s)) {
            CallAsync<Resp>(std::move(start), std::move(call->req), std::move(done), false);
            return;
          }
          done(s, call->resp);
        });
}

template <typename Done>
void AsyncPut(etcdserverpb::KV::Stub& kv, etcdserverpb::PutRequest req, Done done) {
  CallAsync<etcdserverpb::PutResponse>(
      [&kv](auto* c, auto* q, auto* r, auto cb) { kv.async()->Put(c, q, r, std::move(cb)); },
      std::move(req), std::move(done));
}

template <typename Done>
void AsyncRange(etcdserverpb::KV::Stub& kv, etcdserverpb::RangeRequest req, Done done) {
  CallAsync<etcdserverpb::RangeResponse>(
      [&kv](auto* c, auto* q, auto* r, auto cb) { kv.async()->Range(c, q, r, std::move(cb)); },
      std::move(req), std::move(done));
}

// A Range whose response is only waited for, not looked at: read as a
// RangeResponseSummary (response_summary.h), so that a big response costs
// the client no parsing into a RangeResponse. done gets the status and the
// summary.
template <typename Done>
void AsyncRangeSummary(const std::shared_ptr<grpc::Channel>& channel,
                       etcdserverpb::RangeRequest req, Done done) {
  CallAsync<RangeResponseSummary>(
      [channel](auto* c, auto* q, auto* r, auto cb) {
        grpc::TemplatedGenericStub<etcdserverpb::RangeRequest, RangeResponseSummary>(channel)
            .UnaryCall(c, RangeMethod(), grpc::StubOptions(), q, r, std::move(cb));
      },
      std::move(req), std::move(done));
}

template <typename Done>
void AsyncTxn(etcdserverpb::KV::Stub& kv, etcdserverpb::TxnRequest req, Done done) {
  CallAsync<etcdserverpb::TxnResponse>(
      [&kv](auto* c, auto* q, auto* r, auto cb) { kv.async()->Txn(c, q, r, std::move(cb)); },
      std::move(req), std::move(done));
}

template <typename Done>
void AsyncLeaseGrant(etcdserverpb::Lease::Stub& lease, etcdserverpb::LeaseGrantRequest req,
                     Done done) {
  CallAsync<etcdserverpb::LeaseGrantResponse>(
      [&lease](auto* c, auto* q, auto* r, auto cb) {
        lease.async()->LeaseGrant(c, q, r, std::move(cb));
      },
      std::move(req), std::move(done));
}


}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_ASYNC_CALL_H_
