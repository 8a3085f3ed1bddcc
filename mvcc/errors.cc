#include "mvcc/errors.h"

#include <string>

#include "util/status_payload.h"

namespace capstan::mvcc {
namespace {

constexpr char kPayloadUrl[] = "capstan.mvcc.Error";

struct ErrorInfo {
  absl::StatusCode code;
  const char* text;
};

ErrorInfo InfoOf(Error e) {
  switch (e) {
    case Error::kEmptyKey: return {absl::StatusCode::kInvalidArgument, "key is not provided"};
    case Error::kKeyNotFound: return {absl::StatusCode::kInvalidArgument, "key not found"};
    case Error::kValueProvided: return {absl::StatusCode::kInvalidArgument, "value is provided"};
    case Error::kLeaseProvided: return {absl::StatusCode::kInvalidArgument, "lease is provided"};
    case Error::kTooManyOps:
      return {absl::StatusCode::kInvalidArgument, "too many operations in txn request"};
    case Error::kDuplicateKey:
      return {absl::StatusCode::kInvalidArgument, "duplicate key given in txn request"};
    case Error::kInvalidSortOption:
      return {absl::StatusCode::kInvalidArgument, "invalid sort option"};
    case Error::kCompacted:
      return {absl::StatusCode::kOutOfRange, "mvcc: required revision has been compacted"};
    case Error::kFutureRev:
      return {absl::StatusCode::kOutOfRange, "mvcc: required revision is a future revision"};
    case Error::kNoSpace: return {absl::StatusCode::kResourceExhausted, "mvcc: database space exceeded"};
    case Error::kCorrupt: return {absl::StatusCode::kDataLoss, "corrupt cluster"};
    case Error::kRequestTooLarge: return {absl::StatusCode::kInvalidArgument, "request is too large"};
    case Error::kLeaseNotFound: return {absl::StatusCode::kNotFound, "requested lease not found"};
    case Error::kLeaseExists: return {absl::StatusCode::kFailedPrecondition, "lease already exists"};
    case Error::kLeaseTtlTooLarge: return {absl::StatusCode::kOutOfRange, "too large lease TTL"};
    case Error::kStopped: return {absl::StatusCode::kUnavailable, "server stopped"};
    case Error::kStorageFailed:
      return {absl::StatusCode::kUnavailable, "storage failed; writes are no longer accepted"};
    case Error::kTimeout: return {absl::StatusCode::kUnavailable, "request timed out"};
    case Error::kTimeoutLeaderFail:
      return {absl::StatusCode::kUnavailable,
              "request timed out, possibly due to previous leader failure"};
    case Error::kProposalDeadline:
      return {absl::StatusCode::kDeadlineExceeded, "context deadline exceeded"};
    case Error::kNoLeader: return {absl::StatusCode::kUnavailable, "no leader"};
    case Error::kTooManyRequests: return {absl::StatusCode::kResourceExhausted, "too many requests"};
    case Error::kLeaderChanged: return {absl::StatusCode::kUnavailable, "leader changed"};
    case Error::kNotLeader: return {absl::StatusCode::kFailedPrecondition, "not leader"};
    case Error::kBadLeaderTransferee:
      return {absl::StatusCode::kFailedPrecondition, "bad leader transferee"};
    case Error::kTimeoutLeaderTransfer:
      return {absl::StatusCode::kDeadlineExceeded,
              "request timed out, leader transfer took too long"};
  }
  return {absl::StatusCode::kUnknown, "unknown error"};
}

}  // namespace

absl::Status MakeError(Error e) {
  const ErrorInfo info = InfoOf(e);
  return util::StatusWithPayload(info.code, info.text, kPayloadUrl, e);
}

std::optional<Error> ErrorOf(const absl::Status& s) {
  return util::PayloadOf<Error>(s, kPayloadUrl);
}

bool Is(const absl::Status& s, Error e) {
  auto got = ErrorOf(s);
  return got && *got == e;
}

}  // namespace capstan::mvcc
