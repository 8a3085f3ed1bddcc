#include "auth/errors.h"

#include <string>

#include "absl/strings/cord.h"

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
  ErrorInfo info = InfoOf(e);
  absl::Status s(info.code, info.text);
  s.SetPayload(kPayloadUrl, absl::Cord(std::to_string(static_cast<int>(e))));
  return s;
}

std::optional<Error> ErrorOf(const absl::Status& s) {
  auto payload = s.GetPayload(kPayloadUrl);
  if (!payload) return std::nullopt;
  return static_cast<Error>(std::stoi(std::string(*payload)));
}

bool Is(const absl::Status& s, Error e) {
  auto got = ErrorOf(s);
  return got && *got == e;
}

}  // namespace capstan::auth
