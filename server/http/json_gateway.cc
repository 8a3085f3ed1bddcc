#include "server/http/json_gateway.h"

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/message.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "server/observability/logging.h"
#include "util/check.h"
#include "util/go_text.h"

namespace capstan::server {
namespace {

using google::protobuf::Message;
using google::protobuf::MethodDescriptor;

// etcd's gateway routes (the google.api.http options of its protos), path
// to fully qualified method. etcd's protos map /v3/maintenance/hash twice;
// its gateway serves Hash there, and so does Capstan.
constexpr std::pair<const char*, const char*> kRoutes[] = {
    {"/v3/kv/range", "etcdserverpb.KV.Range"},
    {"/v3/kv/put", "etcdserverpb.KV.Put"},
    {"/v3/kv/deleterange", "etcdserverpb.KV.DeleteRange"},
    {"/v3/kv/txn", "etcdserverpb.KV.Txn"},
    {"/v3/kv/compaction", "etcdserverpb.KV.Compact"},
    {"/v3/watch", "etcdserverpb.Watch.Watch"},
    {"/v3/lease/grant", "etcdserverpb.Lease.LeaseGrant"},
    {"/v3/lease/revoke", "etcdserverpb.Lease.LeaseRevoke"},
    {"/v3/kv/lease/revoke", "etcdserverpb.Lease.LeaseRevoke"},
    {"/v3/lease/keepalive", "etcdserverpb.Lease.LeaseKeepAlive"},
    {"/v3/lease/timetolive", "etcdserverpb.Lease.LeaseTimeToLive"},
    {"/v3/kv/lease/timetolive", "etcdserverpb.Lease.LeaseTimeToLive"},
    {"/v3/lease/leases", "etcdserverpb.Lease.LeaseLeases"},
    {"/v3/kv/lease/leases", "etcdserverpb.Lease.LeaseLeases"},
    {"/v3/cluster/member/add", "etcdserverpb.Cluster.MemberAdd"},
    {"/v3/cluster/member/remove", "etcdserverpb.Cluster.MemberRemove"},
    {"/v3/cluster/member/update", "etcdserverpb.Cluster.MemberUpdate"},
    {"/v3/cluster/member/list", "etcdserverpb.Cluster.MemberList"},
    {"/v3/cluster/member/promote", "etcdserverpb.Cluster.MemberPromote"},
    {"/v3/maintenance/alarm", "etcdserverpb.Maintenance.Alarm"},
    {"/v3/maintenance/status", "etcdserverpb.Maintenance.Status"},
    {"/v3/maintenance/defragment", "etcdserverpb.Maintenance.Defragment"},
    {"/v3/maintenance/hash", "etcdserverpb.Maintenance.Hash"},
    {"/v3/maintenance/snapshot", "etcdserverpb.Maintenance.Snapshot"},
    {"/v3/maintenance/transfer-leadership", "etcdserverpb.Maintenance.MoveLeader"},
    {"/v3/auth/enable", "etcdserverpb.Auth.AuthEnable"},
    {"/v3/auth/disable", "etcdserverpb.Auth.AuthDisable"},
    {"/v3/auth/authenticate", "etcdserverpb.Auth.Authenticate"},
    {"/v3/auth/user/add", "etcdserverpb.Auth.UserAdd"},
    {"/v3/auth/user/get", "etcdserverpb.Auth.UserGet"},
    {"/v3/auth/user/list", "etcdserverpb.Auth.UserList"},
    {"/v3/auth/user/delete", "etcdserverpb.Auth.UserDelete"},
    {"/v3/auth/user/changepw", "etcdserverpb.Auth.UserChangePassword"},
    {"/v3/auth/user/grant", "etcdserverpb.Auth.UserGrantRole"},
    {"/v3/auth/user/revoke", "etcdserverpb.Auth.UserRevokeRole"},
    {"/v3/auth/role/add", "etcdserverpb.Auth.RoleAdd"},
    {"/v3/auth/role/get", "etcdserverpb.Auth.RoleGet"},
    {"/v3/auth/role/list", "etcdserverpb.Auth.RoleList"},
    {"/v3/auth/role/delete", "etcdserverpb.Auth.RoleDelete"},
    {"/v3/auth/role/grant", "etcdserverpb.Auth.RoleGrantPermission"},
    {"/v3/auth/role/revoke", "etcdserverpb.Auth.RoleRevokePermission"},
    {"/v3/lock/lock", "v3lockpb.Lock.Lock"},
    {"/v3/lock/unlock", "v3lockpb.Lock.Unlock"},
    {"/v3/election/campaign", "v3electionpb.Election.Campaign"},
    {"/v3/election/proclaim", "v3electionpb.Election.Proclaim"},
    {"/v3/election/leader", "v3electionpb.Election.Leader"},
    {"/v3/election/observe", "v3electionpb.Election.Observe"},
    {"/v3/election/resign", "v3electionpb.Election.Resign"},
};

// How long a streaming answer waits for the next message before it looks
// whether the client is still there.
constexpr auto kStreamPoll = std::chrono::milliseconds(200);

// grpc-gateway's runtime.HTTPStatusFromCode.
int HttpStatusFromCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return 200;
    case grpc::StatusCode::CANCELLED: return 408;
    case grpc::StatusCode::INVALID_ARGUMENT: return 400;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return 504;
    case grpc::StatusCode::NOT_FOUND: return 404;
    case grpc::StatusCode::ALREADY_EXISTS: return 409;
    case grpc::StatusCode::PERMISSION_DENIED: return 403;
    case grpc::StatusCode::UNAUTHENTICATED: return 401;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return 429;
    case grpc::StatusCode::FAILED_PRECONDITION: return 412;
    case grpc::StatusCode::ABORTED: return 409;
    case grpc::StatusCode::OUT_OF_RANGE: return 400;
    case grpc::StatusCode::UNIMPLEMENTED: return 501;
    case grpc::StatusCode::UNAVAILABLE: return 503;
    default: return 500;  // Unknown, Internal, DataLoss
  }
}

