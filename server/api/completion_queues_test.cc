// CompletionQueues through a real gRPC server: calls on the queues are served
// while the queues' threads are busy and once they have gone idle (no longer
// waiting in gRPC, only looking at their queues).

#include "server/api/completion_queues.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/byte_buffer.h"
#include "gtest/gtest.h"

namespace capstan::server {
namespace {

std::string Text(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

grpc::ByteBuffer Buffer(const std::string& text) {
  grpc::Slice slice(text);
  return grpc::ByteBuffer(&slice, 1);
}

// Any method: reads one message and answers it reversed, then arms the next
// call on its queue.
class EchoCall : public AsyncCall {
 public:
  EchoCall(grpc::AsyncGenericService* service, grpc::ServerCompletionQueue* cq,
           CompletionQueues* queues)
      : service_(service), cq_(cq), queues_(queues) {}

  static void Arm(grpc::AsyncGenericService* service, grpc::ServerCompletionQueue* cq,
                  CompletionQueues* queues) {
    if (!queues->Enter()) return;
    auto* call = new EchoCall(service, cq, queues);
    service->RequestCall(&call->context_, &call->stream_, cq, cq, call);
  }

  void Proceed(bool ok) override {
    switch (step_) {
      case Step::kRequested:
        if (!ok) return End();
        Arm(service_, cq_, queues_);
        step_ = Step::kRead;
        stream_.Read(&request_, this);
        return;
      case Step::kRead: {
        if (!ok) return End();
        std::string text = Text(request_);
        answer_ = Buffer(std::string(text.rbegin(), text.rend()));
        step_ = Step::kWritten;
        stream_.Write(answer_, this);
        return;
      }
      case Step::kWritten:
        step_ = Step::kFinished;
        stream_.Finish(grpc::Status::OK, this);
        return;
      case Step::kFinished:
        return End();
    }
  }

 private:
  enum class Step { kRequested, kRead, kWritten, kFinished };

  void End() {
    queues_->Leave();
    delete this;
  }

  grpc::AsyncGenericService* const service_;
  grpc::ServerCompletionQueue* const cq_;
  CompletionQueues* const queues_;
  grpc::GenericServerContext context_;
  grpc::GenericServerAsyncReaderWriter stream_{&context_};
  grpc::ByteBuffer request_;
  grpc::ByteBuffer answer_;
  Step step_ = Step::kRequested;
};

class CompletionQueuesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterAsyncGenericService(&service_);
    queues_ = std::make_unique<CompletionQueues>(&builder, 2);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    queues_->Start();
    for (auto* cq : queues_->queues()) EchoCall::Arm(&service_, cq, queues_.get());
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                   grpc::InsecureChannelCredentials());
  }

  void TearDown() override {
    queues_->BeginStop();
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    queues_->Stop();
  }

  // One call through the generic stub; its answer or an error text.
  std::string Call(const std::string& text) {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::CompletionQueue cq;
    grpc::ByteBuffer request = Buffer(text);
    auto reader = stub.PrepareUnaryCall(&context, "/test.Echo/Echo", request, &cq);
    reader->StartCall();
    grpc::ByteBuffer response;
    grpc::Status status;
    reader->Finish(&response, &status, this);
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_TRUE(ok);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    return status.ok() ? Text(response) : "error: " + status.error_message();
  }

  grpc::AsyncGenericService service_;
  std::unique_ptr<CompletionQueues> queues_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(CompletionQueuesTest, QueuesWithNothingToDoStopWaitingInGrpc) {
  EXPECT_TRUE(queues_->TEST_AwaitIdle(absl::Seconds(30)));
}

TEST_F(CompletionQueuesTest, ACallToIdleQueuesIsServed) {
  ASSERT_TRUE(queues_->TEST_AwaitIdle(absl::Seconds(30)));
  EXPECT_EQ(Call("abc"), "cba");
  // Busy again, then idle again, and served again.
  ASSERT_TRUE(queues_->TEST_AwaitIdle(absl::Seconds(30)));
  EXPECT_EQ(Call("idle"), "eldi");
}

TEST_F(CompletionQueuesTest, CallsOneAfterAnotherAreServed) {
  for (int i = 0; i < 200; ++i) {
    const std::string text = "call " + std::to_string(i);
    ASSERT_EQ(Call(text), std::string(text.rbegin(), text.rend()));
  }
}

}  // namespace
}  // namespace capstan::server
