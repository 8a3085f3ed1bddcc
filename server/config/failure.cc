#include "server/config/failure.h"

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/config/config.h"

namespace capstan::server {
namespace config_internal {
namespace {

constexpr char kFailurePayload[] = "type.capstan.io/capstan.server.ConfigFailure";

}  // namespace

absl::Status Failure(absl::StatusCode code, int exit_code, bool print_usage, std::string msg) {
  absl::Status status(code, msg);
  status.SetPayload(kFailurePayload,
                    absl::Cord(absl::StrCat(exit_code, print_usage ? ",usage" : "")));
  return status;
}

absl::Status UsageError(std::string msg) {
  return Failure(absl::StatusCode::kInvalidArgument, 2, true, std::move(msg));
}

absl::Status VerifyError(std::string msg) {
  return Failure(absl::StatusCode::kInvalidArgument, 1, false, std::move(msg));
}

absl::Status RefusalError(std::string msg) {
  return Failure(absl::StatusCode::kUnimplemented, 1, false, std::move(msg));
}

}  // namespace config_internal

ConfigFailure GetConfigFailure(const absl::Status& status) {
  ConfigFailure failure;
  absl::optional<absl::Cord> payload = status.GetPayload(config_internal::kFailurePayload);
  if (!payload) return failure;
  std::string text(*payload);
  failure.print_usage = absl::EndsWith(text, ",usage");
  failure.exit_code = text[0] - '0';
  return failure;
}

}  // namespace capstan::server