std::string JsonString(absl::string_view s) {
  return absl::StrCat("\"", gotext::JsonEscape(std::string_view(s.data(), s.size())), "\"");
}

// grpc-gateway's error body for a call that failed before it streamed.
HttpResponse ErrorResponse(grpc::StatusCode code, const std::string& message,
                           const HttpHeaders& headers) {
  HttpResponse r;
  r.status = HttpStatusFromCode(code);
  r.headers = headers;
  r.headers.emplace_back("Content-Type", "application/json");
  const std::string text = JsonString(message);
  r.body = absl::StrCat("{\"error\":", text, ",\"message\":", text, ",\"code\":",
                        static_cast<int>(code), "}");
  return r;
}

// grpc-gateway's error object inside a stream.
std::string StreamError(const grpc::Status& status) {
  const int http = HttpStatusFromCode(status.error_code());
  return absl::StrCat("{\"error\":{\"grpc_code\":", static_cast<int>(status.error_code()),
                      ",\"http_code\":", http, ",\"message\":", JsonString(status.error_message()),
                      ",\"http_status\":", JsonString(HttpStatusText(http)), "}}");
}

// The JSON values of a body, one after another, as Go's json.Decoder reads
// them: each an object, an array, a string or a bare token.
class JsonValueReader {
 public:
  explicit JsonValueReader(absl::string_view body) : body_(body) {}

  // The next value; false at the end of the body.
  bool Next(absl::string_view* value) {
    SkipSpace();
    if (i_ >= body_.size()) return false;
    const size_t start = i_;
    int depth = 0;
    bool in_string = false;
    for (; i_ < body_.size(); ++i_) {
      const char c = body_[i_];
      if (in_string) {
        if (c == '\\') {
          ++i_;
        } else if (c == '"') {
          in_string = false;
          if (depth == 0) break;
        }
      } else if (c == '"') {
        in_string = true;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth <= 0) break;
      } else if (depth == 0 && absl::ascii_isspace(static_cast<unsigned char>(c))) {
        --i_;
        break;
      }
    }
    i_ = std::min(i_ + 1, body_.size());
    *value = body_.substr(start, i_ - start);
    return true;
  }

 private:
  void SkipSpace() {
    while (i_ < body_.size() && absl::ascii_isspace(static_cast<unsigned char>(body_[i_]))) ++i_;
  }

  const absl::string_view body_;
  size_t i_ = 0;
};

