// Debian's Abseil is built with its own absl::string_view (not an alias of
// std::string_view, ABSL_OPTION_USE_STD_STRING_VIEW=0); this converts.

#ifndef CAPSTAN_WATCHCACHE_ABSL_COMPAT_H_
#define CAPSTAN_WATCHCACHE_ABSL_COMPAT_H_

#include <string_view>

#include "absl/strings/string_view.h"

namespace capstan::watchcache {

inline absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }
inline std::string_view SV(absl::string_view s) { return std::string_view(s.data(), s.size()); }

}  // namespace capstan::watchcache

#endif  // CAPSTAN_WATCHCACHE_ABSL_COMPAT_H_
