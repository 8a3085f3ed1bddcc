#include "server/peer/peer_transport.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "capstan/v1/peer.grpc.pb.h"
#include "membership/member_table.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"
#include "server/peer/peer_protocol.h"
#include "server/peer/peer_snapshot.h"
#include "server/peer/peer_sender.h"
#include "server/peer/peer_listener.h"
#include "server/peer/peer_service.h"
#include "spdlog/spdlog.h"

namespace capstan::server {
namespace {

absl::Status FromGrpc(const grpc::Status& s) {
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// role: what the called member is to the caller ("leader", "peer"), for
// the error's text.
absl::Status UnknownPeer(uint64_t id, const char* role = "leader") {
  return absl::UnavailableError(absl::StrCat(role, " ", peer::IdText(id), " is not a known peer"));
}

// A call to a peer (the leader, for lease calls): who makes it, and until
// when it waits for the peer to be reachable and to answer.
void PreparePeerCall(grpc::ClientContext* context, uint64_t to, const PeerTransportOptions& options,
                     int64_t deadline_ms) {
  context->AddMetadata(peer::kClusterIdKey, peer::IdText(options.cluster_id));
  context->AddMetadata(peer::kFromKey, peer::IdText(options.member_id));
  context->AddMetadata(peer::kToKey, peer::IdText(to));
  context->set_wait_for_ready(true);
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::milliseconds(std::max<int64_t>(deadline_ms, 0)));
}

// The called member's answer, or Unavailable when it could not be had in
// time.
absl::Status PeerStatus(const grpc::Status& status, uint64_t id, const char* role) {
  if (status.error_code() == grpc::UNAVAILABLE || status.error_code() == grpc::DEADLINE_EXCEEDED ||
      status.error_code() == grpc::CANCELLED) {
    return absl::UnavailableError(absl::StrCat(role, " ", peer::IdText(id),
                                               " unreachable: ", status.error_message()));
  }
  return FromGrpc(status);
}

// A call to a peer (the leader, for lease calls), waited for.
template <typename Call>
absl::Status CallPeer(const std::shared_ptr<grpc::Channel>& channel, uint64_t id,
                      const PeerTransportOptions& options, int64_t deadline_ms, Call call,
                      const char* role = "leader") {
  if (!channel) return UnknownPeer(id, role);
  grpc::ClientContext context;
  PreparePeerCall(&context, id, options, deadline_ms);
  auto stub = capstan::v1::Peer::NewStub(channel);
  return PeerStatus(call(stub.get(), &context), id, role);
}

}  // namespace

struct PeerTransport::PeerStub {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<capstan::v1::Peer::Stub> stub;
};

// A keep-alive forwarded to the leader, owned by its completion and by
// Stop while it cancels it.
struct PeerTransport::LeaseCall {
  grpc::ClientContext context;
  etcdserverpb::LeaseKeepAliveRequest request;
  etcdserverpb::LeaseKeepAliveResponse response;
  std::shared_ptr<PeerStub> stub;  // alive until the call completes
  LeaseRenewDone done;
};

absl::StatusOr<PeerTransportOptions> PeerTransportOptionsFromConfig(const ServerConfig& config,
                                                                    uint64_t member_id,
                                                                    uint64_t cluster_id) {
  PeerTransportOptions options;
  options.member_id = member_id;
  options.cluster_id = cluster_id;
  options.listen_peer_urls = config.listen_peer_urls;
  if (HasPeerCertificate(config)) {
    auto tls = ResolvePeerTls(config);
    if (!tls.ok()) return tls.status();
    options.tls = *std::move(tls);
  }
  for (const auto& url : options.listen_peer_urls) {
    if (url.scheme == "https" && !options.tls) {
      // etcd's newTLSListener.
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot listen on TLS for ", url.host, ": KeyFile and CertFile are not presented"));
    }
  }
  return options;
}

PeerTransport::PeerTransport(PeerTransportOptions options) : options_(std::move(options)) {}

PeerTransport::~PeerTransport() { Stop(); }

absl::Status PeerTransport::Start(replication::TransportHandler handler) {
  {
    util::MutexLock l(&mu_);
    if (started_ || stopped_) return absl::FailedPreconditionError("peer transport already started");
  }
  handler_ = std::move(handler);
  if (options_.tls) {
    auto credentials = PeerChannelCredentials(*options_.tls);
    if (!credentials.ok()) return credentials.status();
    channel_tls_ = *std::move(credentials);
    auto probe = peer::NewPeerClientContext(*options_.tls);
    if (!probe.ok()) return probe.status();
    probe_tls_ = std::shared_ptr<SSL_CTX>(probe->release(), SSL_CTX_free);
  }
  {
    peer::PeerProberOptions probe = options_.probe;
    // With a TLS probe the sender logs an unreachable peer itself.
    probe.log_unhealthy = probe.log_unhealthy && probe_tls_ == nullptr;
    prober_ = std::make_unique<peer::PeerProber>(probe);
    prober_->Start();
  }
  service_ = std::make_unique<peer::PeerService>(
      options_.member_id, options_.cluster_id, &handler_,
      [this](uint64_t id) { return IsRemoved(id); },
      // The listeners check client certificates' addresses in the handshake.
      /*check_client_san=*/false);

  grpc::ServerBuilder builder;
  // A callback service alone: the server starts no polling threads of its
  // own (peer_service.h says why).
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  // The senders' keepalive pings (peer_sender.cc) are welcome.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Without this gRPC sets SO_REUSEPORT, and a second member started on the
  // same peer URL would bind it too and receive half of the Raft traffic.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // http and https URLs are PeerListeners, which serve Raft streams
  // themselves and hand gRPC its connections (after their TLS handshake);
  // unix ones are gRPC's own.
  std::vector<int> ports(options_.listen_peer_urls.size(), 0);
  for (size_t i = 0; i < options_.listen_peer_urls.size(); ++i) {
    const Url& url = options_.listen_peer_urls[i];
    if (url.scheme == "https") {
      if (!options_.tls) {
        return absl::InvalidArgumentError(
            absl::StrCat("no peer certificate for ", url.String(), " (--peer-cert-file)"));
      }
    } else if (url.scheme == "http") {
    } else if (url.scheme == "unix") {
      // etcd listens on a unix socket named by the URL's host.
      builder.AddListeningPort("unix:" + url.host, grpc::InsecureServerCredentials(), &ports[i]);
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("peer URL scheme must be http, https or unix: ", url.String()));
    }
  }
  // One per listen URL: the https ones' TLS context, null for the others.
  std::vector<peer::SslCtxPtr> server_contexts(options_.listen_peer_urls.size());
  for (size_t i = 0; i < options_.listen_peer_urls.size(); ++i) {
    if (options_.listen_peer_urls[i].scheme != "https") continue;
    auto ctx = peer::NewPeerServerContext(*options_.tls);
    if (!ctx.ok()) return ctx.status();
    server_contexts[i] = *std::move(ctx);
  }
  auto server = builder.BuildAndStart();
  if (!server) return absl::UnavailableError("cannot serve the peer URLs");
  std::vector<std::unique_ptr<peer::PeerListener>> listeners;
  auto fail = [&](absl::Status s) {
    for (auto& l : listeners) l->Stop();
    server->Shutdown(std::chrono::system_clock::now());
    return s;
  };
  for (size_t i = 0; i < options_.listen_peer_urls.size(); ++i) {
    const Url& url = options_.listen_peer_urls[i];
    if (url.scheme == "https" || url.scheme == "http") {
      auto listener = std::make_unique<peer::PeerListener>(std::move(server_contexts[i]),
                                                           server.get(), service_.get());
      if (auto s = listener->Start(url.host); !s.ok()) {
        return fail(absl::UnavailableError(
            absl::StrCat("cannot listen on peer URL ", url.String(), ": ", s.message())));
      }
      ports[i] = listener->port();
      listeners.push_back(std::move(listener));
    }
    if (ports[i] == 0) {
      return fail(absl::UnavailableError(
          absl::StrCat("cannot listen on peer URL ", url.String())));
    }
  }
  server_ = std::move(server);
  listeners_ = std::move(listeners);
  ports_ = std::move(ports);

