#include "server/api/watch_service.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "grpcpp/alarm.h"
#include "server/api/auth_service.h"
#include "server/api/decoded.h"
#include "server/api/errors.h"
#include "server/api/go_unmarshal.h"
#include "server/api/grpc_buffers.h"
#include "util/mutex.h"

namespace capstan::server {

class WatchCall;

// The writes of one completion queue's streams. Post (any thread) puts an
// idle stream with a response to send on the ready list and, when the list
// was empty, sets the queue's alarm; the alarm wakes the queue's thread,
// which takes the whole list and writes each stream's response.
class WatchWriter final : public AsyncCall {
 public:
  WatchWriter(CompletionQueues* queues, grpc::ServerCompletionQueue* cq)
      : queues_(queues), cq_(cq) {}

  grpc::ServerCompletionQueue* cq() const { return cq_; }

  // `call` has a response to write (WatchCall::posted_). Any thread.
  void Post(WatchCall* call) ABSL_LOCKS_EXCLUDED(mu_);
  // `call` is being destroyed: it leaves the ready list. The queue's thread.
  void Forget(WatchCall* call) ABSL_LOCKS_EXCLUDED(mu_);
  // The alarm went off: writes the ready streams. The queue's thread.
  void Proceed(bool ok) override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  CompletionQueues* const queues_;
  grpc::ServerCompletionQueue* const cq_;
  grpc::Alarm alarm_;
  // Lock order: after the hub's and the hub stream's locks (Post runs
  // under them); a leaf otherwise.
  util::Mutex mu_;
  bool armed_ ABSL_GUARDED_BY(mu_) = false;  // the alarm is set and not yet taken
  std::vector<WatchCall*> ready_ ABSL_GUARDED_BY(mu_);
  std::vector<WatchCall*> taken_;  // the queue's thread's
};

// One Watch stream. Reads requests one at a time and hands them to the
// hub's WatchStream; writes the responses the hub queues, one at a time.
// Its handlers run on its queue's thread; the hub's deliver function is
// the only entry from other threads. Deletes itself once the call is done
// and none of its operations is pending.
class WatchCall final {
 public:
  // Arms a stream on writer's queue, unless the queues are stopping.
  static void Arm(WatchService* service, CompletionQueues* queues, WatchWriter* writer) {
    if (!queues->Enter()) return;
    new WatchCall(service, queues, writer);
  }

  // Writes the response posted to the writer (WatchWriter::Proceed).
  void WritePosted() ABSL_LOCKS_EXCLUDED(send_mu_) {
    std::string message;
    {
      util::MutexLock l(&send_mu_);
      message = std::move(posted_);
    }
    if (ending_) return;  // the stream is closed: nothing more goes out
    Write(std::move(message));
  }

 private:
  // A tag for one kind of operation; several are pending at a time.
  struct Tag final : AsyncCall {
    Tag(WatchCall* c, void (WatchCall::*f)(bool)) : call(c), on(f) {}
    void Proceed(bool ok) override { (call->*on)(ok); }
    WatchCall* const call;
    void (WatchCall::*const on)(bool);
  };

  WatchCall(WatchService* service, CompletionQueues* queues, WatchWriter* writer)
      : registered_{queues}, service_(service), queues_(queues), writer_(writer) {
    ctx_.AsyncNotifyWhenDone(&done_tag_);
    service_->RequestWatch(&ctx_, &stream_, writer_->cq(), writer_->cq(), &accept_tag_);
  }

  ~WatchCall() { writer_->Forget(this); }

  void OnAccepted(bool ok) {
    if (!ok) {  // the server is shutting down; the done tag never comes
      delete this;
      return;
    }
    Arm(service_, queues_, writer_);
    if (absl::Status s = LearnerRefusal(service_->member()); !s.ok()) {
      End(ToGrpcStatus(s));
      return;
    }
    membership::FillHeader(*service_->member(), &header_);
    hub_stream_ = service_->hub()->OpenStream(header_);
    // Runs under the hub stream's lock when the reader found its queue
    // empty; never after hub_stream_->Close().
    hub_stream_->SetDeliver([this](std::string message) { Send(std::move(message)); });
    Read();
  }

  void Read() {
    read_pending_ = true;
    stream_.Read(&in_, &read_tag_);
  }

