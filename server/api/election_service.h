// v3electionpb.Election over the gRPC callback API: etcd's leader election,
// run as its clientv3/concurrency election recipe inside the server
// (server/api/recipes.h).
//
// A candidate's key is "<name>/<lease in hex>", attached to its lease (0: a
// lease of 60 s is granted first); the oldest key under "<name>/" leads.
// Campaign answers once the caller leads; Proclaim and Resign act on a
// leader key only while its create revision is the one given; Leader reads
// the current leader, and Observe streams each leader and each value it
// proclaims. Errors reach the client as etcd's do, code Unknown with their
// text ("election: no leader", "election: not leader").

#ifndef CAPSTAN_SERVER_API_ELECTION_SERVICE_H_
#define CAPSTAN_SERVER_API_ELECTION_SERVICE_H_

#include "server/api/recipes.h"
#include "v3electionpb/v3election.grpc.pb.h"

namespace capstan::server {

using ElectionServiceBase = v3electionpb::Election::WithRawCallbackMethod_Campaign<
    v3electionpb::Election::WithRawCallbackMethod_Proclaim<
        v3electionpb::Election::WithRawCallbackMethod_Leader<
            v3electionpb::Election::WithRawCallbackMethod_Observe<
                v3electionpb::Election::WithRawCallbackMethod_Resign<
                    v3electionpb::Election::Service>>>>>;

// Thread-safe. recipes must outlive the service.
class ElectionService final : public ElectionServiceBase {
 public:
  explicit ElectionService(Recipes* recipes) : recipes_(recipes) {}

  grpc::ServerUnaryReactor* Campaign(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Proclaim(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Leader(grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Observe(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Resign(grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;

 private:
  Recipes* const recipes_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_ELECTION_SERVICE_H_
