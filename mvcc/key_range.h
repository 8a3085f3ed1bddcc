// Key range helpers shared by the services and the embedding API.

#ifndef CAPSTAN_MVCC_KEY_RANGE_H_
#define CAPSTAN_MVCC_KEY_RANGE_H_

#include <string>
#include <string_view>

namespace capstan::mvcc {

// The range_end that makes a range cover every key starting with prefix
// (etcd's GetPrefixRangeEnd): the prefix with its last byte below 0xff
// incremented and what follows dropped, or "\0" (every key from the range's
// start on) when there is no such byte, as for an empty prefix.
inline std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  while (!end.empty()) {
    const auto c = static_cast<unsigned char>(end.back());
    if (c < 0xff) {
      end.back() = static_cast<char>(c + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_KEY_RANGE_H_
