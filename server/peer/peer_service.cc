#include "server/peer/peer_service.h"

#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "server/peer/peer_protocol.h"
#include "server/peer/peer_snapshot.h"
#include "server/peer/peer_tls.h"
#include "spdlog/spdlog.h"
#include "util/mutex.h"

namespace capstan::server::peer {
namespace {

std::string_view Metadata(const grpc::ServerContextBase& context, const char* key) {
  const auto& md = context.client_metadata();
  auto it = md.find(key);
  if (it == md.end()) return {};
  return std::string_view(it->second.data(), it->second.size());
}

grpc::Status ToGrpc(const absl::Status& s) {
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// The IP of a gRPC peer string ("ipv4:127.0.0.1:5000", "ipv6:[::1]:5000").
std::string CallerHost(const std::string& peer) {
  std::string_view p = peer;
  const size_t colon = p.find(':');
  if (colon != std::string_view::npos) p.remove_prefix(colon + 1);
  if (!p.empty() && p[0] == '[') {
    const size_t close = p.find(']');
    return std::string(p.substr(1, close == std::string_view::npos ? p.size() - 1 : close - 1));
  }
  const size_t port = p.rfind(':');
  return std::string(port == std::string_view::npos ? p : p.substr(0, port));
}

}  // namespace

PeerService::PeerService(uint64_t local_id, uint64_t cluster_id,
                         const replication::TransportHandler* handler,
                         std::function<bool(uint64_t)> is_removed, bool check_client_san)
    : local_id_(local_id),
      cluster_id_(cluster_id),
      handler_(handler),
      is_removed_(std::move(is_removed)),
      check_client_san_(check_client_san),
      snapshots_(1, "peer-snapshot") {}

grpc::Status PeerService::Admit(const grpc::ServerContextBase& context, uint64_t* from) const {
  if (check_client_san_) {
    // etcd checks the connection, before any request: here, every call.
    const auto auth = context.auth_context();
    const auto pem = auth ? auth->FindPropertyValues("x509_pem_cert")
                          : std::vector<grpc::string_ref>{};
    if (!pem.empty()) {
      const std::string host = CallerHost(context.peer());
      const std::string why = PeerAddressMismatch(std::string_view(pem[0].data(), pem[0].size()), host);
      if (!why.empty()) {
        SPDLOG_WARN("rejected connection from {}: {}", host, why);
        return grpc::Status(grpc::UNAUTHENTICATED, why);
      }
    }
  }
  return AdmitIdentity(Metadata(context, kClusterIdKey), Metadata(context, kFromKey),
                       Metadata(context, kToKey), from);
}

grpc::Status PeerService::AdmitIdentity(std::string_view cluster, std::string_view sender_text,
                                        std::string_view to, uint64_t* from) const {
  // rafthttp's order: cluster compatibility, the sender's ID, removal, then
  // whom the request is for.
  if (ParseIdText(cluster) != cluster_id_) {
    SPDLOG_WARN("request cluster ID mismatch (local member {}, local cluster {}, remote cluster {})",
                IdText(local_id_), IdText(cluster_id_), cluster);
    return grpc::Status(grpc::FAILED_PRECONDITION, kClusterIdMismatch);
  }
  const auto sender = ParseIdText(sender_text);
  if (!sender) return grpc::Status(grpc::INVALID_ARGUMENT, kInvalidFrom);
  if (is_removed_(*sender)) {
    SPDLOG_WARN("rejected request from remote peer {} because it was removed (local member {})",
                IdText(*sender), IdText(local_id_));
    return grpc::Status(grpc::PERMISSION_DENIED, kMemberRemoved);
  }
  if (ParseIdText(to) != local_id_) {
    SPDLOG_WARN("ignored request from {}; ID mismatch (local member {}, x-raft-to {})",
                IdText(*sender), IdText(local_id_), to);
    return grpc::Status(grpc::FAILED_PRECONDITION, kToFieldMismatch);
  }
  *from = *sender;
  return grpc::Status::OK;
}

std::atomic<uint64_t>* PeerService::ReceivedCounter(uint64_t from) const {
  util::MutexLock l(&received_mu_);
  auto& counter = received_[from];
  if (!counter) counter = std::make_unique<std::atomic<uint64_t>>(0);
  return counter.get();
}

std::vector<std::pair<uint64_t, uint64_t>> PeerService::ReceivedBytes() const {
  std::vector<std::pair<uint64_t, uint64_t>> bytes;
  util::MutexLock l(&received_mu_);
  for (const auto& [from, counter] : received_) {
    bytes.emplace_back(from, counter->load(std::memory_order_relaxed));
  }
  return bytes;
}

grpc::Status PeerService::HandleBatch(uint64_t from, capstan::v1::RaftBatch* batch,
                                      std::atomic<uint64_t>* received) const {
  if (is_removed_(from)) return grpc::Status(grpc::PERMISSION_DENIED, kMemberRemoved);
  for (std::string& message : *batch->mutable_messages()) {
    if (grpc::Status s = HandleMessage(from, std::move(message), received); !s.ok()) return s;
  }
  return grpc::Status::OK;
}

grpc::Status PeerService::HandleMessage(uint64_t from, std::string message,
                                        std::atomic<uint64_t>* received) const {
  uint64_t to = 0, message_from = 0;
  if (!ReadMessageAddresses(message, &to, &message_from)) {
    return grpc::Status(grpc::INVALID_ARGUMENT, "error unmarshalling raft message");
  }
  if (to != local_id_ || message_from != from) {
    return grpc::Status(grpc::FAILED_PRECONDITION, kToFieldMismatch);
  }
  // Counted as etcd counts them: each message handed on, once.
  received->fetch_add(message.size(), std::memory_order_relaxed);
  if (handler_->on_message) handler_->on_message(from, std::move(message));
  return grpc::Status::OK;
}

// A Raft stream: one read in flight; each batch goes to the handler, in
// order, on the callback thread that read it, before the next read starts.
class PeerService::RaftReactor final : public grpc::ServerReadReactor<capstan::v1::RaftBatch> {
 public:
  RaftReactor(const PeerService* service, grpc::CallbackServerContext* context)
      : service_(service) {
    if (grpc::Status s = service->Admit(*context, &from_); !s.ok()) {
      Finish(s);
      return;
    }
    // Accepted: say so at once (the sender waits for this before it writes).
    received_ = service->ReceivedCounter(from_);
    context->AddInitialMetadata(kClusterIdKey, IdText(service->cluster_id_));
    StartSendInitialMetadata();
    StartRead(&batch_);
  }

