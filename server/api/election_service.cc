#include "server/api/election_service.h"

#include <deque>
#include <string>
#include <utility>

#include "mvcc/errors.h"
#include "mvcc/key_range.h"
#include "server/api/client_traffic.h"

namespace capstan::server {

using etcdserverpb::ResponseHeader;
using etcdserverpb::TxnRequest;
using etcdserverpb::TxnResponse;
using v3electionpb::LeaderKey;

namespace {

// The texts of etcd's election errors.
constexpr char kNoLeader[] = "election: no leader";
constexpr char kNotLeader[] = "election: not leader";
constexpr char kMissingLeader[] = "\"leader\" field must be provided";

// If the key still has create revision rev: put value on it (Proclaim).
TxnRequest ProclaimTxn(const std::string& key, int64_t rev, const std::string& value,
                       int64_t lease) {
  TxnRequest txn;
  *txn.add_compare() = CreateRevisionIs(key, rev);
  auto* put = txn.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  return txn;
}

// If the key still has create revision rev: delete it (Resign).
TxnRequest ResignTxn(const std::string& key, int64_t rev) {
  TxnRequest txn;
  *txn.add_compare() = CreateRevisionIs(key, rev);
  txn.add_success()->mutable_request_delete_range()->set_key(key);
  return txn;
}

class CampaignCall final
    : public UnaryRecipe<v3electionpb::CampaignRequest, v3electionpb::CampaignResponse> {
 public:
  CampaignCall(Recipes* recipes, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* out)
      : UnaryRecipe(recipes, ctx, out) {}

 private:
  void Run() override {
    Session(request_.lease(), [this](int64_t lease) { Enter(lease); });
  }

  // Puts the candidate's key with its value unless the key exists (the same
  // lease campaigning again keeps its place, proclaiming a new value).
  void Enter(int64_t lease) {
    lease_ = lease;
    prefix_ = request_.name() + "/";
    key_ = SessionKey(prefix_, lease);
    TxnRequest txn;
    *txn.add_compare() = CreateRevisionIs(key_, 0);
    auto* put = txn.add_success()->mutable_request_put();
    put->set_key(key_);
    put->set_value(request_.value());
    put->set_lease(lease);
    txn.add_failure()->mutable_request_range()->set_key(key_);
    Txn(std::move(txn), [this](absl::StatusOr<TxnResponse> r) {
      if (!r.ok()) return End(RecipeStatus(r.status()));
      // The answer's header is this txn's, as in etcd.
      header_rev_ = r->header().revision();
      leader_rev_ = header_rev_;
      entered_ = true;
      if (r->succeeded()) return Wait();
      const auto& mine = r->responses(0).response_range().kvs();
      if (mine.empty()) return End(RecipeStatus(absl::InternalError("candidate key vanished")));
      leader_rev_ = mine[0].create_revision();
      if (mine[0].value() == request_.value()) return Wait();
      Txn(ProclaimTxn(key_, leader_rev_, request_.value(), lease_),
          [this](absl::StatusOr<TxnResponse> p) {
            if (!p.ok()) {
              TxnDetached(ResignTxn(key_, leader_rev_));
              return End(RecipeStatus(p.status()));
            }
            if (!p->succeeded()) return End(RecipeStatus(absl::UnknownError(kNotLeader)));
            Wait();
          });
    });
  }

  // Leads once every older candidate's key is gone.
  void Wait() {
    WaitDeletes(prefix_, leader_rev_ - 1, [this](absl::StatusOr<ResponseHeader> h) {
      if (!h.ok()) return End(RecipeStatus(h.status()));
      LeaderKey* leader = response_.mutable_leader();
      leader->set_name(request_.name());
      leader->set_key(key_);
      leader->set_rev(leader_rev_);
      leader->set_lease(lease_);
      Succeed(header_rev_);
    });
  }

  // A candidate that gives up resigns, as etcd's election does.
  void Cleanup() override {
    if (entered_) TxnDetached(ResignTxn(key_, leader_rev_));
  }

  int64_t lease_ = 0;
  std::string prefix_;
  std::string key_;
  int64_t header_rev_ = 0;
  int64_t leader_rev_ = 0;
  bool entered_ = false;
};

class ProclaimCall final
    : public UnaryRecipe<v3electionpb::ProclaimRequest, v3electionpb::ProclaimResponse> {
 public:
  ProclaimCall(Recipes* recipes, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* out)
      : UnaryRecipe(recipes, ctx, out) {}

 private:
  void Run() override {
    if (!request_.has_leader()) return End(RecipeStatus(absl::UnknownError(kMissingLeader)));
    // etcd resumes the election in a session of the leader's lease, and so
    // grants a new one when the leader key names none.
    Session(request_.leader().lease(), [this](int64_t lease) {
      const LeaderKey& leader = request_.leader();
      Txn(ProclaimTxn(leader.key(), leader.rev(), request_.value(), lease),
          [this](absl::StatusOr<TxnResponse> r) {
            if (!r.ok()) return End(RecipeStatus(r.status()));
            if (!r->succeeded()) return End(RecipeStatus(absl::UnknownError(kNotLeader)));
            Succeed(r->header().revision());
          });
    });
  }
};

class ResignCall final
    : public UnaryRecipe<v3electionpb::ResignRequest, v3electionpb::ResignResponse> {
 public:
  ResignCall(Recipes* recipes, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* out)
      : UnaryRecipe(recipes, ctx, out) {}

 private:
  void Run() override {
    if (!request_.has_leader()) return End(RecipeStatus(absl::UnknownError(kMissingLeader)));
    Session(request_.leader().lease(), [this](int64_t) {
      Txn(ResignTxn(request_.leader().key(), request_.leader().rev()),
          [this](absl::StatusOr<TxnResponse> r) {
            if (!r.ok()) return End(RecipeStatus(r.status()));
            Succeed(r->header().revision());
          });
    });
  }
};

class LeaderCall final
    : public UnaryRecipe<v3electionpb::LeaderRequest, v3electionpb::LeaderResponse> {
 public:
  LeaderCall(Recipes* recipes, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* out)
      : UnaryRecipe(recipes, ctx, out) {}

 private:
  void Run() override {
    absl::StatusOr<etcdserverpb::RangeResponse> got = Get(FirstCreated(request_.name() + "/"));
    if (!got.ok()) return End(RecipeStatus(got.status()));
    if (got->kvs_size() == 0) return End(RecipeStatus(absl::UnknownError(kNoLeader)));
    *response_.mutable_header() = got->header();
    *response_.mutable_kv() = got->kvs(0);
    End(grpc::Status::OK);
  }
};

// Observe: etcd's observe loop. Reads the leader (or, with none, watches
// the election's prefix for the first candidate put), sends it, then
// watches the leader's key and sends every value it proclaims until the key
// is deleted, and starts over. A failed read or watch ends the stream with
// OK, as etcd's does.
//
// At most kMaxQueued responses wait for the client: past that the watch on
// the leader's key is closed and opened again, from the revision after the
// last one sent, once the client has read them, so a client that does not
// read costs bounded memory. If a compaction removed those revisions in
// between, the observer goes on from the current leader.
class ObserveCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer>, public RecipeCall {
 public:
  static constexpr size_t kMaxQueued = 64;