  // The peers added before Start, now that the credentials exist.
  std::map<uint64_t, std::vector<std::string>> peers;
  {
    util::MutexLock l(&mu_);
    started_ = true;
    peers = peer_urls_;
  }
  for (const auto& [id, urls] : peers) AddPeerSender(id, urls);
  return absl::OkStatus();
}

void PeerTransport::Stop() {
  std::map<uint64_t, std::shared_ptr<peer::PeerSender>> senders;
  bool started;
  {
    util::MutexLock l(&mu_);
    if (stopped_) return;
    stopped_ = true;
    started = started_;
    senders.swap(senders_);
  }
  if (prober_) prober_->Stop();
  for (auto& [id, sender] : senders) sender->Stop();
  {
    // A forwarded keep-alive still answers its caller: Unavailable, once
    // cancelled. Cancelled outside the lock, since a cancellation may run the
    // call's completion, which takes it, on this thread.
    std::vector<std::shared_ptr<LeaseCall>> calls;
    {
      util::MutexLock l(&mu_);
      for (const auto& [key, call] : lease_calls_) calls.push_back(call);
    }
    for (const auto& call : calls) call->context.TryCancel();
  }
  {
    // A Send that got past its check still reports to the handler.
    util::MutexLock l(&mu_);
    auto idle = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return active_sends_ == 0 && lease_calls_.empty();
    };
    mu_.Await(absl::Condition(&idle));
  }
  for (auto& listener : listeners_) listener->Stop();
  if (started && server_) {
    // Cancels the open streams at once; returns when every handler has
    // returned.
    server_->Shutdown(std::chrono::system_clock::now());
  }
}

