#include "watchcache/store_feed.h"

#include <chrono>
#include <utility>
#include <vector>

#include "mvcc/errors.h"
#include "mvcc/kv_codec.h"
#include "spdlog/spdlog.h"
#include "util/thread_name.h"

namespace capstan::watchcache {
namespace {

constexpr int64_t kListPage = 1000;
// At most one progress request per this interval.
constexpr int64_t kProgressRequestGapNs = 20'000'000;

// Calls visit(field, wire_type, varint, bytes) for each field; false if
// malformed.
template <typename Visit>
bool Fields(std::string_view msg, Visit visit) {
  const char* p = msg.data();
  const char* end = p + msg.size();
  while (p < end) {
    uint64_t tag;
    if (!util::ReadVarint(&p, end, &tag)) return false;
    const int field = static_cast<int>(tag >> 3);
    const int wt = static_cast<int>(tag & 7);
    uint64_t v = 0;
    std::string_view bytes;
    if (wt == 0) {
      if (!util::ReadVarint(&p, end, &v)) return false;
    } else if (wt == 2) {
      uint64_t len;
      if (!util::ReadVarint(&p, end, &len) || len > static_cast<uint64_t>(end - p)) return false;
      bytes = std::string_view(p, len);
      p += len;
    } else if (wt == 1 && end - p >= 8) {
      p += 8;
    } else if (wt == 5 && end - p >= 4) {
      p += 4;
    } else {
      return false;
    }
    visit(field, wt, v, bytes);
  }
  return true;
}

}  // namespace

StoreFeed::StoreFeed(ResourceCache* cache, mvcc::KvStore* store, mvcc::WatchHub* hub, bool prev_kv)
    : cache_(cache), store_(store), hub_(hub), prev_kv_(prev_kv) {
  cache_->SetRevisionSource([store]() -> absl::StatusOr<int64_t> { return store->Rev(); },
                            [this] { RequestProgress(); });
}

StoreFeed::~StoreFeed() { Stop(); }

void StoreFeed::Start() { thread_ = NamedThread("cache-feed", [this] { Run(); }); }

void StoreFeed::Stop() {
  {
    util::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void StoreFeed::RequestProgress() {
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  int64_t last = last_progress_request_ns_.load(std::memory_order_relaxed);
  if (now - last < kProgressRequestGapNs) return;
  if (!last_progress_request_ns_.compare_exchange_strong(last, now)) return;
  std::shared_ptr<mvcc::WatchStream> s;
  {
    util::MutexLock l(&mu_);
    s = stream_;
  }
  if (s) s->RequestProgress();
}

void StoreFeed::Run() {
  for (;;) {
    {
      util::MutexLock l(&mu_);
      if (stopping_) return;
    }
    int64_t rev = 0;
    absl::Status s = Load(&rev);
    if (!s.ok()) {
      if (mvcc::Is(s, mvcc::Error::kStopped)) return;
      SPDLOG_WARN("watch cache {}: list failed: {}; retrying", cache_->spec().prefix, s.ToString());
      util::MutexLock l(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(100));
      continue;
    }
    lists_.fetch_add(1);
    Follow(rev);
  }
}

absl::Status StoreFeed::Load(int64_t* rev) {
  // One published view: its revision is the state listed. Holding the view
  // keeps compaction from deleting what the pages read.
  std::shared_ptr<const mvcc::ReadView> view = store_->View();
  const int64_t at = view->rev;
  const std::string& prefix = cache_->spec().prefix;
  etcdserverpb::RangeRequest req;
  req.set_key(prefix);
  req.set_range_end(PrefixEnd(prefix));
  req.set_revision(at);
  req.set_limit(kListPage);
  std::vector<ObjectRef> objects;
  for (;;) {
    mvcc::RangeResult result;
    if (auto s = store_->Range(req, &result); !s.ok()) return s;
    std::string last_key;
    bool ok = Fields(result.kvs_wire, [&](int field, int wt, uint64_t, std::string_view rec) {
      if (field != 2 || wt != 2) return;
      ObjectRef o = cache_->MakeObject(rec);
      if (!o) return;
      last_key.assign(o->key());
      objects.push_back(std::move(o));
    });
    if (!ok) return absl::DataLossError("malformed Range result");
    if (!result.more || last_key.empty()) break;
    req.set_key(last_key + std::string(1, '\0'));
  }
  cache_->Reset(at, std::move(objects));
  *rev = at;
  SPDLOG_INFO("watch cache {}: listed {} objects at revision {}", prefix, cache_->GetStats().objects, at);
  return absl::OkStatus();
}

void StoreFeed::Follow(int64_t rev) {
  etcdserverpb::ResponseHeader header;
  std::shared_ptr<mvcc::WatchStream> stream =
      hub_->OpenStream(header, mvcc::WatchHub::StreamUse::kInternal);
  {
    util::MutexLock l(&mu_);
    inbox_.clear();
    stream_ = stream;
  }
  stream->SetDeliver([this](std::string m) {
    // Wakes the loop below: it waits on a condition over inbox_.
    util::MutexLock l(&mu_);
    inbox_.push_back(std::move(m));
  });
  etcdserverpb::WatchCreateRequest create;
  const std::string& prefix = cache_->spec().prefix;
  create.set_key(prefix);
  create.set_range_end(PrefixEnd(prefix));
  create.set_start_revision(rev + 1);
  create.set_prev_kv(prev_kv_);
  stream->Create(create);
  for (;;) {
    std::string m;
    {
      util::MutexLock l(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return stopping_ || !inbox_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) break;
      m = std::move(inbox_.front());
      inbox_.pop_front();
    }
    bool live = Process(m);
    while (live && stream->Pop(&m)) live = Process(m);
    if (!live) break;
  }
  stream->Close();
  util::MutexLock l(&mu_);
  stream_.reset();
  inbox_.clear();
}

bool StoreFeed::Process(const std::string& message) {
  int64_t header_rev = 0, watch_id = 0, compact_rev = 0;
  bool created = false, canceled = false;
  std::vector<std::string_view> events;
  Fields(message, [&](int field, int wt, uint64_t v, std::string_view b) {
    switch (field) {
      case 1:
        Fields(b, [&](int f, int, uint64_t hv, std::string_view) {
          if (f == 3) header_rev = static_cast<int64_t>(hv);  // ResponseHeader.revision
        });
        break;
      case 2: watch_id = static_cast<int64_t>(v); break;
      case 3: created = v != 0; break;
      case 4: canceled = v != 0; break;
      case 5: compact_rev = static_cast<int64_t>(v); break;
      case 11: events.push_back(b); break;
      default: break;
    }
  });
  if (canceled) {
    SPDLOG_INFO("watch cache {}: feed watch canceled (compacted at {}); listing again",
                 cache_->spec().prefix, compact_rev);
    return false;
  }
  if (created) return true;
  if (events.empty()) {
    if (header_rev > 0) cache_->AdvanceTo(header_rev);  // a progress notification
    return true;
  }
  std::vector<FeedChange> changes;
  changes.reserve(events.size());
  for (std::string_view e : events) {
    bool is_delete = false;
    std::string_view kv, prev;
    bool has_prev = false;
    Fields(e, [&](int f, int, uint64_t v, std::string_view b) {
      if (f == 1) is_delete = v == 1;
      if (f == 2) kv = b;
      if (f == 3) {
        prev = b;
        has_prev = true;
      }
    });
    FeedChange c;
    if (is_delete) {
      mvcc::KeyValueView view;
      if (!mvcc::DecodeKeyValue(kv, &view)) continue;
      c.rev = view.mod_revision;
      c.key = std::string(view.key);
    } else {
      c.object = cache_->MakeObject(kv);
      if (!c.object) continue;
      c.rev = c.object->mod_revision();
    }
    if (prev_kv_) {
      c.prev_mod_rev = 0;
      mvcc::KeyValueView pv;
      if (has_prev && mvcc::DecodeKeyValue(prev, &pv)) c.prev_mod_rev = pv.mod_revision;
      // A put that is not a create but came without a previous value: the
      // hub did not know it; do not count it.
      if (!is_delete && !has_prev && c.object->version() > 1) c.prev_mod_rev = -1;
    }
    changes.push_back(std::move(c));
  }
  // Applied up to the events' own revision: a catch-up response carries the
  // store's revision in its header while later events may still follow.
  cache_->Apply(std::move(changes), 0);
  (void)watch_id;
  return true;
}

}  // namespace capstan::watchcache
