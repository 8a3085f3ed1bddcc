// Continue tokens of paginated Lists, in kube-apiserver's format:
// base64url (no padding) of {"v":"meta.k8s.io/v1","rv":REV,"start":KEY}
// where KEY is the next key to list relative to the list's prefix (the last
// key listed + "\0").

#ifndef CAPSTAN_WATCHCACHE_CONTINUE_TOKEN_H_
#define CAPSTAN_WATCHCACHE_CONTINUE_TOKEN_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace capstan::watchcache {

struct ContinuePoint {
  int64_t rev = 0;
  std::string start;  // relative to the list prefix
};

std::string EncodeContinue(int64_t rev, std::string_view relative_start);

// Decodes and validates a token: InvalidRequest ("continue key is not
// valid: ...") when it is malformed, has another version, a revision <= 0,
// an empty start, or a start that would leave the prefix ("..", "//").
absl::StatusOr<ContinuePoint> DecodeContinue(std::string_view token);

}  // namespace capstan::watchcache

#endif  // CAPSTAN_WATCHCACHE_CONTINUE_TOKEN_H_