std::unique_ptr<Message> NewMessage(const google::protobuf::Descriptor* type) {
  return std::unique_ptr<Message>(
      google::protobuf::MessageFactory::generated_factory()->GetPrototype(type)->New());
}

// Parses one JSON value into a new message of type; an empty value is an
// empty message. Unknown fields are ignored, as by etcd's gateway.
grpc::Status ParseJson(absl::string_view json, const google::protobuf::Descriptor* type,
                       std::unique_ptr<Message>* out) {
  *out = NewMessage(type);
  if (json.empty()) return grpc::Status::OK;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto status = google::protobuf::util::JsonStringToMessage(std::string(json), out->get(), options);
  if (!status.ok()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(status.message()));
  }
  return grpc::Status::OK;
}

// A message as etcd's gateway writes it: proto field names, zero values
// left out.
std::string ToJson(const Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return out;
}

bool Serialize(const Message& message, grpc::ByteBuffer* out) {
  bool own = false;
  return grpc::SerializationTraits<Message>::Serialize(message, out, &own).ok();
}

std::string FullMethod(const MethodDescriptor* method) {
  return absl::StrCat("/", method->service()->full_name(), "/", method->name());
}

void ForwardAuthorization(const HttpRequest& request, grpc::ClientContext* context) {
  // grpc-gateway passes the Authorization header on as metadata, where
  // etcd (and Capstan) take the token from.
  if (const std::string* auth = request.Header("authorization")) {
    context->AddMetadata("authorization", *auth);
  }
}

HttpHeaders SuccessHeaders(const HttpHeaders& headers) {
  HttpHeaders out = headers;
  out.emplace_back("Content-Type", "application/json");
  out.emplace_back("Grpc-Metadata-Content-Type", "application/grpc");
  return out;
}

// The next completion on cq, checking every kStreamPoll whether the client
// went away or the server is stopping; if so the call is cancelled (its
// operations still complete, not ok). False once cq is shut down.
bool NextEvent(grpc::CompletionQueue* cq, void** tag, bool* ok, grpc::ClientContext* context,
               const std::atomic<bool>& stopping, HttpConnection* connection, bool* cancelled) {
  for (;;) {
    const auto deadline = std::chrono::system_clock::now() + kStreamPoll;
    const auto status = cq->AsyncNext(tag, ok, deadline);
    if (status == grpc::CompletionQueue::GOT_EVENT) return true;
    if (status == grpc::CompletionQueue::SHUTDOWN) return false;
    if (!*cancelled && (stopping.load() || connection->PeerClosed(0))) {
      *cancelled = true;
      context->TryCancel();
    }
  }
}

}  // namespace

JsonGateway::JsonGateway(grpc::Server* server) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  channel_ = server->InProcessChannel(args);
  const auto* pool = google::protobuf::DescriptorPool::generated_pool();
  for (const auto& [path, name] : kRoutes) {
    const MethodDescriptor* m = pool->FindMethodByName(name);
    // The services are linked in (they serve gRPC); a miss is a typo.
    CHECK(m != nullptr) << "gateway route " << path << ": no method " << name;
    routes_[path] = m;
  }
}

JsonGateway::~JsonGateway() = default;

const MethodDescriptor* JsonGateway::Route(const std::string& path) const {
  auto it = routes_.find(path);
  return it == routes_.end() ? nullptr : it->second;
}

bool JsonGateway::Serve(const MethodDescriptor* method, const HttpRequest& request,
                        const HttpHeaders& headers, const std::atomic<bool>& stopping,
                        HttpConnection* connection) const {
  if (method->client_streaming() || method->server_streaming()) {
    return ServeStream(method, request, headers, stopping, connection);
  }
  return ServeUnary(method, request, headers, stopping, connection);
}