std::shared_ptr<peer::PeerSender> PeerTransport::NewSender(uint64_t id,
                                                           const std::vector<std::string>& urls) {
  peer::PeerSenderOptions o;
  o.local_id = options_.member_id;
  o.cluster_id = options_.cluster_id;
  o.peer_id = id;
  o.urls = urls;
  o.tls = channel_tls_;
  o.probe_tls = probe_tls_;
  o.queue_capacity = options_.queue_capacity;
  o.max_batch_bytes = options_.max_batch_bytes;
  o.initial_backoff = options_.initial_backoff;
  o.max_backoff = options_.max_backoff;
  o.on_unreachable = [this](uint64_t peer) { ReportUnreachable(peer); };
  o.on_error = options_.on_peer_error;
  return std::make_shared<peer::PeerSender>(std::move(o));
}

void PeerTransport::AddPeer(uint64_t id, const std::vector<std::string>& peer_urls) {
  if (peer_urls.empty() || id == options_.member_id) return;
  {
    util::MutexLock l(&mu_);
    if (stopped_ || removed_.count(id)) return;
    auto it = peer_urls_.find(id);
    if (it != peer_urls_.end() && it->second == peer_urls) return;  // nothing changes
    peer_urls_[id] = peer_urls;
    if (!started_) return;  // Start makes its sender
  }
  AddPeerSender(id, peer_urls);
}

void PeerTransport::AddPeerSender(uint64_t id, const std::vector<std::string>& peer_urls) {
  // Made outside the lock (it copies options and credentials).
  std::shared_ptr<peer::PeerSender> added = NewSender(id, peer_urls);
  std::shared_ptr<peer::PeerSender> replaced;
  {
    util::MutexLock l(&mu_);
    // A RemovePeer or Stop that came in between wins.
    if (stopped_ || removed_.count(id)) return;
    auto it = senders_.find(id);
    if (it != senders_.end()) replaced = std::move(it->second);
    senders_[id] = added;
    // Under the lock, so that a RemovePeer cannot come in between.
    prober_->AddPeer(id, [sender = std::weak_ptr<peer::PeerSender>(added)] {
      auto s = sender.lock();
      return s ? s->Channel() : nullptr;
    });
  }
  if (replaced) replaced->Stop();
  added->Start();
}

