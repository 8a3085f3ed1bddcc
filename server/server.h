// Server: one Capstan member. Opens the data directory and the KV store,
// serves etcd's gRPC API on the client URLs (and on http:// ones HTTP/1.1
// beside it: the JSON gateway and the HTTP endpoints), the HTTP endpoints on
// the metrics URLs, and shuts down gracefully.
//
// Thread safety: Start, Open, Serve and Shutdown (and the destructor) must
// not run concurrently with one another; they share no lock.

#ifndef CAPSTAN_SERVER_SERVER_H_
#define CAPSTAN_SERVER_SERVER_H_

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "server/config/config.h"
#include "server/config/version.h"
#include "util/mutex.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace grpc {
class Server;
class Service;
namespace experimental {
class ExternalConnectionAcceptor;
}
}  // namespace grpc

namespace capstan::mvcc {
class KvStore;
class WatchHub;
}  // namespace capstan::mvcc

namespace capstan::watchcache {
class Cache;
}

namespace capstan::auth {
class AuthStore;
}  // namespace capstan::auth

namespace capstan::membership {
struct MemberInfo;
}  // namespace capstan::membership

namespace capstan::replication {
class CorruptionCheck;
class RaftEngineFactory;
class Replicator;
class Transport;
}  // namespace capstan::replication

namespace capstan::storage {
class Backend;
class FileSystem;
}  // namespace capstan::storage

namespace capstan::server {

class AutoCompactor;
class BulkReads;
class ClientHttp;
class ClientListener;
class JsonGateway;
class CompletionQueues;
class KvService;
class LeaderMonitor;
class LeaseService;
class CacheRange;
class GrpcMetrics;
class Metrics;
class HttpEndpoints;
class Recipes;

class Server {
 public:
  // Starts serving. Fails (with nothing left running) if the data directory
  // is unusable or an address cannot be bound.
  //
  // raft makes the Raft engines of a cluster member (--initial-cluster with
  // more than one member): the `capstan` binary passes etcd's Raft (Go),
  // which libcapstan never links. Without it such a config is refused; a
  // single member never needs it. It must outlive the server.
  //
  // file_system: where the store and the Raft log do their I/O; null for the
  // operating system's (a fault-injecting one in tests).
  static absl::StatusOr<std::unique_ptr<Server>> Start(
      const ServerConfig& config, replication::RaftEngineFactory* raft = nullptr,
      std::shared_ptr<storage::FileSystem> file_system = nullptr);

  // Embedding (libcapstan): Open does what Start does except listening, so
  // the caller can use the store directly; Serve then starts the gRPC and
  // HTTP listeners of config on the same store (at most once). Start is
  // Open followed by Serve.
  static absl::StatusOr<std::unique_ptr<Server>> Open(
      const ServerConfig& config, replication::RaftEngineFactory* raft = nullptr,
      std::shared_ptr<storage::FileSystem> file_system = nullptr);
  absl::Status Serve();
  // Owned by the Server; valid until Shutdown. cache() is null when no
  // watch cache prefix is configured.
  mvcc::KvStore* store() const { return store_.get(); }
  mvcc::WatchHub* hub() const { return hub_.get(); }
  watchcache::Cache* cache() const { return cache_.get(); }
  const membership::MemberInfo& member() const { return *member_; }
  // The port each client URL was bound to, in order (after Serve; useful
  // with port 0).
  const std::vector<int>& client_ports() const { return client_ports_; }

  // Stops accepting requests, lets in-flight ones finish (up to a deadline),
  // then closes the store. Idempotent; the destructor calls it.
  void Shutdown();
  ~Server();

 private:
  // What Serve's phases hand on to one another (server.cc).
  struct Listening;

  Server(const ServerConfig& config, replication::RaftEngineFactory* raft,
         std::shared_ptr<storage::FileSystem> file_system);

