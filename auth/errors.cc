#include "auth/errors.h"

#include <string>

#include "util/status_payload.h"

namespace capstan::auth {
namespace {

constexpr char kPayloadUrl[] = "capstan.auth.Error";

struct ErrorInfo {
  absl::StatusCode code;
  const char* text;
};

ErrorInfo InfoOf(Error e) {
  switch (e) {
    case Error::kRootUserNotExist:
      return {absl::StatusCode::kFailedPrecondition, "root user does not exist"};
    case Error::kRootRoleNotExist:
      return {absl::StatusCode::kFailedPrecondition, "root user does not have root role"};
    case Error::kUserAlreadyExist:
      return {absl::StatusCode::kFailedPrecondition, "user name already exists"};
    case Error::kUserEmpty: return {absl::StatusCode::kInvalidArgument, "user name is empty"};
    case Error::kUserNotFound: return {absl::StatusCode::kFailedPrecondition, "user name not found"};
    case Error::kRoleAlreadyExist:
      return {absl::StatusCode::kFailedPrecondition, "role name already exists"};
    case Error::kRoleNotFound: return {absl::StatusCode::kFailedPrecondition, "role name not found"};
    case Error::kRoleEmpty: return {absl::StatusCode::kInvalidArgument, "role name is empty"};
    case Error::kAuthFailed:
      return {absl::StatusCode::kInvalidArgument,
              "authentication failed, invalid user ID or password"};
    case Error::kPermissionDenied: return {absl::StatusCode::kPermissionDenied, "permission denied"};
    case Error::kRoleNotGranted:
      return {absl::StatusCode::kFailedPrecondition, "role is not granted to the user"};
    case Error::kPermissionNotGranted:
      return {absl::StatusCode::kFailedPrecondition, "permission is not granted to the role"};
    case Error::kAuthNotEnabled:
      return {absl::StatusCode::kFailedPrecondition, "authentication is not enabled"};
    case Error::kInvalidAuthToken: return {absl::StatusCode::kUnauthenticated, "invalid auth token"};
    case Error::kInvalidAuthMgmt:
      return {absl::StatusCode::kInvalidArgument, "invalid auth management"};
    case Error::kPermissionNotGiven:
      return {absl::StatusCode::kInvalidArgument, "permission not given"};
    case Error::kAuthOldRevision:
      return {absl::StatusCode::kInvalidArgument, "revision of auth store is old"};
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

}  // namespace capstan::auth
