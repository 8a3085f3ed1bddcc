#include "server/errors.h"

#include <string>

#include "mvcc/errors.h"

namespace capstan::server {
namespace {

struct EtcdError {
  grpc::StatusCode code;
  const char* text;
};

// etcd's api/v3rpc/rpctypes/error.go, for the errors Capstan produces.
EtcdError EtcdErrorOf(mvcc::Error e) {
  using mvcc::Error;
  switch (e) {
    case Error::kEmptyKey: return {grpc::INVALID_ARGUMENT, "etcdserver: key is not provided"};
    case Error::kKeyNotFound: return {grpc::INVALID_ARGUMENT, "etcdserver: key not found"};
    case Error::kValueProvided: return {grpc::INVALID_ARGUMENT, "etcdserver: value is provided"};
    case Error::kLeaseProvided: return {grpc::INVALID_ARGUMENT, "etcdserver: lease is provided"};
    case Error::kTooManyOps:
      return {grpc::INVALID_ARGUMENT, "etcdserver: too many operations in txn request"};
    case Error::kDuplicateKey:
      return {grpc::INVALID_ARGUMENT, "etcdserver: duplicate key given in txn request"};
    case Error::kInvalidSortOption:
      return {grpc::INVALID_ARGUMENT, "etcdserver: invalid sort option"};
    case Error::kCompacted:
      return {grpc::OUT_OF_RANGE, "etcdserver: mvcc: required revision has been compacted"};
    case Error::kFutureRev:
      return {grpc::OUT_OF_RANGE, "etcdserver: mvcc: required revision is a future revision"};
    case Error::kNoSpace:
      return {grpc::RESOURCE_EXHAUSTED, "etcdserver: mvcc: database space exceeded"};
    case Error::kRequestTooLarge:
      return {grpc::INVALID_ARGUMENT, "etcdserver: request is too large"};
    case Error::kLeaseNotFound: return {grpc::NOT_FOUND, "etcdserver: requested lease not found"};
    case Error::kLeaseExists: return {grpc::FAILED_PRECONDITION, "etcdserver: lease already exists"};
    case Error::kLeaseTtlTooLarge: return {grpc::OUT_OF_RANGE, "etcdserver: too large lease TTL"};
    case Error::kStopped: return {grpc::UNAVAILABLE, "etcdserver: server stopped"};
    case Error::kStorageFailed:
      return {grpc::UNAVAILABLE, "etcdserver: storage failed; writes are no longer accepted"};
  }
  return {grpc::UNKNOWN, "etcdserver: unknown error"};
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  if (auto e = mvcc::ErrorOf(s)) {
    EtcdError ee = EtcdErrorOf(*e);
    return grpc::Status(ee.code, ee.text);
  }
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace capstan::server