bool JsonGateway::ServeUnary(const MethodDescriptor* method, const HttpRequest& request,
                             const HttpHeaders& headers, const std::atomic<bool>& stopping,
                             HttpConnection* connection) const {
  absl::string_view first;
  JsonValueReader(request.body).Next(&first);
  std::unique_ptr<Message> req;
  grpc::Status status = ParseJson(first, method->input_type(), &req);
  grpc::ByteBuffer req_buffer, resp_buffer;
  if (status.ok() && !Serialize(*req, &req_buffer)) {
    status = grpc::Status(grpc::StatusCode::INTERNAL, "cannot serialize the request");
  }
  if (status.ok()) {
    grpc::GenericStub stub(channel_);
    grpc::ClientContext context;
    ForwardAuthorization(request, &context);
    grpc::CompletionQueue cq;
    auto call = stub.PrepareUnaryCall(&context, FullMethod(method), req_buffer, &cq);
    call->StartCall();
    int tag = 0;
    call->Finish(&resp_buffer, &status, &tag);
    // A Lock or Campaign may wait long: a client that hangs up cancels it.
    bool cancelled = false;
    void* got = nullptr;
    bool ok = false;
    NextEvent(&cq, &got, &ok, &context, stopping, connection, &cancelled);
    cq.Shutdown();
    while (cq.Next(&got, &ok)) {
    }
    if (cancelled) return false;
  }
  if (!status.ok()) {
    return connection->Write(ErrorResponse(status.error_code(), status.error_message(), headers),
                             request.keep_alive);
  }
  std::unique_ptr<Message> resp = NewMessage(method->output_type());
  if (!grpc::SerializationTraits<Message>::Deserialize(&resp_buffer, resp.get()).ok()) {
    return connection->Write(
        ErrorResponse(grpc::StatusCode::INTERNAL, "cannot parse the response", headers),
        request.keep_alive);
  }
  HttpResponse r;
  r.headers = SuccessHeaders(headers);
  r.body = ToJson(*resp);
  return connection->Write(r, request.keep_alive);
}

namespace {

// One streaming call forwarded from an HTTP request: the requests parsed
// from the body one at a time as they are written (a body of many small
// values stays one body in memory), the answers written to the connection
// as chunks as they are read. Used by one thread, inside ServeStream.
class StreamCall {
 public:
  // first: the first request to write, or null to write none. REQUIRES:
  // method, request, headers, stopping, connection and values outlive the
  // StreamCall.
  StreamCall(const std::shared_ptr<grpc::Channel>& channel, const MethodDescriptor* method,
             const HttpRequest& request, const HttpHeaders& headers,
             const std::atomic<bool>& stopping, HttpConnection* connection,
             JsonValueReader* values, std::unique_ptr<Message> first)
      : method_(method),
        request_(request),
        headers_(headers),
        stopping_(stopping),
        connection_(connection),
        values_(values),
        stub_(channel),
        next_request_(std::move(first)),
        resp_(NewMessage(method->output_type())) {
    ForwardAuthorization(request_, &context_);
    call_ = stub_.PrepareCall(&context_, FullMethod(method_), &cq_);
  }

  // Runs the call to its end and answers it. Returns whether the
  // connection may serve another request. Call once.
  bool Serve() {
    Exchange();
    return Finish();
  }

 private:
  // The request after next_request_, or null at the end (or at a value that
  // does not parse).
  std::unique_ptr<Message> ParseNext() {
    absl::string_view value;
    std::unique_ptr<Message> m;
    if (!method_->client_streaming() || !values_->Next(&value) ||
        !ParseJson(value, method_->input_type(), &m).ok()) {
      return nullptr;
    }
    return m;
  }

  // Like Go's server, the status line goes out with the first message (or
  // the error), so a call that fails at once answers with its HTTP status.
  void Begin(int http_status) {
    if (!began_) {
      alive_ = connection_->BeginChunked(http_status, SuccessHeaders(headers_), request_.http10);
      began_ = true;
    }
  }

  // Writes the next request, or the half-close after the last.
  void WriteNext() {
    if (!writing_) return;
    out_.Clear();  // serializing needs an empty buffer
    if (next_request_ != nullptr && Serialize(*next_request_, &out_)) {
      call_->Write(out_, &write_tag_);
      next_request_ = ParseNext();
    } else {
      call_->WritesDone(&write_tag_);
      writing_ = false;
    }
    ++pending_;
  }

  void EndCall() {
    writing_ = false;  // nothing is written after Finish
    call_->Finish(&status_, &finish_tag_);
    ++pending_;
  }

