// PeerService: the receiving half of the peer transport, the
// capstan.v1.Peer service (proto/capstan/v1/peer.proto) on the peer URLs.
//
// Every call is admitted first, as etcd's peer listener and rafthttp admit
// a request: a client certificate must name the caller's address (unless
// --peer-skip-client-san-verification), then the sender's
// cluster ID must be this member's ("cluster ID mismatch"), the sender must
// not be a removed member ("the member has been permanently removed from
// the cluster"), and the call must be addressed to this member ("to field
// mismatch"). A refused call never reaches the handler. On an accepted Raft
// stream each message's own `to` and `from` are checked too, and the
// removal check is repeated for every batch, so a member removed while its
// stream is open is cut off at its next batch.
//
// Thread safety: gRPC calls the methods concurrently from its server
// threads (the synchronous API: one thread per open Raft stream). They call
// the handler's callbacks on those threads, under no lock; the callbacks
// must enqueue and return (replication/transport.h).

#ifndef CAPSTAN_SERVER_PEER_PEER_SERVICE_H_
#define CAPSTAN_SERVER_PEER_PEER_SERVICE_H_

#include <cstdint>
#include <functional>

#include "capstan/v1/peer.grpc.pb.h"
#include "replication/transport.h"
#include "util/mutex.h"

namespace capstan::server::peer {

class PeerService final : public capstan::v1::Peer::Service {
 public:
  // is_removed answers whether a member ID was removed from the cluster; it
  // is called for every call and every batch and must be cheap. handler
  // and is_removed must outlive the service's server.
  // check_client_san: a caller's client certificate must name the address
  // it calls from (etcd's checkSAN; PeerAddressMismatch), else
  // UNAUTHENTICATED with the reason.
  PeerService(uint64_t local_id, uint64_t cluster_id, const replication::TransportHandler* handler,
              std::function<bool(uint64_t)> is_removed, bool check_client_san);

  grpc::Status Raft(grpc::ServerContext* context, grpc::ServerReader<capstan::v1::RaftBatch>* reader,
                    capstan::v1::RaftStreamEnd* response) override;
  grpc::Status LeaseRenew(grpc::ServerContext* context,
                          const etcdserverpb::LeaseKeepAliveRequest* request,
                          etcdserverpb::LeaseKeepAliveResponse* response) override;
  grpc::Status LeaseTimeToLive(grpc::ServerContext* context,
                               const etcdserverpb::LeaseTimeToLiveRequest* request,
                               etcdserverpb::LeaseTimeToLiveResponse* response) override;
  // Receives into handler->snapshot_dir (one snapshot at a time), then calls
  // handler->on_snapshot.
  grpc::Status Snapshot(grpc::ServerContext* context,
                        grpc::ServerReader<capstan::v1::SnapshotChunk>* reader,
                        capstan::v1::SnapshotEnd* response) override;

 private:
  // Admits a call: OK and the sender's ID in *from, or the refusal.
  grpc::Status Admit(const grpc::ServerContext& context, uint64_t* from) const;

  const uint64_t local_id_;
  const uint64_t cluster_id_;
  const replication::TransportHandler* const handler_;
  const std::function<bool(uint64_t)> is_removed_;
  const bool check_client_san_;
  // Held while a snapshot is received: one at a time into snapshot_dir.
  util::Mutex snapshot_mu_;
};

}  // namespace capstan::server::peer

#endif  // CAPSTAN_SERVER_PEER_PEER_SERVICE_H_
