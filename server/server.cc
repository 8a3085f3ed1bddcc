#include "server/server.h"

#include <netdb.h>
#include <sys/socket.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "auth/auth_store.h"
#include "grpcpp/grpcpp.h"
#include "membership/member.h"
#include "membership/member_table.h"
#include "mvcc/kv_store.h"
#include "mvcc/watch_hub.h"
#include "replication/corruption_check.h"
#include "replication/replicator.h"
#include "server/api/auth_service.h"
#include "server/api/bulk_reads.h"
#include "server/api/cache_service.h"
#include "server/api/completion_queues.h"
#include "server/api/election_service.h"
#include "server/api/health_service.h"
#include "server/api/kv_service.h"
#include "server/api/leader_monitor.h"
#include "server/api/lease_service.h"
#include "server/api/lock_service.h"
#include "server/api/maintenance_service.h"
#include "server/api/snapshot_stream.h"
#include "server/api/watch_service.h"
#include "server/auto_compactor.h"
#include "server/config/validation.h"
#include "server/http/client_http.h"
#include "server/http/client_listener.h"
#include "server/http/http_endpoints.h"
#include "server/http/json_gateway.h"
#include "server/observability/grpc_metrics.h"
#include "server/observability/metrics.h"
#include "server/peer/peer_transport.h"
#include "server/security/metrics_tls.h"
#include "server/security/tls.h"
#include "spdlog/spdlog.h"
#include "storage/backend.h"
#include "storage/data_dir.h"
#include "util/mutex.h"
#include "watchcache/cache.h"