void PeerTransport::RemovePeer(uint64_t id) {
  std::shared_ptr<peer::PeerSender> sender;
  {
    util::MutexLock l(&mu_);
    removed_.insert(id);
    peer_urls_.erase(id);
    auto it = senders_.find(id);
    if (it != senders_.end()) {
      sender = std::move(it->second);
      senders_.erase(it);
    }
    if (prober_) prober_->RemovePeer(id);
    stubs_.erase(id);
  }
  if (sender) sender->Stop();
}

bool PeerTransport::IsRemoved(uint64_t id) const {
  util::MutexLock l(&mu_);
  return removed_.count(id) > 0;
}

void PeerTransport::ReportUnreachable(uint64_t id) const {
  if (handler_.on_unreachable) handler_.on_unreachable(id);
}

void PeerTransport::Send(std::vector<replication::RaftMessage> messages) {
  if (messages.empty()) return;
  // The messages per peer, in order, with the peer's sender (looked up once
  // under the lock, fed outside it).
  struct Outgoing {
    uint64_t to;
    std::shared_ptr<peer::PeerSender> sender;
    std::vector<std::string> messages;
  };
  std::vector<Outgoing> outgoing;
  {
    util::MutexLock l(&mu_);
    if (stopped_) return;
    ++active_sends_;  // Stop waits for this call before it returns
    for (auto& m : messages) {
      auto out = std::find_if(outgoing.begin(), outgoing.end(),
                              [&](const Outgoing& o) { return o.to == m.to; });
      if (out == outgoing.end()) {
        auto it = senders_.find(m.to);
        outgoing.push_back({m.to, it == senders_.end() ? nullptr : it->second, {}});
        out = outgoing.end() - 1;
      }
      // MsgSnap (replication::MessageType::kSnapshot) is queued like any
      // message for now; its snapshot stream will go beside it.
      if (out->sender) out->messages.push_back(std::move(m.bytes));
    }
  }
  for (auto& out : outgoing) {
    if (!out.sender) {
      SPDLOG_DEBUG("ignored message send request; unknown remote peer target {}",
                   peer::IdText(out.to));
      continue;
    }
    const size_t queued = out.sender->EnqueueAll(&out.messages);
    if (queued < out.messages.size()) {
      SPDLOG_WARN("dropped {} internal Raft message(s) since sending buffer is full (remote peer {})",
                  out.messages.size() - queued, peer::IdText(out.to));
      ReportUnreachable(out.to);
    }
  }
  util::MutexLock l(&mu_);
  --active_sends_;
}

std::vector<membership::PeerTraffic> PeerTransport::Traffic() const {
  std::vector<std::shared_ptr<peer::PeerSender>> senders;
  peer::PeerService* service = nullptr;
  peer::PeerProber* prober = nullptr;
  {
    util::MutexLock l(&mu_);
    for (const auto& [id, sender] : senders_) senders.push_back(sender);
    // Made by Start before it set started_; kept until destruction.
    if (started_) {
      service = service_.get();
      prober = prober_.get();
    }
  }
  std::vector<membership::PeerTraffic> traffic;
  for (const auto& sender : senders) {
    membership::PeerTraffic p;
    p.id = sender->peer_id();
    p.active = sender->ActiveSince() != absl::InfiniteFuture();
    p.sent_bytes = sender->sent_bytes();
    p.sent_failures = sender->sent_failures();
    if (prober) p.round_trips = prober->RoundTrips(p.id);
    traffic.push_back(p);
  }
  if (service == nullptr) return traffic;
  for (const auto& [from, bytes] : service->ReceivedBytes()) {
    auto it = std::find_if(traffic.begin(), traffic.end(),
                           [from = from](const membership::PeerTraffic& p) { return p.id == from; });
    if (it == traffic.end()) {
      traffic.push_back({from});
      it = traffic.end() - 1;
    }
    it->received_bytes = bytes;
  }
  return traffic;
}

