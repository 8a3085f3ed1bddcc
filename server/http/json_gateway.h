// etcd's JSON gateway (grpc-gateway) on the client URLs: POST /v3/kv/range
// and the rest of etcd's HTTP mappings of its gRPC services. A request's
// JSON body (proto field names, 64-bit integers as strings, bytes in
// base64) becomes the gRPC request; the call runs through an in-process
// channel to Capstan's own gRPC server, so it passes the same auth, limits
// and metrics as any gRPC call; the answer comes back as JSON. Streaming
// calls (watch, lease keep-alive, snapshot, election observe) take their
// requests from the body, one JSON object after another, and stream
// `{"result":...}` lines until the call ends or the client goes away. It
// answers as etcd 3.5.16's gateway (grpc-gateway v2) does: errors as a
// google.rpc.Status `{"code":3, "message":"..."}`, HTTP statuses from
// grpc-gateway v2's table, a stream's error as its last line
// `{"error":{"code":...,"message":...}}`.

#ifndef CAPSTAN_SERVER_HTTP_JSON_GATEWAY_H_
#define CAPSTAN_SERVER_HTTP_JSON_GATEWAY_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>

#include "server/http/http1.h"

namespace google::protobuf {
class MethodDescriptor;
}

namespace grpc {
class Channel;
class Server;
}  // namespace grpc

namespace capstan::server {

// grpc-gateway v2's answer to an error of gRPC code code: the HTTP status
// of the code, the body `{"code":5, "message":"Not Found"}`, headers and a
// JSON content type (and WWW-Authenticate for Unauthenticated). Also what
// a /v3/ path that routes nowhere (code 5, "Not Found") or a method other
// than POST (code 12, "Method Not Allowed") is answered with.
HttpResponse GatewayError(int code, const std::string& message, const HttpHeaders& headers);

// Thread-safe: any number of connections may Serve at once.
class JsonGateway {
 public:
  // REQUIRES: server is started and outlives the gateway.
  explicit JsonGateway(grpc::Server* server);
  ~JsonGateway();

  // The gRPC method path maps to, or null.
  const google::protobuf::MethodDescriptor* Route(const std::string& path) const;

  // Answers request (POST to a routed path) on connection: whole for a
  // unary call, chunked for a streaming one. headers are added to the
  // response (CORS). A call still running when stopping is set or the
  // client hangs up is cancelled. False if the connection can no longer be
  // used.
  bool Serve(const google::protobuf::MethodDescriptor* method, const HttpRequest& request,
             const HttpHeaders& headers, const std::atomic<bool>& stopping,
             HttpConnection* connection) const;

 private:
  bool ServeUnary(const google::protobuf::MethodDescriptor* method, const HttpRequest& request,
                  const HttpHeaders& headers, const std::atomic<bool>& stopping,
                  HttpConnection* connection) const;
  bool ServeStream(const google::protobuf::MethodDescriptor* method, const HttpRequest& request,
                   const HttpHeaders& headers, const std::atomic<bool>& stopping,
                   HttpConnection* connection) const;

  std::shared_ptr<grpc::Channel> channel_;
  std::map<std::string, const google::protobuf::MethodDescriptor*> routes_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_HTTP_JSON_GATEWAY_H_