namespace capstan::server {


namespace {

// gRPC's own framing beyond --max-request-bytes that etcd allows for.
constexpr int kGrpcOverheadBytes = 512 * 1024;

std::string GrpcAddress(const Url& url) {
  if (url.scheme == "unix" || url.scheme == "unixs") return absl::StrCat("unix:", url.host, url.path);
  return url.host;
}

bool IsTls(const Url& url) { return url.scheme == "https" || url.scheme == "unixs"; }

absl::StatusOr<std::unique_ptr<ClientListener>> BindClientListener(const Url& url,
                                                                   bool reuse_port) {
  int port = 0;
  if (!absl::SimpleAtoi(url.Port(), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("client URL ", url.String(), " has no port"));
  }
  return ClientListener::Bind(url.Hostname(), port, reuse_port);
}

// Why a TCP client or peer URL cannot be listened on, worded like the Go net.Listen
// error etcd prints ("listen tcp 127.0.0.1:2379: bind: address already in
// use"); OK if a plain bind succeeds. gRPC only says that it failed.
absl::Status ProbeListen(const Url& url) {
  if (url.scheme == "unix" || url.scheme == "unixs") return absl::OkStatus();
  return BindClientListener(url, /*reuse_port=*/false).status();  // and closes it
}

std::vector<std::string> UrlStrings(const std::vector<Url>& urls) {
  std::vector<std::string> out;
  for (const auto& u : urls) out.push_back(u.String());
  return out;
}

// Whether CAPSTAN_FAILPOINTS (tests only) names failpoint `name`.
bool FailpointActive(std::string_view name) {
  const char* fp = std::getenv("CAPSTAN_FAILPOINTS");
  return fp != nullptr && std::string_view(fp).find(name) != std::string_view::npos;
}

// The KV store's options from the flags that bear on it.
mvcc::KvStoreOptions StoreOptions(const ServerConfig& config, uint64_t member_id) {
  mvcc::KvStoreOptions kv_options;
  if (config.backend_batch_limit > 0) kv_options.batch_limit = static_cast<int>(config.backend_batch_limit);
  kv_options.batch_interval = config.backend_batch_interval;
  kv_options.max_txn_ops = static_cast<int>(config.max_txn_ops);
  kv_options.max_request_bytes = static_cast<int64_t>(config.max_request_bytes);
  kv_options.compaction_batch_limit = static_cast<int>(config.compaction_batch_limit);
  kv_options.compaction_sleep_interval = config.compaction_sleep_interval;
  kv_options.warning_apply_duration = config.warning_apply_duration;
  kv_options.lease_revoke_rate = config.lease_revoke_rate;
  kv_options.min_lease_ttl_seconds = config.MinLeaseTtlSeconds();
  kv_options.lease_id_prefix = static_cast<uint16_t>(member_id & 0xffff);
  kv_options.quota_bytes = config.QuotaBackendBytes();
  kv_options.member_id = member_id;
  if (FailpointActive("corrupt-values")) {
    SPDLOG_CRITICAL("failpoint corrupt-values is active: this member stores every put's value "
                    "altered, so that its data differs from its peers' (tests only)");
    kv_options.failpoint_value_suffix = "\x01corrupt";
  }
  return kv_options;
}

// The client TLS settings if an https client or metrics URL needs them and
// a certificate is configured (or --auto-tls); else empty.
absl::StatusOr<std::optional<ClientTls>> ClientTlsIfNeeded(const ServerConfig& config) {
  const bool wants_tls =
      std::any_of(config.listen_client_urls.begin(), config.listen_client_urls.end(), IsTls) ||
      std::any_of(config.listen_client_http_urls.begin(), config.listen_client_http_urls.end(),
                  [](const Url& u) { return u.scheme == "https"; }) ||
      std::any_of(config.listen_metrics_urls.begin(), config.listen_metrics_urls.end(),
                  [](const Url& u) { return u.scheme == "https"; });
  if (!wants_tls || !HasClientCertificate(config)) return std::optional<ClientTls>();
  auto resolved = ResolveClientTls(config);
  if (!resolved.ok()) return resolved.status();
  return std::optional<ClientTls>(*std::move(resolved));
}

}  // namespace

Server::Server(const ServerConfig& config, replication::RaftEngineFactory* raft,
               std::shared_ptr<storage::FileSystem> file_system)
    : config_(config), raft_factory_(raft), file_system_(std::move(file_system)) {}

struct Server::ReadyWait {
  util::Mutex mu;
  bool stop ABSL_GUARDED_BY(mu) = false;  // set by Shutdown
};

Server::~Server() { Shutdown(); }

absl::StatusOr<std::unique_ptr<Server>> Server::Start(
    const ServerConfig& config, replication::RaftEngineFactory* raft,
    std::shared_ptr<storage::FileSystem> file_system) {
  auto server = Open(config, raft, std::move(file_system));
  if (!server.ok()) return server.status();
  if (auto s = (*server)->Serve(); !s.ok()) {
    (*server)->Shutdown();
    return s;
  }
  return server;
}

absl::StatusOr<std::unique_ptr<Server>> Server::Open(
    const ServerConfig& config, replication::RaftEngineFactory* raft,
    std::shared_ptr<storage::FileSystem> file_system) {
  std::unique_ptr<Server> server(new Server(config, raft, std::move(file_system)));
  if (auto s = server->Init(); !s.ok()) {
    server->Shutdown();
    return s;
  }
  return server;
}

absl::Status Server::Init() {
  if (auto s = OpenStore(); !s.ok()) return s;
  if (auto s = StartWatchHubAndCache(); !s.ok()) return s;
  if (auto s = BuildServices(); !s.ok()) return s;
  if (replicated_) {
    if (auto s = StartReplication(); !s.ok()) return s;
  }
  StartAutoCompaction();
  return absl::OkStatus();
}

absl::Status Server::OpenStore() {
  if (auto s = storage::PrepareDataDir(config_.data_dir); !s.ok()) return s;

  std::vector<membership::InitialMember> initial;
  if (auto parsed = config_internal::ParseInitialCluster(config_.initial_cluster); parsed.ok()) {
    for (const auto& [name, urls] : *parsed) initial.push_back({name, UrlStrings(urls)});
  }
  // Every member runs Raft when this build has an engine, a single member
  // as a one-voter group, as etcd does (the replicator campaigns at once,
  // reads without a ReadIndex round, and keeps no log of what its store
  // makes durable). A build without one (the embedding library) runs a
  // single member only, its writes made durable by the store itself.
  std::error_code ec;
  replicated_ = raft_factory_ != nullptr || initial.size() > 1 ||
                std::filesystem::exists(storage::RaftLogDir(config_.data_dir), ec);
  if (replicated_ && raft_factory_ == nullptr) {
    return absl::FailedPreconditionError(
        "this build of Capstan has no Raft engine: it cannot run a member of a multi-member "
        "cluster (the capstan binary can)");
  }

  storage::BackendOptions backend_options;
  backend_options.dir = storage::BackendDir(config_.data_dir);
  RemoveSnapshotLeftovers(backend_options.dir);
  // A cluster member's data is durable in its Raft log first: the store
  // writes the applied index with its data, without its WAL, and replays
  // the log after a crash (docs/REPLICATION.md). A sole voter's store syncs
  // the groups it holds instead of the log (replication/replicator.h).
  backend_options.sync = !config_.unsafe_no_fsync;
  backend_options.block_cache_bytes = static_cast<size_t>(config_.backend_cache_bytes);
  backend_options.file_system = file_system_;
  auto backend = storage::Backend::Open(backend_options);
  if (!backend.ok()) return backend.status();

  auto member = membership::LoadOrCreateMember(backend->get(), config_.name,
                                   UrlStrings(InitialPeerUrls(config_)),
                                   UrlStrings(config_.advertise_client_urls),
                                   config_.initial_cluster_token, initial);
  if (!member.ok()) return member.status();
  member_ = std::make_unique<membership::MemberInfo>(std::move(*member));
  if (config_.initial_cluster_state == ClusterState::kExisting && member_->created &&
      initial.size() > 1) {
    if (auto s = JoinExistingCluster(backend->get()); !s.ok()) return s;
  } else if (!member_->created) {
    // A member that joined keeps the table it was given (until its store
    // holds one of its own, which then rules).
    auto joined = membership::LoadJoinedMembers(backend->get());
    if (!joined.ok()) return joined.status();
    if (!joined->empty()) member_->initial_members = *std::move(joined);
  }

  const auto start = std::chrono::steady_clock::now();
  mvcc::KvStoreOptions kv_options = StoreOptions(config_, member_->member_id);
  kv_options.requires_write_log = replicated_;
  // Writes with no log between (a sole voter's direct writes; an embedded
  // store's, which runs no Raft) are committed by the thread that submits
  // them when no group is being committed (KvStore's inline commits): the
  // gRPC thread that took them, or the embedding program's.
  kv_options.inline_commit = true;
  auto store = mvcc::KvStore::Open(kv_options, std::move(*backend));
  if (!store.ok()) return store.status();
  store_ = std::move(*store);
  SPDLOG_INFO("opened store: revision {}, compacted revision {}, {} keys, recovered in {} ms",
               store_->Rev(), store_->CompactRev(), store_->GetStats().keys,
               std::chrono::duration_cast<std::chrono::milliseconds>(
                   std::chrono::steady_clock::now() - start)
                   .count());
  return absl::OkStatus();
}

absl::Status Server::JoinExistingCluster(storage::Backend* backend) {
  // etcd's GetClusterFromRemotePeers and ValidateClusterAndAssignIDs: the
  // members as a running member lists them, each matched by its peer URLs
  // to one of --initial-cluster; this member takes the ID the cluster gave
  // it, and the cluster's ID.
  auto parsed = config_internal::ParseInitialCluster(config_.initial_cluster);
  if (!parsed.ok()) return parsed.status();
  std::vector<std::string> remote_urls;
  std::vector<std::vector<std::string>> local;
  for (const auto& [name, urls] : *parsed) {
    std::vector<std::string> strings = UrlStrings(urls);
    std::sort(strings.begin(), strings.end());
    local.push_back(strings);
    if (name != config_.name) remote_urls.insert(remote_urls.end(), strings.begin(), strings.end());
  }
  std::sort(remote_urls.begin(), remote_urls.end());
  auto tls = PeerTransportOptionsFromConfig(config_, 0, 0);
  if (!tls.ok()) return tls.status();
  auto fetched = FetchClusterMembers(tls->tls, remote_urls, absl::Seconds(10));
  if (!fetched.ok()) {
    return absl::Status(fetched.status().code(), absl::StrCat("cannot fetch cluster info from peer urls: ",
                                                               fetched.status().message()));
  }
  if (static_cast<size_t>(fetched->members_size()) != local.size()) {
    return absl::FailedPreconditionError(
        "error validating peerURLs: member count is unequal");
  }
  std::vector<std::string> own = UrlStrings(InitialPeerUrls(config_));
  std::sort(own.begin(), own.end());
  std::vector<membership::ClusterMember> members;
  uint64_t own_id = 0;
  for (const auto& m : fetched->members()) {
    std::vector<std::string> urls(m.peerurls().begin(), m.peerurls().end());
    std::sort(urls.begin(), urls.end());
    if (std::find(local.begin(), local.end(), urls) == local.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "error validating peerURLs: PeerURLs: no match found for existing member (",
          absl::Hex(m.id()), ", ", absl::StrJoin(urls, ","), ")"));
    }
    if (urls == own) own_id = m.id();
    members.push_back(membership::FromProto(m));
  }
  const uint64_t cluster_id = fetched->header().cluster_id();
  if (auto s = membership::StampIdentity(backend, cluster_id, own_id); !s.ok()) return s;
  if (auto s = membership::StoreJoinedMembers(backend, members); !s.ok()) return s;
  member_->member_id = own_id;
  member_->cluster_id = cluster_id;
  member_->initial_members = std::move(members);
  SPDLOG_INFO("joining cluster {:x} as member {:x}; its members as {:x} listed them", cluster_id,
              own_id, fetched->header().member_id());
  return absl::OkStatus();
}

