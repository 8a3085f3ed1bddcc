// capstan cache-proxy: the watch cache in front of a remote etcd-compatible
// endpoint, serving capstan.v1.Cache.
//
//   capstan cache-proxy --upstream http://10.0.0.5:2379
//       [--listen-client-urls http://127.0.0.1:23790]
//       [--watch-cache-prefixes /registry/pods/,/registry/minions/,/registry/leases/]
//
// (one command, shown on three lines).
//
// Each cached prefix is fed by a RemoteFeed (watchcache/remote_feed.h):
// listed from the upstream in pages at one revision, then followed through
// the upstream's Watch API, listed again after the upstream compacted past
// it, reconnected with backoff. Response headers carry the upstream's
// cluster and member ids.
//
// Thread safety: Start and Shutdown from one thread.

#ifndef CAPSTAN_CMD_CACHE_PROXY_H_
#define CAPSTAN_CMD_CACHE_PROXY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/server.h"
#include "membership/member.h"
#include "watchcache/cache.h"
#include "watchcache/remote_feed.h"

namespace capstan::server {

class CacheService;

struct CacheProxyOptions {
  // The upstream endpoint: "http://host:port" or "host:port".
  std::string upstream;
  // Where capstan.v1.Cache is served (http URLs; port 0 picks a free port).
  std::vector<std::string> listen_client_urls = {"http://127.0.0.1:23790"};
  // Empty: the server's default (--watch-cache-prefixes).
  std::vector<std::string> watch_cache_prefixes;
  watchcache::CacheOptions cache;  // its resources are set from the prefixes
  watchcache::RemoteFeedOptions feed;
};

class CacheProxy {
 public:
  // Starts the feeds and the gRPC server; returns once the server listens
  // (the caches become ready as their lists finish: cache()->WaitReady).
  static absl::StatusOr<std::unique_ptr<CacheProxy>> Start(CacheProxyOptions options);
  ~CacheProxy();
  CacheProxy(const CacheProxy&) = delete;
  CacheProxy& operator=(const CacheProxy&) = delete;

  // Stops serving, then the feeds and the cache. Idempotent.
  void Shutdown();

  watchcache::Cache* cache() const { return cache_.get(); }
  // One feed per cached resource, in the order of cache()->resources().
  const std::vector<std::unique_ptr<watchcache::RemoteFeed>>& feeds() const { return feeds_; }
  // The ports bound, one per listen URL.
  const std::vector<int>& ports() const { return ports_; }

 private:
  CacheProxy() = default;
  absl::Status Init(CacheProxyOptions options);

  membership::MemberInfo member_;
  std::unique_ptr<watchcache::Cache> cache_;
  std::vector<std::unique_ptr<watchcache::RemoteFeed>> feeds_;
  std::unique_ptr<CacheService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::vector<int> ports_;
  bool shut_down_ = false;
};

// `capstan cache-proxy ARGS...` (args after the subcommand); runs until
// SIGINT or SIGTERM. Returns the exit code.
int CacheProxyCommand(const std::vector<std::string>& args);

}  // namespace capstan::server

#endif  // CAPSTAN_CMD_CACHE_PROXY_H_
