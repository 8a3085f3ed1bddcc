// The gRPC channels a run uses: --conns channels, each its own TCP connection,
// spread round-robin over --endpoints; client i uses channel i % conns, as in
// etcd's benchmark (mustCreateClients). With a ClientSecurity, channels use
// TLS and/or send an auth token (client_security.h).
//
// Thread-safe after Dial(): stubs may be used from any thread.

#ifndef CAPSTAN_BENCH_LOADGEN_CONNECTION_POOL_H_
#define CAPSTAN_BENCH_LOADGEN_CONNECTION_POOL_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bench/loadgen/client_security.h"
#include "capstan/v1/cache.grpc.pb.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "v3lockpb/v3lock.grpc.pb.h"

namespace capstan::bench {

class ConnectionPool {
 public:
  // Opens conns channels and waits until every one is connected, or fails
  // after dial_timeout. With security.user set, authenticates first.
  static absl::StatusOr<std::unique_ptr<ConnectionPool>> Dial(
      const std::vector<std::string>& endpoints, int conns, absl::Duration dial_timeout,
      const ClientSecurity& security = {});

  size_t size() const { return conns_.size(); }
  etcdserverpb::KV::Stub& Kv(size_t client) { return *At(client).kv; }
  etcdserverpb::Watch::Stub& Watch(size_t client) { return *At(client).watch; }
  const std::shared_ptr<grpc::Channel>& Channel(size_t client) { return At(client).channel; }
  etcdserverpb::Lease::Stub& Lease(size_t client) { return *At(client).lease; }
  etcdserverpb::Maintenance::Stub& Maintenance(size_t client) { return *At(client).maintenance; }
  // Capstan's watch cache; etcd answers its calls UNIMPLEMENTED.
  capstan::v1::Cache::Stub& Cache(size_t client) { return *At(client).cache; }
  v3lockpb::Lock::Stub& Lock(size_t client) { return *At(client).lock; }

  // "http://127.0.0.1:2379" -> "127.0.0.1:2379".
  static std::string TargetOf(const std::string& endpoint);
  // --target-leader, as etcd's benchmark finds the leader: the leader that
  // the first endpoint to answer Status names, and that member's client
  // URLs from MemberList. Fails with etcd's tool's messages when no endpoint
  // answers, the member list cannot be read, or no member is the leader.
  static absl::StatusOr<std::vector<std::string>> LeaderEndpoints(
      const std::vector<std::string>& endpoints, absl::Duration dial_timeout,
      const ClientSecurity& security = {});

 private:
  struct Conn {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<etcdserverpb::KV::Stub> kv;
    std::unique_ptr<etcdserverpb::Watch::Stub> watch;
    std::unique_ptr<etcdserverpb::Lease::Stub> lease;
    std::unique_ptr<etcdserverpb::Maintenance::Stub> maintenance;
    std::unique_ptr<capstan::v1::Cache::Stub> cache;
    std::unique_ptr<v3lockpb::Lock::Stub> lock;
  };
  Conn& At(size_t client) { return conns_[client % conns_.size()]; }

  std::shared_ptr<AuthTokenSource> token_;  // null without --user; outlives the channels
  std::vector<Conn> conns_;
};

}  // namespace capstan::bench

#endif  // CAPSTAN_BENCH_LOADGEN_CONNECTION_POOL_H_