  ObserveCall(Recipes* recipes, grpc::CallbackServerContext* ctx) : RecipeCall(recipes, ctx) {}

  static grpc::ServerWriteReactor<grpc::ByteBuffer>* Start(Recipes* recipes,
                                                           grpc::CallbackServerContext* ctx,
                                                           const grpc::ByteBuffer* in) {
    auto call = std::make_shared<ObserveCall>(recipes, ctx);
    ObserveCall* c = call.get();
    c->BeginRequest(
        *in, &c->request_,
        [c] {
          c->prefix_ = c->request_.name() + "/";
          c->Loop();
        },
        /*streamed=*/true);
    return c;
  }

  void OnWriteDone(bool ok) override {
    recipes_->Run([self = shared_from_this(), this, ok] {
      writing_ = false;
      if (over()) return;
      if (!ok) return End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "observe stream broken"));
      if (!queued_.empty()) {
        WriteNext();
      } else if (paused_) {
        paused_ = false;
        Follow(leader_key_, next_rev_);
      }
    });
  }
  void OnCancel() override { Cancelled(); }
  void OnDone() override { Release(); }

 private:
  void Answer(const grpc::Status& status) override { Finish(status); }

  void Loop() {
    absl::StatusOr<etcdserverpb::RangeResponse> got = Get(FirstCreated(prefix_));
    if (!got.ok()) return End(grpc::Status::OK);
    if (got->kvs_size() > 0) {
      const mvccpb::KeyValue& kv = got->kvs(0);
      Send(got->header().revision(), kv);
      return Follow(kv.key(), got->header().revision() + 1);
    }
    // No leader: the first candidate put under the prefix is the next one.
    etcdserverpb::WatchCreateRequest req;
    req.set_key(prefix_);
    req.set_range_end(mvcc::PrefixEnd(prefix_));
    req.set_start_revision(got->header().revision());
    Watch(
        req,
        [this](const etcdserverpb::WatchResponse& resp) {
          for (const auto& ev : resp.events()) {
            if (ev.type() != mvccpb::Event::PUT) continue;
            CloseWatch();
            mvccpb::KeyValue kv = ev.kv();
            Send(kv.mod_revision(), kv);
            return Follow(kv.key(), kv.mod_revision() + 1);
          }
        },
        [this](absl::Status) { End(grpc::Status::OK); });
  }