void Server::OnRemoved(absl::Duration delay) {
  if (removed_.exchange(true)) return;
  // etcd's server error; the process then stops as on SIGTERM.
  auto stop = [] {
    SPDLOG_WARN("server error: {}",
                std::string(membership::MakeError(membership::Error::kMemberRemoved).message()));
    SPDLOG_WARN("data-dir used by this member must be removed");
    kill(getpid(), SIGTERM);
  };
  if (delay <= absl::ZeroDuration()) {
    stop();
    return;
  }
  util::MutexLock l(&removed_mu_);
  if (shutting_down_.HasBeenNotified()) return;  // stopping already
  removed_stopper_ = std::thread([this, delay, stop] {
    if (!shutting_down_.WaitForNotificationWithTimeout(delay)) stop();
  });
}

absl::Status Server::StartWatchHubAndCache() {
  mvcc::WatchHubOptions hub_options;
  // etcd's watch server fragments at the request limit plus gRPC's
  // allowance (v3rpc: maxRequestBytes + grpcOverheadBytes).
  hub_options.max_response_bytes =
      static_cast<int64_t>(config_.max_request_bytes) + kGrpcOverheadBytes;
  hub_options.progress_interval = config_.watch_progress_notify_interval;
  hub_ = std::make_unique<mvcc::WatchHub>(store_.get(), hub_options);
  store_->SetWatchHub(hub_.get());

  watchcache::CacheOptions cache_options;
  cache_options.resources.clear();
  for (const auto& prefix : config_.watch_cache_prefixes) {
    cache_options.resources.push_back(watchcache::ResourceForPrefix(prefix));
  }
  if (!cache_options.resources.empty()) {
    auto cache = watchcache::Cache::Start(cache_options, store_.get(), hub_.get());
    if (!cache.ok()) return cache.status();
    cache_ = std::move(*cache);
  }
  return absl::OkStatus();
}

