#include "watchcache/absl_compat.h"
#include "watchcache/errors.h"

#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace capstan::watchcache {
namespace {

constexpr char kPayloadUrl[] = "capstan.watchcache/CacheError";

absl::Status Make(absl::StatusCode code, std::string_view message, CacheError e) {
  absl::Status s(code, AV(message));
  s.SetPayload(kPayloadUrl, absl::Cord(std::to_string(static_cast<int>(e))));
  return s;
}

}  // namespace

absl::Status TooOldResourceVersion(int64_t requested, int64_t oldest) {
  return Make(absl::StatusCode::kOutOfRange,
              absl::StrCat("too old resource version: ", requested, " (", oldest, ")"),
              CacheError::kTooOldResourceVersion);
}

absl::Status TooLargeResourceVersion(int64_t requested, int64_t current) {
  return Make(absl::StatusCode::kDeadlineExceeded,
              absl::StrCat("Too large resource version: ", requested, ", current: ", current),
              CacheError::kTooLargeResourceVersion);
}

absl::Status ContinueExpired() {
  // kube-apiserver's text for an expired continue token.
  return Make(absl::StatusCode::kOutOfRange,
              "The provided continue parameter is too old to display a consistent list result. "
              "You can start a new list without the continue parameter, or use the continue value "
              "from the response to get a consistent snapshot.",
              CacheError::kContinueExpired);
}

absl::Status InvalidRequest(std::string_view message) {
  return Make(absl::StatusCode::kInvalidArgument, message, CacheError::kInvalidRequest);
}

absl::Status NotCached(std::string_view prefix) {
  return Make(absl::StatusCode::kNotFound, absl::StrCat("prefix is not cached: ", AV(prefix)),
              CacheError::kNotCached);
}

absl::Status NotReady() {
  return Make(absl::StatusCode::kUnavailable, "watch cache is not ready (initial list in progress)",
              CacheError::kNotReady);
}

absl::Status WatcherTooSlow(std::string_view reason) {
  return Make(absl::StatusCode::kResourceExhausted, reason, CacheError::kWatcherTooSlow);
}

absl::Status CacheReinitialized() {
  return Make(absl::StatusCode::kAborted,
              "watch cache re-initialized after its feed was compacted: watch again",
              CacheError::kCacheReinitialized);
}

absl::Status CacheStopped() {
  return Make(absl::StatusCode::kUnavailable, "watch cache stopped", CacheError::kStopped);
}

std::optional<CacheError> CacheErrorOf(const absl::Status& s) {
  auto p = s.GetPayload(kPayloadUrl);
  if (!p) return std::nullopt;
  int v = 0;
  if (!absl::SimpleAtoi(std::string(*p), &v)) return std::nullopt;
  return static_cast<CacheError>(v);
}

}  // namespace capstan::watchcache