  // Open: OpenStore, StartWatchHubAndCache, BuildServices, then
  // StartAutoCompaction. On failure the caller calls Shutdown.
  absl::Status Init();
  // Prepares the data directory, opens its backend, loads (or creates) this
  // member's record in it and opens the KV store on it.
  // REQUIRES: nothing opened yet.
  absl::Status OpenStore();
  // Starts the watch hub on the store and, with --watch-cache-prefixes, the
  // watch cache it feeds. REQUIRES: OpenStore succeeded.
  absl::Status StartWatchHubAndCache();
  // Builds the gRPC services (auth first: every other service checks its
  // gate) on the store, the hub and the cache; nothing serves them yet.
  // REQUIRES: StartWatchHubAndCache succeeded.
  absl::Status BuildServices();
  // Starts auto-compaction if --auto-compaction-retention asks for it.
  // REQUIRES: OpenStore succeeded.
  void StartAutoCompaction();
  // A member of a Raft group (of one or more): opens the Raft log, starts
  // the peer transport on --listen-peer-urls and the replicator, which
  // becomes the store's write log. REQUIRES: BuildServices succeeded (the
  // log's auth entries apply to the auth store); replicated_.
  absl::Status StartReplication();
  // --initial-cluster-state existing with a new data dir: takes this
  // member's and the cluster's IDs from a running member (the members it
  // lists, matched by peer URL to --initial-cluster) into backend.
  absl::Status JoinExistingCluster(storage::Backend* backend);
  // This member learned that it was removed from the cluster: logs etcd's
  // messages and stops the process as SIGTERM does (exit status 0, as
  // etcd), after `delay` (etcd's stopWithDelay: a leader that applied its
  // own removal goes on sending the commit index for a second, so that the
  // others apply the removal and answer its client before they elect a new
  // leader). Once; any thread; does not block.
  void OnRemoved(absl::Duration delay = absl::ZeroDuration());

  // Serve's phases, in this order. On failure the caller calls Shutdown,
  // which stops whatever the earlier phases started.
  //
  // Binds the client URLs: those whose port gRPC and HTTP share (http and
  // https, unless --listen-client-http-urls is set) to client_listeners_,
  // the others as gRPC listening ports in l.builder. Makes gRPC's TLS and
  // HTTPS's context for https URLs. REQUIRES: Init succeeded;
  // l.client_tls resolved; nothing bound yet.
  absl::Status BindClientUrls(Listening& l);
  // Registers the services with l.builder, creates the metrics and gRPC's
  // interceptor for them, and sets gRPC's limits and keepalives from the
  // flags. REQUIRES: BindClientUrls succeeded.
  void ConfigureGrpc(Listening& l);
  // Binds --listen-client-http-urls (HTTP only; https ones with the client
  // TLS settings) after the shared ports in client_listeners_. REQUIRES:
  // ConfigureGrpc done.
  absl::Status BindClientHttpUrls(Listening& l);
  // Makes https_context_, HTTP's TLS context on https client URLs, from
  // l.client_tls, once. REQUIRES: l.client_tls is set.
  absl::Status MakeHttpsContext(const Listening& l);
  // Starts the gRPC server and checks that it bound every client URL,
  // saying why not as Go would; sets client_ports_.
  // REQUIRES: BindClientHttpUrls succeeded.
  absl::Status StartGrpc(Listening& l);
  // Creates the HTTP endpoints, the JSON gateway and the HTTP client side,
  // and starts every client listener handing connections to gRPC or HTTP.
  // REQUIRES: StartGrpc succeeded.
  void StartClientHttp(const Listening& l);
  // Serves the HTTP endpoints on --listen-metrics-urls.
  // REQUIRES: StartClientHttp done (http_ exists).
  absl::Status ListenOnMetricsUrls(const Listening& l);
  // The lines etcd logs once it serves. REQUIRES: every phase succeeded.
  void LogReady() const;
  // A cluster member's LogReady: etcd logs those lines once its publish
  // (its name and client URLs, through the log) is applied, so a leader is
  // known by then and the member lists its client URLs; tools that start a
  // cluster and wait for these lines (etcd's e2e harness) then ask the
  // members for the leader and the member list. Runs on ready_logger_ until
  // then or until Shutdown.
  void LogReadyWhenPublished();

