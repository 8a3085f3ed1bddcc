#include "server/api/lease_service.h"

#include "auth/errors.h"
#include "mvcc/errors.h"
#include "server/api/auth_service.h"
#include "server/api/client_traffic.h"
#include "server/api/errors.h"
#include "server/api/write_rpc.h"

namespace capstan::server {
namespace {

using etcdserverpb::LeaseKeepAliveRequest;
using etcdserverpb::LeaseKeepAliveResponse;

// One keep-alive stream on a completion queue: each request renews one
// lease and is answered with its TTL (0 if the lease does not exist), one at
// a time. A stream accepted arms the next one on its queue first. A stream
// that asks for a leader is refused while the member has none and ended by
// the LeaderMonitor while it waits for its next renewal.
class KeepAliveCall final : public AsyncCall, public LeaderMonitor::Stream {
 public:
  // Arms a stream on `cq`, unless the queues are stopping.
  static void Arm(LeaseService* service, CompletionQueues* queues,
                  grpc::ServerCompletionQueue* cq, mvcc::KvStore* store,
                  const membership::MemberInfo* member, LeaderMonitor* monitor) {
    if (!queues->Enter()) return;
    new KeepAliveCall(service, queues, cq, store, member, monitor);
  }

  ~KeepAliveCall() override {
    if (bound_) monitor_->Forget(this);
  }

  void Proceed(bool ok) override {
    State state;
    {
      util::MutexLock l(&mu_);
      state = state_;
      if (ended_early_) {
        // EndForNoLeader finished the stream with a read pending: both
        // complete, and the last deletes the call.
        if (!early_done_) {
          early_done_ = true;
          return;
        }
        state = State::kFinish;
      } else if (state_ == State::kRead) {
        // Busy with what the read brought until it reads again: the
        // monitor leaves the stream alone meanwhile.
        state_ = State::kRenew;
      }
    }
    switch (state) {
      case State::kAccept:
        if (!ok) break;  // the server is shutting down
        Arm(service_, queues_, cq_, store_, member_, monitor_);
        call_ = service_->keep_alive_calls().Start();
        if (absl::Status s = LearnerRefusal(member_); !s.ok()) {
          Finish(ToGrpcStatus(s));
          return;
        }
        // clientv3's keep-alive streams ask for a leader.
        if (monitor_ != nullptr && RequiresLeader(ctx_.client_metadata(), member_)) {
          if (member_->raft->Leader() == 0) {
            Finish(NoLeaderStatus());
            return;
          }
          bound_ = true;
          monitor_->Remember(this);
        }
        Read();
        return;
      case State::kRead:
        if (!ok) {
          Finish(grpc::Status::OK);
          return;
        }
        if (!request_.ok()) {
          Finish(StreamUnmarshalStatus(request_.error));
          return;
        }
        Renew();
        return;
      case State::kRenew:
        break;  // no operation is pending while a renewal is
      case State::kWrite:
        if (!ok) {
          Finish(grpc::Status(grpc::UNAVAILABLE, "keep-alive stream broken"));
          return;
        }
        Read();
        return;
      case State::kFinish:
        break;
    }
    delete this;
  }

  // Only while the stream waits for its next request: a renewal under way
  // ends the stream itself if it finds no leader. Runs under the monitor's
  // lock, on its thread.
  bool EndForNoLeader() override {
    util::MutexLock l(&mu_);
    if (state_ != State::kRead) return false;
    ended_early_ = true;
    call_.Ended(grpc::UNAVAILABLE);
    stream_.Finish(NoLeaderStatus(), this);
    return true;
  }

 private:
  enum class State { kAccept, kRead, kRenew, kWrite, kFinish };

  KeepAliveCall(LeaseService* service, CompletionQueues* queues,
                grpc::ServerCompletionQueue* cq, mvcc::KvStore* store,
                const membership::MemberInfo* member, LeaderMonitor* monitor)
      : registered_{queues}, service_(service), queues_(queues), cq_(cq), store_(store),
        member_(member), monitor_(monitor) {
    service_->RequestKeepAlive(&ctx_, &stream_, cq_, this);
  }

  void Read() {
    util::MutexLock l(&mu_);
    state_ = State::kRead;
    stream_.Read(&request_, this);
  }

  void Finish(const grpc::Status& st) {
    util::MutexLock l(&mu_);
    call_.Ended(st.error_code());
    state_ = State::kFinish;
    stream_.Finish(st, this);
  }

  // Renewed here, or by the cluster's leader: the answer may come on
  // another thread, and no operation of the stream is pending meanwhile.
  void Renew() {
    {
      util::MutexLock l(&mu_);
      state_ = State::kRenew;
    }
    const int64_t id = request_.message.id();
    store_->RenewLease(id, [this, id](absl::StatusOr<int64_t> ttl) {
      if (!ttl.ok() && !mvcc::Is(ttl.status(), mvcc::Error::kLeaseNotFound)) {
        Finish(ToGrpcStatus(ttl.status()));
        return;
      }
      response_.Clear();
      membership::FillHeader(*member_, response_.mutable_header());
      response_.mutable_header()->set_revision(store_->Rev());
      response_.set_id(id);
      response_.set_ttl(ttl.ok() ? *ttl : 0);  // 0: the lease does not exist
      ClientTraffic::Sent(response_.ByteSizeLong());
      util::MutexLock l(&mu_);
      state_ = State::kWrite;
      stream_.Write(response_, this);
    });
  }