absl::Status Server::BuildServices() {
  // Auth: users, roles and tokens on the store; the gate checks every request.
  // The auth service owns both; services are destroyed after the gRPC server
  // and the store are gone.
  auth::AuthStoreOptions auth_options;
  auth_options.bcrypt_cost = static_cast<int>(config_.bcrypt_cost);
  auth_options.token_ttl = absl::Seconds(static_cast<int64_t>(config_.auth_token_ttl_seconds));
  if (config_.auth_token_type == "jwt") {
    auto jwt = auth::JwtTokens::Create(config_.auth_token_options);
    if (!jwt.ok()) return jwt.status();
    auth_options.jwt = std::move(*jwt);
  }
  // Auth changes go through the store's write log: the Raft log when
  // replicated (StartReplication), else the store itself.
  auto auth_store = auth::AuthStore::Open(store_.get(), /*log=*/store_.get(), auth_options);
  if (!auth_store.ok()) return auth_store.status();
  auto auth = std::make_unique<AuthService>(std::move(*auth_store), config_.client_cert_auth,
                                            member_.get());
  const AuthGate* gate = auth->gate();
  auth_store_ = gate->store();
  bulk_reads_ = std::make_unique<BulkReads>(BulkReads::Options{});
  auto kv = std::make_unique<KvService>(store_.get(), member_.get(), gate, bulk_reads_.get());
  if (cache_) {
    auto ranges = std::make_unique<CacheRange>(store_.get(), cache_.get(), member_.get());
    cache_range_ = ranges.get();
    kv->ServeCachedRanges(std::move(ranges));
  }
  kv_service_ = kv.get();
  services_.push_back(std::move(kv));
  leader_monitor_ = std::make_unique<LeaderMonitor>(
      member_.get(), absl::Milliseconds(config_.election_timeout_ms));
  services_.push_back(
      std::make_unique<WatchService>(hub_.get(), member_.get(), gate, leader_monitor_.get()));
  services_.push_back(std::make_unique<MaintenanceService>(store_.get(), member_.get(),
                                                           kEtcdApiVersion, gate));
  services_.push_back(std::make_unique<ClusterService>(store_.get(), member_.get(), gate));
  auto lease =
      std::make_unique<LeaseService>(store_.get(), member_.get(), gate, leader_monitor_.get());
  lease_service_ = lease.get();
  services_.push_back(std::move(lease));
  recipes_ = std::make_unique<Recipes>(store_.get(), hub_.get(), member_.get(), gate);
  services_.push_back(std::make_unique<LockService>(recipes_.get()));
  services_.push_back(std::make_unique<ElectionService>(recipes_.get()));
  services_.push_back(std::make_unique<HealthService>());
  if (cache_) {
    services_.push_back(std::make_unique<CacheService>(cache_.get(), member_.get(), 4, gate));
  }
  services_.push_back(std::move(auth));
  return absl::OkStatus();
}