  const ServerConfig config_;
  replication::RaftEngineFactory* const raft_factory_;
  // Whether this member's writes go through Raft (OpenStore decides).
  bool replicated_ = false;
  // Where the store and the Raft log do their I/O (null: the system's).
  const std::shared_ptr<storage::FileSystem> file_system_;
  std::unique_ptr<membership::MemberInfo> member_;
  auth::AuthStore* auth_store_ = nullptr;  // owned by the auth service
  std::unique_ptr<mvcc::KvStore> store_;
  std::unique_ptr<mvcc::WatchHub> hub_;
  // The Kubernetes watch cache, fed by the store and the hub.
  std::unique_ptr<watchcache::Cache> cache_;
  const CacheRange* cache_range_ = nullptr;  // owned by the KV service
  // Where big Ranges run; outlives the gRPC server, not the store.
  std::unique_ptr<BulkReads> bulk_reads_;
  // The Lock and Election services' calls (a Lock may wait for as long as
  // another holds the lock).
  std::unique_ptr<Recipes> recipes_;
  // Ends the watch and keep-alive streams that ask for a leader when the
  // member has none; outlives the streams.
  std::unique_ptr<LeaderMonitor> leader_monitor_;
  std::vector<std::unique_ptr<grpc::Service>> services_;
  KvService* kv_service_ = nullptr;        // in services_
  LeaseService* lease_service_ = nullptr;  // in services_
  // The methods on gRPC's completion-queue model; built with the server,
  // destroyed after it.
  std::unique_ptr<CompletionQueues> completion_queues_;
  // Keep-alive streams accepted ahead on each queue.
  static constexpr int kKeepAlivesArmed = 32;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<GrpcMetrics> grpc_metrics_;
  std::unique_ptr<HttpEndpoints> http_;
  // HTTP/1.1 on the client URLs: the JSON gateway and the endpoints above.
  std::unique_ptr<JsonGateway> json_gateway_;
  std::unique_ptr<ClientHttp> client_http_;
  // https client URLs: gRPC's side of their connections, and HTTP's TLS.
  struct SslContextFree {
    void operator()(ssl_ctx_st* ctx) const;
  };
  std::unique_ptr<grpc::experimental::ExternalConnectionAcceptor> grpc_tls_acceptor_;
  std::unique_ptr<ssl_ctx_st, SslContextFree> https_context_;
  // The http and https client URLs, whose connections are sorted between
  // gRPC and HTTP, then those of --listen-client-http-urls (HTTP only).
  std::vector<std::unique_ptr<ClientListener>> client_listeners_;
  std::unique_ptr<AutoCompactor> auto_compactor_;
  // A cluster member's peer transport and write log. The replicator is
  // stopped first at shutdown and destroyed after the store.
  std::unique_ptr<replication::Transport> peer_transport_;
  // This member was removed from its cluster (OnRemoved ran).
  std::atomic<bool> removed_{false};
  // Sends the SIGTERM of a delayed OnRemoved; Shutdown ends its wait and
  // joins it.
  util::Mutex removed_mu_;
  std::thread removed_stopper_ ABSL_GUARDED_BY(removed_mu_);
  absl::Notification shutting_down_;
  std::unique_ptr<replication::Replicator> replicator_;
  // etcd's corruption checks between members (--experimental-initial-
  // corrupt-check, --corrupt-check-time); stopped after the transport.
  std::unique_ptr<replication::CorruptionCheck> corruption_check_;
  std::vector<int> client_ports_;
  bool shut_down_ = false;
  // LogReadyWhenPublished's thread, and what tells it to stop.
  struct ReadyWait;
  std::thread ready_logger_;
  std::unique_ptr<ReadyWait> ready_wait_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_SERVER_H_