  // Leaves the queues' count of calls when the call is destroyed, after
  // every other member (the stream and its context) is gone.
  struct Registered {
    CompletionQueues* queues;
    ~Registered() { queues->Leave(); }
  } registered_;
  LeaseService* const service_;
  CompletionQueues* const queues_;
  grpc::ServerCompletionQueue* const cq_;
  mvcc::KvStore* const store_;
  const membership::MemberInfo* const member_;
  LeaderMonitor* const monitor_;  // null: no stream is ended for want of a leader
  bool bound_ = false;            // remembered by the monitor
  grpc::ServerContext ctx_;
  grpc::ServerAsyncReaderWriter<LeaseKeepAliveResponse, Decoded<LeaseKeepAliveRequest>> stream_{
      &ctx_};
  Decoded<LeaseKeepAliveRequest> request_;
  LeaseKeepAliveResponse response_;
  // A leaf, after the monitor's lock. It orders the state and the issuing
  // of the stream's operations against EndForNoLeader.
  util::Mutex mu_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kAccept;
  bool ended_early_ ABSL_GUARDED_BY(mu_) = false;  // by EndForNoLeader
  bool early_done_ ABSL_GUARDED_BY(mu_) = false;   // the first of its two completions came
  CountedCall call_;  // from the stream's acceptance
};

}  // namespace

LeaseService::LeaseService(mvcc::KvStore* store, const membership::MemberInfo* member,
                           const AuthGate* auth, LeaderMonitor* monitor)
    : store_(store), member_(member), auth_(auth), monitor_(monitor) {
  learner_check_ = member;
  DecodeUnary("LeaseGrant", &LeaseService::LeaseGrant);
  DecodeUnary("LeaseRevoke", &LeaseService::LeaseRevoke);
  DecodeUnary("LeaseTimeToLive", &LeaseService::LeaseTimeToLive);
  DecodeUnary("LeaseLeases", &LeaseService::LeaseLeases);
}

void LeaseService::ServeKeepAlives(CompletionQueues* queues, int per_queue) {
  for (grpc::ServerCompletionQueue* cq : queues->queues()) {
    for (int i = 0; i < per_queue; ++i) {
      KeepAliveCall::Arm(this, queues, cq, store_, member_, monitor_);
    }
  }
}

grpc::ServerUnaryReactor* LeaseService::LeaseGrant(grpc::CallbackServerContext* ctx,
                                                   const etcdserverpb::LeaseGrantRequest* request,
                                                   etcdserverpb::LeaseGrantResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  // No permission is needed, but a bad token is refused.
  if (auth_ != nullptr) {
    if (auto s = auth_->CheckIdentity(*ctx); !s.ok()) {
      reactor->Finish(ToGrpcStatus(s));
      return reactor;
    }
  }
  SubmitAndFinish(store_, member_, reactor, mvcc::LeaseGrantOp{request, response});
  return reactor;
}

grpc::ServerUnaryReactor* LeaseService::LeaseRevoke(grpc::CallbackServerContext* ctx,
                                                    const etcdserverpb::LeaseRevokeRequest* request,
                                                    etcdserverpb::LeaseRevokeResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  // Revoking deletes the attached keys: the user must be able to write each.
  if (auth_ != nullptr) {
    if (auto s = auth_->CheckLeaseRevoke(*ctx, request->id()); !s.ok()) {
      reactor->Finish(ToGrpcStatus(s));
      return reactor;
    }
  }
  SubmitAndFinish(store_, member_, reactor, mvcc::LeaseRevokeOp{request, response},
                  auth_ != nullptr ? std::optional(auth_->CallerOf(*ctx)) : std::nullopt);
  return reactor;
}

grpc::ServerUnaryReactor* LeaseService::LeaseTimeToLive(
    grpc::CallbackServerContext* ctx, const etcdserverpb::LeaseTimeToLiveRequest* request,
    etcdserverpb::LeaseTimeToLiveResponse* response) {
  auto* reactor = ctx->DefaultReactor();
  // As etcd 3.5.13+: listing a lease's keys needs read permission on each
  // (3.4 lists them to anyone); without keys nothing is checked.
  uint64_t auth_revision = 0;
  if (auth_ != nullptr && request->keys()) {
    auth_revision = auth_->store()->Revision();
    if (auto s = auth_->CheckLeaseTimeToLive(*ctx, request->id()); !s.ok()) {
      reactor->Finish(ToGrpcStatus(s));
      return reactor;
    }
  }
  // Answered here, or by the cluster's leader, which alone sees the
  // keep-alives; the answer may come on another thread.
  store_->LeaseTimeToLive(*request, [this, request, response, reactor, auth_revision](
                                        absl::StatusOr<etcdserverpb::LeaseTimeToLiveResponse> got) {
    if (!got.ok() && !mvcc::Is(got.status(), mvcc::Error::kLeaseNotFound)) {
      reactor->Finish(ToGrpcStatus(got.status()));
      return;
    }
    if (got.ok()) {
      *response = *std::move(got);
    } else {
      response->set_ttl(-1);  // etcd's answer for a lease that does not exist
    }
    membership::FillHeader(*member_, response->mutable_header());
    response->mutable_header()->set_revision(store_->Rev());
    response->set_id(request->id());
    // The keys were checked against an auth state that has since changed.
    if (auth_revision != 0 && auth_->store()->Enabled() &&
        auth_->store()->Revision() != auth_revision) {
      reactor->Finish(ToGrpcStatus(auth::MakeError(auth::Error::kAuthOldRevision)));
      return;
    }
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* LeaseService::LeaseLeases(grpc::CallbackServerContext* ctx,
                                                    const etcdserverpb::LeaseLeasesRequest*,
                                                    etcdserverpb::LeaseLeasesResponse* response) {
  membership::FillHeader(*member_, response->mutable_header());
  response->mutable_header()->set_revision(store_->Rev());
  for (int64_t id : store_->lessor()->List()) response->add_leases()->set_id(id);
  auto* reactor = ctx->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace capstan::server
