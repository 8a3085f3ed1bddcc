// etcdserverpb.Watch over the gRPC callback API, served raw: responses are
// encoded by the watch hub and written as they are, one write in flight per
// stream. A stream that stops reading fills only its own bounded queue; the
// hub then parks its watchers (see mvcc/watch_hub.h).

#ifndef CAPSTAN_SERVER_API_WATCH_SERVICE_H_
#define CAPSTAN_SERVER_API_WATCH_SERVICE_H_

#include "etcdserverpb/rpc.grpc.pb.h"
#include "membership/member.h"
#include "mvcc/watch_hub.h"

namespace capstan::server {
class AuthGate;
}  // namespace capstan::server

namespace capstan::server {

// Thread-safe. hub and member must outlive every stream the service serves
// (shut the gRPC server down first).
class WatchService final
    : public etcdserverpb::Watch::WithRawCallbackMethod_Watch<etcdserverpb::Watch::Service> {
 public:
  // auth: read permission checks on created watchers (null: none); must
  // outlive every stream.
  WatchService(mvcc::WatchHub* hub, const membership::MemberInfo* member, const AuthGate* auth = nullptr)
      : hub_(hub), member_(member), auth_(auth) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Watch(
      grpc::CallbackServerContext* ctx) override;

 private:
  mvcc::WatchHub* const hub_;
  const membership::MemberInfo* const member_;
  const AuthGate* const auth_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_WATCH_SERVICE_H_
