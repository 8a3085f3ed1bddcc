#include "server/api/lock_service.h"

#include <string>
#include <utility>

namespace capstan::server {

using etcdserverpb::RangeRequest;
using etcdserverpb::ResponseHeader;
using etcdserverpb::TxnRequest;
using etcdserverpb::TxnResponse;

namespace {

// The text etcd 3.5's mutex answers when the waiter's own key went away
// (its lease expired or was revoked) while it waited.
constexpr char kSessionExpired[] = "mutex: session is expired";

class LockCall final : public UnaryRecipe<v3lockpb::LockRequest, v3lockpb::LockResponse> {
 public:
  LockCall(Recipes* recipes, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* out)
      : UnaryRecipe(recipes, ctx, out) {}

 private:
  void Run() override {
    Session(request_.lease(), [this](int64_t lease) { Acquire(lease); });
  }

  // Puts the caller's key unless it exists (the same lease asking again
  // keeps its place), reading the oldest key under the prefix in the same
  // txn: if that is the caller's, the lock is held.
  void Acquire(int64_t lease) {
    prefix_ = request_.name() + "/";
    key_ = SessionKey(prefix_, lease);
    TxnRequest txn;
    *txn.add_compare() = CreateRevisionIs(key_, 0);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(key_);
    put->set_lease(lease);
    *txn.add_success()->mutable_request_range() = FirstCreated(prefix_);
    txn.add_failure()->mutable_request_range()->set_key(key_);
    *txn.add_failure()->mutable_request_range() = FirstCreated(prefix_);
    Txn(std::move(txn), [this](absl::StatusOr<TxnResponse> r) {
      if (!r.ok()) return End(RecipeStatus(r.status()));
      int64_t my_rev = r->header().revision();
      if (!r->succeeded()) {
        const auto& mine = r->responses(0).response_range().kvs();
        if (mine.empty()) return End(RecipeStatus(absl::InternalError("lock key vanished")));
        my_rev = mine[0].create_revision();
      }
      const auto& owner = r->responses(1).response_range().kvs();
      if (owner.empty() || owner[0].create_revision() == my_rev) return Held(r->header().revision());
      waiting_ = true;
      WaitDeletes(prefix_, my_rev - 1, [this](absl::StatusOr<ResponseHeader> h) {
        if (!h.ok()) {
          DeleteDetached(key_);
          return End(RecipeStatus(h.status()));
        }
        // As etcd 3.5: the caller's key must still be there (its lease may
        // have ended while it waited).
        RangeRequest mine;
        mine.set_key(key_);
        absl::StatusOr<etcdserverpb::RangeResponse> got = Get(mine);
        if (!got.ok()) {
          DeleteDetached(key_);
          return End(RecipeStatus(got.status()));
        }
        if (got->kvs_size() == 0) return End(RecipeStatus(absl::UnknownError(kSessionExpired)));
        Held(got->header().revision());
      });
    });
  }

  void Held(int64_t revision) {
    response_.set_key(key_);
    Succeed(revision);
  }

  // A waiter that gives up takes its key away, as etcd's mutex does.
  void Cleanup() override {
    if (waiting_) DeleteDetached(key_);
  }

  std::string prefix_;
  std::string key_;
  bool waiting_ = false;
};

class UnlockCall final : public UnaryRecipe<v3lockpb::UnlockRequest, v3lockpb::UnlockResponse> {
 public:
  UnlockCall(Recipes* recipes, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* out)
      : UnaryRecipe(recipes, ctx, out) {}

 private:
  void Run() override {
    Delete(request_.key(), [this](absl::StatusOr<etcdserverpb::DeleteRangeResponse> r) {
      if (!r.ok()) return End(RecipeStatus(r.status()));
      Succeed(r->header().revision());
    });
  }
};

}  // namespace

grpc::ServerUnaryReactor* LockService::Lock(grpc::CallbackServerContext* ctx,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) {
  return LockCall::Start<LockCall>(recipes_, ctx, request, response);
}

grpc::ServerUnaryReactor* LockService::Unlock(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  return UnlockCall::Start<UnlockCall>(recipes_, ctx, request, response);
}

}  // namespace capstan::server