absl::Time PeerTransport::ActiveSince(uint64_t id) const {
  std::shared_ptr<peer::PeerSender> sender;
  {
    util::MutexLock l(&mu_);
    auto it = senders_.find(id);
    if (it == senders_.end()) return absl::InfiniteFuture();
    sender = it->second;
  }
  return sender->ActiveSince();
}

std::shared_ptr<grpc::Channel> PeerTransport::ChannelTo(uint64_t id) {
  std::shared_ptr<peer::PeerSender> sender;
  {
    util::MutexLock l(&mu_);
    auto it = senders_.find(id);
    if (it == senders_.end()) return nullptr;
    sender = it->second;
  }
  return sender->Channel();
}

std::shared_ptr<PeerTransport::PeerStub> PeerTransport::StubTo(uint64_t id) {
  std::shared_ptr<grpc::Channel> channel = ChannelTo(id);
  if (!channel) return nullptr;
  {
    util::MutexLock l(&mu_);
    auto it = stubs_.find(id);
    if (it != stubs_.end() && it->second->channel == channel) return it->second;
  }
  // Made outside the lock; a stub made meanwhile by another caller for the
  // same channel is as good.
  auto made = std::make_shared<PeerStub>(PeerStub{channel, capstan::v1::Peer::NewStub(channel)});
  util::MutexLock l(&mu_);
  stubs_[id] = made;
  return made;
}

void PeerTransport::LeaseRenew(uint64_t leader, const etcdserverpb::LeaseKeepAliveRequest& request,
                               int64_t deadline_ms, LeaseRenewDone done) {
  std::shared_ptr<PeerStub> stub = StubTo(leader);
  if (!stub) {
    done(UnknownPeer(leader));
    return;
  }
  auto call = std::make_shared<LeaseCall>();
  PreparePeerCall(&call->context, leader, options_, deadline_ms);
  call->request = request;
  call->stub = std::move(stub);
  call->done = std::move(done);
  bool stopped;
  {
    util::MutexLock l(&mu_);
    stopped = stopped_;
    // Stop may cancel it from now on, even before it starts (gRPC then
    // cancels it as it starts).
    if (!stopped) lease_calls_.emplace(call.get(), call);
  }
  if (stopped) {
    call->done(absl::UnavailableError("the peer transport is stopped"));
    return;
  }
  call->stub->stub->async()->LeaseRenew(
      &call->context, &call->request, &call->response, [this, call, leader](grpc::Status status) {
        absl::Status s = PeerStatus(status, leader, "leader");
        if (s.ok()) {
          call->done(std::move(call->response));
        } else {
          call->done(std::move(s));
        }
        // Answered: Stop stops waiting for it.
        util::MutexLock l(&mu_);
        lease_calls_.erase(call.get());
      });
}

absl::Status PeerTransport::LeaseTimeToLive(uint64_t leader,
                                            const etcdserverpb::LeaseTimeToLiveRequest& request,
                                            etcdserverpb::LeaseTimeToLiveResponse* response,
                                            int64_t deadline_ms) {
  return CallPeer(ChannelTo(leader), leader, options_, deadline_ms,
                  [&](capstan::v1::Peer::Stub* stub, grpc::ClientContext* context) {
                    return stub->LeaseTimeToLive(context, request, response);
                  });
}

absl::StatusOr<std::vector<membership::ClusterMember>> PeerTransport::PromoteMember(
    uint64_t leader, uint64_t id, int64_t deadline_ms) {
  etcdserverpb::MemberPromoteRequest request;
  request.set_id(id);
  etcdserverpb::MemberPromoteResponse response;
  absl::Status s = CallPeer(ChannelTo(leader), leader, options_, deadline_ms,
                            [&](capstan::v1::Peer::Stub* stub, grpc::ClientContext* context) {
                              return stub->MemberPromote(context, request, &response);
                            });
  if (!s.ok()) {
    if (auto e = membership::ErrorOfText(std::string(s.message()))) return membership::MakeError(*e);
    return s;
  }
  std::vector<membership::ClusterMember> members;
  for (const auto& m : response.members()) members.push_back(membership::FromProto(m));
  return members;
}

