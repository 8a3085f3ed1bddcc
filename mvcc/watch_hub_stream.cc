// WatchStream: one Watch stream's watchers and its send queue, and the
// encoding of WatchResponse messages (watch_hub.h).

#include <algorithm>

#include "mvcc/kv_codec.h"
#include "mvcc/kv_store.h"
#include "mvcc/watch_hub.h"
#include "mvcc/watch_hub_watcher.h"
#include "util/check.h"

namespace capstan::mvcc {

using etcdserverpb::WatchCreateRequest;

namespace {

// WatchResponse: header(1) watch_id(2) created(3) canceled(4)
// compact_revision(5) cancel_reason(6) fragment(7) events(11).
std::string EncodeResponse(const std::string& header, int64_t watch_id, bool created,
                           bool canceled, int64_t compact_revision,
                           const std::string& cancel_reason, bool fragment,
                           const std::string* const* events, size_t num_events,
                           const std::string* joined_events = nullptr) {
  size_t size = header.size() + 40 + cancel_reason.size();
  for (size_t i = 0; i < num_events; ++i) size += events[i]->size();
  if (joined_events != nullptr) size += joined_events->size();
  std::string out;
  out.reserve(size);
  util::AppendBytesField(1, header, &out);
  util::AppendVarintField(2, static_cast<uint64_t>(watch_id), &out);
  util::AppendVarintField(3, created ? 1 : 0, &out);
  util::AppendVarintField(4, canceled ? 1 : 0, &out);
  util::AppendVarintField(5, static_cast<uint64_t>(compact_revision), &out);
  if (!cancel_reason.empty()) util::AppendBytesField(6, cancel_reason, &out);
  util::AppendVarintField(7, fragment ? 1 : 0, &out);
  for (size_t i = 0; i < num_events; ++i) out.append(*events[i]);
  if (joined_events != nullptr) out.append(*joined_events);
  return out;
}

// The encoded size of a WatchResponse with a header of header_size bytes
// (encoded ResponseHeader), this watch id, no events, and fragment set or
// not: what etcd's sendFragments counts besides the events.
size_t ResponseBaseSize(size_t header_size, int64_t watch_id, bool fragment) {
  size_t n = 1 + util::VarintSize(header_size) + header_size;
  if (watch_id != 0) n += 1 + util::VarintSize(static_cast<uint64_t>(watch_id));
  if (fragment) n += 2;
  return n;
}

}  // namespace

WatchStream::WatchStream(WatchHub* hub, const etcdserverpb::ResponseHeader& header, bool internal)
    : hub_(hub), internal_(internal) {
  util::AppendVarintField(1, header.cluster_id(), &header_prefix_);
  util::AppendVarintField(2, header.member_id(), &header_prefix_);
  util::AppendVarintField(4, header.raft_term(), &header_suffix_);
}

WatchStream::~WatchStream() { Close(); }

std::string WatchStream::EncodeHeader(int64_t rev) const {
  std::string h;
  h.reserve(header_prefix_.size() + header_suffix_.size() + 12);
  h.append(header_prefix_);
  util::AppendVarintField(3, static_cast<uint64_t>(rev), &h);
  h.append(header_suffix_);
  return h;
}

bool WatchStream::HasRoomLocked() const {
  return queue_.size() < hub_->options_.stream_queue_messages &&
         queued_bytes_ < hub_->options_.stream_queue_bytes;
}

std::string WatchStream::Encode(const Queued& q) const {
  if (!q.events) return q.bytes;
  return EncodeResponse(EncodeHeader(q.header_rev), q.watch_id, false, false, 0, "", false,
                        nullptr, 0, &q.bytes);
}

void WatchStream::PushLocked(Queued q) {
  if (closed_) return;
  if (waiting_ && deliver_ && queue_.empty()) {
    waiting_ = false;
    deliver_(Encode(q));
    return;
  }
  if (q.events) open_events_[q.watch_id] = popped_ + queue_.size();
  queued_bytes_ += q.bytes.size();
  queue_.push_back(std::move(q));
}

void WatchStream::PushControlLocked(const ControlFields& f, int64_t rev) {
  open_events_.erase(f.watch_id);
  Queued q;
  q.bytes = EncodeResponse(EncodeHeader(rev), f.watch_id, f.created, f.canceled,
                           f.compact_revision, f.cancel_reason, false, nullptr, 0);
  PushLocked(std::move(q));
}

void WatchStream::PushEventsLocked(int64_t watch_id, int64_t rev,
                                   const std::vector<const std::string*>& fields, bool fragment,
                                   size_t max_bytes) {
  if (closed_ || fields.empty()) return;
  size_t total = 0;
  for (const std::string* f : fields) total += f->size();
  const size_t header_size = header_prefix_.size() + header_suffix_.size() +
                             (rev != 0 ? 1 + util::VarintSize(static_cast<uint64_t>(rev)) : 0);
  const size_t whole_base = ResponseBaseSize(header_size, watch_id, false);
  // Into the watcher's response still waiting in the queue.
  if (auto open = open_events_.find(watch_id); open != open_events_.end()) {
    Queued& q = queue_[open->second - popped_];
    if (whole_base + q.bytes.size() + total < max_bytes) {
      for (const std::string* f : fields) q.bytes.append(*f);
      q.header_rev = rev;
      queued_bytes_ += total;
      return;
    }
    open_events_.erase(open);
  }
  // etcd sends a response whole when it is under the limit (all of it
  // counted) or holds one event.
  if (!fragment || fields.size() < 2 || whole_base + total < max_bytes) {
    Queued q;
    q.events = true;
    q.watch_id = watch_id;
    q.header_rev = rev;
    q.bytes.reserve(total);
    for (const std::string* f : fields) q.bytes.append(*f);
    PushLocked(std::move(q));
    return;
  }
  // etcd's sendFragments: as many events as keep the response, counted
  // with its fragment flag, under the limit (at least one) per response;
  // every response but the last is marked fragment.
  const std::string header = EncodeHeader(rev);
  const size_t base = ResponseBaseSize(header.size(), watch_id, true);
  size_t i = 0;
  while (i < fields.size()) {
    const size_t first = i;
    size_t size = base;
    while (i < fields.size()) {
      if (i > first && size + fields[i]->size() >= max_bytes) break;
      size += fields[i]->size();
      ++i;
    }
    Queued q;
    q.bytes = EncodeResponse(header, watch_id, false, false, 0, "", i < fields.size(),
                             fields.data() + first, i - first);
    PushLocked(std::move(q));
  }
}

bool WatchStream::Pop(std::string* message, bool* more) {
  util::MutexLock l(&mu_);
  if (queue_.empty()) {
    waiting_ = true;
    return false;
  }
  PopLocked(message);
  if (more != nullptr) *more = !queue_.empty();
  return true;
}

void WatchStream::PopLocked(std::string* message) {
  Queued& q = queue_.front();
  if (q.events) {
    auto open = open_events_.find(q.watch_id);
    if (open != open_events_.end() && open->second == popped_) open_events_.erase(open);
  }
  queued_bytes_ -= q.bytes.size();
  *message = Encode(q);
  queue_.pop_front();
  ++popped_;
}

void WatchStream::SetDeliver(std::function<void(std::string)> deliver) {
  util::MutexLock l(&mu_);
  deliver_ = std::move(deliver);
  if (waiting_ && !queue_.empty() && deliver_) {
    waiting_ = false;
    std::string m;
    PopLocked(&m);
    deliver_(std::move(m));
  }
}

size_t WatchStream::num_watchers() const {
  util::MutexLock hl(&hub_->mu_);
  const WatchHub::StreamWatchers* sw = hub_->StreamWatchersLocked(const_cast<WatchStream*>(this));
  return sw == nullptr ? 0 : sw->by_id.size();
}

void WatchStream::Create(const WatchCreateRequest& req) {
  auto w = std::make_unique<HubWatcher>();
  // etcd's normalization: an empty key is "\0" (the smallest key); an empty
  // range_end watches one key; "\0" watches every key >= key.
  w->key = req.key().empty() ? std::string(1, '\0') : req.key();
  if (req.range_end().empty()) {
    w->single = true;
  } else {
    w->single = false;
    w->end = (req.range_end().size() == 1 && req.range_end()[0] == 0) ? "" : req.range_end();
  }
  w->prev_kv = req.prev_kv();
  w->progress = req.progress_notify();
  w->fragment = req.fragment();
  for (int f : req.filters()) {
    if (f == WatchCreateRequest::NOPUT) w->no_put = true;
    if (f == WatchCreateRequest::NODELETE) w->no_delete = true;
  }
  w->stream = this;

  // The store's revision, not the dispatcher's: a write acknowledged
  // before the watch was created is never one of its events, as in etcd.
  const int64_t store_rev = hub_->store_->Rev();
  hub_->TestSyncPoint("WatchStream::Create:AfterStoreRev");
  util::MutexLock hl(&hub_->mu_);
  util::MutexLock l(&mu_);
  WatchHub::StreamWatchers* sw = hub_->StreamWatchersLocked(this);
  if (closed_ || sw == nullptr) return;
  const int64_t wsrev = std::max(hub_->last_notified_rev_, store_rev);
  ControlFields f;
  f.created = true;
  // Refusals are created-and-canceled responses with watch_id -1, as etcd
  // answers them.
  // In etcd's order: the range first, then the id.
  if (!w->single && !w->end.empty() && w->key >= w->end) {
    f.watch_id = -1;
    f.canceled = true;
    f.cancel_reason = "mvcc: watcher range is empty";
    PushControlLocked(f, wsrev);
    return;
  }
  if (req.watch_id() != 0 && sw->by_id.contains(req.watch_id())) {
    f.watch_id = -1;
    f.canceled = true;
    f.cancel_reason = "mvcc: duplicate watch ID provided on the WatchStream";
    PushControlLocked(f, wsrev);
    return;
  }
  if (req.watch_id() != 0) {
    w->id = req.watch_id();
  } else {
    while (sw->by_id.contains(sw->next_watch_id)) ++sw->next_watch_id;
    w->id = sw->next_watch_id++;
  }
  f.watch_id = w->id;
  PushControlLocked(f, wsrev);
  w->min_rev = req.start_revision() == 0 ? wsrev + 1 : req.start_revision();
  w->synced = w->min_rev > wsrev;
  // An unsynced watcher wakes the syncer (AddWatcherLocked).
  hub_->AddWatcherLocked(std::move(w));
}

void WatchStream::Cancel(int64_t watch_id) {
  util::MutexLock hl(&hub_->mu_);
  WatchHub::StreamWatchers* sw = hub_->StreamWatchersLocked(this);
  if (sw == nullptr) return;  // closed
  auto it = sw->by_id.find(watch_id);
  if (it == sw->by_id.end()) return;
  hub_->RemoveWatcherLocked(it->second);
  util::MutexLock l(&mu_);
  ControlFields f;
  f.watch_id = watch_id;
  f.canceled = true;
  PushControlLocked(f, hub_->last_notified_rev_);
}

void WatchStream::RequestProgress() {
  const int64_t covered = hub_->notified_rev_.load(std::memory_order_acquire);
  util::MutexLock hl(&hub_->mu_);
  WatchHub::StreamWatchers* sw = hub_->StreamWatchersLocked(this);
  // etcd 3.5 answers through one of the stream's watchers: none, no answer.
  if (sw == nullptr || sw->by_id.empty()) return;
  // etcd 3.5.16 (progressIfSync) drops the request unless every watcher of
  // the stream is synced; it never answers it later.
  if (!hub_->AllSyncedLocked(this)) return;
  // etcd has notified its watchers of every write it acknowledged before
  // the request: wait for the hub to reach those too.
  sw->progress_rev = std::max(sw->progress_rev, covered);
  if (hub_->last_notified_rev_ < sw->progress_rev) {
    sw->progress_deferred = true;
    return;
  }
  sw->progress_deferred = false;
  sw->progress_rev = 0;
  util::MutexLock l(&mu_);
  ControlFields f;
  f.watch_id = -1;  // not one watcher's: the whole stream is at this revision
  PushControlLocked(f, hub_->last_notified_rev_);
}

void WatchStream::Close() {
  util::MutexLock hl(&hub_->mu_);
  {
    util::MutexLock l(&mu_);
    if (closed_) return;
    closed_ = true;
    deliver_ = nullptr;
    queue_.clear();
    open_events_.clear();
    queued_bytes_ = 0;
  }
  std::vector<HubWatcher*> mine;
  if (WatchHub::StreamWatchers* sw = hub_->StreamWatchersLocked(this)) {
    for (const auto& [id, p] : sw->by_id) mine.push_back(p);
  }
  for (auto* p : mine) hub_->RemoveWatcherLocked(p);
  hub_->streams_.erase(this);
}

}  // namespace capstan::mvcc
