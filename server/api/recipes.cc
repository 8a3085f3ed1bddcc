#include "server/api/recipes.h"

#include <cstdio>
#include <utility>
#include <vector>

#include "mvcc/errors.h"
#include "mvcc/key_range.h"
#include "server/api/auth_service.h"
#include "server/api/errors.h"

namespace capstan::server {

using etcdserverpb::RangeRequest;
using etcdserverpb::RangeResponse;
using etcdserverpb::ResponseHeader;
using etcdserverpb::TxnRequest;
using etcdserverpb::TxnResponse;
using etcdserverpb::WatchCreateRequest;
using etcdserverpb::WatchResponse;

std::string SessionKey(const std::string& prefix, int64_t lease) {
  const uint64_t magnitude =
      lease < 0 ? 0 - static_cast<uint64_t>(lease) : static_cast<uint64_t>(lease);
  char hex[24];
  std::snprintf(hex, sizeof(hex), "%s%llx", lease < 0 ? "-" : "",
                static_cast<unsigned long long>(magnitude));
  return prefix + hex;
}

RangeRequest FirstCreated(const std::string& prefix) {
  RangeRequest req;
  req.set_key(prefix);
  req.set_range_end(mvcc::PrefixEnd(prefix));
  req.set_sort_target(RangeRequest::CREATE);
  req.set_sort_order(RangeRequest::ASCEND);
  req.set_limit(1);
  return req;
}

RangeRequest LastCreated(const std::string& prefix) {
  RangeRequest req = FirstCreated(prefix);
  req.set_sort_order(RangeRequest::DESCEND);
  return req;
}

etcdserverpb::Compare CreateRevisionIs(const std::string& key, int64_t rev) {
  etcdserverpb::Compare c;
  c.set_key(key);
  c.set_target(etcdserverpb::Compare::CREATE);
  c.set_result(etcdserverpb::Compare::EQUAL);
  c.set_create_revision(rev);
  return c;
}

grpc::Status RecipeStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNKNOWN, ToGrpcStatus(s).error_message());
}

// One watcher of the hub, read by a call's steps: the hub's stream hands
// each response to the recipes' thread, which parses it for the call.
class HubWatch : public std::enable_shared_from_this<HubWatch> {
 public:
  using OnResponse = std::function<void(const WatchResponse&)>;

  HubWatch(Recipes* recipes, OnResponse on_response)
      : recipes_(recipes), on_response_(std::make_shared<OnResponse>(std::move(on_response))) {}
  ~HubWatch() { Close(); }

  void Open(const ResponseHeader& header, const WatchCreateRequest& req) {
    stream_ = recipes_->hub()->OpenStream(header);
    std::weak_ptr<HubWatch> weak = shared_from_this();
    Recipes* recipes = recipes_;
    // Runs under the stream's lock: only queue the message.
    stream_->SetDeliver([weak, recipes](std::string message) {
      recipes->Run([weak, message = std::move(message)]() mutable {
        if (auto w = weak.lock()) w->Drain(std::move(message));
      });
    });
    stream_->Create(req);
  }

  // No response is handed on after Close.
  void Close() {
    if (stream_ != nullptr) stream_->Close();
    stream_.reset();
    on_response_ = nullptr;
  }

 private:
  // Handles a delivered message, then every message queued behind it (the
  // stream delivers the next one only after Pop found its queue empty).
  void Drain(std::string message) {
    auto self = shared_from_this();  // a handler may drop the call's reference
    for (;;) {
      if (stream_ == nullptr) return;
      WatchResponse resp;
      // Held here: the handler may close the watch, which drops on_response_.
      std::shared_ptr<OnResponse> handler = on_response_;
      if (handler != nullptr && resp.ParseFromString(message)) (*handler)(resp);
      if (stream_ == nullptr || !stream_->Pop(&message)) return;
    }
  }

  Recipes* const recipes_;
  std::shared_ptr<OnResponse> on_response_;  // null once closed
  std::shared_ptr<mvcc::WatchStream> stream_;
};

// ---------------------------------------------------------------------------
// RecipeCall

RecipeCall::RecipeCall(Recipes* recipes, const grpc::ServerContextBase* ctx)
    : recipes_(recipes), ctx_(ctx) {}

RecipeCall::~RecipeCall() = default;

void RecipeCall::Begin(std::function<void()> first) {
  recipes_->Run([self = shared_from_this(), first = std::move(first)] {
    // A call never registered ends as any other: End's clean-up finds
    // nothing to undo.
    if (self->recipes_->stopping_) {
      return self->End(ToGrpcStatus(mvcc::MakeError(mvcc::Error::kStopped)));
    }
    self->recipes_->Register(self.get(), true);
    first();
  });
}

