// TLS and authentication for capstan-bench's connections, with etcd
// benchmark's flags: --cacert, --cert, --key (TLS; an https:// endpoint or
// --cacert turns it on) and --user name:password (etcd auth: Authenticate
// once, then send the token as "token" metadata on every call, as clientv3
// does; a call answered "etcdserver: invalid auth token" makes the next call
// authenticate again).

#ifndef CAPSTAN_BENCH_LOADGEN_CLIENT_SECURITY_H_
#define CAPSTAN_BENCH_LOADGEN_CLIENT_SECURITY_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/client_interceptor.h>

#include "absl/status/statusor.h"
#include "etcdserverpb/rpc.grpc.pb.h"

namespace capstan::bench {

struct ClientSecurity {
  std::string ca_file;    // --cacert: CA bundle that verifies the server
  std::string cert_file;  // --cert: client certificate (with --key)
  std::string key_file;   // --key
  std::string user;       // --user "name:password"; empty: no auth

  bool UsesTls(const std::string& endpoint) const;
};

// The credentials of a channel to endpoint: TLS (with the files read here)
// or insecure.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientSecurity& security, const std::string& endpoint);

// Whether status is etcd's ErrInvalidAuthToken (the token expired or the
// server restarted): the call may be retried once with a fresh token.
bool IsInvalidAuthToken(const grpc::Status& status);

// A user's token, fetched with Authenticate on its own channel. Thread-safe.
class AuthTokenSource {
 public:
  // Parses "name:password" and authenticates at once.
  static absl::StatusOr<std::shared_ptr<AuthTokenSource>> Create(
      const std::string& user, const std::string& target,
      std::shared_ptr<grpc::ChannelCredentials> credentials);

  // The current token; authenticates first when it was invalidated. An empty
  // string if authenticating failed (the call then fails as unauthenticated).
  std::string Token();
  // Marks `token` stale (no-op if a newer one is already in use).
  void Invalidate(const std::string& token);

  // Adds the token to every call of a channel.
  std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface> InterceptorFactory();

 private:
  AuthTokenSource() = default;
  absl::Status AuthenticateLocked();

  std::string name_, password_;
  std::unique_ptr<etcdserverpb::Auth::Stub> auth_;
  std::mutex mu_;
  std::string token_;  // guarded by mu_
  bool stale_ = true;  // guarded by mu_
};

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_CLIENT_SECURITY_H_