absl::Status Server::StartReplication() {
  replication::RaftLogOptions log_options;
  log_options.dir = storage::RaftLogDir(config_.data_dir);
  log_options.sync = !config_.unsafe_no_fsync;
  log_options.file_system = file_system_;
  auto log = replication::RaftLog::Open(log_options);
  if (!log.ok()) return log.status();
  // etcd's memberInitialized: a member started before (its log was kept).
  const bool initialized = !(*log)->IsNew();

  auto transport_options =
      PeerTransportOptionsFromConfig(config_, member_->member_id, member_->cluster_id);
  if (!transport_options.ok()) return transport_options.status();
  // A peer that refuses this member as removed (etcd's errMemberRemoved).
  transport_options->on_peer_error = [this](uint64_t, const absl::Status& s) {
    if (s.message() == membership::MakeError(membership::Error::kMemberRemoved).message()) OnRemoved();
  };
  auto transport = std::make_unique<PeerTransport>(*std::move(transport_options));

  replication::ReplicatorOptions options;
  options.member_id = member_->member_id;
  options.cluster_id = member_->cluster_id;
  options.initial_members = member_->initial_members;
  options.name = member_->name;
  options.client_urls = member_->client_urls;
  options.cluster_version = kEtcdClusterVersion;
  options.tick = absl::Milliseconds(static_cast<int64_t>(config_.heartbeat_interval_ms));
  options.election_ticks = static_cast<int>(
      std::max<uint64_t>(1, config_.election_timeout_ms / std::max<uint64_t>(1, config_.heartbeat_interval_ms)));
  options.pre_vote = config_.pre_vote;
  options.max_proposal_bytes = static_cast<int64_t>(config_.max_request_bytes);
  // etcd's ReqTimeout: 5 s plus two election timeouts.
  options.request_timeout =
      absl::Seconds(5) + 2 * absl::Milliseconds(static_cast<int64_t>(config_.election_timeout_ms));
  options.snapshot_count = config_.snapshot_count;
  options.data_dir = config_.data_dir;
  options.max_learners = static_cast<int>(config_.max_learners);
  options.strict_reconfig_check = config_.strict_reconfig_check;
  options.join_existing = config_.initial_cluster_state == ClusterState::kExisting;
  options.force_new_cluster = config_.force_new_cluster;
  options.direct_writes = true;
  options.on_removed = [this] { OnRemoved(absl::Seconds(1)); };
  {
    auth::AuthStore* auth = auth_store_;
    options.on_restored = [auth]() { return auth->Reload(); };
  }
  if (FailpointActive("answer-before-commit")) {
    SPDLOG_CRITICAL("failpoint answer-before-commit is active: this member answers writes before "
                    "a quorum has them and loses acknowledged writes (tests only)");
    options.failpoint_answer_before_commit = true;
  }
  // Auth changes and simple tokens (Authenticate) are entries too: each
  // member rebuilds them on its auth store.
  auth::AuthStore* auth_store = auth_store_;
  replication::EntryDecoder decode_auth =
      [auth_store](std::shared_ptr<const etcdserverpb::InternalRaftRequest> request,
                   absl::AnyInvocable<void(absl::Status)>* done)
      -> std::optional<mvcc::WriteRequest> {
    return auth_store->Decode(std::move(request), done);
  };
  replicator_ = replication::Replicator::Create(options, raft_factory_, *std::move(log),
                                                store_.get(), transport.get(),
                                                std::move(decode_auth));
  auth_store_->SetReplayedThrough(replicator_->ReplayThrough());
  // A simple token from another member is waited for only up to the index
  // this member knows committed. Shutdown stops the client servers before
  // it destroys the replicator.
  auth_store_->SetCommittedIndex(
      [replicator = replicator_.get()] { return replicator->CommittedIndex(); });
  if (auto s = transport->Start(replicator_->handler()); !s.ok()) {
    // gRPC does not say why it could not serve a peer URL; the usual cause
    // is a port another process listens on, said in etcd's words.
    for (const auto& url : config_.listen_peer_urls) {
      if (auto probe = ProbeListen(url); !probe.ok()) return probe;
    }
    return s;
  }
  // The members of the table the store holds (or, until its first entries,
  // those the member was started with).
  for (const auto& m : replicator_->Members()) {
    if (m.id != member_->member_id) transport->AddPeer(m.id, m.peer_urls);
  }
  peer_transport_ = std::move(transport);
  if (auto s = replicator_->Run(); !s.ok()) return s;
  {
    // Clients are served only once the store holds everything the log had
    // committed (its WAL-less tail is replayed after a crash).
    const auto start = std::chrono::steady_clock::now();
    const uint64_t from = store_->AppliedIndex();
    if (auto s = replicator_->AwaitReplay(); !s.ok()) return s;
    if (store_->AppliedIndex() > from) {
      SPDLOG_INFO("replayed the raft log from index {} to {} in {} ms", from,
                  store_->AppliedIndex(),
                  std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count());
    }
  }
  member_->raft = replicator_.get();
  SPDLOG_INFO("member {:x} of cluster {:x} started with {} members", member_->member_id,
              member_->cluster_id, member_->initial_members.size());
  replication::CorruptionCheckOptions check;
  check.member_id = member_->member_id;
  check.interval = config_.corrupt_check_time;
  check.timeout = options.request_timeout;
  corruption_check_ = std::make_unique<replication::CorruptionCheck>(
      check, store_.get(), replicator_.get(), peer_transport_.get());
  // etcd checks before it serves clients, and does not start on a mismatch;
  // a member started for the first time has nothing to compare yet.
  if (initialized && config_.feature_gates.Enabled(kInitialCorruptCheckGate)) {
    if (auto s = corruption_check_->CheckInitial(); !s.ok()) {
      SPDLOG_ERROR("checkInitialHashKV failed: {}", std::string(s.message()));
      return s;
    }
  }
  corruption_check_->Start();
  return absl::OkStatus();
}

void Server::StartAutoCompaction() {
  // Auto compaction belongs to the store: it runs whether or not the server
  // listens (an embedded store may never serve).
  if (config_.auto_compaction_mode == CompactionMode::kPeriodic &&
      config_.auto_compaction_period > absl::ZeroDuration()) {
    auto_compactor_ = std::make_unique<AutoCompactor>(store_.get(), config_.auto_compaction_period, 0);
  } else if (config_.auto_compaction_mode == CompactionMode::kRevision &&
             config_.auto_compaction_revisions > 0) {
    auto_compactor_ = std::make_unique<AutoCompactor>(store_.get(), absl::ZeroDuration(),
                                                      config_.auto_compaction_revisions);
  }
}

// What Serve's phases hand on to one another; lives for one call of Serve.
struct Server::Listening {
  // The client TLS settings, shared by https client and metrics URLs; empty
  // when no such URL needs them or none are configured.
  std::optional<ClientTls> client_tls;
  grpc::ServerBuilder builder;
  // The port gRPC bound for each client URL, in order (0 until it started;
  // set by BindClientUrls for the URLs whose port HTTP shares).
  std::vector<int> bound;
  // client_listeners_[i] shares its port with gRPC if i < with_grpc (its URL
  // is a client URL), else serves HTTP alone; listener_urls[i] is its URL.
  std::vector<const Url*> listener_urls;
  size_t with_grpc = 0;
  // gRPC's TLS credentials, made once for every https/unixs client URL.
  std::shared_ptr<grpc::ServerCredentials> tls;