void RecipeCall::End(const grpc::Status& status) {
  if (over_) return;
  over_ = true;
  CloseWatch();
  recipes_->Register(this, false);
  Answer(status);
}

void RecipeCall::Cancelled() {
  recipes_->Run([self = shared_from_this()] {
    if (self->over_) return;
    self->CloseWatch();
    self->Cleanup();
    self->End(grpc::Status(grpc::StatusCode::CANCELLED, "context canceled"));
  });
}

ResponseHeader RecipeCall::Header(int64_t revision) const {
  ResponseHeader h;
  membership::FillHeader(*recipes_->member(), &h);
  h.set_revision(revision);
  return h;
}

template <typename Req, typename Resp>
void RecipeCall::Write(Req req, std::function<void(absl::StatusOr<Resp>)> then, bool validated) {
  struct Pending {
    Req req;
    Resp resp;
  };
  auto p = std::make_shared<Pending>();
  p->req = std::move(req);
  mvcc::WriteRequest w;
  w.op = mvcc::ClientOp<Req, Resp>{&p->req, &p->resp};
  w.validated = validated;
  // Checked again when it applies, as the client's own write would be
  // (etcd's lock and election servers write through a client carrying the
  // caller's token).
  if (const AuthGate* auth = recipes_->auth(); auth != nullptr) w.caller = auth->CallerOf(*ctx_);
  {
    util::MutexLock l(&recipes_->writes_mu_);
    ++recipes_->writes_in_flight_;
  }
  Recipes* recipes = recipes_;
  w.done = [self = shared_from_this(), recipes, p, then = std::move(then)](absl::Status s) {
    // s moves to the recipes' thread: only that thread touches it from here.
    recipes->Run([self, p, s = std::move(s), then] {
      if (self->over_ || !then) return;
      if (s.ok()) {
        then(std::move(p->resp));
      } else {
        then(s);
      }
    });
    util::MutexLock l(&recipes->writes_mu_);
    --recipes->writes_in_flight_;  // the destructor waits for 0
  };
  recipes_->store()->Submit(std::move(w));
}

void RecipeCall::Session(int64_t lease, std::function<void(int64_t)> then) {
  if (lease != 0) return then(lease);
  if (const AuthGate* auth = recipes_->auth(); auth != nullptr) {
    if (absl::Status s = auth->CheckIdentity(*ctx_); !s.ok()) return End(RecipeStatus(s));
  }
  etcdserverpb::LeaseGrantRequest req;
  req.set_ttl(kSessionTtl);
  Write<etcdserverpb::LeaseGrantRequest, etcdserverpb::LeaseGrantResponse>(
      std::move(req),
      [this, then = std::move(then)](absl::StatusOr<etcdserverpb::LeaseGrantResponse> r) {
        if (!r.ok()) return End(RecipeStatus(r.status()));
        then(r->id());
      });
}

template <typename Req, typename Resp>
void RecipeCall::CheckedWrite(
    Req req,
    absl::Status (AuthGate::*check)(const grpc::ServerContextBase&, const Req&) const,
    std::function<void(absl::StatusOr<Resp>)> then) {
  // As the KV service checks a client's write.
  absl::Status s =
      CheckWrite(recipes_->auth(), *ctx_, req, recipes_->store()->options().max_txn_ops, check);
  if (!s.ok()) {
    if (then) then(s);
    return;
  }
  Write<Req, Resp>(std::move(req), std::move(then), /*validated=*/true);
}

void RecipeCall::Txn(TxnRequest req, std::function<void(absl::StatusOr<TxnResponse>)> then) {
  CheckedWrite<TxnRequest, TxnResponse>(std::move(req), &AuthGate::CheckTxn, std::move(then));
}

void RecipeCall::TxnDetached(TxnRequest req) { Txn(std::move(req), nullptr); }

void RecipeCall::Delete(
    const std::string& key,
    std::function<void(absl::StatusOr<etcdserverpb::DeleteRangeResponse>)> then) {
  etcdserverpb::DeleteRangeRequest req;
  req.set_key(key);
  CheckedWrite<etcdserverpb::DeleteRangeRequest, etcdserverpb::DeleteRangeResponse>(
      std::move(req), &AuthGate::CheckDeleteRange, std::move(then));
}

void RecipeCall::DeleteDetached(const std::string& key) { Delete(key, nullptr); }

