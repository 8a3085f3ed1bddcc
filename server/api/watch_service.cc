#include "server/api/watch_service.h"

#include <pthread.h>

#include <atomic>
#include <deque>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "server/api/auth_service.h"
#include "server/api/client_traffic.h"
#include "server/api/decoded.h"
#include "server/api/errors.h"
#include "server/api/go_unmarshal.h"
#include "server/api/grpc_buffers.h"
#include "util/mutex.h"

namespace capstan::server {
namespace {

// One Watch stream. Reads requests one at a time and hands them to the
// hub's WatchStream; writes the responses the hub queues, one at a time.
// Deletes itself in OnDone.
class WatchReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>,
                           public LeaderMonitor::Stream {
 public:
  // monitor: the stream asks for a leader, and is ended when the member
  // has none (monitor->Forget in OnDone); null: it does not.
  WatchReactor(mvcc::WatchHub* hub, const etcdserverpb::ResponseHeader& header,
               const grpc::CallbackServerContext* ctx, const AuthGate* auth,
               LeaderMonitor* monitor)
      : stream_(hub->OpenStream(header)),
        header_(header),
        ctx_(ctx),
        auth_(auth),
        monitor_(monitor) {
    // Runs under the stream's lock when the reader found the stream's queue
    // empty; never after stream_->Close().
    stream_->SetDeliver([this](std::string message) { Send(std::move(message)); });
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client closed its side: as etcd's, the stream goes on sending
      // until the client cancels it (OnCancel), which a broken call does too.
      return;
    }
    etcdserverpb::WatchRequest req;
    if (std::string error = DecodeReceived(in_, &req); !error.empty()) {
      End(StreamUnmarshalStatus(error));
      return;
    }
    switch (req.request_union_case()) {
      case etcdserverpb::WatchRequest::kCreateRequest:
        if (auth_ != nullptr) {
          const auto& c = req.create_request();
          if (absl::Status s = auth_->CheckWatch(*ctx_, c.key(), c.range_end()); !s.ok()) {
            SendRefused(s);
            break;
          }
        }
        stream_->Create(req.create_request());
        break;
      case etcdserverpb::WatchRequest::kCancelRequest:
        stream_->Cancel(req.cancel_request().watch_id());
        break;
      case etcdserverpb::WatchRequest::kProgressRequest:
        stream_->RequestProgress();
        break;
      default:
        break;
    }
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(send_mu_) {
    if (!ok) {
      End(grpc::Status(grpc::UNAVAILABLE, "watch stream broken"));
      return;
    }
    send_mu_.Lock();
    if (!own_.empty()) {
      std::string message = std::move(own_.front());
      own_.pop_front();
      send_mu_.Unlock();
      Write(std::move(message));  // writing_ stays true
      return;
    }
    writing_ = false;
    send_mu_.Unlock();
    std::string message;
    bool more = false;
    if (stream_->Pop(&message, &more)) Send(std::move(message), more);
  }

  void OnCancel() override { End(grpc::Status::CANCELLED); }

  void OnDone() override {
    if (monitor_ != nullptr) monitor_->Forget(this);
    stream_->Close();
    delete this;
  }

  // etcd's watch stream when monitorLeader cancels it: Unavailable.
  bool EndForNoLeader() override {
    End(NoLeaderStatus());
    return true;
  }

 private:
  // Writes message now, or queues it behind the write in flight. With more
  // (others are queued right behind it), gRPC may hold it back to send it
  // with them, sparing a flush per message. Lock order: the stream's lock
  // (held when the hub delivers) before send_mu_; never call into the
  // stream with send_mu_ held.
  void Send(std::string message, bool more = false) ABSL_LOCKS_EXCLUDED(send_mu_) {
    {
      util::MutexLock lock(&send_mu_);
      if (writing_) {
        own_.push_back(std::move(message));
        return;
      }
      writing_ = true;
    }
    Write(std::move(message), more);
  }

  // etcd's answer to a watch it refuses (a range the user may not read, no
  // user, a bad token): created and canceled at once, with watch id -1
  // (clientv3.InvalidWatchID) whatever id was asked for.
  void SendRefused(const absl::Status& why) {
    etcdserverpb::WatchResponse resp;
    *resp.mutable_header() = header_;
    resp.mutable_header()->set_revision(auth_->store()->kv()->Rev());
    resp.set_watch_id(-1);
    resp.set_created(true);
    resp.set_canceled(true);
    resp.set_cancel_reason(WatchRefusalReason(why));
    Send(resp.SerializeAsString());
  }

  void Write(std::string message, bool more = false) {
    ClientTraffic::Sent(message.size());
    StringToBuffer(std::move(message), &out_);
    grpc::WriteOptions options;
    if (more) options.set_buffer_hint();
    StartWrite(&out_, options);
  }

  void End(const grpc::Status& status) {
    stream_->Close();
    if (!finished_.exchange(true)) Finish(status);
  }

  std::shared_ptr<mvcc::WatchStream> stream_;
  const etcdserverpb::ResponseHeader header_;
  const grpc::CallbackServerContext* const ctx_;
  const AuthGate* const auth_;
  LeaderMonitor* const monitor_;
  // Lock order: after the hub stream's lock (Send runs under it when the
  // hub delivers); nothing calls into the stream or gRPC under it.
  util::Mutex send_mu_;
  bool writing_ ABSL_GUARDED_BY(send_mu_) = false;  // a write is in flight
  std::deque<std::string> own_ ABSL_GUARDED_BY(send_mu_);  // messages waiting for it
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;  // the write in flight
  std::atomic<bool> finished_{false};
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* WatchService::Watch(
    grpc::CallbackServerContext* ctx) {
  if (absl::Status s = LearnerRefusal(member_); !s.ok()) {
    return new RefusedBidi<grpc::ByteBuffer, grpc::ByteBuffer>(ToGrpcStatus(s));
  }
  // etcd's stream interceptor: a client that asks for a leader
  // (clientv3.WithRequireLeader) is refused while the member has none, and
  // its stream is remembered to end once the member has had none for a while.
  const bool bound = RequiresLeader(ctx->client_metadata(), member_);
  if (bound && member_->raft->Leader() == 0) {
    return new RefusedBidi<grpc::ByteBuffer, grpc::ByteBuffer>(NoLeaderStatus());
  }
  etcdserverpb::ResponseHeader header;
  membership::FillHeader(*member_, &header);
  auto* reactor = new WatchReactor(hub_, header, ctx, auth_, bound ? monitor_ : nullptr);
  if (bound) monitor_->Remember(reactor);
  return reactor;
}

}  // namespace capstan::server
