// capstan::Watch: a watch on keys through the store's watch hub, pulled
// with Next or pushed to a callback on the watch's own thread.

#include <deque>

#include "absl/base/thread_annotations.h"
#include "capstan/capstan.h"
#include "embed/convert.h"
#include "embed/store_impl.h"
#include "embed/wakeup.h"
#include "etcdserverpb/rpc.pb.h"
#include "membership/member.h"
#include "mvcc/errors.h"
#include "mvcc/watch_hub.h"
#include "util/mutex.h"

namespace capstan {

// One hub stream holding the one watcher. The hub hands a message to
// deliver only when the consumer found the stream's queue empty; the
// consumer then drains the stream with Pop (one message in the inbox at a
// time, so memory stays bounded by the stream's own queue).
struct Watch::Impl {
  std::shared_ptr<mvcc::WatchStream> stream;
  int64_t watch_id = 0;
  embed::WatchConsumer consumer;
  embed::Wakeup& wakeup = consumer.wakeup;
  // A leaf lock, taken under the hub stream's lock by deliver.
  util::Mutex inbox_mu;
  std::deque<std::string> inbox ABSL_GUARDED_BY(inbox_mu);
  std::optional<WatchBatch> ended;  // the end batch, returned again by Next
  WatchCallback callback;

  ~Impl() { Stop(); }

  void Stop() {
    consumer.Stop([this] {
      if (stream) stream->Close();
    });
  }

  bool TakeInbox(std::string* msg) ABSL_LOCKS_EXCLUDED(inbox_mu) {
    util::MutexLock l(&inbox_mu);
    if (inbox.empty()) return false;
    *msg = std::move(inbox.front());
    inbox.pop_front();
    return true;
  }

  bool NextMessage(std::string* msg, embed::Wakeup::Clock::time_point deadline) {
    while (true) {
      if (TakeInbox(msg) || stream->Pop(msg)) return true;
      if (!wakeup.Wait(deadline)) return false;
    }
  }

  // The next batch for the consumer; false on timeout or once stopped.
  bool NextBatch(WatchBatch* batch, embed::Wakeup::Clock::time_point deadline) {
    if (ended) {
      *batch = *ended;
      return true;
    }
    std::string msg;
    while (NextMessage(&msg, deadline)) {
      etcdserverpb::WatchResponse resp;
      if (!resp.ParseFromString(msg)) continue;
      if (resp.created() && !resp.canceled()) continue;
      WatchBatch b;
      b.revision = resp.header().revision();
      if (resp.canceled()) {
        b.compact_revision = resp.compact_revision();
        b.end = resp.compact_revision() > 0
                    ? embed::FromAbsl(mvcc::MakeError(mvcc::Error::kCompacted))
                    : Status(StatusCode::kCancelled,
                             resp.cancel_reason().empty() ? "watch canceled" : resp.cancel_reason());
        ended = b;
        *batch = std::move(b);
        return true;
      }
      b.progress_notify = resp.events_size() == 0;
      for (const auto& e : resp.events()) {
        Event ev;
        ev.type = e.type() == mvccpb::Event::DELETE ? Event::Type::kDelete : Event::Type::kPut;
        ev.kv = embed::FromProto(e.kv());
        if (e.has_prev_kv()) ev.prev_kv = embed::FromProto(e.prev_kv());
        b.events.push_back(std::move(ev));
      }
      *batch = std::move(b);
      return true;
    }
    return false;
  }

  void CallbackLoop() {
    while (!wakeup.closed()) {
      WatchBatch b;
      if (!NextBatch(&b, embed::DeadlineAfter(std::chrono::hours(1)))) continue;
      callback(b);
      if (!b.end.ok()) return;
    }
  }
};

Watch::Watch(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Watch::~Watch() = default;

bool Watch::Next(WatchBatch* batch, std::chrono::milliseconds timeout) {
  if (impl_->callback) return false;
  return impl_->NextBatch(batch, embed::DeadlineAfter(timeout));
}

void Watch::Cancel() { impl_->Stop(); }

int64_t Watch::id() const { return impl_->watch_id; }

Result<std::unique_ptr<Watch>> Store::Watch(std::string_view key, const WatchOptions& options,
                                            WatchCallback callback) {
  etcdserverpb::ResponseHeader header;
  membership::FillHeader(impl_->server->member(), &header);
  auto impl = std::make_unique<capstan::Watch::Impl>();
  impl->stream = impl_->server->hub()->OpenStream(header);
  capstan::Watch::Impl* w = impl.get();
  impl->stream->SetDeliver([w](std::string msg) {
    {
      util::MutexLock l(&w->inbox_mu);
      w->inbox.push_back(std::move(msg));
    }
    w->wakeup.Notify();
  });

  etcdserverpb::WatchCreateRequest req;
  req.set_key(std::string(key));
  req.set_range_end(options.range_end);
  req.set_start_revision(options.start_revision);
  req.set_prev_kv(options.prev_kv);
  req.set_progress_notify(options.progress_notify);
  if (options.no_put) req.add_filters(etcdserverpb::WatchCreateRequest::NOPUT);
  if (options.no_delete) req.add_filters(etcdserverpb::WatchCreateRequest::NODELETE);
  impl->stream->Create(req);

  // The Created response comes first; a watcher that cannot be made is
  // answered created-and-canceled with the reason.
  std::string msg;
  if (!impl->NextMessage(&msg, embed::DeadlineAfter(std::chrono::seconds(30)))) {
    return Status(StatusCode::kDeadlineExceeded, "capstan: no answer to the watch request");
  }
  etcdserverpb::WatchResponse created;
  if (!created.ParseFromString(msg) || !created.created()) {
    return Status(StatusCode::kInternal, "capstan: the watch was not created");
  }
  if (created.canceled()) {
    return Status(StatusCode::kInvalidArgument,
                  created.cancel_reason().empty() ? "watch canceled" : created.cancel_reason());
  }
  impl->watch_id = created.watch_id();
  if (callback) {
    impl->callback = std::move(callback);
    impl->consumer.StartThread([w] { w->CallbackLoop(); });
  }
  return std::make_unique<capstan::Watch>(std::move(impl));
}

}  // namespace capstan
