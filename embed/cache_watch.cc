// The watch cache through libcapstan: Store::List and capstan::CacheWatch.


#include "absl/time/time.h"
#include "capstan/capstan.h"
#include "embed/convert.h"
#include "embed/store_impl.h"
#include "embed/wakeup.h"
#include "watchcache/cache.h"
#include "watchcache/errors.h"

namespace capstan {
namespace {

Object ToObject(const watchcache::CachedObject& o) {
  Object out;
  out.key = std::string(o.key());
  out.value = std::string(o.value());
  out.create_revision = o.create_revision();
  out.mod_revision = o.mod_revision();
  out.version = o.version();
  out.lease = o.lease();
  return out;
}

CacheEvent ToEvent(const watchcache::WatchEvent& e) {
  CacheEvent out;
  switch (e.type) {
    case watchcache::EventType::kAdded: out.type = CacheEvent::Type::kAdded; break;
    case watchcache::EventType::kModified: out.type = CacheEvent::Type::kModified; break;
    case watchcache::EventType::kDeleted: out.type = CacheEvent::Type::kDeleted; break;
    case watchcache::EventType::kBookmark: out.type = CacheEvent::Type::kBookmark; break;
  }
  out.revision = e.revision;
  if (e.object) out.object = ToObject(*e.object);
  if (e.prev_object) out.prev_object = ToObject(*e.prev_object);
  out.initial_events_end = e.initial_events_end;
  return out;
}

Status NotCached(std::string_view prefix) {
  return embed::FromAbsl(watchcache::NotCached(prefix));
}

}  // namespace

struct CacheWatch::Impl {
  std::unique_ptr<watchcache::CacheWatch> watch;
  embed::WatchConsumer consumer;
  embed::Wakeup& wakeup = consumer.wakeup;
  CacheWatchCallback callback;

  ~Impl() { Stop(); }

  void Stop() {
    consumer.Stop([this] {
      if (watch) {
        watch->SetNotify(nullptr);
        watch->Cancel();
      }
    });
  }

  Status Next(std::vector<CacheEvent>* events, embed::Wakeup::Clock::time_point deadline,
              size_t max_events) {
    std::vector<watchcache::WatchEvent> popped;
    while (true) {
      if (watch->Pop(&popped, max_events) > 0) {
        for (const auto& e : popped) events->push_back(ToEvent(e));
        return Status();
      }
      if (watch->done()) {
        Status end = embed::FromAbsl(watch->status());
        return end.ok() ? Status(StatusCode::kCancelled, "watch canceled") : end;
      }
      if (!wakeup.Wait(deadline)) return Status();
    }
  }

  void CallbackLoop() {
    std::vector<CacheEvent> events;
    while (!wakeup.closed()) {
      events.clear();
      Status s = Next(&events, embed::DeadlineAfter(std::chrono::hours(1)), 1024);
      if (!events.empty()) callback(events, Status());
      if (!s.ok()) {
        if (!wakeup.closed()) callback({}, s);
        return;
      }
    }
  }
};

CacheWatch::CacheWatch(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CacheWatch::~CacheWatch() = default;

Status CacheWatch::Next(std::vector<CacheEvent>* events, std::chrono::milliseconds timeout,
                        size_t max_events) {
  if (impl_->callback) {
    return Status(StatusCode::kFailedPrecondition, "capstan: Next on a callback watch");
  }
  return impl_->Next(events, embed::DeadlineAfter(timeout), max_events);
}

void CacheWatch::Cancel() { impl_->Stop(); }

int64_t CacheWatch::start_revision() const { return impl_->watch->start_revision(); }

Result<ListResult> Store::List(const ListOptions& options) {
  watchcache::Cache* cache = impl_->server->cache();
  if (cache == nullptr) return NotCached(options.prefix);
  watchcache::ListOptions l;
  l.prefix = options.prefix;
  l.label_selector = options.label_selector;
  l.field_selector = options.field_selector;
  l.resource_version = options.resource_version;
  l.match = static_cast<watchcache::ResourceVersionMatch>(options.match);
  l.limit = options.limit;
  l.continue_token = options.continue_token;
  auto r = cache->List(l);
  if (!r.ok()) return embed::FromAbsl(r.status());
  ListResult out;
  out.revision = r->revision;
  out.objects.reserve(r->objects.size());
  for (const auto& o : r->objects) out.objects.push_back(ToObject(*o));
  out.continue_token = std::move(r->continue_token);
  out.remaining_item_count = r->remaining_item_count;
  return out;
}

Result<std::unique_ptr<CacheWatch>> Store::CacheWatch(const CacheWatchOptions& options,
                                                      CacheWatchCallback callback) {
  watchcache::Cache* cache = impl_->server->cache();
  if (cache == nullptr) return NotCached(options.prefix);
  watchcache::WatchOptions w;
  w.prefix = options.prefix;
  w.label_selector = options.label_selector;
  w.field_selector = options.field_selector;
  w.resource_version = options.resource_version;
  w.allow_bookmarks = options.allow_bookmarks;
  w.send_initial_events = options.send_initial_events;
  auto watch = cache->Watch(w);
  if (!watch.ok()) return embed::FromAbsl(watch.status());
  auto impl = std::make_unique<capstan::CacheWatch::Impl>();
  impl->watch = std::move(*watch);
  capstan::CacheWatch::Impl* p = impl.get();
  impl->watch->SetNotify([p] { p->wakeup.Notify(); });
  if (callback) {
    impl->callback = std::move(callback);
    impl->consumer.StartThread([p] { p->CallbackLoop(); });
  }
  return std::make_unique<capstan::CacheWatch>(std::move(impl));
}

}  // namespace capstan
