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

// grpc-gateway v2's runtime.HTTPStatusFromCode (FailedPrecondition is
// 400 there, not 412; Canceled is nginx's 499).
int HttpStatusFromCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK: return 200;
    case grpc::StatusCode::CANCELLED: return 499;
    case grpc::StatusCode::UNKNOWN: return 500;
    case grpc::StatusCode::INVALID_ARGUMENT: return 400;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return 504;
    case grpc::StatusCode::NOT_FOUND: return 404;
    case grpc::StatusCode::ALREADY_EXISTS: return 409;
    case grpc::StatusCode::PERMISSION_DENIED: return 403;
    case grpc::StatusCode::UNAUTHENTICATED: return 401;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return 429;
    case grpc::StatusCode::FAILED_PRECONDITION: return 400;
    case grpc::StatusCode::ABORTED: return 409;
    case grpc::StatusCode::OUT_OF_RANGE: return 400;
    case grpc::StatusCode::UNIMPLEMENTED: return 501;
    case grpc::StatusCode::INTERNAL: return 500;
    case grpc::StatusCode::UNAVAILABLE: return 503;
    case grpc::StatusCode::DATA_LOSS: return 500;
    default: return 500;
  }
}

// How the gateway's JSON reads. etcd's gateway writes a unary answer with
// protojson, which puts one space after each comma between members and
// elements (protojson picks that per binary; etcd 3.5.16's build has it).
// A stream message goes out inside a Go map through encoding/json, which
// compacts it (no spaces) and escapes <, >, &, U+2028 and U+2029.
enum class JsonStyle { kUnary, kStream };

// Appends text (UTF-8) as a JSON string the way protojson writes one:
// quote, backslash and control characters escaped (\b \f \n \r \t, else
// \u00xx), everything else as it is; for kStream with encoding/json's
// HTML-safe escapes on top.
void AppendJsonString(absl::string_view text, JsonStyle style, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (size_t i = 0; i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    switch (c) {
      case '"': out->append("\\\""); continue;
      case '\\': out->append("\\\\"); continue;
      case '\b': out->append("\\b"); continue;
      case '\f': out->append("\\f"); continue;
      case '\n': out->append("\\n"); continue;
      case '\r': out->append("\\r"); continue;
      case '\t': out->append("\\t"); continue;
      default: break;
    }
    if (c < 0x20 || (style == JsonStyle::kStream && (c == '<' || c == '>' || c == '&'))) {
      out->append("\\u00");
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 0xf]);
    } else if (style == JsonStyle::kStream && c == 0xe2 && i + 2 < text.size() &&
               static_cast<unsigned char>(text[i + 1]) == 0x80 &&
               (static_cast<unsigned char>(text[i + 2]) & ~1u) == 0xa8) {
      out->append(static_cast<unsigned char>(text[i + 2]) == 0xa8 ? "\\u2028" : "\\u2029");
      i += 2;
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
  out->push_back('"');
}

