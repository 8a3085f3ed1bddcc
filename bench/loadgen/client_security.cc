#include "bench/loadgen/client_security.h"

#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace capstan::bench {

namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("--", flag, ": cannot read ", path));
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// Sends the token with every call but Authenticate, and invalidates it when
// the server rejects it.
class TokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit TokenInterceptor(AuthTokenSource* source) : source_(source) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_INITIAL_METADATA)) {
      token_ = source_->Token();
      if (!token_.empty()) methods->GetSendInitialMetadata()->insert({"token", token_});
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_STATUS)) {
      if (IsInvalidAuthToken(*methods->GetRecvStatus())) source_->Invalidate(token_);
    }
    methods->Proceed();
  }

 private:
  AuthTokenSource* const source_;
  std::string token_;  // the token this call sent
};

class TokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit TokenInterceptorFactory(AuthTokenSource* source) : source_(source) {}
  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new TokenInterceptor(source_);
  }

 private:
  AuthTokenSource* const source_;
};

}  // namespace

bool ClientSecurity::UsesTls(const std::string& endpoint) const {
  return !ca_file.empty() || !cert_file.empty() || absl::StartsWith(endpoint, "https://");
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientSecurity& security, const std::string& endpoint) {
  if (!security.UsesTls(endpoint)) return grpc::InsecureChannelCredentials();
  if (security.cert_file.empty() != security.key_file.empty()) {
    return absl::InvalidArgumentError("--cert and --key go together");
  }
  grpc::SslCredentialsOptions o;
  if (!security.ca_file.empty()) {
    absl::StatusOr<std::string> ca = ReadFile(security.ca_file, "cacert");
    if (!ca.ok()) return ca.status();
    o.pem_root_certs = *ca;
  }
  if (!security.cert_file.empty()) {
    absl::StatusOr<std::string> cert = ReadFile(security.cert_file, "cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile(security.key_file, "key");
    if (!key.ok()) return key.status();
    o.pem_cert_chain = *cert;
    o.pem_private_key = *key;
  }
  return grpc::SslCredentials(o);
}

bool IsInvalidAuthToken(const grpc::Status& status) {
  return status.error_code() == grpc::UNAUTHENTICATED &&
         status.error_message() == "etcdserver: invalid auth token";
}

absl::StatusOr<std::shared_ptr<AuthTokenSource>> AuthTokenSource::Create(
    const std::string& user, const std::string& target,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  const size_t colon = user.find(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError("--user must be name:password");
  }
  auto source = std::shared_ptr<AuthTokenSource>(new AuthTokenSource());
  source->name_ = user.substr(0, colon);
  source->password_ = user.substr(colon + 1);
  source->auth_ = etcdserverpb::Auth::NewStub(grpc::CreateChannel(target, credentials));
  std::lock_guard<std::mutex> l(source->mu_);
  if (absl::Status s = source->AuthenticateLocked(); !s.ok()) return s;
  return source;
}

absl::Status AuthTokenSource::AuthenticateLocked() {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  etcdserverpb::AuthenticateRequest req;
  req.set_name(name_);
  req.set_password(password_);
  etcdserverpb::AuthenticateResponse resp;
  const grpc::Status s = auth_->Authenticate(&ctx, req, &resp);
  if (!s.ok()) {
    return absl::UnauthenticatedError(absl::StrCat("authenticate as ", name_, ": ", s.error_message()));
  }
  token_ = resp.token();
  stale_ = false;
  return absl::OkStatus();
}

std::string AuthTokenSource::Token() {
  std::lock_guard<std::mutex> l(mu_);
  // A failure leaves stale_ set: the call goes without a valid token, fails
  // and is counted, and the next call tries again.
  if (stale_) AuthenticateLocked().IgnoreError();
  return token_;
}

void AuthTokenSource::Invalidate(const std::string& token) {
  std::lock_guard<std::mutex> l(mu_);
  if (token == token_) stale_ = true;
}

std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>
AuthTokenSource::InterceptorFactory() {
  return std::make_unique<TokenInterceptorFactory>(this);
}

}  // namespace capstan::bench
