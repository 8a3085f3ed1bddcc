#include "watchcache/remote_feed.h"

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "util/thread_name.h"

namespace capstan::watchcache {
namespace {

// At most one progress request per this interval.
constexpr int64_t kProgressRequestGapNs = 20'000'000;

// etcd's text for a read or watch below the compacted revision
// (etcdserver: mvcc: required revision has been compacted).
bool IsCompacted(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::OUT_OF_RANGE &&
         absl::StrContains(s.error_message(), "required revision has been compacted");
}

absl::Status ToStatus(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

}  // namespace

bool AnswersProgressEarly(std::string_view version) {
  int major = 0, minor = 0, patch = 0;
  std::string v(version);
  if (std::sscanf(v.c_str(), "%d.%d.%d", &major, &minor, &patch) != 3) return false;
  if (major != 3) return false;
  if (minor < 4) return true;
  if (minor == 4) return patch < 31;
  if (minor == 5) return patch < 13;
  return false;
}

RemoteFeed::RemoteFeed(ResourceCache* cache, std::shared_ptr<grpc::Channel> channel,
                       RemoteFeedOptions options)
    : cache_(cache),
      options_(options),
      kv_(etcdserverpb::KV::NewStub(channel)),
      watch_(etcdserverpb::Watch::NewStub(channel)),
      maintenance_(etcdserverpb::Maintenance::NewStub(channel)),
      backoff_(options.min_backoff) {
  cache_->SetRevisionSource([this] { return CurrentRevision(); }, [this] { RequestProgress(); });
}

RemoteFeed::~RemoteFeed() { Stop(); }

void RemoteFeed::Start() { thread_ = NamedThread("cache-feed", [this] { Run(); }); }

void RemoteFeed::Stop() {
  {
    util::MutexLock l(&mu_);
    stopping_ = true;
    if (call_) call_->TryCancel();
  }
  if (thread_.joinable()) thread_.join();
}

void RemoteFeed::TEST_Pause(bool paused) {
  util::MutexLock l(&mu_);
  paused_ = paused;
  if (paused && call_) call_->TryCancel();
}

etcdserverpb::ResponseHeader RemoteFeed::upstream_header() const {
  util::MutexLock l(&mu_);
  return header_;
}

void RemoteFeed::NoteHeader(const etcdserverpb::ResponseHeader& h) {
  util::MutexLock l(&mu_);
  header_ = h;
}

std::shared_ptr<grpc::ClientContext> RemoteFeed::NewContext(bool deadline) {
  auto ctx = std::make_shared<grpc::ClientContext>();
  if (deadline) ctx->set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  util::MutexLock l(&mu_);
  if (stopping_ || paused_) ctx->TryCancel();
  call_ = ctx;
  return ctx;
}

absl::StatusOr<int64_t> RemoteFeed::CurrentRevision() {
  // One key: the header carries the revision, the answer costs nothing.
  etcdserverpb::RangeRequest req;
  req.set_key(cache_->spec().prefix);
  req.set_count_only(true);
  etcdserverpb::RangeResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  // As etcd's Go client does: a channel still backing off after an upstream restart is waited
  // for, up to the deadline, rather than failing the read at once.
  ctx.set_wait_for_ready(true);
  grpc::Status s = kv_->Range(&ctx, req, &resp);
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot read the upstream's current revision: ", s.error_message()));
  }
  return resp.header().revision();
}

void RemoteFeed::RequestProgress() {
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  int64_t last = last_progress_request_ns_.load(std::memory_order_relaxed);
  if (now - last < kProgressRequestGapNs) return;
  if (!last_progress_request_ns_.compare_exchange_strong(last, now)) return;
  etcdserverpb::WatchRequest req;
  req.mutable_progress_request();
  util::MutexLock l(&stream_mu_);
  if (stream_ != nullptr) stream_->Write(req);
}

void RemoteFeed::CheckUpstreamVersion() {
  etcdserverpb::StatusResponse resp;
  auto ctx = NewContext(true);
  if (!maintenance_->Status(ctx.get(), etcdserverpb::StatusRequest(), &resp).ok()) return;
  version_checked_ = true;
  if (AnswersProgressEarly(resp.version())) {
    SPDLOG_WARN(
        "watch cache {}: upstream etcd {} answers watch progress requests ahead of events "
        "(etcd#15220): after the feed starts a watch, consistent reads wait up to {} before "
        "trusting progress, and a smaller window remains; etcd 3.4.31, 3.5.13 and later are not "
        "affected",
        cache_->spec().prefix, resp.version(), absl::FormatDuration(options_.catch_up_grace));
  }
}

void RemoteFeed::Backoff() {
  // Jitter: 50% to 100% of the backoff.
  static thread_local std::mt19937_64 rng(std::random_device{}());
  const absl::Duration d = backoff_ * (0.5 + 0.5 * std::uniform_real_distribution<double>(0, 1)(rng));
  {
    util::MutexLock l(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), d);
  }
  backoff_ = std::min(backoff_ * 2, options_.max_backoff);
}

void RemoteFeed::Run() {
  const std::string& prefix = cache_->spec().prefix;
  bool need_list = true;
  for (;;) {
    {
      util::MutexLock l(&mu_);
      auto runnable = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !paused_; };
      mu_.Await(absl::Condition(&runnable));
      if (stopping_) return;
    }
    if (!version_checked_) CheckUpstreamVersion();  // once it answers
    if (need_list) {
      absl::Status s = Load();
      if (!s.ok()) {
        SPDLOG_WARN("watch cache {}: list from upstream failed: {}; retrying", prefix, s.ToString());
        Backoff();
        continue;
      }
      lists_.fetch_add(1);
      need_list = false;
    }
    switch (Follow(cache_->rev())) {
      case WatchEnd::kStopped: break;
      case WatchEnd::kCompacted:
        SPDLOG_INFO("watch cache {}: upstream compacted past revision {}; listing again", prefix,
                     cache_->rev());
        need_list = true;
        break;
      case WatchEnd::kBroken:
        reconnects_.fetch_add(1);
        Backoff();
        break;
    }
  }
}

