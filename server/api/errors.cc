#include "server/api/errors.h"

#include <string>

#include "auth/errors.h"
#include "membership/member_table.h"
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
    case Error::kCorrupt: return {grpc::DATA_LOSS, "etcdserver: corrupt cluster"};
    case Error::kRequestTooLarge:
      return {grpc::INVALID_ARGUMENT, "etcdserver: request is too large"};
    case Error::kLeaseNotFound: return {grpc::NOT_FOUND, "etcdserver: requested lease not found"};
    case Error::kLeaseExists: return {grpc::FAILED_PRECONDITION, "etcdserver: lease already exists"};
    case Error::kLeaseTtlTooLarge: return {grpc::OUT_OF_RANGE, "etcdserver: too large lease TTL"};
    case Error::kStopped: return {grpc::UNAVAILABLE, "etcdserver: server stopped"};
    case Error::kStorageFailed:
      return {grpc::UNAVAILABLE, "etcdserver: storage failed; writes are no longer accepted"};
    case Error::kTimeout: return {grpc::UNAVAILABLE, "etcdserver: request timed out"};
    case Error::kTimeoutLeaderFail:
      return {grpc::UNAVAILABLE,
              "etcdserver: request timed out, possibly due to previous leader failure"};
    case Error::kProposalDeadline:
      // etcd's raft node.Propose blocks while there is no leader; the
      // request's context ends it, and gRPC answers the context's error.
      return {grpc::DEADLINE_EXCEEDED, "context deadline exceeded"};
    case Error::kNoLeader: return {grpc::UNAVAILABLE, "etcdserver: no leader"};
    case Error::kTooManyRequests: return {grpc::RESOURCE_EXHAUSTED, "etcdserver: too many requests"};
    case Error::kLeaderChanged: return {grpc::UNAVAILABLE, "etcdserver: leader changed"};
    case Error::kNotLeader: return {grpc::FAILED_PRECONDITION, "etcdserver: not leader"};
    case Error::kBadLeaderTransferee:
      return {grpc::FAILED_PRECONDITION, "etcdserver: bad leader transferee"};
    case Error::kTimeoutLeaderTransfer:
      // Not in etcd's toGRPCErrorMap: togRPCError answers it as Unknown.
      return {grpc::UNKNOWN, "etcdserver: request timed out, leader transfer took too long"};
  }
  return {grpc::UNKNOWN, "etcdserver: unknown error"};
}

EtcdError EtcdErrorOf(auth::Error e) {
  using auth::Error;
  switch (e) {
    case Error::kRootUserNotExist:
      return {grpc::FAILED_PRECONDITION, "etcdserver: root user does not exist"};
    case Error::kRootRoleNotExist:
      return {grpc::FAILED_PRECONDITION, "etcdserver: root user does not have root role"};
    case Error::kUserAlreadyExist:
      return {grpc::FAILED_PRECONDITION, "etcdserver: user name already exists"};
    case Error::kUserEmpty: return {grpc::INVALID_ARGUMENT, "etcdserver: user name is empty"};
    case Error::kUserNotFound: return {grpc::FAILED_PRECONDITION, "etcdserver: user name not found"};
    case Error::kRoleAlreadyExist:
      return {grpc::FAILED_PRECONDITION, "etcdserver: role name already exists"};
    case Error::kRoleNotFound: return {grpc::FAILED_PRECONDITION, "etcdserver: role name not found"};
    case Error::kRoleEmpty: return {grpc::INVALID_ARGUMENT, "etcdserver: role name is empty"};
    case Error::kAuthFailed:
      return {grpc::INVALID_ARGUMENT,
              "etcdserver: authentication failed, invalid user ID or password"};
    case Error::kPermissionDenied: return {grpc::PERMISSION_DENIED, "etcdserver: permission denied"};
    case Error::kRoleNotGranted:
      return {grpc::FAILED_PRECONDITION, "etcdserver: role is not granted to the user"};
    case Error::kPermissionNotGranted:
      return {grpc::FAILED_PRECONDITION, "etcdserver: permission is not granted to the role"};
    case Error::kAuthNotEnabled:
      return {grpc::FAILED_PRECONDITION, "etcdserver: authentication is not enabled"};
    case Error::kInvalidAuthToken: return {grpc::UNAUTHENTICATED, "etcdserver: invalid auth token"};
    case Error::kInvalidAuthMgmt:
      return {grpc::INVALID_ARGUMENT, "etcdserver: invalid auth management"};
    case Error::kPermissionNotGiven:
      return {grpc::INVALID_ARGUMENT, "etcdserver: permission not given"};
    case Error::kAuthOldRevision:
      return {grpc::INVALID_ARGUMENT, "etcdserver: revision of auth store is old"};
  }
  return {grpc::UNKNOWN, "etcdserver: unknown error"};
}

