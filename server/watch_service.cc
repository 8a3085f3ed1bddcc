#include "server/watch_service.h"

#include <atomic>
#include <memory>
#include <string>

#include "server/grpc_buffers.h"

namespace capstan::server {
namespace {

// One Watch stream. Reads requests one at a time and hands them to the
// hub's WatchStream; writes the responses the hub queues, one at a time.
// Deletes itself in OnDone.
class WatchReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  WatchReactor(mvcc::WatchHub* hub, const etcdserverpb::ResponseHeader& header)
      : stream_(hub->OpenStream(header)) {
    // Runs under the stream's lock when the writer is idle; never after
    // stream_->Close().
    stream_->SetDeliver([this](std::string message) { Write(std::move(message)); });
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client closed its side (or the call broke): end the stream.
      End(grpc::Status::OK);
      return;
    }
    std::string bytes;
    etcdserverpb::WatchRequest req;
    if (!FlattenBuffer(in_, &bytes) || !req.ParseFromString(bytes)) {
      End(grpc::Status(grpc::INTERNAL, kUnmarshalError));
      return;
    }
    switch (req.request_union_case()) {
      case etcdserverpb::WatchRequest::kCreateRequest:
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

  void OnWriteDone(bool ok) override {
    if (!ok) {
      End(grpc::Status(grpc::UNAVAILABLE, "watch stream broken"));
      return;
    }
    std::string message;
    if (stream_->Pop(&message)) Write(std::move(message));
  }

  void OnCancel() override { stream_->Close(); }

  void OnDone() override {
    stream_->Close();
    delete this;
  }

 private:
  void Write(std::string message) {
    StringToBuffer(std::move(message), &out_);
    StartWrite(&out_);
  }

  void End(const grpc::Status& status) {
    stream_->Close();
    if (!finished_.exchange(true)) Finish(status);
  }

  std::shared_ptr<mvcc::WatchStream> stream_;
  grpc::ByteBuffer in_;
  grpc::ByteBuffer out_;  // the write in flight
  std::atomic<bool> finished_{false};
};

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* WatchService::Watch(
    grpc::CallbackServerContext* ctx) {
  etcdserverpb::ResponseHeader header;
  FillHeader(*member_, &header);
  return new WatchReactor(hub_, header);
}

}  // namespace capstan::server
