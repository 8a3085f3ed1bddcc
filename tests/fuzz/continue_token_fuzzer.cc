// Continue tokens of paginated Lists (watchcache/continue_token): any string
// decodes without crashing; a token that decodes re-encodes to one that
// decodes to the same point.

#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "watchcache/continue_token.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view token(reinterpret_cast<const char*>(data), size);
  auto point = capstan::watchcache::DecodeContinue(token);
  if (!point.ok()) return 0;
  if (point->rev <= 0 || point->start.empty()) std::abort();
  auto again =
      capstan::watchcache::DecodeContinue(capstan::watchcache::EncodeContinue(point->rev, point->start));
  if (!again.ok() || again->rev != point->rev || again->start != point->start) std::abort();
  return 0;
}
