// The steps of etcd's concurrency recipes (clientv3/concurrency: sessions,
// mutexes, elections) run inside the server, for the Lock and Election
// services.
//
// etcd serves v3lockpb.Lock and v3electionpb.Election by running those
// recipes through a client of itself: a Lock is a transaction that puts the
// caller's key, then a wait for every older key under the lock's name to be
// deleted (a read, then a watch on the newest older key, again until none is
// left). Capstan runs the same transactions, reads and watches against the
// store and the watch hub directly, so its keys, revisions and answers are
// etcd's, without a thread or a client connection per waiting call.
//
// Every step of every call runs on the recipes' one thread, in order; a step
// never blocks (a write's completion and a watch's responses come back as
// new steps). Each step is checked as the caller, with its credentials, as
// etcd's recipes run with the caller's context.
//
// Thread safety: Recipes' public methods may be called from any thread;
// a Call's members are touched on the recipes' thread only.

#ifndef CAPSTAN_SERVER_API_RECIPES_H_
#define CAPSTAN_SERVER_API_RECIPES_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "etcdserverpb/rpc.pb.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/status.h"
#include "membership/member.h"
#include "mvcc/kv_store.h"
#include "mvcc/watch_hub.h"
#include "server/api/client_traffic.h"
#include "server/api/errors.h"
#include "server/api/go_unmarshal.h"
#include "server/api/grpc_buffers.h"
#include "util/mutex.h"
#include "util/work_queue.h"

namespace capstan::server {

class AuthGate;
class HubWatch;
class Recipes;

// The lease TTL of a session etcd creates for a call that names no lease
// (clientv3/concurrency's defaultSessionTTL), in seconds.
inline constexpr int64_t kSessionTtl = 60;

// A lock's or a candidate's key: the prefix and the lease ID as Go's %x
// prints it (lower-case hex; a minus sign before a negative ID).
std::string SessionKey(const std::string& prefix, int64_t lease);

// The oldest or the newest key under prefix, by create revision
// (clientv3's WithFirstCreate and WithLastCreate).
etcdserverpb::RangeRequest FirstCreated(const std::string& prefix);
etcdserverpb::RangeRequest LastCreated(const std::string& prefix);

// A txn compare: the key's create revision is rev (0: the key is absent).
etcdserverpb::Compare CreateRevisionIs(const std::string& key, int64_t rev);

// The status etcd's Lock and Election services answer for a failed step:
// their recipes' errors reach the client as code Unknown with the error's
// text ("etcdserver: requested lease not found", "election: no leader").
grpc::Status RecipeStatus(const absl::Status& s);

// The member recipes serve for (Recipes::member(), for calls declared before
// Recipes is complete).
const membership::MemberInfo* MemberOf(const Recipes* recipes);

// One call of the Lock or Election service: its steps and what they share.
// Held by shared_ptr while the RPC or any pending step needs it. Subclasses
// implement Answer, which End calls once to answer the RPC; after it,
// pending steps are dropped.
class RecipeCall : public std::enable_shared_from_this<RecipeCall> {
 public:
  virtual ~RecipeCall();

 protected:
  RecipeCall(Recipes* recipes, const grpc::ServerContextBase* ctx);

  // Registers the call (so that Recipes can end it at shutdown) and runs
  // `first` on the recipes' thread.
  void Begin(std::function<void()> first);
  // The start of an RPC: keeps the call alive until Release (its reactor's
  // OnDone), parses the received bytes into *request and begins with
  // `first`; a request that does not parse is answered with Go gRPC's
  // unmarshal error, as by etcd (a server stream's text: `streamed`).
  template <typename Request>
  void BeginRequest(const grpc::ByteBuffer& in, Request* request, std::function<void()> first,
                    bool streamed = false) {
    self_ = shared_from_this();
    if (std::string error = DecodeReceived(in, request); !error.empty()) {
      grpc::Status status = streamed ? StreamUnmarshalStatus(error) : UnmarshalStatus(error);
      Begin([this, status] { End(status); });
    } else if (absl::Status refused = LearnerRefusal(MemberOf(recipes_)); !refused.ok()) {
      Begin([this, status = ToGrpcStatus(refused)] { End(status); });
    } else {
      Begin(std::move(first));
    }
  }
  // gRPC is done with the call's reactor.
  void Release() { self_.reset(); }
  // Answers the RPC with status (a subclass's own response, if OK). Called
  // once, on the recipes' thread.
  virtual void Answer(const grpc::Status& status) = 0;
  // Ends the call: closes its watch, marks it over, answers. Idempotent.
  void End(const grpc::Status& status);
  // The client went away: runs `cleanup` (a step that undoes what the call
  // left behind, as etcd's recipes do when their context is cancelled),
  // then ends the call. Safe from any thread.
  void Cancelled();
  virtual void Cleanup() {}
  bool over() const { return over_; }