absl::StatusOr<RangeResponse> RecipeCall::Get(const RangeRequest& req) {
  if (const AuthGate* auth = recipes_->auth(); auth != nullptr) {
    if (absl::Status s = auth->CheckRange(*ctx_, req); !s.ok()) return s;
  }
  mvcc::RangeResult result;
  if (absl::Status s = recipes_->store()->Range(req, &result); !s.ok()) return s;
  RangeResponse resp;
  if (!resp.ParseFromString(result.kvs_wire)) {
    return absl::InternalError("a stored record does not parse");
  }
  *resp.mutable_header() = Header(result.rev);
  resp.set_more(result.more);
  resp.set_count(result.count);
  return resp;
}

void RecipeCall::Watch(const WatchCreateRequest& req,
                       std::function<void(const WatchResponse&)> on_response,
                       std::function<void(absl::Status)> on_error) {
  CloseWatch();
  if (const AuthGate* auth = recipes_->auth(); auth != nullptr) {
    if (absl::Status s = auth->CheckWatch(*ctx_, req.key(), req.range_end()); !s.ok()) {
      return on_error(s);
    }
  }
  // The call holds the watch; the watch's handler holds the call only
  // while the watch is open (Close drops the handler).
  watch_ = std::make_shared<HubWatch>(
      recipes_, [this, self = shared_from_this(), on_response = std::move(on_response),
                 on_error = std::move(on_error)](const WatchResponse& resp) {
        if (over_) return;
        // A refused watcher is answered created and canceled at once.
        if (resp.canceled()) {
          CloseWatch();
          // As the Go client reports a cancelled watcher: a compacted start
          // revision is ErrCompacted, anything else its reason.
          on_error(resp.compact_revision() > 0 ? mvcc::MakeError(mvcc::Error::kCompacted)
                                               : absl::UnknownError(resp.cancel_reason()));
          return;
        }
        if (resp.created()) return;
        on_response(resp);
      });
  watch_->Open(Header(0), req);
}

void RecipeCall::CloseWatch() {
  if (watch_ == nullptr) return;
  watch_->Close();
  watch_.reset();
}

void RecipeCall::WaitDelete(const std::string& key, int64_t rev,
                            std::function<void(absl::Status)> then) {
  WatchCreateRequest req;
  req.set_key(key);
  req.set_start_revision(rev);
  Watch(
      req,
      [this, then](const WatchResponse& resp) {
        for (const auto& ev : resp.events()) {
          if (ev.type() == mvccpb::Event::DELETE) {
            CloseWatch();
            then(absl::OkStatus());
            return;
          }
        }
      },
      then);
}

void RecipeCall::WaitDeletes(const std::string& prefix, int64_t max_create_rev,
                             std::function<void(absl::StatusOr<ResponseHeader>)> then) {
  // The newest key under prefix created at or below max_create_rev.
  RangeRequest req = LastCreated(prefix);
  req.set_max_create_revision(max_create_rev);
  absl::StatusOr<RangeResponse> got = Get(req);
  if (!got.ok()) return then(got.status());
  if (got->kvs_size() == 0) return then(got->header());
  WaitDelete(got->kvs(0).key(), got->header().revision(),
             [this, prefix, max_create_rev, then](absl::Status s) {
               if (!s.ok()) return then(s);
               WaitDeletes(prefix, max_create_rev, then);
             });
}

// ---------------------------------------------------------------------------
// Recipes

Recipes::Recipes(mvcc::KvStore* store, mvcc::WatchHub* hub, const membership::MemberInfo* member,
                 const AuthGate* auth)
    : store_(store), hub_(hub), member_(member), auth_(auth), queue_(1, "recipes") {}

Recipes::~Recipes() {
  EndCalls();
  // Wait for EndCalls to have run, then for the writes in flight to hand
  // their completions to the queue, which its destructor then drains.
  util::Mutex mu;
  bool ran ABSL_GUARDED_BY(mu) = false;
  Run([&] {
    util::MutexLock l(&mu);
    ran = true;
  });
  {
    util::MutexLock l(&mu);
    mu.Await(absl::Condition(&ran));
  }
  util::MutexLock l(&writes_mu_);
  auto drained = [this]() ABSL_SHARED_LOCKS_REQUIRED(writes_mu_) { return writes_in_flight_ == 0; };
  writes_mu_.Await(absl::Condition(&drained));
}

void Recipes::EndCalls() {
  Run([this] {
    stopping_ = true;
    std::vector<RecipeCall*> calls(calls_.begin(), calls_.end());
    for (RecipeCall* c : calls) c->End(ToGrpcStatus(mvcc::MakeError(mvcc::Error::kStopped)));
  });
}

const membership::MemberInfo* MemberOf(const Recipes* recipes) { return recipes->member(); }

}  // namespace capstan::server