  void OnReadDone(bool ok) override {
    // The sender closed the stream, or it broke.
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    if (grpc::Status s = service_->HandleBatch(from_, &batch_, received_); !s.ok()) {
      Finish(s);
      return;
    }
    StartRead(&batch_);  // parsing the next batch clears this one
  }

  void OnDone() override { delete this; }

 private:
  const PeerService* const service_;
  uint64_t from_ = 0;
  std::atomic<uint64_t>* received_ = nullptr;  // set once admitted
  capstan::v1::RaftBatch batch_;
};

// A Snapshot stream. Admitted on the callback thread; then its turn on the
// snapshot thread, which receives the files with ReceiveSnapshotFiles: each
// read it asks for is started there and waited for there, so only that
// thread waits (for the network and the disk), never a callback thread.
class PeerService::SnapshotReactor final
    : public grpc::ServerReadReactor<capstan::v1::SnapshotChunk> {
 public:
  SnapshotReactor(PeerService* service, grpc::CallbackServerContext* context) {
    uint64_t from = 0;
    if (grpc::Status s = service->Admit(*context, &from); !s.ok()) {
      Finish(s);
      return;
    }
    if (service->handler_->snapshot_dir.empty() || !service->handler_->on_snapshot) {
      Finish(grpc::Status(grpc::UNIMPLEMENTED, "snapshots are not accepted"));
      return;
    }
    service->snapshots_.RunOrCancel([this, service, from](bool run) {
      if (!run) {
        // Touches nothing of the service: it is on its way out.
        Finish(grpc::Status(grpc::UNAVAILABLE, "the peer service stopped"));
        return;
      }
      // The last use of this reactor: OnDone may delete it once Finish
      // is called.
      Finish(Receive(*service, from));
    });
  }

  void OnReadDone(bool ok) override {
    util::MutexLock l(&mu_);
    read_ok_ = ok;
    read_done_ = true;
  }

  void OnDone() override { delete this; }

 private:
  // On the snapshot thread: the files into snapshot_dir, then on_snapshot.
  grpc::Status Receive(const PeerService& service, uint64_t from) {
    const replication::TransportHandler& handler = *service.handler_;
    std::string message;
    absl::Status s = ReceiveSnapshotFiles(
        handler.snapshot_dir, [this](capstan::v1::SnapshotChunk* c) { return Read(c); },
        &message);
    if (!s.ok()) return ToGrpc(s);
    uint64_t to = 0, message_from = 0;
    if (!ReadMessageAddresses(message, &to, &message_from)) {
      return grpc::Status(grpc::INVALID_ARGUMENT, "error unmarshalling raft message");
    }
    if (to != service.local_id_ || message_from != from) {
      return grpc::Status(grpc::FAILED_PRECONDITION, kToFieldMismatch);
    }
    return ToGrpc(handler.on_snapshot(from, std::move(message)));
  }

  // On the snapshot thread: waits for the next chunk; false when the stream
  // ended (the sender closed it, it broke, or the server is stopping).
  bool Read(capstan::v1::SnapshotChunk* chunk) {
    {
      util::MutexLock l(&mu_);
      read_done_ = false;
    }
    StartRead(chunk);
    util::MutexLock l(&mu_);
    mu_.Await(absl::Condition(&read_done_));
    return read_ok_;
  }

  // Hands each read's end from the callback thread to the snapshot thread.
  util::Mutex mu_;
  bool read_done_ ABSL_GUARDED_BY(mu_) = false;
  bool read_ok_ ABSL_GUARDED_BY(mu_) = false;
};

grpc::ServerReadReactor<capstan::v1::RaftBatch>* PeerService::Raft(
    grpc::CallbackServerContext* context, capstan::v1::RaftStreamEnd*) {
  return new RaftReactor(this, context);
}

grpc::ServerReadReactor<capstan::v1::SnapshotChunk>* PeerService::Snapshot(
    grpc::CallbackServerContext* context, capstan::v1::SnapshotEnd*) {
  return new SnapshotReactor(this, context);
}

grpc::ServerUnaryReactor* PeerService::LeaseRenew(
    grpc::CallbackServerContext* context, const etcdserverpb::LeaseKeepAliveRequest* request,
    etcdserverpb::LeaseKeepAliveResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  uint64_t from = 0;
  grpc::Status s = Admit(*context, &from);
  if (s.ok() && !handler_->on_lease_renew) s = grpc::Status(grpc::UNIMPLEMENTED, "no lease handler");
  if (!s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  // The leader answers from its lessor once a ReadIndex round has confirmed
  // that it leads (replication/replicator.cc).
  handler_->on_lease_renew(*request, response,
                           [reactor](absl::Status st) { reactor->Finish(ToGrpc(st)); });
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::LeaseTimeToLive(
    grpc::CallbackServerContext* context, const etcdserverpb::LeaseTimeToLiveRequest* request,
    etcdserverpb::LeaseTimeToLiveResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  uint64_t from = 0;
  grpc::Status s = Admit(*context, &from);
  if (s.ok()) {
    s = handler_->on_lease_time_to_live
            ? ToGrpc(handler_->on_lease_time_to_live(*request, response))
            : grpc::Status(grpc::UNIMPLEMENTED, "no lease handler");
  }
  reactor->Finish(s);
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::MemberPromote(
    grpc::CallbackServerContext* context, const etcdserverpb::MemberPromoteRequest* request,
    etcdserverpb::MemberPromoteResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  uint64_t from = 0;
  if (grpc::Status s = Admit(*context, &from); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  if (!handler_->on_member_promote) {
    reactor->Finish(grpc::Status(grpc::UNIMPLEMENTED, "no membership handler"));
    return reactor;
  }
  handler_->on_member_promote(
      request->id(),
      [reactor, response](absl::StatusOr<std::vector<membership::ClusterMember>> members) {
        if (!members.ok()) {
          reactor->Finish(ToGrpc(members.status()));
          return;
        }
        for (const auto& m : *members) membership::ToProto(m, response->add_members());
        reactor->Finish(grpc::Status::OK);
      });
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::Members(grpc::CallbackServerContext* context,
                                               const capstan::v1::MembersRequest*,
                                               etcdserverpb::MemberListResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  response->mutable_header()->set_cluster_id(cluster_id_);
  response->mutable_header()->set_member_id(local_id_);
  if (handler_->on_members) {
    for (const auto& m : handler_->on_members()) membership::ToProto(m, response->add_members());
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::Probe(grpc::CallbackServerContext* context,
                                             const capstan::v1::ProbeRequest*,
                                             capstan::v1::ProbeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  response->set_unix_nanos(absl::ToUnixNanos(absl::Now()));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* PeerService::HashKV(grpc::CallbackServerContext* context,
                                              const etcdserverpb::HashKVRequest* request,
                                              etcdserverpb::HashKVResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  uint64_t from = 0;
  if (grpc::Status s = Admit(*context, &from); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  if (!handler_->on_hash_kv) {
    reactor->Finish(grpc::Status(grpc::UNIMPLEMENTED, "no hash handler"));
    return reactor;
  }
  handler_->on_hash_kv(*request, response,
                       [reactor](absl::Status s) { reactor->Finish(ToGrpc(s)); });
  return reactor;
}

}  // namespace capstan::server::peer