  // Steps. Each checks the caller's permission first and hands `then` the
  // outcome on the recipes' thread, unless the call is over by then.
  // etcd's session for a call: `then` gets the lease given, or for 0 a new
  // lease of kSessionTtl seconds with an ID the store picks (the call ends
  // with the error if the grant fails).
  void Session(int64_t lease, std::function<void(int64_t)> then);
  void Txn(etcdserverpb::TxnRequest req,
           std::function<void(absl::StatusOr<etcdserverpb::TxnResponse>)> then);
  // A write left to finish on its own (a cleanup after the call is over).
  void TxnDetached(etcdserverpb::TxnRequest req);
  void Delete(const std::string& key,
              std::function<void(absl::StatusOr<etcdserverpb::DeleteRangeResponse>)> then);
  void DeleteDetached(const std::string& key);
  // A read at the current revision (synchronous: reads never wait).
  absl::StatusOr<etcdserverpb::RangeResponse> Get(const etcdserverpb::RangeRequest& req);
  // Watches from a revision: on_response gets every WatchResponse after
  // the created one until the watch is closed (by CloseWatch, or by the
  // call ending); a cancelled watcher ends the watch with its error.
  void Watch(const etcdserverpb::WatchCreateRequest& req,
             std::function<void(const etcdserverpb::WatchResponse&)> on_response,
             std::function<void(absl::Status)> on_error);
  void CloseWatch();
  // etcd's waitDeletes: waits until no key under prefix has a create
  // revision at or below max_create_rev, and hands on the header of the
  // read that found none.
  void WaitDeletes(const std::string& prefix, int64_t max_create_rev,
                   std::function<void(absl::StatusOr<etcdserverpb::ResponseHeader>)> then);

  // A header with the member's fields and the given revision.
  etcdserverpb::ResponseHeader Header(int64_t revision) const;

  Recipes* const recipes_;
  const grpc::ServerContextBase* const ctx_;

 private:
  friend class Recipes;

  // Submits a write (the client write of mvcc/write_request.h whose request
  // is Req); then gets its outcome (unless null). validated: the caller ran
  // ValidateWrite on it (WriteRequest::validated).
  template <typename Req, typename Resp>
  void Write(Req req, std::function<void(absl::StatusOr<Resp>)> then, bool validated = false);
  // Checks the write's shape, then the caller's permission with check, and
  // submits it; a refusal goes to then (unless null).
  template <typename Req, typename Resp>
  void CheckedWrite(
      Req req,
      absl::Status (AuthGate::*check)(const grpc::ServerContextBase&, const Req&) const,
      std::function<void(absl::StatusOr<Resp>)> then);
  void WaitDelete(const std::string& key, int64_t rev, std::function<void(absl::Status)> then);

  bool over_ = false;
  std::shared_ptr<HubWatch> watch_;
  // Set by BeginRequest and reset by Release, on gRPC threads only.
  std::shared_ptr<RecipeCall> self_;
};

// A unary RPC of the Lock or Election service run as a recipe call: its
// request parsed from the received bytes, its response, and the reactor
// that answers it. A subclass implements Run, the call's first step.
template <typename Request, typename Response>
class UnaryRecipe : public grpc::ServerUnaryReactor, public RecipeCall {
 public:
  // Starts a Call (a subclass) for the received bytes; a request that does
  // not parse is answered with Go gRPC's unmarshal error, as by etcd.
  template <typename Call>
  static grpc::ServerUnaryReactor* Start(Recipes* recipes, grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* in, grpc::ByteBuffer* out) {
    std::shared_ptr<UnaryRecipe> call = std::make_shared<Call>(recipes, ctx, out);
    UnaryRecipe* c = call.get();
    c->BeginRequest(*in, &c->request_, [c] { c->Run(); });
    return c;
  }

