#include "watchcache/absl_compat.h"
#include "watchcache/cache.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "util/thread_name.h"
#include "watchcache/errors.h"
#include "watchcache/store_feed.h"

namespace capstan::watchcache {

Cache::Cache(CacheOptions options) : options_(std::move(options)) {
  alloc_ = options_.allocator == AllocatorKind::kSlab ? NewSlabAllocator(options_.free_list)
                                                       : NewMallocAllocator();
  for (const auto& spec : options_.resources) {
    resources_.push_back(std::make_unique<ResourceCache>(spec, options_, alloc_.get()));
  }
}

absl::StatusOr<std::unique_ptr<Cache>> Cache::Create(CacheOptions options) {
  for (size_t i = 0; i < options.resources.size(); ++i) {
    if (options.resources[i].prefix.empty()) return absl::InvalidArgumentError("empty resource prefix");
    for (size_t j = 0; j < options.resources.size(); ++j) {
      if (i != j && options.resources[i].prefix.starts_with(options.resources[j].prefix)) {
        return absl::InvalidArgumentError(absl::StrCat("resource prefixes overlap: ",
                                                       options.resources[i].prefix, " and ",
                                                       options.resources[j].prefix));
      }
    }
  }
  std::unique_ptr<Cache> c(new Cache(std::move(options)));
  c->ticker_ = NamedThread("cache-ticker", [p = c.get()] { p->TickLoop(); });
  return c;
}

absl::StatusOr<std::unique_ptr<Cache>> Cache::Start(CacheOptions options, mvcc::KvStore* store,
                                                    mvcc::WatchHub* hub) {
  const bool prev_kv = options.feed_prev_kv;
  auto c = Create(std::move(options));
  if (!c.ok()) return c.status();
  for (auto& r : (*c)->resources_) {
    (*c)->feeds_.push_back(std::make_unique<StoreFeed>(r.get(), store, hub, prev_kv));
    (*c)->feeds_.back()->Start();
  }
  return c;
}

Cache::~Cache() { Stop(); }

void Cache::Stop() {
  {
    util::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (ticker_.joinable()) ticker_.join();
  for (auto& f : feeds_) f->Stop();
  for (auto& r : resources_) r->Stop();
}

void Cache::TickLoop() {
  for (;;) {
    {
      util::MutexLock l(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), options_.tick_interval)) return;
    }
    const absl::Time now = absl::Now();
    for (auto& r : resources_) r->Tick(now);
  }
}

ResourceCache* Cache::ResourceFor(std::string_view prefix) const {
  for (const auto& r : resources_) {
    if (prefix.starts_with(r->spec().prefix)) return r.get();
  }
  return nullptr;
}

absl::StatusOr<ListResult> Cache::List(const ListOptions& options) {
  ResourceCache* r = ResourceFor(options.prefix);
  if (r == nullptr) return NotCached(options.prefix);
  return r->List(options);
}

absl::StatusOr<std::unique_ptr<CacheWatch>> Cache::Watch(const WatchOptions& options) {
  ResourceCache* r = ResourceFor(options.prefix);
  if (r == nullptr) return NotCached(options.prefix);
  return r->Watch(options);
}

bool Cache::WaitReady(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (auto& r : resources_) {
    if (!r->WaitReady(std::max(deadline - absl::Now(), absl::ZeroDuration()))) return false;
  }
  return true;
}

}  // namespace capstan::watchcache
