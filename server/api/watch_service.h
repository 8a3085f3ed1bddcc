// etcdserverpb.Watch over the gRPC callback API, served raw: responses are
// encoded by the watch hub and written as they are, one write in flight per
// stream. A stream that stops reading fills only its own bounded queue; the
// hub then parks its watchers (see mvcc/watch_hub.h).

#ifndef CAPSTAN_SERVER_API_WATCH_SERVICE_H_
#define CAPSTAN_SERVER_API_WATCH_SERVICE_H_

#include "etcdserverpb/rpc.grpc.pb.h"
#include "membership/member.h"
#include "mvcc/watch_hub.h"
#include "server/api/leader_monitor.h"

namespace capstan::server {
class AuthGate;
}  // namespace capstan::server

namespace capstan::server {

// A stream whose client asks for a leader (etcd's "hasleader: true"
// metadata) is refused with "etcdserver: no leader" while the member knows
// none, and ended with it by the LeaderMonitor (leader_monitor.h).
//
// Thread-safe. hub, member and monitor must outlive every stream the
// service serves (shut the gRPC server down first).
class WatchService final
    : public etcdserverpb::Watch::WithRawCallbackMethod_Watch<etcdserverpb::Watch::Service> {
 public:
  // auth: read permission checks on created watchers (null: none); must
  // outlive every stream. monitor: ends the streams that ask for a leader.
  WatchService(mvcc::WatchHub* hub, const membership::MemberInfo* member, const AuthGate* auth,
               LeaderMonitor* monitor)
      : hub_(hub), member_(member), auth_(auth), monitor_(monitor) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Watch(
      grpc::CallbackServerContext* ctx) override;

 private:
  mvcc::WatchHub* const hub_;
  const membership::MemberInfo* const member_;
  const AuthGate* const auth_;
  LeaderMonitor* const monitor_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_WATCH_SERVICE_H_