  void OnRead(bool ok) {
    read_pending_ = false;
    if (!ok || ending_) {
      // The client closed its side: as etcd's, the stream goes on sending
      // until the client cancels it (the done tag), which a broken call
      // does too.
      MaybeDelete();
      return;
    }
    etcdserverpb::WatchRequest req;
    if (std::string error = DecodeAsEtcd(in_, &req); !error.empty()) {
      End(StreamUnmarshalStatus(error));
      return;
    }
    switch (req.request_union_case()) {
      case etcdserverpb::WatchRequest::kCreateRequest:
        if (const AuthGate* auth = service_->auth(); auth != nullptr) {
          const auto& c = req.create_request();
          if (absl::Status s = auth->CheckWatch(ctx_, c.key(), c.range_end()); !s.ok()) {
            SendRefused(s);
            break;
          }
        }
        hub_stream_->Create(req.create_request());
        break;
      case etcdserverpb::WatchRequest::kCancelRequest:
        hub_stream_->Cancel(req.cancel_request().watch_id());
        break;
      case etcdserverpb::WatchRequest::kProgressRequest:
        hub_stream_->RequestProgress();
        break;
      default:
        break;
    }
    if (!ending_) Read();
  }

  void OnWritten(bool ok) ABSL_LOCKS_EXCLUDED(send_mu_) {
    {
      util::MutexLock l(&send_mu_);
      write_pending_ = false;
    }
    if (!ok) {
      End(grpc::Status(grpc::UNAVAILABLE, "watch stream broken"));
      MaybeDelete();
      return;
    }
    if (ending_) {
      StartFinish();
      return;
    }
    std::string message;
    bool own = false;
    {
      util::MutexLock l(&send_mu_);
      if (own_.empty()) {
        writing_ = false;
      } else {
        message = std::move(own_.front());
        own_.pop_front();
        own = true;
      }
    }
    if (!own) {
      // The hub delivers nothing while we look: its queue is not waiting
      // until Pop finds it empty.
      if (!hub_stream_->Pop(&message)) return;
      util::MutexLock l(&send_mu_);
      writing_ = true;
    }
    Write(std::move(message));
  }

  void OnFinished(bool /*ok*/) {
    finish_pending_ = false;
    MaybeDelete();
  }

  void OnDone(bool /*ok*/) {
    done_ = true;
    if (!ending_) {
      // Canceled (a finished call has ended already): pending operations
      // fail; nothing is finished.
      ending_ = true;
      if (hub_stream_) hub_stream_->Close();
    }
    MaybeDelete();
  }

  // Sends message once the write in flight (if any) is done. Any thread:
  // the hub's deliveries come from its threads, the refusals from the
  // queue's. A delivery on the path of the write it reports (the committer
  // fanning out to a few watchers before it answers) is written here and
  // now, so that the event leaves before the write's answer, as etcd's
  // does; the others are posted to the queue's writer.
  void Send(std::string message) ABSL_LOCKS_EXCLUDED(send_mu_) {
    const bool now = mvcc::WatchHub::OnWritePath();
    {
      util::MutexLock l(&send_mu_);
      if (writing_) {
        own_.push_back(std::move(message));
        return;
      }
      writing_ = true;
      if (!now) posted_ = std::move(message);
    }
    if (now) {
      Write(std::move(message));
    } else {
      writer_->Post(this);
    }
  }

  // etcd's answer to a watch it refuses (a range the user may not read, no
  // user, a bad token): created and canceled at once, with watch id -1
  // (clientv3.InvalidWatchID) whatever id was asked for.
  void SendRefused(const absl::Status& why) {
    etcdserverpb::WatchResponse resp;
    *resp.mutable_header() = header_;
    resp.mutable_header()->set_revision(service_->auth()->store()->kv()->Rev());
    resp.set_watch_id(-1);
    resp.set_created(true);
    resp.set_canceled(true);
    resp.set_cancel_reason(WatchRefusalReason(why));
    Send(resp.SerializeAsString());
  }

  // REQUIRES: writing_ was set by this caller (no other write is started).
  void Write(std::string message) ABSL_LOCKS_EXCLUDED(send_mu_) {
    StringToBuffer(std::move(message), &out_);
    {
      util::MutexLock l(&send_mu_);
      write_pending_ = true;
    }
    stream_.Write(out_, &write_tag_);
  }

  bool WritePending() ABSL_LOCKS_EXCLUDED(send_mu_) {
    util::MutexLock l(&send_mu_);
    return write_pending_;
  }