void AppendUtf8(uint32_t rune, std::string* out) {
  if (rune < 0x80) {
    out->push_back(static_cast<char>(rune));
  } else if (rune < 0x800) {
    out->push_back(static_cast<char>(0xc0 | (rune >> 6)));
    out->push_back(static_cast<char>(0x80 | (rune & 0x3f)));
  } else if (rune < 0x10000) {
    out->push_back(static_cast<char>(0xe0 | (rune >> 12)));
    out->push_back(static_cast<char>(0x80 | ((rune >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (rune & 0x3f)));
  } else {
    out->push_back(static_cast<char>(0xf0 | (rune >> 18)));
    out->push_back(static_cast<char>(0x80 | ((rune >> 12) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | ((rune >> 6) & 0x3f)));
    out->push_back(static_cast<char>(0x80 | (rune & 0x3f)));
  }
}

// The four hex digits at json[i..i+4), or -1.
int Hex4(absl::string_view json, size_t i) {
  if (i + 4 > json.size()) return -1;
  int v = 0;
  for (size_t j = i; j < i + 4; ++j) {
    const char c = json[j];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (d < 0) return -1;
    v = v * 16 + d;
  }
  return v;
}

// Rewrites compact JSON as protobuf's C++ printer writes it (its own
// escapes: \u003c for <, \u2028, upper-case hex) in the gateway's style.
// Strings are decoded and written again; outside them a space follows each
// comma for kUnary.
std::string GoJson(absl::string_view json, JsonStyle style) {
  std::string out;
  out.reserve(json.size() + json.size() / 8);
  std::string text;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (c != '"') {
      out.push_back(c);
      if (c == ',' && style == JsonStyle::kUnary) out.push_back(' ');
      continue;
    }
    text.clear();
    for (++i; i < json.size() && json[i] != '"'; ++i) {
      if (json[i] != '\\' || i + 1 >= json.size()) {
        text.push_back(json[i]);
        continue;
      }
      const char e = json[++i];
      switch (e) {
        case 'b': text.push_back('\b'); break;
        case 'f': text.push_back('\f'); break;
        case 'n': text.push_back('\n'); break;
        case 'r': text.push_back('\r'); break;
        case 't': text.push_back('\t'); break;
        case 'u': {
          int rune = Hex4(json, i + 1);
          if (rune < 0) {
            text.append("\\u");
            break;
          }
          i += 4;
          if (rune >= 0xd800 && rune < 0xdc00 && i + 2 < json.size() && json[i + 1] == '\\' &&
              json[i + 2] == 'u') {
            const int low = Hex4(json, i + 3);
            if (low >= 0xdc00 && low < 0xe000) {
              rune = 0x10000 + ((rune - 0xd800) << 10) + (low - 0xdc00);
              i += 6;
            }
          }
          AppendUtf8(static_cast<uint32_t>(rune), &text);
          break;
        }
        default: text.push_back(e); break;  // \" \\ \/
      }
    }
    AppendJsonString(text, style, &out);
  }
  return out;
}

// google.rpc.Status as protojson writes it: code and message, each left
// out when zero or empty (etcd's errors carry no details).
std::string StatusJson(int code, absl::string_view message, JsonStyle style) {
  std::string out = "{";
  if (code != 0) absl::StrAppend(&out, "\"code\":", code);
  if (!message.empty()) {
    if (code != 0) out.append(style == JsonStyle::kUnary ? ", " : ",");
    out.append("\"message\":");
    AppendJsonString(message, style, &out);
  }
  out.push_back('}');
  return out;
}

// grpc-gateway v2's error answer (DefaultHTTPErrorHandler): the HTTP
// status of the code, a google.rpc.Status body, and for Unauthenticated a
// WWW-Authenticate header with the message.
HttpResponse ErrorResponse(grpc::StatusCode code, const std::string& message,
                           const HttpHeaders& headers) {
  return GatewayError(static_cast<int>(code), message, headers);
}

// A stream's error message (grpc-gateway v2's errorChunk), ending the
// stream's last line.
std::string StreamError(const grpc::Status& status) {
  return absl::StrCat("{\"error\":",
                      StatusJson(static_cast<int>(status.error_code()), status.error_message(),
                                 JsonStyle::kStream),
                      "}\n");
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
// left out, in style.
std::string ToJson(const Message& message, JsonStyle style) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  std::string out;
  (void)google::protobuf::util::MessageToJsonString(message, &out, options);
  return GoJson(out, style);
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

HttpResponse GatewayError(int code, const std::string& message, const HttpHeaders& headers) {
  HttpResponse r;
  r.status = HttpStatusFromCode(static_cast<grpc::StatusCode>(code));
  r.headers = headers;
  r.headers.emplace_back("Content-Type", "application/json");
  if (code == grpc::StatusCode::UNAUTHENTICATED) r.headers.emplace_back("Www-Authenticate", message);
  r.body = StatusJson(code, message, JsonStyle::kUnary);
  return r;
}

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
  r.body = ToJson(*resp, JsonStyle::kUnary);
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
      alive_ = alive_ && connection_->WriteChunk(
                              absl::StrCat("{\"result\":", ToJson(*resp_, JsonStyle::kStream), "}\n"));
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
    if (!began_) {
      // No message went out, so no call headers came either: the answer
      // carries neither grpc-gateway's metadata header nor, for a call that
      // ended well, a content type. A call that failed answers with the
      // HTTP status of its code.
      HttpHeaders headers = headers_;
      if (!status_.ok()) headers.emplace_back("Content-Type", "application/json");
      alive_ = connection_->BeginChunked(
          status_.ok() ? 200 : HttpStatusFromCode(status_.error_code()), headers,
          request_.http10);
      began_ = true;
    }
    // The error is the stream's last line.
    if (!status_.ok()) alive_ = alive_ && connection_->WriteChunk(StreamError(status_));
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
  // sends every value up to the first that does not parse, then closes its
  // side, as etcd's gateway does (even if that is the first: a watch then
  // waits with nothing to say, a keep-alive ends). A server-streaming call
  // takes the first value, as a unary one does, and fails as one if it does
  // not parse.
  JsonValueReader values(request.body);
  absl::string_view value;
  std::unique_ptr<Message> first_request;
  const bool has_first = values.Next(&value);
  if (method->client_streaming()) {
    if (has_first && !ParseJson(value, method->input_type(), &first_request).ok()) {
      first_request = nullptr;
    }
  } else if (grpc::Status s = ParseJson(has_first ? value : "", method->input_type(), &first_request);
             !s.ok()) {
    return connection->Write(ErrorResponse(s.error_code(), s.error_message(), headers),
                             request.keep_alive);
  }
  StreamCall call(channel_, method, request, headers, stopping, connection, &values,
                  std::move(first_request));
  return call.Serve();
}

}  // namespace capstan::server