  // Makes tls unless it was made. Fails if no certificate was configured.
  absl::Status MakeGrpcTls() {
    if (tls) return absl::OkStatus();
    if (!client_tls) {
      return absl::InvalidArgumentError(
          "TLS key/cert (--cert-file, --key-file) must be provided for https client URLs (or "
          "use --auto-tls)");
    }
    auto made = ClientTlsCredentials(*client_tls);
    if (!made.ok()) return made.status();
    tls = *made;
    return absl::OkStatus();
  }
};

absl::Status Server::Serve() {
  if (grpc_server_ || shut_down_) {
    return absl::FailedPreconditionError("the server is already serving");
  }
  Listening l;
  auto client_tls = ClientTlsIfNeeded(config_);
  if (!client_tls.ok()) return client_tls.status();
  l.client_tls = *std::move(client_tls);
  if (auto s = BindClientUrls(l); !s.ok()) return s;
  ConfigureGrpc(l);
  if (auto s = BindClientHttpUrls(l); !s.ok()) return s;
  // The metrics URLs are bound before gRPC answers anything, as etcd binds
  // every listener before it serves: a taken port fails the start before a
  // client (or a supervisor's readiness probe) could take the member for up.
  http_ = std::make_unique<HttpEndpoints>(store_.get(), member_.get(),
                                          Versions{kEtcdApiVersion, kEtcdClusterVersion, kCapstanVersion},
                                          metrics_.get());
  if (auto s = ListenOnMetricsUrls(l); !s.ok()) return s;
  if (auto s = StartGrpc(l); !s.ok()) return s;
  StartClientHttp(l);
  if (replicator_) {
    ready_wait_ = std::make_unique<ReadyWait>();
    ready_logger_ = std::thread([this] { LogReadyWhenPublished(); });
  } else {
    LogReady();
  }
  return absl::OkStatus();
}

absl::Status Server::BindClientUrls(Listening& l) {
  l.bound.assign(config_.listen_client_urls.size(), 0);
  // http:// and https:// client URLs serve gRPC and HTTP/1.1 on one port
  // unless --listen-client-http-urls takes HTTP elsewhere; gRPC alone
  // listens on the others (and on unix ones).
  const bool shared_ports = config_.listen_client_http_urls.empty();
  for (size_t i = 0; i < config_.listen_client_urls.size(); ++i) {
    const Url& url = config_.listen_client_urls[i];
    if (shared_ports && (url.scheme == "http" || url.scheme == "https")) {
      if (url.scheme == "https" && !grpc_tls_acceptor_) {
        if (auto s = l.MakeGrpcTls(); !s.ok()) return s;
        // gRPC does its own handshake on the connections handed to it.
        grpc_tls_acceptor_ = l.builder.experimental().AddExternalConnectionAcceptor(
            grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, l.tls);
        if (auto s = MakeHttpsContext(l); !s.ok()) return s;
      }
      auto listener = BindClientListener(url, config_.socket_reuse_port);
      if (!listener.ok()) return listener.status();
      l.bound[i] = (*listener)->port();
      client_listeners_.push_back(*std::move(listener));
      l.listener_urls.push_back(&url);
      continue;
    }
    std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
    if (IsTls(url)) {
      if (auto s = l.MakeGrpcTls(); !s.ok()) return s;
      creds = l.tls;
    }
    l.builder.AddListeningPort(GrpcAddress(url), creds, &l.bound[i]);
  }
  return absl::OkStatus();
}

void Server::ConfigureGrpc(Listening& l) {
  grpc::ServerBuilder& builder = l.builder;
  for (auto& s : services_) builder.RegisterService(s.get());
  // A queue per core for the methods on the completion-queue model.
  completion_queues_ = std::make_unique<CompletionQueues>(
      &builder, static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 8u)));
  metrics_ = std::make_unique<Metrics>(store_.get(), member_.get(), kEtcdApiVersion);
  if (cache_range_ != nullptr) metrics_->AddWatchCache(cache_.get(), cache_range_);
  metrics_->AddWatches(hub_.get(), cache_range_ != nullptr ? cache_.get() : nullptr);
  metrics_->AddRecipes(recipes_.get());
  if (peer_transport_) {
    metrics_->AddPeers(member_->member_id,
                       [transport = peer_transport_.get()] { return transport->Traffic(); });
  }
  metrics_->AddFeatureGates(config_.feature_gates);
  grpc_metrics_ =
      std::make_unique<GrpcMetrics>(metrics_->registry(), config_.metrics == "extensive",
                                    metrics_->requests());
  // The methods on the hot path count themselves; the interceptor counts
  // the rest.
  kv_service_->CountCalls(grpc_metrics_.get());
  lease_service_->CountCalls(grpc_metrics_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(grpc_metrics_->NewInterceptorFactory());
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.SetMaxReceiveMessageSize(static_cast<int>(config_.max_request_bytes) + kGrpcOverheadBytes);
  builder.SetMaxSendMessageSize(std::numeric_limits<int>::max());
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             static_cast<int>(std::min<uint64_t>(config_.max_concurrent_streams,
                                                                 std::numeric_limits<int>::max())));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(config_.grpc_keepalive_min_time)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(std::min<int64_t>(
                                 absl::ToInt64Milliseconds(config_.grpc_keepalive_interval),
                                 std::numeric_limits<int>::max())));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(config_.grpc_keepalive_timeout)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // gRPC sets SO_REUSEPORT unless told not to, which would let a second
  // server bind a port this one serves and split its clients between them.
  // etcd sets it only with --socket-reuse-port.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, config_.socket_reuse_port ? 1 : 0);
}

