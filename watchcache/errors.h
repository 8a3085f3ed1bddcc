// Named errors of the watch cache.
//
// Like mvcc/errors.h: each expected failure is an absl::Status carrying a
// CacheError payload. The status code and message are already the ones the
// Kubernetes API server uses for the same condition (kube-apiserver's
// storage/cacher texts), so server/ can pass them through unchanged; the
// payload lets callers and tests tell the cases apart without parsing text.

#ifndef CAPSTAN_WATCHCACHE_ERRORS_H_
#define CAPSTAN_WATCHCACHE_ERRORS_H_

#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/status/status.h"

namespace capstan::watchcache {

enum class CacheError {
  // 410 Gone / Expired: the requested revision is older than the cache's
  // history ("too old resource version: R (OLDEST)"). OUT_OF_RANGE.
  kTooOldResourceVersion,
  // 504 Timeout: the cache did not reach the requested revision in time
  // ("Too large resource version: R, current: C"). DEADLINE_EXCEEDED.
  kTooLargeResourceVersion,
  // 410 Gone: a continue token whose revision the cache no longer holds.
  kContinueExpired,
  // 400: a malformed continue token, selector or resourceVersion.
  // INVALID_ARGUMENT.
  kInvalidRequest,
  // The prefix is not under any cached resource prefix. NOT_FOUND.
  kNotCached,
  // The cache has not finished its initial list yet. UNAVAILABLE.
  kNotReady,
  // A watcher was cut off: too slow, or its cache was re-listed.
  // RESOURCE_EXHAUSTED (slow) or ABORTED (re-list).
  kWatcherTooSlow,
  kCacheReinitialized,
  // The cache is shutting down. UNAVAILABLE.
  kStopped,
};

absl::Status TooOldResourceVersion(int64_t requested, int64_t oldest);
absl::Status TooLargeResourceVersion(int64_t requested, int64_t current);
absl::Status ContinueExpired();
absl::Status InvalidRequest(std::string_view message);
absl::Status NotCached(std::string_view prefix);
absl::Status NotReady();
absl::Status WatcherTooSlow(std::string_view reason);
absl::Status CacheReinitialized();
absl::Status CacheStopped();

// The CacheError a status carries, if any.
std::optional<CacheError> CacheErrorOf(const absl::Status& s);
inline bool Is(const absl::Status& s, CacheError e) { return CacheErrorOf(s) == e; }

}  // namespace capstan::watchcache

#endif  // CAPSTAN_WATCHCACHE_ERRORS_H_
