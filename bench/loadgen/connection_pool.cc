#include "bench/loadgen/connection_pool.h"

#include <chrono>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace capstan::bench {

std::string ConnectionPool::TargetOf(const std::string& endpoint) {
  for (const char* scheme : {"http://", "https://"}) {
    if (absl::StartsWith(endpoint, scheme)) return endpoint.substr(std::string(scheme).size());
  }
  return endpoint;
}

absl::StatusOr<std::unique_ptr<ConnectionPool>> ConnectionPool::Dial(
    const std::vector<std::string>& endpoints, int conns, absl::Duration dial_timeout,
    const ClientSecurity& security) {
  if (endpoints.empty()) return absl::InvalidArgumentError("no --endpoints");
  if (conns < 1) return absl::InvalidArgumentError("--conns must be at least 1");
  auto pool = std::unique_ptr<ConnectionPool>(new ConnectionPool());
  const auto deadline = std::chrono::system_clock::now() +
                        absl::ToChronoMilliseconds(dial_timeout);
  for (int i = 0; i < conns; ++i) {
    grpc::ChannelArguments args;
    // Channels with equal arguments share one subchannel (one TCP connection);
    // a distinct argument per channel gives each its own, like separate Go
    // clients in etcd's benchmark.
    args.SetInt("capstan.bench.channel_index", i);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    const std::string& endpoint = endpoints[i % endpoints.size()];
    const std::string target = TargetOf(endpoint);
    auto credentials = MakeChannelCredentials(security, endpoint);
    if (!credentials.ok()) return credentials.status();
    if (!security.user.empty() && pool->token_ == nullptr) {
      auto token = AuthTokenSource::Create(security.user, target, *credentials);
      if (!token.ok()) return token.status();
      pool->token_ = *std::move(token);
    }
    Conn c;
    if (pool->token_ != nullptr) {
      std::vector<std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>> creators;
      creators.push_back(pool->token_->InterceptorFactory());
      c.channel = grpc::experimental::CreateCustomChannelWithInterceptors(target, *credentials, args,
                                                                          std::move(creators));
    } else {
      c.channel = grpc::CreateCustomChannel(target, *credentials, args);
    }
    if (!c.channel->WaitForConnected(deadline)) {
      return absl::UnavailableError(
          absl::StrCat("cannot connect to ", target, " within ", absl::FormatDuration(dial_timeout)));
    }
    c.kv = etcdserverpb::KV::NewStub(c.channel);
    c.watch = etcdserverpb::Watch::NewStub(c.channel);
    c.lease = etcdserverpb::Lease::NewStub(c.channel);
    c.maintenance = etcdserverpb::Maintenance::NewStub(c.channel);
    c.cache = capstan::v1::Cache::NewStub(c.channel);
    c.lock = v3lockpb::Lock::NewStub(c.channel);
    pool->conns_.push_back(std::move(c));
  }
  return pool;
}

absl::StatusOr<std::vector<std::string>> ConnectionPool::LeaderEndpoints(
    const std::vector<std::string>& endpoints, absl::Duration dial_timeout,
    const ClientSecurity& security) {
  uint64_t leader = 0;
  std::unique_ptr<ConnectionPool> answered;
  std::string last_error = "no --endpoints";
  for (const std::string& endpoint : endpoints) {
    auto pool = Dial({endpoint}, 1, dial_timeout, security);
    if (!pool.ok()) {
      last_error = std::string(pool.status().message());
      continue;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(dial_timeout));
    etcdserverpb::StatusResponse status;
    grpc::Status s = (*pool)->Maintenance(0).Status(&ctx, etcdserverpb::StatusRequest(), &status);
    if (!s.ok()) {
      last_error = absl::StrCat("Status of ", endpoint, ": ", s.error_message());
      continue;
    }
    leader = status.leader();
    answered = *std::move(pool);
    break;
  }
  if (answered == nullptr) {
    return absl::UnavailableError(absl::StrCat("failed to find a leader endpoint: ", last_error));
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(dial_timeout));
  etcdserverpb::MemberListResponse members;
  grpc::Status s = etcdserverpb::Cluster::NewStub(answered->Channel(0))
                       ->MemberList(&ctx, etcdserverpb::MemberListRequest(), &members);
  if (!s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("failed to get a member list: ", s.error_message()));
  }
  for (const auto& m : members.members()) {
    if (leader != 0 && m.id() == leader && m.clienturls_size() > 0) {
      return std::vector<std::string>(m.clienturls().begin(), m.clienturls().end());
    }
  }
  return absl::UnavailableError("failed to find a leader endpoint");
}

}  // namespace capstan::bench
