// Requests that reach a typed callback method whether or not they parse, so
// that the method answers bytes that are not its request as etcd does.
//
// gRPC's C++ callback API answers a unary request it cannot decode with
// UNIMPLEMENTED and no message, and ends a stream's read on such a message
// as if the client had half-closed. etcd's Go gRPC answers INTERNAL
// "grpc: error unmarshalling request: ..." for a unary request and ends a
// stream with INTERNAL "grpc: failed to unmarshal the received message: ...".
// A method registered through DecodingService reads Decoded<Request>, whose
// decoding never fails, and answers a request that did not decode with
// etcd's code and text before anything else (server/api/go_unmarshal.h).
//
// The KV, Watch, Lock, Election and Cache services read raw bytes for their
// own reasons and decode them the same way.

#ifndef CAPSTAN_SERVER_API_DECODED_H_
#define CAPSTAN_SERVER_API_DECODED_H_

#include <functional>
#include <string>
#include <string_view>

#include "google/protobuf/descriptor.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/server_callback.h"
#include "grpcpp/support/status.h"
#include "server/api/client_traffic.h"
#include "server/api/errors.h"
#include "server/api/go_unmarshal.h"

namespace capstan::server {

// A received message, or why it did not decode.
template <typename Message>
struct Decoded {
  bool ok() const { return error.empty(); }

  Message message;
  std::string error;  // DecodeAsEtcd's text
};

// An answer whose encoded bytes are counted as they are sent
// (etcd_network_client_grpc_sent_bytes_total, client_traffic.h).
template <typename Message>
struct Encoded {
  Message message;
};

// What a learner serves of the requests that go through DecodingService
// (etcd's isRPCSupportedForLearner): Status.
template <typename Message>
bool ServedByLearner(const Message&) {
  return std::string_view(Message::descriptor()->full_name()) == "etcdserverpb.StatusRequest";
}

// A stream refused before it starts.
template <typename Request, typename Response>
class RefusedBidi final : public grpc::ServerBidiReactor<Request, Response> {
 public:
  explicit RefusedBidi(grpc::Status s) { this->Finish(std::move(s)); }
  void OnDone() override { delete this; }
};

// A generated callback service (Grpc::CallbackService, e.g.
// etcdserverpb::Lease::CallbackService) whose subclass may register its
// methods to read Decoded requests. Registration is done in the subclass's
// constructor and replaces what gRPC generated for the method. `Base` is
// the generated service class with the method types wanted: a method served
// on the completion queues (completion_queues.h) is asynchronous there from
// the start, since gRPC does not turn a callback method into an async one.
template <typename Grpc, typename Base = typename Grpc::CallbackService>
class DecodingService : public Base {
 protected:
  // The unary method `name` hands method the requests that decode and
  // answers any other with UnmarshalStatus.
  template <typename Self, typename Request, typename Response>
  void DecodeUnary(const char* name,
                   grpc::ServerUnaryReactor* (Self::*method)(grpc::CallbackServerContext*,
                                                             const Request*, Response*)) {
    Self* self = static_cast<Self*>(this);
    this->MarkMethodCallback(
        MethodIndex(name, *Request::descriptor()),
        new grpc::internal::CallbackUnaryHandler<Decoded<Request>, Encoded<Response>>(
            [self, method](grpc::CallbackServerContext* ctx, const Decoded<Request>* request,
                           Encoded<Response>* encoded) -> grpc::ServerUnaryReactor* {
              Response* response = &encoded->message;
              if (!request->ok()) {
                auto* reactor = ctx->DefaultReactor();
                reactor->Finish(UnmarshalStatus(request->error));
                return reactor;
              }
              if (self->learner_check_ != nullptr && !ServedByLearner(request->message)) {
                if (absl::Status s = LearnerRefusal(self->learner_check_); !s.ok()) {
                  auto* reactor = ctx->DefaultReactor();
                  reactor->Finish(ToGrpcStatus(s));
                  return reactor;
                }
              }
              return (self->*method)(ctx, &request->message, response);
            }));
  }

  // The bidirectional stream `name` is served by reactors from make, which
  // read Decoded requests and end the stream with StreamUnmarshalStatus on
  // one that did not decode.
  template <typename Request, typename Response>
  void DecodeBidi(const char* name,
                  std::function<grpc::ServerBidiReactor<Decoded<Request>, Response>*(
                      grpc::CallbackServerContext*)>
                      make) {
    this->MarkMethodCallback(
        MethodIndex(name, *Request::descriptor()),
        new grpc::internal::CallbackBidiHandler<Decoded<Request>, Response>(
            [this, make = std::move(make)](grpc::CallbackServerContext* ctx)
                -> grpc::ServerBidiReactor<Decoded<Request>, Response>* {
              if (absl::Status s = LearnerRefusal(learner_check_); !s.ok()) {
                return new RefusedBidi<Decoded<Request>, Response>(ToGrpcStatus(s));
              }
              return make(ctx);
            }));
  }

  // The services of a member that may be a learner set this: their calls
  // get etcd's learner refusal (errors.h: LearnerRefusal).
  const membership::MemberInfo* learner_check_ = nullptr;

  // The server stream `name`: make gets the Decoded request and answers one
  // that did not decode with StreamUnmarshalStatus.
  template <typename Request, typename Response>
  void DecodeServerStream(const char* name,
                          std::function<grpc::ServerWriteReactor<Response>*(
                              grpc::CallbackServerContext*, const Decoded<Request>*)>
                              make) {
    this->MarkMethodCallback(MethodIndex(name, *Request::descriptor()),
                             new grpc::internal::CallbackServerStreamingHandler<
                                 Decoded<Request>, Response>(std::move(make)));
  }

 private:
  // gRPC numbers a service's methods in the order the proto declares them.
  // The method must exist and take `request` (a registration naming one
  // method with another's handler stops the server at start).
  static int MethodIndex(const char* name, const google::protobuf::Descriptor& request) {
    const auto* service =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
            Grpc::service_full_name());
    const auto* method = service == nullptr ? nullptr : service->FindMethodByName(name);
    GPR_ASSERT(method != nullptr && method->input_type() == &request);
    return method->index();
  }
};

}  // namespace capstan::server

namespace grpc {

// Decoding a Decoded<Message> never fails: why the bytes did not decode is
// kept for the method to answer.
template <typename Message>
class SerializationTraits<capstan::server::Decoded<Message>, void> {
 public:
  static Status Serialize(const capstan::server::Decoded<Message>& msg, ByteBuffer* bb,
                          bool* own_buffer) {
    return SerializationTraits<Message>::Serialize(msg.message, bb, own_buffer);
  }
  static Status Deserialize(ByteBuffer* buffer, capstan::server::Decoded<Message>* msg) {
    msg->error = capstan::server::DecodeReceived(*buffer, &msg->message);
    buffer->Clear();
    return Status::OK;
  }
};

template <typename Message>
class SerializationTraits<capstan::server::Encoded<Message>, void> {
 public:
  static Status Serialize(const capstan::server::Encoded<Message>& msg, ByteBuffer* bb,
                          bool* own_buffer) {
    Status s = SerializationTraits<Message>::Serialize(msg.message, bb, own_buffer);
    if (s.ok()) capstan::server::ClientTraffic::Sent(bb->Length());
    return s;
  }
  static Status Deserialize(ByteBuffer* buffer, capstan::server::Encoded<Message>* msg) {
    return SerializationTraits<Message>::Deserialize(buffer, &msg->message);
  }
};

}  // namespace grpc

#endif  // CAPSTAN_SERVER_API_DECODED_H_
