#include "server/api/cache_service.h"

#include <memory>
#include <string>
#include <utility>

#include "mvcc/key_range.h"
#include "mvcc/kv_codec.h"
#include "server/api/auth_service.h"
#include "server/api/client_traffic.h"
#include "server/api/errors.h"
#include "server/api/go_unmarshal.h"
#include "server/api/grpc_buffers.h"
#include "util/mutex.h"

namespace capstan::server {
namespace {

using watchcache::CachedObject;
using watchcache::EventType;
using watchcache::WatchEvent;

// Records at least this large are sent from the cached block itself.
constexpr size_t kZeroCopyMin = 512;
// Events per WatchResponse, and bytes (a response grows past it by at most
// one event).
constexpr size_t kMaxBatchEvents = 256;
constexpr size_t kMaxBatchBytes = 1 << 20;

void UnrefObject(void* p) { static_cast<const CachedObject*>(p)->Unref(); }

void AppendLength(int field, size_t len, std::string* out) {
  util::AppendTag(field, 2, out);
  util::AppendVarint(len, out);
}

std::string Header(const membership::MemberInfo& member, int64_t rev) {
  etcdserverpb::ResponseHeader h;
  membership::FillHeader(member, &h);
  h.set_revision(rev);
  return h.SerializeAsString();
}

watchcache::ResourceVersionMatch MatchOf(capstan::v1::ResourceVersionMatch m) {
  switch (m) {
    case capstan::v1::NOT_OLDER_THAN: return watchcache::ResourceVersionMatch::kNotOlderThan;
    case capstan::v1::EXACT: return watchcache::ResourceVersionMatch::kExact;
    default: return watchcache::ResourceVersionMatch::kUnset;
  }
}

// One Event (field 2 of a WatchResponse), its records by reference.
void AppendEvent(const WatchEvent& e, bool with_prev, ResponseSlices* b) {
  std::string head;
  util::AppendVarintField(1, static_cast<uint64_t>(e.type), &head);
  util::AppendVarintField(2, static_cast<uint64_t>(e.revision), &head);
  size_t size = head.size();
  const CachedObject* kv = e.object.get();
  const CachedObject* prev = with_prev ? e.prev_object.get() : nullptr;
  if (kv) size += 1 + util::VarintSize(kv->kv().size()) + kv->kv().size();
  if (prev) size += 1 + util::VarintSize(prev->kv().size()) + prev->kv().size();
  if (e.initial_events_end) size += 2;
  AppendLength(2, size, b->bytes());
  b->bytes()->append(head);
  if (kv) {
    AppendLength(3, kv->kv().size(), b->bytes());
    b->AppendObject(kv);
  }
  if (prev) {
    AppendLength(4, prev->kv().size(), b->bytes());
    b->AppendObject(prev);
  }
  if (e.initial_events_end) util::AppendVarintField(5, 1, b->bytes());
}

// One Watch stream. Deletes itself in OnDone.
class CacheWatchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  CacheWatchReactor(CacheService* service, capstan::v1::WatchRequest req)
      : service_(service), prev_kv_(req.prev_kv()) {
    // Starting may wait for the cache to reach the requested revision.
    service_->Run([this, req = std::move(req)] { Start(req); });
  }

  void OnWriteDone(bool ok) override {
    {
      util::MutexLock l(&mu_);
      writing_ = false;
      if (!ok) {
        FinishLocked(grpc::Status(grpc::UNAVAILABLE, "watch stream broken"));
        return;
      }
    }
    TrySend();
  }

  void OnCancel() override {
    util::MutexLock l(&mu_);
    FinishLocked(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    // Cancel guarantees the notify function is not running and never runs
    // again; the start task has finished (OnDone follows Finish, which the
    // start task or a later event triggers).
    std::unique_ptr<watchcache::CacheWatch> w;
    {
      util::MutexLock l(&mu_);
      mu_.Await(absl::Condition(&start_done_));
      w = std::move(watch_);
    }
    if (w) w->Cancel();
    delete this;
  }

 private:
  void Start(const capstan::v1::WatchRequest& req) ABSL_LOCKS_EXCLUDED(mu_) {
    watchcache::WatchOptions o;
    o.prefix = req.prefix();
    o.label_selector = req.label_selector();
    o.field_selector = req.field_selector();
    o.resource_version = req.resource_version();
    o.allow_bookmarks = req.allow_bookmarks();
    o.send_initial_events = req.send_initial_events();
    auto w = service_->cache()->Watch(o);
    if (w.ok()) {
      // Before the watch is shared: the notify function takes mu_, so
      // SetNotify (which takes the watch's notify lock) is not called under it.
      (*w)->SetNotify([this] { TrySend(); });
    }
    util::MutexLock l(&mu_);
    if (!w.ok()) {
      FinishLocked(ToGrpcStatus(w.status()));
    } else {
      watch_ = std::move(*w);
      TrySendLocked();
    }
    // Last: once it is set, OnDone may delete this reactor as soon as mu_
    // is released, so nothing of it may be touched after.
    start_done_ = true;  // wakes OnDone
  }

  void TrySend() ABSL_LOCKS_EXCLUDED(mu_) {
    util::MutexLock l(&mu_);
    TrySendLocked();
  }

  void TrySendLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_ || !watch_) return;
    events_.clear();
    size_t bytes = 0;
    while (events_.size() < kMaxBatchEvents && bytes < kMaxBatchBytes) {
      const size_t before = events_.size();
      if (watch_->Pop(&events_, kMaxBatchEvents - events_.size()) == 0) break;
      for (size_t i = before; i < events_.size(); ++i) {
        if (events_[i].object) bytes += events_[i].object->kv().size();
      }
    }
    if (events_.empty()) {
      if (watch_->done()) {
        absl::Status s = watch_->status();
        FinishLocked(s.ok() ? grpc::Status::OK : ToGrpcStatus(s));
      }
      return;
    }
    ResponseSlices b;
    const std::string header = Header(*service_->member(), events_.back().revision);
    AppendLength(1, header.size(), b.bytes());
    b.bytes()->append(header);
    for (const WatchEvent& e : events_) AppendEvent(e, prev_kv_, &b);
    events_.clear();
    b.Finish(&out_);
    ClientTraffic::Sent(out_.Length());
    writing_ = true;
    StartWrite(&out_);
  }