absl::Status RemoteFeed::Load() {
  const std::string& prefix = cache_->spec().prefix;
  etcdserverpb::RangeRequest req;
  req.set_key(prefix);
  req.set_range_end(PrefixEnd(prefix));
  req.set_limit(options_.list_page);
  std::vector<ObjectRef> objects;
  int64_t at = 0;
  std::string record;
  for (;;) {
    etcdserverpb::RangeResponse resp;
    auto ctx = NewContext(true);
    grpc::Status s = kv_->Range(ctx.get(), req, &resp);
    if (!s.ok()) {
      if (at > 0 && IsCompacted(s)) {
        // Compacted between pages: start over at a new revision.
        SPDLOG_INFO("watch cache {}: revision {} compacted while listing; listing again", prefix, at);
        objects.clear();
        at = 0;
        req.set_key(prefix);
        req.set_revision(0);
        continue;
      }
      return ToStatus(s);
    }
    NoteHeader(resp.header());
    if (at == 0) {
      at = resp.header().revision();
      req.set_revision(at);
    }
    for (const mvccpb::KeyValue& kv : resp.kvs()) {
      record.clear();
      kv.SerializeToString(&record);
      if (ObjectRef o = cache_->MakeObject(record)) objects.push_back(std::move(o));
    }
    if (!resp.more() || resp.kvs_size() == 0) break;
    req.set_key(resp.kvs(resp.kvs_size() - 1).key() + std::string(1, '\0'));
  }
  const size_t n = objects.size();
  cache_->Reset(at, std::move(objects));
  SPDLOG_INFO("watch cache {}: listed {} objects from upstream at revision {}", prefix, n, at);
  return absl::OkStatus();
}

RemoteFeed::WatchEnd RemoteFeed::Follow(int64_t rev) {
  const std::string& prefix = cache_->spec().prefix;
  auto ctx = NewContext(false);
  std::unique_ptr<WatchStream> stream = watch_->Watch(ctx.get());
  etcdserverpb::WatchRequest create;
  auto* c = create.mutable_create_request();
  c->set_key(prefix);
  c->set_range_end(PrefixEnd(prefix));
  c->set_start_revision(rev + 1);
  c->set_prev_kv(true);
  c->set_progress_notify(true);
  {
    util::MutexLock l(&stream_mu_);
    stream_ = stream.get();
    stream_->Write(create);
  }
  WatchEnd end = WatchEnd::kBroken;
  etcdserverpb::WatchResponse resp;
  bool created = false;
  // While the watch may still be catching up to the revision it was created
  // at, an empty response proves nothing (see the header): until then.
  int64_t catch_up_to = 0;
  absl::Time catch_up_until;
  while (stream->Read(&resp)) {
    if (resp.canceled()) {
      if (resp.compact_revision() > 0) {
        end = WatchEnd::kCompacted;
      } else {
        SPDLOG_WARN("watch cache {}: upstream canceled the watch: {}", prefix, resp.cancel_reason());
      }
      break;
    }
    NoteHeader(resp.header());
    if (resp.created()) {
      if (!created) backoff_ = options_.min_backoff;  // connected again
      created = true;
      if (resp.header().revision() > rev) {
        // Events from rev + 1 up to the header's revision may follow.
        catch_up_to = resp.header().revision();
        catch_up_until = absl::Now() + options_.catch_up_grace;
      }
      continue;
    }
    if (resp.events_size() == 0) {
      if (catch_up_to > 0 && absl::Now() < catch_up_until) continue;
      catch_up_to = 0;
      // A progress notification: every event up to its revision was sent.
      cache_->AdvanceTo(resp.header().revision());
      continue;
    }
    Apply(resp);
    if (resp.events(resp.events_size() - 1).kv().mod_revision() >= catch_up_to) catch_up_to = 0;
  }
  {
    util::MutexLock l(&stream_mu_);
    stream_ = nullptr;
  }
  ctx->TryCancel();
  grpc::Status s = stream->Finish();
  {
    util::MutexLock l(&mu_);
    if (stopping_) return WatchEnd::kStopped;
  }
  if (end == WatchEnd::kBroken && IsCompacted(s)) end = WatchEnd::kCompacted;
  if (end == WatchEnd::kBroken) {
    SPDLOG_INFO("watch cache {}: upstream watch ended ({}); watching again from revision {}", prefix,
                 s.error_message(), cache_->rev() + 1);
  }
  return end;
}

void RemoteFeed::Apply(const etcdserverpb::WatchResponse& resp) {
  std::vector<FeedChange> changes;
  changes.reserve(resp.events_size());
  std::string record;
  for (const mvccpb::Event& e : resp.events()) {
    FeedChange c;
    c.rev = e.kv().mod_revision();
    if (e.type() == mvccpb::Event::DELETE) {
      c.key = e.kv().key();
    } else {
      record.clear();
      e.kv().SerializeToString(&record);
      c.object = cache_->MakeObject(record);
      if (!c.object) continue;
    }
    // The upstream's previous value, checked against the cache's own.
    c.prev_mod_rev = e.has_prev_kv() ? e.prev_kv().mod_revision() : 0;
    changes.push_back(std::move(c));
  }
  // Up to the events' own revision: a catch-up response's header revision
  // may be ahead of events that follow in later responses.
  cache_->Apply(std::move(changes), 0);
}

}  // namespace capstan::watchcache