absl::Status Server::MakeHttpsContext(const Listening& l) {
  if (https_context_) return absl::OkStatus();
  auto ctx = NewHttpsContext(*l.client_tls);
  if (!ctx.ok()) return ctx.status();
  https_context_.reset(*ctx);
  return absl::OkStatus();
}

absl::Status Server::BindClientHttpUrls(Listening& l) {
  l.with_grpc = client_listeners_.size();
  for (const Url& url : config_.listen_client_http_urls) {
    if (url.scheme != "http" && url.scheme != "https") {
      return absl::UnimplementedError(absl::StrCat(
          "client HTTP URL ", url.String(), ": only http and https are supported"));
    }
    if (url.scheme == "https") {
      if (!l.client_tls) {
        // etcd's configureClientListeners, for client and client HTTP URLs.
        return absl::InvalidArgumentError(
            absl::StrCat("TLS key/cert (--cert-file, --key-file) must be provided for client url ",
                         url.String(), " with HTTPS scheme"));
      }
      if (auto s = MakeHttpsContext(l); !s.ok()) return s;
    }
    auto listener = BindClientListener(url, config_.socket_reuse_port);
    if (!listener.ok()) return listener.status();
    client_listeners_.push_back(*std::move(listener));
    l.listener_urls.push_back(&url);
  }
  return absl::OkStatus();
}

absl::Status Server::StartGrpc(Listening& l) {
  grpc_server_ = l.builder.BuildAndStart();
  if (grpc_server_) {
    completion_queues_->Start();
    lease_service_->ServeKeepAlives(completion_queues_.get(), kKeepAlivesArmed);
  } else {
    for (const auto& url : config_.listen_client_urls) {
      if (auto s = ProbeListen(url); !s.ok()) return s;
    }
    return absl::UnavailableError("cannot start the gRPC server");
  }
  for (size_t i = 0; i < l.bound.size(); ++i) {
    if (l.bound[i] == 0) {
      // gRPC does not say why; the usual cause is a port in use.
      if (auto s = ProbeListen(config_.listen_client_urls[i]); !s.ok()) return s;
      return absl::UnavailableError(absl::StrCat("cannot listen on client URL ",
                                                 config_.listen_client_urls[i].String()));
    }
    SPDLOG_INFO("serving client traffic {}on {}",
                 IsTls(config_.listen_client_urls[i]) ? "securely " : "insecurely ",
                 config_.listen_client_urls[i].String());
  }
  client_ports_ = l.bound;
  return absl::OkStatus();
}

void Server::StartClientHttp(const Listening& l) {
  if (config_.enable_grpc_gateway) json_gateway_ = std::make_unique<JsonGateway>(grpc_server_.get());
  ClientHttpOptions http_options;
  http_options.cors = config_.cors;
  http_options.host_whitelist = config_.host_whitelist;
  // A JSON body carries bytes in base64: room for a request at the limit.
  http_options.max_body = 2 * config_.max_request_bytes + kGrpcOverheadBytes;
  client_http_ = std::make_unique<ClientHttp>(http_.get(), json_gateway_.get(), http_options);
  auto adopt = [http = client_http_.get()](int fd) { http->Adopt(fd); };
  auto adopt_tls = [http = client_http_.get(), ctx = https_context_.get()](int fd) {
    http->Adopt(fd, ctx);
  };
  for (size_t i = 0; i < client_listeners_.size(); ++i) {
    const bool with_grpc = i < l.with_grpc;
    const bool https = l.listener_urls[i]->scheme == "https";
    if (https) {
      // With gRPC beside it, h2-only TLS connections go to gRPC's acceptor;
      // an HTTP-only listener (null acceptor) hands every one to HTTP.
      client_listeners_[i]->StartTls(with_grpc ? grpc_tls_acceptor_.get() : nullptr, adopt_tls);
    } else {
      client_listeners_[i]->Start(with_grpc ? grpc_server_.get() : nullptr, adopt);
    }
    if (!with_grpc) {
      SPDLOG_INFO("serving client HTTP traffic {}on {}", https ? "securely " : "insecurely ",
                  l.listener_urls[i]->String());
    }
  }
}

absl::Status Server::ListenOnMetricsUrls(const Listening& l) {
  for (const auto& url : config_.listen_metrics_urls) {
    if (url.scheme != "http" && url.scheme != "https") {
      return absl::UnimplementedError(
          absl::StrCat("metrics URL ", url.String(), ": only http and https are supported"));
    }
    int port = 0;
    if (!absl::SimpleAtoi(url.Port(), &port)) {
      return absl::InvalidArgumentError(absl::StrCat("metrics URL ", url.String(), " has no port"));
    }
    const bool https = url.scheme == "https";
    if (https && !l.client_tls) {
      // etcd 3.5's error (embed.ErrMissingClientTLSInfoForMetricsURL) for an
      // https URL without client TLS.
      return absl::InvalidArgumentError(
          "client TLS key/cert (--cert-file, --key-file) must be provided for metrics secure url");
    }
    if (auto s = http_->Listen(url.Hostname(), port, https ? &*l.client_tls : nullptr); !s.ok()) {
      return s;
    }
    SPDLOG_INFO("serving metrics and health {}on {}", https ? "securely " : "insecurely ",
                 url.String());
  }
  return absl::OkStatus();
}

