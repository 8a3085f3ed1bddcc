// etcdserverpb.Lease. Grants and revokes are writes through the KV store's
// committer; keep-alives and time-to-live reads are answered from the
// in-memory lessor. The unary methods run on gRPC's callback API; the
// keep-alive streams on the completion queues (completion_queues.h), where
// a stream opened for each renewal, as etcd's clients do, costs less.

#ifndef CAPSTAN_SERVER_API_LEASE_SERVICE_H_
#define CAPSTAN_SERVER_API_LEASE_SERVICE_H_

#include "etcdserverpb/rpc.grpc.pb.h"
#include "server/api/completion_queues.h"
#include "server/api/counted_call.h"
#include "membership/member.h"
#include "mvcc/kv_store.h"
#include "server/api/decoded.h"
#include "server/api/leader_monitor.h"

namespace capstan::server {
class AuthGate;
}  // namespace capstan::server

namespace capstan::server {

using LeaseServiceBase = etcdserverpb::Lease::WithCallbackMethod_LeaseGrant<
    etcdserverpb::Lease::WithCallbackMethod_LeaseRevoke<
        etcdserverpb::Lease::WithAsyncMethod_LeaseKeepAlive<
            etcdserverpb::Lease::WithCallbackMethod_LeaseTimeToLive<
                etcdserverpb::Lease::WithCallbackMethod_LeaseLeases<
                    etcdserverpb::Lease::Service>>>>>;

// Thread-safe. store and member must outlive the service.
class LeaseService final : public DecodingService<etcdserverpb::Lease, LeaseServiceBase> {
 public:
  // auth: permission checks (null: none); monitor: ends the keep-alive
  // streams that ask for a leader (null: none is). Both must outlive the
  // service.
  LeaseService(mvcc::KvStore* store, const membership::MemberInfo* member,
               const AuthGate* auth = nullptr, LeaderMonitor* monitor = nullptr);

  grpc::ServerUnaryReactor* LeaseGrant(grpc::CallbackServerContext* ctx,
                                       const etcdserverpb::LeaseGrantRequest* request,
                                       etcdserverpb::LeaseGrantResponse* response) override;
  grpc::ServerUnaryReactor* LeaseRevoke(grpc::CallbackServerContext* ctx,
                                        const etcdserverpb::LeaseRevokeRequest* request,
                                        etcdserverpb::LeaseRevokeResponse* response) override;
  grpc::ServerUnaryReactor* LeaseTimeToLive(grpc::CallbackServerContext* ctx,
                                            const etcdserverpb::LeaseTimeToLiveRequest* request,
                                            etcdserverpb::LeaseTimeToLiveResponse* response) override;
  grpc::ServerUnaryReactor* LeaseLeases(grpc::CallbackServerContext* ctx,
                                        const etcdserverpb::LeaseLeasesRequest* request,
                                        etcdserverpb::LeaseLeasesResponse* response) override;

  // Serves keep-alive streams on `queues` (after the server started),
  // `per_queue` accepted at a time on each queue. REQUIRES: called once;
  // `queues` outlives the streams (CompletionQueues::Stop waits for them).
  void ServeKeepAlives(CompletionQueues* queues, int per_queue);

  // LeaseKeepAlive counts its streams into counter itself
  // (server/api/counted_call.h). Call before serving; counter must outlive
  // the service.
  void CountCalls(CallCounter* counter) {
    keep_alive_calls_.Count(counter, "/etcdserverpb.Lease/LeaseKeepAlive",
                            grpc::internal::RpcMethod::BIDI_STREAMING);
  }
  const CountedMethod& keep_alive_calls() const { return keep_alive_calls_; }

  // Arms one keep-alive stream (the stream's own use).
  template <typename Stream>
  void RequestKeepAlive(grpc::ServerContext* ctx, Stream* stream,
                        grpc::ServerCompletionQueue* cq, void* tag) {
    this->RequestAsyncBidiStreaming(kKeepAliveMethod, ctx, stream, cq, cq, tag);
  }

 private:
  // LeaseKeepAlive's index in etcdserverpb.Lease.
  static constexpr int kKeepAliveMethod = 2;

  mvcc::KvStore* const store_;
  const membership::MemberInfo* const member_;
  const AuthGate* const auth_;
  LeaderMonitor* const monitor_;
  CountedMethod keep_alive_calls_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_LEASE_SERVICE_H_