// etcd's v3rpc toGRPCErrorMap for the membership errors.
EtcdError EtcdErrorOf(membership::Error e) {
  using membership::Error;
  switch (e) {
    case Error::kIdRemoved:
    case Error::kIdNotFound: return {grpc::NOT_FOUND, "etcdserver: member not found"};
    case Error::kIdExists: return {grpc::FAILED_PRECONDITION, "etcdserver: member ID already exist"};
    case Error::kPeerUrlExists:
      return {grpc::FAILED_PRECONDITION, "etcdserver: Peer URLs already exists"};
    case Error::kMemberNotLearner:
      return {grpc::FAILED_PRECONDITION, "etcdserver: can only promote a learner member"};
    case Error::kTooManyLearners:
      return {grpc::FAILED_PRECONDITION, "etcdserver: too many learner members in cluster"};
    case Error::kLearnerNotReady:
      return {grpc::FAILED_PRECONDITION,
              "etcdserver: can only promote a learner member which is in sync with leader"};
    case Error::kNotEnoughStarted:
      // etcd maps it to an rpctypes.EtcdError, which gRPC sends as Unknown.
      return {grpc::UNKNOWN, "etcdserver: re-configuration failed due to not enough started members"};
    case Error::kUnhealthy: return {grpc::UNAVAILABLE, "etcdserver: unhealthy cluster"};
    case Error::kBadUrls: return {grpc::INVALID_ARGUMENT, "etcdserver: given member URLs are invalid"};
    case Error::kNotSupportedForLearner:
      return {grpc::UNAVAILABLE, "etcdserver: rpc not supported for learner"};
    case Error::kMemberRemoved:
      return {grpc::UNAVAILABLE, "the member has been permanently removed from the cluster"};
  }
  return {grpc::UNKNOWN, "etcdserver: unknown error"};
}

}  // namespace

std::string EtcdInternalText(const absl::Status& s) {
  if (auto e = membership::ErrorOf(s)) {
    using membership::Error;
    switch (*e) {
      case Error::kIdRemoved: return "membership: ID removed";
      case Error::kIdExists: return "membership: ID exists";
      case Error::kIdNotFound: return "membership: ID not found";
      case Error::kPeerUrlExists: return "membership: peerURL exists";
      case Error::kMemberNotLearner: return "membership: can only promote a learner member";
      case Error::kTooManyLearners: return "membership: too many learner members in cluster";
      default: break;
    }
  }
  return ToGrpcStatus(s).error_message();
}

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  if (auto e = mvcc::ErrorOf(s)) {
    EtcdError ee = EtcdErrorOf(*e);
    return grpc::Status(ee.code, ee.text);
  }
  if (auto e = auth::ErrorOf(s)) {
    EtcdError ee = EtcdErrorOf(*e);
    return grpc::Status(ee.code, ee.text);
  }
  if (auto e = membership::ErrorOf(s)) {
    EtcdError ee = EtcdErrorOf(*e);
    return grpc::Status(ee.code, ee.text);
  }
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

absl::Status LearnerRefusal(const membership::MemberInfo* member) {
  if (member == nullptr || member->raft == nullptr || !member->raft->IsLearner()) {
    return absl::OkStatus();
  }
  return membership::MakeError(membership::Error::kNotSupportedForLearner);
}

bool RequiresLeader(const std::multimap<grpc::string_ref, grpc::string_ref>& client_metadata,
                    const membership::MemberInfo* member) {
  if (member == nullptr || member->raft == nullptr) return false;
  const auto it = client_metadata.find("hasleader");
  return it != client_metadata.end() && it->second == "true";
}

grpc::Status NoLeaderStatus() { return grpc::Status(grpc::UNAVAILABLE, "etcdserver: no leader"); }

grpc::Status ToUnconvertedAuthStatus(const absl::Status& s) {
  using auth::Error;
  auto e = auth::ErrorOf(s);
  if (!e) return ToGrpcStatus(s);
  switch (*e) {
    case Error::kUserEmpty:
    case Error::kUserNotFound:
    case Error::kPermissionDenied:
    case Error::kInvalidAuthToken:
      // auth's texts are etcd's auth texts without their package prefix.
      return grpc::Status(grpc::UNKNOWN, "auth: " + std::string(s.message()));
    default:
      return ToGrpcStatus(s);
  }
}

const char* GoCodeName(grpc::StatusCode code) {
  static const char* kNames[] = {"OK",
                                 "Canceled",
                                 "Unknown",
                                 "InvalidArgument",
                                 "DeadlineExceeded",
                                 "NotFound",
                                 "AlreadyExists",
                                 "PermissionDenied",
                                 "ResourceExhausted",
                                 "FailedPrecondition",
                                 "Aborted",
                                 "OutOfRange",
                                 "Unimplemented",
                                 "Internal",
                                 "Unavailable",
                                 "DataLoss",
                                 "Unauthenticated"};
  const int i = static_cast<int>(code);
  return i >= 0 && i <= 16 ? kNames[i] : "Unknown";
}

std::string GoErrorText(const grpc::Status& s) {
  return std::string("rpc error: code = ") + GoCodeName(s.error_code()) +
         " desc = " + s.error_message();
}

std::string WatchRefusalReason(const absl::Status& s) {
  using auth::Error;
  if (!auth::Is(s, Error::kInvalidAuthToken) && !auth::Is(s, Error::kAuthOldRevision) &&
      !auth::Is(s, Error::kUserEmpty)) {
    return GoErrorText(ToGrpcStatus(auth::MakeError(Error::kPermissionDenied)));
  }
  return GoErrorText(ToGrpcStatus(s));
}

}  // namespace capstan::server
