// v3lockpb.Lock over the gRPC callback API: etcd's distributed lock, run as
// its clientv3/concurrency mutex recipe inside the server (server/api/recipes.h).
//
// Lock(name, lease) puts the key "<name>/<lease in hex>" attached to the
// lease (0: a lease of 60 s is granted first), unless that key exists
// already, and answers once no older key is left under "<name>/": the
// oldest key holds the lock and the others wait in create-revision order.
// A waiter whose client goes away deletes its key. Unlock(key) deletes the
// key. Errors reach the client as etcd's do, code Unknown with their text.

#ifndef CAPSTAN_SERVER_API_LOCK_SERVICE_H_
#define CAPSTAN_SERVER_API_LOCK_SERVICE_H_

#include "server/api/recipes.h"
#include "v3lockpb/v3lock.grpc.pb.h"

namespace capstan::server {

using LockServiceBase = v3lockpb::Lock::WithRawCallbackMethod_Lock<
    v3lockpb::Lock::WithRawCallbackMethod_Unlock<v3lockpb::Lock::Service>>;

// Thread-safe. recipes must outlive the service.
class LockService final : public LockServiceBase {
 public:
  explicit LockService(Recipes* recipes) : recipes_(recipes) {}

  grpc::ServerUnaryReactor* Lock(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                 grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Unlock(grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;

 private:
  Recipes* const recipes_;
};

}  // namespace capstan::server

#endif  // CAPSTAN_SERVER_API_LOCK_SERVICE_H_