  // An answer read (ok) or the end of the answers: writes it as a chunk and
  // reads the next, or finishes the call.
  void OnRead(bool ok) {
    resp_->Clear();
    if (ok && grpc::SerializationTraits<Message>::Deserialize(&in_, resp_.get()).ok()) {
      Begin(200);
      alive_ = alive_ && connection_->WriteChunk(absl::StrCat("{\"result\":", ToJson(*resp_), "}\n"));
      if (!alive_ && !cancelled_) {
        cancelled_ = true;
        context_.TryCancel();
      }
      call_->Read(&in_, &read_tag_);
      ++pending_;
    } else {
      EndCall();
    }
  }

  // Requests are written while answers are read: the server may not read a
  // request before its answer to the last one is taken. At most one write
  // and one read are in flight; Finish follows the last read. Returns once
  // the call ended (or was cancelled) and its queue is drained.
  void Exchange() {
    call_->StartCall(&start_tag_);
    void* tag = nullptr;
    bool ok = false;
    while (pending_ > 0 &&
           NextEvent(&cq_, &tag, &ok, &context_, stopping_, connection_, &cancelled_)) {
      --pending_;
      if (tag == &start_tag_) {
        WriteNext();
        call_->Read(&in_, &read_tag_);
        ++pending_;
      } else if (tag == &write_tag_) {
        if (ok) {
          WriteNext();
        } else {
          writing_ = false;
        }
      } else if (tag == &read_tag_) {
        OnRead(ok);
      }
    }
    cq_.Shutdown();
    while (cq_.Next(&tag, &ok)) {
    }
  }

  // Answers the end of the call. REQUIRES: Exchange returned.
  bool Finish() {
    if (!alive_ || cancelled_) return false;
    if (!status_.ok()) {
      // A call that fails before its first message fails as a unary one
      // (grpc-gateway sees the error while it waits for the call's headers);
      // later, the error is the stream's last object.
      if (!began_) {
        return connection_->Write(
            ErrorResponse(status_.error_code(), status_.error_message(), headers_),
            request_.keep_alive);
      }
      alive_ = connection_->WriteChunk(StreamError(status_));
    }
    Begin(200);
    return alive_ && connection_->EndChunked() && request_.keep_alive && !request_.http10;
  }

  const MethodDescriptor* const method_;
  const HttpRequest& request_;
  const HttpHeaders& headers_;
  const std::atomic<bool>& stopping_;
  HttpConnection* const connection_;
  JsonValueReader* const values_;

  grpc::GenericStub stub_;
  grpc::ClientContext context_;
  grpc::CompletionQueue cq_;
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call_;

  std::unique_ptr<Message> next_request_;  // the request WriteNext writes
  bool began_ = false;                     // the status line went out
  bool alive_ = true;                      // the connection took every write
  int start_tag_ = 0, write_tag_ = 0, read_tag_ = 0, finish_tag_ = 0;
  bool writing_ = true;  // requests (or the half-close) still to go
  int pending_ = 1;      // operations in flight
  bool cancelled_ = false;
  grpc::ByteBuffer out_, in_;
  grpc::Status status_;
  std::unique_ptr<Message> resp_;
};

}  // namespace

bool JsonGateway::ServeStream(const MethodDescriptor* method, const HttpRequest& request,
                              const HttpHeaders& headers, const std::atomic<bool>& stopping,
                              HttpConnection* connection) const {
  // The requests to send, parsed one at a time as they are sent (a body
  // of many small values stays one body in memory). A bidirectional call
  // sends every value up to the first that does not parse; if that is the
  // first, the call fails as etcd's gateway fails it (code Unknown). A
  // server-streaming call takes the first value, as a unary one does.
  JsonValueReader values(request.body);
  absl::string_view value;
  std::unique_ptr<Message> first_request;
  const bool has_first = values.Next(&value);
  if (has_first || !method->client_streaming()) {
    if (grpc::Status s = ParseJson(has_first ? value : "", method->input_type(), &first_request);
        !s.ok()) {
      const bool stream = method->client_streaming();
      connection->Write(
          ErrorResponse(stream ? grpc::StatusCode::UNKNOWN : s.error_code(), s.error_message(),
                        headers),
          request.keep_alive && !stream);
      return request.keep_alive && !stream;
    }
  }
  StreamCall call(channel_, method, request, headers, stopping, connection, &values,
                  std::move(first_request));
  return call.Serve();
}

}  // namespace capstan::server
