// Named errors of auth (etcd's auth.Err*).
//
// As mvcc's: each is an absl::Status carrying its Error as a payload, mapped
// to etcd's gRPC code and exact text in server/api/errors.cc; the texts
// below are for logs and tests only.

#ifndef CAPSTAN_AUTH_ERRORS_H_
#define CAPSTAN_AUTH_ERRORS_H_

#include <optional>

#include "absl/status/status.h"

namespace capstan::auth {

enum class Error {
  kRootUserNotExist,      // etcdserver: root user does not exist
  kRootRoleNotExist,      // etcdserver: root user does not have root role
  kUserAlreadyExist,      // etcdserver: user name already exists
  kUserEmpty,             // etcdserver: user name is empty
  kUserNotFound,          // etcdserver: user name not found
  kRoleAlreadyExist,      // etcdserver: role name already exists
  kRoleNotFound,          // etcdserver: role name not found
  kRoleEmpty,             // etcdserver: role name is empty
  kAuthFailed,            // etcdserver: authentication failed, invalid user ID or password
  kPermissionDenied,      // etcdserver: permission denied
  kRoleNotGranted,        // etcdserver: role is not granted to the user
  kPermissionNotGranted,  // etcdserver: permission is not granted to the role
  kAuthNotEnabled,        // etcdserver: authentication is not enabled
  kInvalidAuthToken,      // etcdserver: invalid auth token
  kInvalidAuthMgmt,       // etcdserver: invalid auth management
  kPermissionNotGiven,    // etcdserver: permission not given
  kAuthOldRevision,       // etcdserver: revision of auth store is old
};

// A Status carrying `e`.
absl::Status MakeError(Error e);
// The Error a status carries, if any.
std::optional<Error> ErrorOf(const absl::Status& s);
// True if s carries e.
bool Is(const absl::Status& s, Error e);

}  // namespace capstan::auth

#endif  // CAPSTAN_AUTH_ERRORS_H_
