#include "cmd/cache_proxy.h"

#include <csignal>
#include <cstdio>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "grpcpp/grpcpp.h"
#include "server/api/cache_service.h"
#include "server/config/config.h"
#include "server/stop_signals.h"
#include "spdlog/spdlog.h"

namespace capstan::server {
namespace {

constexpr char kUsage[] =
    "Usage:\n"
    "  capstan cache-proxy --upstream URL [--listen-client-urls URLS] [--watch-cache-prefixes PREFIXES]\n"
    "Serves capstan.v1.Cache (List, Watch) from a watch cache fed by the etcd-compatible endpoint\n"
    "URL over its Watch API.\n"
    "  --upstream URL                 the endpoint, e.g. http://127.0.0.1:2379\n"
    "  --listen-client-urls URLS      where to serve (default http://127.0.0.1:23790)\n"
    "  --watch-cache-prefixes P,...   the cached prefixes (default: the server's)\n";

// How long Start waits for the upstream's identity (cluster and member ids).
constexpr absl::Duration kIdentityTimeout = absl::Seconds(3);

std::string UpstreamTarget(const std::string& upstream) {
  absl::string_view t = upstream;
  absl::ConsumePrefix(&t, "http://");
  return std::string(t);
}

}  // namespace

absl::StatusOr<std::unique_ptr<CacheProxy>> CacheProxy::Start(CacheProxyOptions options) {
  std::unique_ptr<CacheProxy> proxy(new CacheProxy());
  if (auto s = proxy->Init(std::move(options)); !s.ok()) {
    proxy->Shutdown();
    return s;
  }
  return proxy;
}

CacheProxy::~CacheProxy() { Shutdown(); }

absl::Status CacheProxy::Init(CacheProxyOptions options) {
  if (options.upstream.empty()) return absl::InvalidArgumentError("--upstream is required");
  if (absl::StartsWith(options.upstream, "https://")) {
    return absl::UnimplementedError("--upstream: only http endpoints are supported yet");
  }
  std::vector<std::string> prefixes = options.watch_cache_prefixes;
  if (prefixes.empty()) prefixes = ServerConfig{}.watch_cache_prefixes;
  options.cache.resources.clear();
  for (const auto& p : prefixes) options.cache.resources.push_back(watchcache::ResourceForPrefix(p));
  auto cache = watchcache::Cache::Create(options.cache);
  if (!cache.ok()) return cache.status();
  cache_ = std::move(*cache);

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(UpstreamTarget(options.upstream),
                                           grpc::InsecureChannelCredentials(), args);
  // The upstream's identity for response headers, if it answers soon.
  {
    auto kv = etcdserverpb::KV::NewStub(channel);
    etcdserverpb::RangeRequest req;
    req.set_key("/");
    req.set_count_only(true);
    etcdserverpb::RangeResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + kIdentityTimeout));
    ctx.set_wait_for_ready(true);
    if (grpc::Status s = kv->Range(&ctx, req, &resp); s.ok()) {
      member_.cluster_id = resp.header().cluster_id();
      member_.member_id = resp.header().member_id();
      member_.raft_term = resp.header().raft_term();
    } else {
      SPDLOG_WARN("upstream {} did not answer ({}); serving with zero cluster and member ids",
                   options.upstream, s.error_message());
    }
  }
  for (const auto& r : cache_->resources()) {
    feeds_.push_back(std::make_unique<watchcache::RemoteFeed>(r.get(), channel, options.feed));
    feeds_.back()->Start();
  }

  service_ = std::make_unique<CacheService>(cache_.get(), &member_, 4, nullptr);
  grpc::ServerBuilder builder;
  std::vector<Url> urls;
  for (const auto& u : options.listen_client_urls) {
    auto parsed = ParseUrlList(u);
    if (!parsed.ok()) return parsed.status();
    for (auto& url : *parsed) {
      if (url.scheme != "http") {
        return absl::UnimplementedError(absl::StrCat("listen URL ", url.String(), ": only http is supported yet"));
      }
      urls.push_back(std::move(url));
    }
  }
  ports_.assign(urls.size(), 0);
  for (size_t i = 0; i < urls.size(); ++i) {
    builder.AddListeningPort(urls[i].host, grpc::InsecureServerCredentials(), &ports_[i]);
  }
  builder.RegisterService(service_.get());
  builder.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  grpc_server_ = builder.BuildAndStart();
  if (!grpc_server_) return absl::UnavailableError("cannot start the gRPC server");
  for (size_t i = 0; i < urls.size(); ++i) {
    if (ports_[i] == 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on client URL ", urls[i].String(), " (bind: address already in use?)"));
    }
    SPDLOG_INFO("cache proxy for {} serving capstan.v1.Cache on {}:{}", options.upstream,
                 urls[i].Hostname(), ports_[i]);
  }
  return absl::OkStatus();
}

void CacheProxy::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  if (grpc_server_) {
    grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc_server_->Wait();
  }
  // Responses in flight referenced cached objects: the cache goes after the
  // server; the feeds stop before the cache they feed.
  grpc_server_.reset();
  service_.reset();
  for (auto& f : feeds_) f->Stop();
  if (cache_) cache_->Stop();
  feeds_.clear();
  cache_.reset();
}

int CacheProxyCommand(const std::vector<std::string>& args) {
  CacheProxyOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string flag = args[i], value;
    if (auto eq = flag.find('='); eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag.resize(eq);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    }
    if (flag == "--help" || flag == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (flag == "--upstream") {
      options.upstream = value;
    } else if (flag == "--listen-client-urls") {
      options.listen_client_urls = {value};
    } else if (flag == "--watch-cache-prefixes") {
      options.watch_cache_prefixes = absl::StrSplit(value, ',', absl::SkipWhitespace());
    } else {
      std::fprintf(stderr, "unknown flag %s\n%s", flag.c_str(), kUsage);
      return 2;
    }
  }
  if (options.upstream.empty()) {
    std::fprintf(stderr, "--upstream is required\n%s", kUsage);
    return 2;
  }
  StopSignals stop;
  auto proxy = CacheProxy::Start(std::move(options));
  if (!proxy.ok()) {
    SPDLOG_CRITICAL("failed to start: {}", std::string(proxy.status().message()));
    return 1;
  }
  stop.Wait();
  (*proxy)->Shutdown();
  return 0;
}

}  // namespace capstan::server
