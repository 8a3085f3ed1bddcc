// etcdserverpb.Watch over the gRPC callback API, served raw: responses are
// encoded by the watch hub and written as they are, one write in flight per
// stream. A stream that stops reading fills only its own bounded queue; the
// hub then parks its watchers (see mvcc/watch_hub.h).

#ifndef CAPSTAN_SERVER_API_WATCH_SERVICE_H_
#define CAPSTAN_SERVER_API_WATCH_SERVICE_H_

#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "membership/member.h"
#include "mvcc/watch_hub.h"
#include "util/mutex.h"

namespace capstan::server {
class AuthGate;
}  // namespace capstan::server

namespace capstan::server {

// A stream whose client asks for a leader (etcd's "hasleader: true"
// metadata, clientv3.WithRequireLeader: etcdctl's watches, the
// kube-apiserver's) is refused with "etcdserver: no leader" while the
// member knows none, and ended with it once the member has known none for
// three election timeouts in a row, as etcd's monitorLeader ends it, so
// that the client moves to a member that has one.
//
// Thread-safe. hub and member must outlive every stream the service serves
// and StopLeaderMonitor (shut the gRPC server down first).
class WatchService final
    : public etcdserverpb::Watch::WithRawCallbackMethod_Watch<etcdserverpb::Watch::Service> {
 public:
  // auth: read permission checks on created watchers (null: none); must
  // outlive every stream. election_timeout: how often the leader is looked
  // at for streams that ask for one.
  WatchService(mvcc::WatchHub* hub, const membership::MemberInfo* member,
               const AuthGate* auth = nullptr,
               absl::Duration election_timeout = absl::Seconds(1))
      : hub_(hub), member_(member), auth_(auth), election_timeout_(election_timeout) {}
  ~WatchService() override { StopLeaderMonitor(); }

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Watch(
      grpc::CallbackServerContext* ctx) override;

  // Stops looking at the leader. Idempotent.
  void StopLeaderMonitor() ABSL_LOCKS_EXCLUDED(mu_);

  // The streams that ask for a leader (the service's reactors).
  class LeaderBound {
   public:
    virtual ~LeaderBound() = default;
    // Ends the stream with etcd's no-leader error.
    virtual void EndForNoLeader() = 0;
  };
  void Forget(LeaderBound* stream) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Remember(LeaderBound* stream) ABSL_LOCKS_EXCLUDED(mu_);
  void MonitorLeader();

  mvcc::WatchHub* const hub_;
  const membership::MemberInfo* const member_;
  const AuthGate* const auth_;
  const absl::Duration election_timeout_;
  // Lock order: taken before a stream's own locks (EndForNoLeader runs under
  // it); a stream's OnDone takes it to Forget itself.
  util::Mutex mu_;
  std::set<LeaderBound*> bound_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread monitor_;  // started with the first stream that asks for a leader
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_WATCH_SERVICE_H_
