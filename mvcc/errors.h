// Named errors of the KV layer (auth/errors.h holds auth's).
//
// Expected failures are values with names (etcd's ErrCompacted,
// ErrFutureRev, ...). Each is an absl::Status carrying its Error as a
// payload; server/ maps an Error to etcd's gRPC code and exact text in one
// table, so the texts below are for logs and tests only.

#ifndef CAPSTAN_MVCC_ERRORS_H_
#define CAPSTAN_MVCC_ERRORS_H_

#include <optional>

#include "absl/status/status.h"

namespace capstan::mvcc {

enum class Error {
  kEmptyKey,          // etcdserver: key is not provided
  kKeyNotFound,       // etcdserver: key not found
  kValueProvided,     // etcdserver: value is provided
  kLeaseProvided,     // etcdserver: lease is provided
  kTooManyOps,        // etcdserver: too many operations in txn request
  kDuplicateKey,      // etcdserver: duplicate key given in txn request
  kInvalidSortOption, // etcdserver: invalid sort option
  kCompacted,         // etcdserver: mvcc: required revision has been compacted
  kFutureRev,         // etcdserver: mvcc: required revision is a future revision
  kNoSpace,           // etcdserver: mvcc: database space exceeded
  kCorrupt,           // etcdserver: corrupt cluster (a CORRUPT alarm is active)
  kRequestTooLarge,   // etcdserver: request is too large
  kLeaseNotFound,     // etcdserver: requested lease not found
  kLeaseExists,       // etcdserver: lease already exists
  kLeaseTtlTooLarge,  // etcdserver: too large lease TTL
  kStopped,           // etcdserver: server stopped
  kStorageFailed,     // the backend failed a write; the store no longer accepts writes
  // A cluster's (the write log's) errors.
  kTimeout,                // etcdserver: request timed out
  kTimeoutLeaderFail,      // etcdserver: request timed out, possibly due to previous leader failure
  kProposalDeadline,       // context deadline exceeded (never proposed: no leader until the deadline)
  kNoLeader,               // etcdserver: no leader
  kTooManyRequests,        // etcdserver: too many requests (apply far behind commit)
  kLeaderChanged,          // etcdserver: leader changed
  // MoveLeader's.
  kNotLeader,              // etcdserver: not leader
  kBadLeaderTransferee,    // etcdserver: bad leader transferee
  kTimeoutLeaderTransfer,  // etcdserver: request timed out, leader transfer took too long
};

// A Status carrying `e`.
absl::Status MakeError(Error e);
// The Error a status carries, if any.
std::optional<Error> ErrorOf(const absl::Status& s);
// True if s carries e.
bool Is(const absl::Status& s, Error e);

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_ERRORS_H_