void Server::LogReady() const {
  // etcd writes these two once its member serves: tools that start etcd and
  // wait for its log (etcd's own e2e harness among them) look for both.
  SPDLOG_INFO("enabled capabilities for version: cluster-version {}",
              std::string(kEtcdClusterVersion, 3));
  SPDLOG_INFO(
      "published local member to cluster through raft: local-member-id {:x}, "
      "local-member-attributes {{Name:{} ClientURLs:[{}]}}, cluster-id {:x}",
      member_->member_id, member_->name, absl::StrJoin(member_->client_urls, " "),
      member_->cluster_id);
  SPDLOG_INFO("ready to serve client requests: name {}, member {:x}, cluster {:x}", member_->name,
               member_->member_id, member_->cluster_id);
}

void Server::LogReadyWhenPublished() {
  // etcd's publish: this member's name and client URLs, proposed by the
  // replicator once a leader is known, committed by a quorum and applied
  // here. Until then the member lists no client URLs for itself. The ready
  // lines also wait for the cluster version (the entry after a new
  // cluster's first attributes), which the first of them names.
  const membership::RaftView* raft = replicator_.get();
  auto published = [&] {
    if (raft->Leader() == 0 || raft->ClusterVersion().empty()) return false;
    for (const auto& m : raft->Members()) {
      if (m.id == member_->member_id) return !m.client_urls.empty();
    }
    return false;
  };
  util::MutexLock l(&ready_wait_->mu);
  // Nothing here is told when an entry is applied: look again every 10 ms.
  while (!published()) {
    if (ready_wait_->mu.AwaitWithTimeout(absl::Condition(&ready_wait_->stop),
                                         absl::Milliseconds(10))) {
      return;
    }
  }
  LogReady();
}

void Server::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  std::thread removed_stopper;
  {
    util::MutexLock l(&removed_mu_);
    if (!shutting_down_.HasBeenNotified()) shutting_down_.Notify();
    removed_stopper = std::move(removed_stopper_);
  }
  if (removed_stopper.joinable()) removed_stopper.join();
  if (ready_logger_.joinable()) {
    {
      util::MutexLock l(&ready_wait_->mu);
      ready_wait_->stop = true;
    }
    ready_logger_.join();
  }
  // No new connections, for gRPC or HTTP.
  for (auto& l : client_listeners_) l->Stop();
  // Writes and reads waiting for the cluster are answered now; later ones
  // are refused (nothing is applied on this member alone).
  if (replicator_) replicator_->Stop();
  if (peer_transport_) peer_transport_->Stop();
  // A check under way ends with the replicator's and the transport's
  // refusals (a peer's hash it waits for, at most its timeout).
  if (corruption_check_) corruption_check_->Stop();
  if (grpc_server_) {
    // Locks and campaigns may wait indefinitely: answer them now.
    if (recipes_) recipes_->EndCalls();
    // Let unary requests in flight finish (up to 5 s), then stop at once:
    // a deadline would also be spent waiting for idle client connections to
    // close, and streams (watches, keep-alives) end with the server anyway.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (grpc_metrics_ && grpc_metrics_->unary_in_flight() > 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    // HTTP clients' calls run through the gRPC server: end them first.
    if (client_http_) client_http_->Stop();
    if (completion_queues_) completion_queues_->BeginStop();
    grpc_server_->Shutdown(std::chrono::system_clock::now());
    grpc_server_->Wait();
  }
  // Every call on the queues has failed or ended; what the calls still wait
  // for (a renewal forwarded to the leader) was answered by the
  // replicator's Stop.
  if (completion_queues_) completion_queues_->Stop();
  // It reads the replicator's leader.
  if (leader_monitor_) leader_monitor_->Stop();
  client_http_.reset();
  https_context_.reset();
  json_gateway_.reset();
  if (http_) http_->Stop();
  // Its calls' steps use the hub and the store.
  recipes_.reset();
  auto_compactor_.reset();
  grpc_server_.reset();
  completion_queues_.reset();  // after the server that polled them
  bulk_reads_.reset();
  // Responses in flight referenced cached objects: the cache goes after the
  // gRPC server, and before the hub its feeds watch.
  cache_.reset();
  // The hub's syncer reads the store: stop it first. The store then drains
  // its queue (still notifying the hub) and stops its threads.
  if (hub_) hub_->Stop();
  store_.reset();
  // The store called the replicator as its write log until it closed.
  replicator_.reset();
  peer_transport_.reset();
  hub_.reset();
  services_.clear();
  SPDLOG_INFO("stopped serving");
}

void Server::SslContextFree::operator()(ssl_ctx_st* ctx) const { SSL_CTX_free(ctx); }

}  // namespace capstan::server
