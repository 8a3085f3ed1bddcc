#include "server/peer/peer_service.h"

#include <string>
#include <utility>

#include "server/peer/peer_protocol.h"
#include "server/peer/peer_snapshot.h"
#include "server/peer/peer_tls.h"
#include "spdlog/spdlog.h"

namespace capstan::server::peer {
namespace {

std::string_view Metadata(const grpc::ServerContext& context, const char* key) {
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
      check_client_san_(check_client_san) {}

grpc::Status PeerService::Admit(const grpc::ServerContext& context, uint64_t* from) const {
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
  // rafthttp's order: cluster compatibility, the sender's ID, removal, then
  // whom the request is for.
  const std::string_view cluster = Metadata(context, kClusterIdKey);
  if (ParseIdText(cluster) != cluster_id_) {
    SPDLOG_WARN("request cluster ID mismatch (local member {}, local cluster {}, remote cluster {})",
                IdText(local_id_), IdText(cluster_id_), cluster);
    return grpc::Status(grpc::FAILED_PRECONDITION, kClusterIdMismatch);
  }
  const auto sender = ParseIdText(Metadata(context, kFromKey));
  if (!sender) return grpc::Status(grpc::INVALID_ARGUMENT, kInvalidFrom);
  if (is_removed_(*sender)) {
    SPDLOG_WARN("rejected request from remote peer {} because it was removed (local member {})",
                IdText(*sender), IdText(local_id_));
    return grpc::Status(grpc::PERMISSION_DENIED, kMemberRemoved);
  }
  if (ParseIdText(Metadata(context, kToKey)) != local_id_) {
    SPDLOG_WARN("ignored request from {}; ID mismatch (local member {}, x-raft-to {})",
                IdText(*sender), IdText(local_id_), Metadata(context, kToKey));
    return grpc::Status(grpc::FAILED_PRECONDITION, kToFieldMismatch);
  }
  *from = *sender;
  return grpc::Status::OK;
}

grpc::Status PeerService::Raft(grpc::ServerContext* context,
                               grpc::ServerReader<capstan::v1::RaftBatch>* reader,
                               capstan::v1::RaftStreamEnd*) {
  uint64_t from = 0;
  if (grpc::Status s = Admit(*context, &from); !s.ok()) return s;
  // Accepted: say so at once (the sender waits for this before it writes).
  context->AddInitialMetadata(kClusterIdKey, IdText(cluster_id_));
  reader->SendInitialMetadata();
  capstan::v1::RaftBatch batch;
  while (reader->Read(&batch)) {
    if (is_removed_(from)) return grpc::Status(grpc::PERMISSION_DENIED, kMemberRemoved);
    for (std::string& message : *batch.mutable_messages()) {
      uint64_t to = 0, message_from = 0;
      if (!ReadMessageAddresses(message, &to, &message_from)) {
        return grpc::Status(grpc::INVALID_ARGUMENT, "error unmarshalling raft message");
      }
      if (to != local_id_ || message_from != from) {
        return grpc::Status(grpc::FAILED_PRECONDITION, kToFieldMismatch);
      }
      if (handler_->on_message) handler_->on_message(from, std::move(message));
    }
  }
  return grpc::Status::OK;
}

grpc::Status PeerService::Snapshot(grpc::ServerContext* context,
                                   grpc::ServerReader<capstan::v1::SnapshotChunk>* reader,
                                   capstan::v1::SnapshotEnd*) {
  uint64_t from = 0;
  if (grpc::Status s = Admit(*context, &from); !s.ok()) return s;
  if (handler_->snapshot_dir.empty() || !handler_->on_snapshot) {
    return grpc::Status(grpc::UNIMPLEMENTED, "snapshots are not accepted");
  }
  util::MutexLock l(&snapshot_mu_);
  std::string message;
  absl::Status s = ReceiveSnapshotFiles(
      handler_->snapshot_dir, [reader](capstan::v1::SnapshotChunk* c) { return reader->Read(c); },
      &message);
  if (s.ok()) {
    uint64_t to = 0, message_from = 0;
    if (!ReadMessageAddresses(message, &to, &message_from)) {
      return grpc::Status(grpc::INVALID_ARGUMENT, "error unmarshalling raft message");
    }
    if (to != local_id_ || message_from != from) {
      return grpc::Status(grpc::FAILED_PRECONDITION, kToFieldMismatch);
    }
    s = handler_->on_snapshot(from, std::move(message));
  }
  return ToGrpc(s);
}

grpc::Status PeerService::LeaseRenew(grpc::ServerContext* context,
                                     const etcdserverpb::LeaseKeepAliveRequest* request,
                                     etcdserverpb::LeaseKeepAliveResponse* response) {
  uint64_t from = 0;
  if (grpc::Status s = Admit(*context, &from); !s.ok()) return s;
  if (!handler_->on_lease_renew) return grpc::Status(grpc::UNIMPLEMENTED, "no lease handler");
  return ToGrpc(handler_->on_lease_renew(*request, response));
}

grpc::Status PeerService::LeaseTimeToLive(grpc::ServerContext* context,
                                          const etcdserverpb::LeaseTimeToLiveRequest* request,
                                          etcdserverpb::LeaseTimeToLiveResponse* response) {
  uint64_t from = 0;
  if (grpc::Status s = Admit(*context, &from); !s.ok()) return s;
  if (!handler_->on_lease_time_to_live) {
    return grpc::Status(grpc::UNIMPLEMENTED, "no lease handler");
  }
  return ToGrpc(handler_->on_lease_time_to_live(*request, response));
}

}  // namespace capstan::server::peer
