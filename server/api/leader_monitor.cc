#include "server/api/leader_monitor.h"

#include <pthread.h>

#include <iterator>

namespace capstan::server {

void LeaderMonitor::Remember(Stream* stream) {
  util::MutexLock l(&mu_);
  streams_.insert(stream);
  if (!thread_.joinable() && !stopping_) thread_ = std::thread([this] { Run(); });
}

void LeaderMonitor::Forget(Stream* stream) {
  util::MutexLock l(&mu_);
  streams_.erase(stream);
}

void LeaderMonitor::Stop() {
  {
    util::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void LeaderMonitor::Run() {
  pthread_setname_np(pthread_self(), "leader-monitor");
  // etcd's monitorLeader: reconnecting streams costs more than refusing new
  // ones, so open streams end only after maxNoLeaderCnt (3) election
  // timeouts in a row without a leader.
  constexpr int kMaxNoLeader = 3;
  int no_leader = 0;
  util::MutexLock l(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), election_timeout_)) {
    no_leader = member_->raft->Leader() == 0 ? no_leader + 1 : 0;
    if (no_leader < kMaxNoLeader) continue;
    for (auto it = streams_.begin(); it != streams_.end();) {
      it = (*it)->EndForNoLeader() ? streams_.erase(it) : std::next(it);
    }
  }
}

}  // namespace capstan::server