  void OnCancel() override { Cancelled(); }
  void OnDone() override { Release(); }

 protected:
  UnaryRecipe(Recipes* recipes, grpc::CallbackServerContext* ctx, grpc::ByteBuffer* out)
      : RecipeCall(recipes, ctx), out_(out) {}

  virtual void Run() = 0;

  // Answers OK: the response filled so far, with the member's header at
  // revision.
  void Succeed(int64_t revision) {
    *response_.mutable_header() = Header(revision);
    End(grpc::Status::OK);
  }

  void Answer(const grpc::Status& status) override {
    if (status.ok()) {
      StringToBuffer(response_.SerializeAsString(), out_);
      ClientTraffic::Sent(out_->Length());
    }
    Finish(status);
  }

  Request request_;
  Response response_;

 private:
  grpc::ByteBuffer* const out_;
};

// What the Lock and Election services share: the store, the hub, the
// caller checks, and the thread their calls' steps run on.
class Recipes {
 public:
  // auth may be null (no checks). store, hub, member and auth must outlive
  // the Recipes.
  Recipes(mvcc::KvStore* store, mvcc::WatchHub* hub, const membership::MemberInfo* member,
          const AuthGate* auth);
  // Ends every call still waiting (as EndCalls), waits for the writes its
  // steps submitted, and stops the thread. Destroy before the hub and the
  // store, after the gRPC server stopped calling the services.
  ~Recipes();

  Recipes(const Recipes&) = delete;
  Recipes& operator=(const Recipes&) = delete;

  // Answers every call still waiting (a Lock behind another holder, a
  // Campaign, an Observe stream), and every call that begins afterwards,
  // with "server stopped", so that the server can stop without waiting for
  // them. Their keys stay, under their leases.
  void EndCalls();

  // For metrics (any thread): calls begun and not yet answered (mostly a
  // Lock or Campaign waiting or an Observe stream open; also a short call
  // such as Unlock in flight), and how often an Observe stream held its
  // watch back for a client that read too slowly.
  int64_t calls_in_progress() const { return calls_in_progress_.load(std::memory_order_relaxed); }
  uint64_t observe_pauses() const { return observe_pauses_.load(std::memory_order_relaxed); }
  void CountObservePause() { observe_pauses_.fetch_add(1, std::memory_order_relaxed); }

  mvcc::KvStore* store() const { return store_; }
  mvcc::WatchHub* hub() const { return hub_; }
  const membership::MemberInfo* member() const { return member_; }
  const AuthGate* auth() const { return auth_; }
  void Run(std::function<void()> fn) { queue_.Run(std::move(fn)); }

 private:
  friend class RecipeCall;

  // Adds a call to calls_ (begun) or removes it (over), keeping the count
  // other threads read in step. Recipes' thread only.
  void Register(RecipeCall* call, bool begun) {
    if (begun) {
      calls_.insert(call);
    } else {
      calls_.erase(call);
    }
    calls_in_progress_.store(static_cast<int64_t>(calls_.size()), std::memory_order_relaxed);
  }

  mvcc::KvStore* const store_;
  mvcc::WatchHub* const hub_;
  const membership::MemberInfo* const member_;
  const AuthGate* const auth_;

  // Calls begun and not yet over, and whether EndCalls ran: calls that
  // begin after it are answered "server stopped" at once (recipes' thread
  // only).
  std::set<RecipeCall*> calls_;
  bool stopping_ = false;
  std::atomic<int64_t> calls_in_progress_{0};  // calls_.size(), for other threads
  std::atomic<uint64_t> observe_pauses_{0};

  // Writes submitted whose completion has not been queued yet. A leaf: the
  // store's completion callbacks take it.
  util::Mutex writes_mu_;
  int writes_in_flight_ ABSL_GUARDED_BY(writes_mu_) = 0;

  util::WorkQueue queue_;  // last: its thread stops first
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_RECIPES_H_
