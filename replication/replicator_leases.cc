// The leases half of the Replicator: keep-alives renewed by the leader,
// once it knows it still leads, or forwarded to it by a follower and
// retried across leader changes as etcd's followers retry them, and
// LeaseTimeToLive answered by the leader. Called from any thread.

#include "replication/replicator.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "mvcc/errors.h"

namespace capstan::replication {

using mvcc::Error;
using mvcc::MakeError;

void Replicator::RenewAsLeader(int64_t id,
                               absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) {
  auto renew = [this, id](absl::Status confirmed) -> absl::StatusOr<int64_t> {
    if (!confirmed.ok()) return confirmed;
    if (!Leads()) return MakeError(Error::kNotLeader);
    std::optional<int64_t> ttl = store_->lessor()->Renew(id);
    if (!ttl) return MakeError(Error::kLeaseNotFound);
    return *ttl;
  };
  if (sole_voter_.load(std::memory_order_acquire)) {
    // Nobody else can lead, and every grant answered was applied here.
    done(renew(absl::OkStatus()));
    return;
  }
  if (RecentlyConfirmedLeader()) {
    // Nobody else can lead yet. A lease a follower applied and answered
    // may be in an entry this leader committed and has not applied yet:
    // renewed once everything committed is applied (etcd's
    // waitAppliedIndex), rather than found missing.
    WhenApplied(CommittedIndex(),
                [renew, done = std::move(done)](absl::Status s) mutable { done(renew(s)); });
    return;
  }
  ReadBarrier([renew, done = std::move(done)](absl::Status s) mutable { done(renew(s)); });
}

bool Replicator::RecentlyConfirmedLeader() const {
  LeadershipConfirmation c;
  {
    util::MutexLock l(&confirmed_mu_);
    c = confirmed_;
  }
  return c.term != 0 && c.term == Term() && Leads() &&
         std::chrono::steady_clock::now() - c.began < absl::ToChronoNanoseconds(options_.tick);
}

void Replicator::SetLeadershipConfirmation(LeadershipConfirmation c) {
  util::MutexLock l(&confirmed_mu_);
  confirmed_ = c;
}

void Replicator::RenewLease(int64_t id, absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) {
  TryRenewal(id, absl::Now() + options_.request_timeout, std::move(done));
}

namespace {

// etcd's follower forwards a renewal again after any failure but an
// unknown lease (NotFound, the leader's answer or this member's): a leader
// that stops or steps down answers the renewals it holds with errors that
// the next leader may not. A stopping member answers "stopped" itself
// (RetryRenewal).
bool RenewalWorthRetrying(const absl::Status& s) { return !s.ok() && !absl::IsNotFound(s); }

}  // namespace

void Replicator::TryRenewal(int64_t id, absl::Time deadline,
                            absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) {
  if (Leads()) {
    RenewAsLeader(id, [this, id, deadline, done = std::move(done)](
                          absl::StatusOr<int64_t> ttl) mutable {
      if (RenewalWorthRetrying(ttl.status())) {
        RetryRenewal(id, deadline, std::move(done));
      } else {
        done(std::move(ttl));
      }
    });
    return;
  }
  const uint64_t leader = Leader();
  if (leader == 0) {
    RetryRenewal(id, deadline, std::move(done));
    return;
  }
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(id);
  {
    util::MutexLock l(&forwarded_renewals_->mu);
    ++forwarded_renewals_->pending;
  }
  // The destructor waits for the callback (forwarded_renewals_), so it may
  // use this Replicator.
  transport_->LeaseRenew(
      leader, request, std::max<int64_t>(1, absl::ToInt64Milliseconds(deadline - absl::Now())),
      [this, id, deadline, renewals = forwarded_renewals_, done = std::move(done)](
          absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse> response) mutable {
        if (response.ok()) {
          done(response->ttl());
        } else if (RenewalWorthRetrying(response.status())) {
          RetryRenewal(id, deadline, std::move(done));
        } else {
          done(MakeError(Error::kLeaseNotFound));  // the leader's own answer
        }
        util::MutexLock l(&renewals->mu);
        --renewals->pending;
      });
}

void Replicator::RetryRenewal(int64_t id, absl::Time deadline,
                              absl::AnyInvocable<void(absl::StatusOr<int64_t>)> done) {
  {
    util::MutexLock l(&inbox_mu_);
    if (!stopping_) {
      inbox_.renewal_retries.push_back(
          {id, deadline, absl::Now() + kRenewalRetryPause, std::move(done)});
      return;
    }
  }
  done(MakeError(Error::kStopped));
}

void Replicator::RetryRenewals(absl::Time now) {
  std::vector<RenewalRetry> waiting;
  const bool leader_known = Leads() || Leader() != 0;
  for (auto& r : renewal_retries_) {
    if (now >= r.deadline) {
      r.done(MakeError(leader_known ? Error::kTimeout : Error::kNoLeader));
    } else if (now < r.not_before || !leader_known) {
      waiting.push_back(std::move(r));
    } else {
      TryRenewal(r.id, r.deadline, std::move(r.done));
    }
  }
  renewal_retries_ = std::move(waiting);
}

void Replicator::LeaseTimeToLive(const etcdserverpb::LeaseTimeToLiveRequest& request,
                                 LeaseTimeToLiveDone done) {
  if (Leads()) {
    etcdserverpb::LeaseTimeToLiveResponse response;
    auto info = store_->lessor()->Get(request.id(), request.keys());
    if (!info) {
      done(MakeError(Error::kLeaseNotFound));
      return;
    }
    response.set_id(info->id);
    response.set_ttl(info->remaining_ttl);
    response.set_grantedttl(info->granted_ttl);
    for (auto& k : info->keys) response.add_keys(std::move(k));
    done(std::move(response));
    return;
  }
  const uint64_t leader = Leader();
  if (leader == 0) {
    done(MakeError(Error::kNoLeader));
    return;
  }
  // WorkQueue takes copyable closures: the completion rides in a shared_ptr.
  auto answered = std::make_shared<LeaseTimeToLiveDone>(std::move(done));
  forward_queue_->Run([this, request, leader, answered] {
    etcdserverpb::LeaseTimeToLiveResponse response;
    absl::Status s = transport_->LeaseTimeToLive(
        leader, request, &response, absl::ToInt64Milliseconds(options_.request_timeout));
    if (!s.ok()) {
      // The leader's own answer for a lease it does not have.
      if (absl::IsNotFound(s)) s = MakeError(Error::kLeaseNotFound);
      (*answered)(s);
      return;
    }
    (*answered)(std::move(response));
  });
}

}  // namespace capstan::replication