  // Sends what the leader's key proclaims from revision `from` on, until
  // the key is deleted.
  void Follow(const std::string& key, int64_t from) {
    leader_key_ = key;
    next_rev_ = from;
    etcdserverpb::WatchCreateRequest req;
    req.set_key(key);
    req.set_start_revision(from);
    Watch(
        req,
        [this](const etcdserverpb::WatchResponse& resp) {
          for (const auto& ev : resp.events()) {
            if (ev.type() == mvccpb::Event::DELETE) {
              CloseWatch();
              return Loop();
            }
            Send(resp.header().revision(), ev.kv());
            next_rev_ = ev.kv().mod_revision() + 1;
          }
          if (queued_.size() >= kMaxQueued) {
            CloseWatch();
            paused_ = true;
            recipes_->CountObservePause();
          }
        },
        [this](absl::Status s) {
          // Only a watch reopened after a pause can start at a compacted
          // revision: the values in between are gone, so go on from the
          // current leader (etcd's observer promises the latest value, not
          // every one).
          if (mvcc::Is(s, mvcc::Error::kCompacted)) return Loop();
          End(grpc::Status::OK);
        });
  }

  void Send(int64_t header_rev, const mvccpb::KeyValue& kv) {
    v3electionpb::LeaderResponse resp;
    *resp.mutable_header() = Header(header_rev);
    *resp.mutable_kv() = kv;
    queued_.push_back(resp.SerializeAsString());
    if (!writing_) WriteNext();
  }

  void WriteNext() {
    writing_ = true;
    ClientTraffic::Sent(queued_.front().size());
    StringToBuffer(std::move(queued_.front()), &out_);
    queued_.pop_front();
    StartWrite(&out_);
  }

  v3electionpb::LeaderRequest request_;
  std::string prefix_;
  std::string leader_key_;
  int64_t next_rev_ = 0;        // the revision Follow resumes from
  bool paused_ = false;         // the leader's watch waits for the client to read
  bool writing_ = false;        // out_ is being written
  std::deque<std::string> queued_;
  grpc::ByteBuffer out_;
};

}  // namespace

grpc::ServerUnaryReactor* ElectionService::Campaign(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return CampaignCall::Start<CampaignCall>(recipes_, ctx, request, response);
}

grpc::ServerUnaryReactor* ElectionService::Proclaim(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return ProclaimCall::Start<ProclaimCall>(recipes_, ctx, request, response);
}

grpc::ServerUnaryReactor* ElectionService::Leader(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  return LeaderCall::Start<LeaderCall>(recipes_, ctx, request, response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ElectionService::Observe(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  return ObserveCall::Start(recipes_, ctx, request);
}

grpc::ServerUnaryReactor* ElectionService::Resign(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  return ResignCall::Start<ResignCall>(recipes_, ctx, request, response);
}

}  // namespace capstan::server