  void FinishLocked(const grpc::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(s);
  }

  CacheService* const service_;
  const bool prev_kv_;

  // Lock order: after the watch's notify lock (its notify function,
  // TrySend, takes mu_), before the watch's other locks (Pop, done and
  // status run under it).
  util::Mutex mu_;
  bool start_done_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::unique_ptr<watchcache::CacheWatch> watch_ ABSL_GUARDED_BY(mu_);
  std::vector<WatchEvent> events_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer out_ ABSL_GUARDED_BY(mu_);  // the write in flight
};

}  // namespace

void ResponseSlices::AppendObject(const CachedObject* o) {
  const std::string_view kv = o->kv();
  if (kv.size() < kZeroCopyMin) {
    pending_.append(kv);
    return;
  }
  Flush();
  o->Ref();
  slices_.emplace_back(const_cast<char*>(kv.data()), kv.size(), &UnrefObject,
                       const_cast<CachedObject*>(o));
}

void ResponseSlices::Finish(grpc::ByteBuffer* out) {
  Flush();
  grpc::ByteBuffer b(slices_.data(), slices_.size());
  out->Swap(&b);
  slices_.clear();
}

void ResponseSlices::Flush() {
  if (pending_.empty()) return;
  slices_.emplace_back(pending_.data(), pending_.size());  // copies
  pending_.clear();
}


CacheService::CacheService(watchcache::Cache* cache, const membership::MemberInfo* member, int threads,
                           const AuthGate* auth)
    : cache_(cache), member_(member), auth_(auth), work_(threads, "cache-service") {}

grpc::ServerUnaryReactor* CacheService::List(grpc::CallbackServerContext* ctx,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  auto* reactor = ctx->DefaultReactor();
  capstan::v1::ListRequest req;
  if (std::string error = DecodeReceived(*request, &req); !error.empty()) {
    reactor->Finish(UnmarshalStatus(error));
    return reactor;
  }
  if (auto st = CheckPrefix(*ctx, req.prefix()); !st.ok()) {
    reactor->Finish(ToGrpcStatus(st));
    return reactor;
  }
  Run([this, reactor, response, req = std::move(req)] {
    watchcache::ListOptions o;
    o.prefix = req.prefix();
    o.label_selector = req.label_selector();
    o.field_selector = req.field_selector();
    o.resource_version = req.resource_version();
    o.match = MatchOf(req.resource_version_match());
    o.limit = req.limit();
    o.continue_token = req.continue_();
    auto r = cache_->List(o);
    if (!r.ok()) {
      reactor->Finish(ToGrpcStatus(r.status()));
      return;
    }
    // ListResponse: header (1), kvs (2), resource_version (3), continue
    // (4), remaining_item_count (5).
    ResponseSlices b;
    const std::string header = Header(*member_, r->revision);
    AppendLength(1, header.size(), b.bytes());
    b.bytes()->append(header);
    for (const auto& obj : r->objects) {
      AppendLength(2, obj->kv().size(), b.bytes());
      b.AppendObject(obj.get());
    }
    util::AppendVarintField(3, static_cast<uint64_t>(r->revision), b.bytes());
    if (!r->continue_token.empty()) util::AppendBytesField(4, r->continue_token, b.bytes());
    if (r->remaining_item_count) {
      util::AppendTag(5, 0, b.bytes());
      util::AppendVarint(static_cast<uint64_t>(*r->remaining_item_count), b.bytes());
    }
    b.Finish(response);
    ClientTraffic::Sent(response->Length());
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

namespace {

// Ends a Watch at once with a refusal.
class RefusedWatchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedWatchReactor(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

absl::Status CacheService::CheckPrefix(const grpc::ServerContextBase& ctx,
                                       const std::string& prefix) const {
  if (auth_ == nullptr) return absl::OkStatus();
  return auth_->CheckWatch(ctx, prefix, mvcc::PrefixEnd(prefix));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* CacheService::Watch(grpc::CallbackServerContext* ctx,
                                                                const grpc::ByteBuffer* request) {
  capstan::v1::WatchRequest req;
  if (std::string error = DecodeReceived(*request, &req); !error.empty()) {
    return new RefusedWatchReactor(StreamUnmarshalStatus(error));
  }
  if (auto st = CheckPrefix(*ctx, req.prefix()); !st.ok()) {
    return new RefusedWatchReactor(ToGrpcStatus(st));
  }
  return new CacheWatchReactor(this, std::move(req));
}

}  // namespace capstan::server
