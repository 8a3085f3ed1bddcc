// etcd's monitorLeader: the streams whose client asks for a leader (etcd's
// "hasleader: true" metadata, clientv3.WithRequireLeader: etcdctl's and the
// kube-apiserver's watches, clientv3's keep-alive streams) are ended with
// "etcdserver: no leader" once the member has known no leader for three
// election timeouts in a row, so that their clients move to a member that
// has one. (A new such stream is refused at once while there is none: the
// services check that themselves.)

#ifndef CAPSTAN_SERVER_API_LEADER_MONITOR_H_
#define CAPSTAN_SERVER_API_LEADER_MONITOR_H_

#include <set>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "membership/member.h"
#include "util/mutex.h"

namespace capstan::server {

// Thread-safe. member must outlive Stop (which the destructor calls).
class LeaderMonitor {
 public:
  // A stream that asks for a leader.
  class Stream {
   public:
    virtual ~Stream() = default;
    // Ends the stream with etcd's no-leader error, or returns false to be
    // looked at again next time (a stream busy with a request that ends it
    // itself). Called with the monitor's lock held, on a stream still
    // remembered: it must not call back into the monitor. An ended stream
    // is forgotten.
    virtual bool EndForNoLeader() = 0;
  };

  // election_timeout: how often the leader is looked at.
  LeaderMonitor(const membership::MemberInfo* member, absl::Duration election_timeout)
      : member_(member), election_timeout_(election_timeout) {}
  ~LeaderMonitor() { Stop(); }
  LeaderMonitor(const LeaderMonitor&) = delete;
  LeaderMonitor& operator=(const LeaderMonitor&) = delete;

  // Watches `stream` until Forget or until it is ended. The monitoring
  // thread starts with the first stream.
  void Remember(Stream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Before the stream goes away; a no-op for one already ended. Lock order:
  // the monitor's lock is taken before a stream's own, so a stream must not
  // hold its own lock here.
  void Forget(Stream* stream) ABSL_LOCKS_EXCLUDED(mu_);
  // Stops looking at the leader. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run();

  const membership::MemberInfo* const member_;
  const absl::Duration election_timeout_;
  util::Mutex mu_;
  std::set<Stream*> streams_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started with the first stream
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_LEADER_MONITOR_H_