absl::StatusOr<etcdserverpb::HashKVResponse> PeerTransport::PeerHashKV(uint64_t id,
                                                                         int64_t revision,
                                                                         int64_t deadline_ms) {
  etcdserverpb::HashKVRequest request;
  request.set_revision(revision);
  etcdserverpb::HashKVResponse response;
  absl::Status s = CallPeer(
      ChannelTo(id), id, options_, deadline_ms,
      [&](capstan::v1::Peer::Stub* stub, grpc::ClientContext* context) {
        return stub->HashKV(context, request, &response);
      },
      "peer");
  if (!s.ok()) return s;
  return response;
}

absl::Status PeerTransport::SendSnapshot(uint64_t to, const std::string& dir,
                                         const std::string& message, int64_t rate_bytes_per_sec) {
  std::shared_ptr<grpc::Channel> channel = ChannelTo(to);
  if (!channel) {
    return absl::UnavailableError(absl::StrCat("member ", peer::IdText(to), " is not a known peer"));
  }
  grpc::ClientContext context;
  context.AddMetadata(peer::kClusterIdKey, peer::IdText(options_.cluster_id));
  context.AddMetadata(peer::kFromKey, peer::IdText(options_.member_id));
  context.AddMetadata(peer::kToKey, peer::IdText(to));
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(absl::ToInt64Milliseconds(options_.snapshot_timeout)));
  auto stub = capstan::v1::Peer::NewStub(channel);
  capstan::v1::SnapshotEnd end;
  std::unique_ptr<grpc::ClientWriter<capstan::v1::SnapshotChunk>> writer =
      stub->Snapshot(&context, &end);
  absl::Status streamed = peer::StreamSnapshotFiles(
      dir, message, rate_bytes_per_sec,
      [&writer](const capstan::v1::SnapshotChunk& c) { return writer->Write(c); });
  if (!streamed.ok()) context.TryCancel();
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  if (!streamed.ok() && status.ok()) return streamed;
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("snapshot to ", peer::IdText(to), ": ", status.error_message()));
  }
  return absl::OkStatus();
}

std::vector<int> PeerTransport::BoundPorts() const { return ports_; }

absl::StatusOr<etcdserverpb::MemberListResponse> FetchClusterMembers(
    const std::optional<PeerTls>& tls, const std::vector<std::string>& urls,
    absl::Duration timeout) {
  std::shared_ptr<grpc::ChannelCredentials> tls_credentials;
  for (const std::string& url : urls) {
    auto [target, secure] = peer::Target(url);
    std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
    if (secure) {
      if (!tls_credentials) {
        if (tls) {
          auto made = PeerChannelCredentials(*tls);
          if (!made.ok()) return made.status();
          tls_credentials = *std::move(made);
        } else {
          tls_credentials = grpc::SslCredentials(grpc::SslCredentialsOptions());
        }
      }
      credentials = tls_credentials;
    }
    auto channel = grpc::CreateCustomChannel(target, credentials, peer::PeerChannelArguments());
    grpc::ClientContext context;
    context.set_wait_for_ready(true);
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout)));
    etcdserverpb::MemberListResponse response;
    const grpc::Status s =
        capstan::v1::Peer::NewStub(channel)->Members(&context, capstan::v1::MembersRequest(), &response);
    if (!s.ok()) {
      SPDLOG_WARN("failed to get cluster response from {}: {}", url, s.error_message());
      continue;
    }
    if (response.members_size() == 0) {
      SPDLOG_WARN("the member at {} listed no members", url);
      continue;
    }
    return response;
  }
  return absl::UnavailableError("could not retrieve cluster information from the given URLs");
}

}  // namespace capstan::server