  // Closes the hub's stream and finishes the call with status, once no
  // write is in flight.
  void End(const grpc::Status& status) {
    if (ending_) return;
    ending_ = true;
    status_ = status;
    if (hub_stream_) hub_stream_->Close();  // no delivery starts a write after this
    if (!WritePending()) StartFinish();
  }

  void StartFinish() {
    if (finish_started_) return;
    finish_started_ = true;
    finish_pending_ = true;
    stream_.Finish(status_, &finish_tag_);
  }

  void MaybeDelete() {
    if (done_ && !read_pending_ && !finish_pending_ && !WritePending()) delete this;
  }

  friend class WatchWriter;

  // Leaves the queues' count of calls when the call is destroyed, after
  // every other member (the stream and its context) is gone.
  struct Registered {
    CompletionQueues* queues;
    ~Registered() { queues->Leave(); }
  } registered_;
  WatchService* const service_;
  CompletionQueues* const queues_;
  WatchWriter* const writer_;
  grpc::ServerContext ctx_;
  grpc::ServerAsyncReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer> stream_{&ctx_};
  Tag accept_tag_{this, &WatchCall::OnAccepted};
  Tag read_tag_{this, &WatchCall::OnRead};
  Tag write_tag_{this, &WatchCall::OnWritten};
  Tag finish_tag_{this, &WatchCall::OnFinished};
  Tag done_tag_{this, &WatchCall::OnDone};
  etcdserverpb::ResponseHeader header_;
  std::shared_ptr<mvcc::WatchStream> hub_stream_;
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;  // the write in flight
  grpc::Status status_;   // End's

  // The queue's thread's.
  bool read_pending_ = false, finish_pending_ = false;
  bool ending_ = false, finish_started_ = false, done_ = false;

  // Lock order: after the hub stream's lock (Send runs under it when the
  // hub delivers), before the writer's; nothing calls into the stream or
  // gRPC under it.
  util::Mutex send_mu_;
  bool writing_ ABSL_GUARDED_BY(send_mu_) = false;  // a write is posted or in flight
  bool write_pending_ ABSL_GUARDED_BY(send_mu_) = false;  // a write is in flight
  std::string posted_ ABSL_GUARDED_BY(send_mu_);    // the response posted to the writer
  std::deque<std::string> own_ ABSL_GUARDED_BY(send_mu_);  // responses waiting behind it
  // On the writer's ready list; guarded by the writer's lock.
  bool on_ready_list_ = false;
};

void WatchWriter::Post(WatchCall* call) {
  bool arm = false;
  {
    util::MutexLock l(&mu_);
    call->on_ready_list_ = true;
    ready_.push_back(call);
    if (!armed_) armed_ = arm = true;
  }
  if (!arm) return;
  // The alarm counts as a call of the queues until its tag is taken, so
  // that the queues outlive it; once they stop, nothing is written.
  if (!queues_->Enter()) {
    util::MutexLock l(&mu_);
    armed_ = false;
    return;
  }
  alarm_.Set(cq_, gpr_time_0(GPR_CLOCK_MONOTONIC), this);
}

void WatchWriter::Forget(WatchCall* call) {
  util::MutexLock l(&mu_);
  if (!call->on_ready_list_) return;
  ready_.erase(std::find(ready_.begin(), ready_.end(), call));
  call->on_ready_list_ = false;
}

void WatchWriter::Proceed(bool /*ok*/) {
  {
    util::MutexLock l(&mu_);
    armed_ = false;
    taken_.swap(ready_);
    for (WatchCall* call : taken_) call->on_ready_list_ = false;
  }
  // No call is destroyed meanwhile: calls are destroyed by their tags,
  // which this thread takes only after this returns.
  for (WatchCall* call : taken_) call->WritePosted();
  taken_.clear();
  queues_->Leave();
}

WatchService::WatchService(mvcc::WatchHub* hub, const membership::MemberInfo* member,
                           const AuthGate* auth)
    : hub_(hub), member_(member), auth_(auth) {}

WatchService::~WatchService() = default;

void WatchService::ServeWatches(CompletionQueues* queues, int per_queue) {
  for (grpc::ServerCompletionQueue* cq : queues->queues()) {
    writers_.push_back(std::make_unique<WatchWriter>(queues, cq));
    for (int i = 0; i < per_queue; ++i) WatchCall::Arm(this, queues, writers_.back().get());
  }
}

}  // namespace capstan::server
