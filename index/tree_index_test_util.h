// Copyright 2025 The Capstan Authors.
//
// Helpers shared by the TreeIndex tests (test-only).

#ifndef CAPSTAN_INDEX_TREE_INDEX_TEST_UTIL_H_
#define CAPSTAN_INDEX_TREE_INDEX_TEST_UTIL_H_

#include <cstdint>
#include <limits>
#include <map>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "index/tree_index.h"

namespace capstan::index::test_util {

inline constexpr int64_t kMaxRev = std::numeric_limits<int64_t>::max();

inline Revision R(int64_t main, int64_t sub = 0) { return Revision{main, sub}; }

// One key reported by Range, comparable.
struct Hit {
  std::string key;
  RangeHit hit;
  bool operator==(const Hit& o) const {
    return key == o.key && hit.modified == o.hit.modified && hit.created == o.hit.created &&
           hit.version == o.hit.version;
  }
};

inline std::ostream& operator<<(std::ostream& os, const Hit& h) {
  return os << h.key << "@" << h.hit.modified << "/" << h.hit.created << "/v" << h.hit.version;
}

inline std::vector<Hit> ViewRange(const IndexView& v, std::string_view key, std::string_view end,
                                  int64_t at) {
  std::vector<Hit> out;
  v.Range(key, end, at, [&](std::string_view k, const RangeHit& hit) {
    out.push_back({std::string(k), hit});
    return true;
  });
  return out;
}

// Every key and KeyIndex of a view.
inline std::vector<std::pair<std::string, KeyIndex>> Dump(const IndexView& v) {
  std::vector<std::pair<std::string, KeyIndex>> out;
  v.ForEach("", kRangeEndAll, [&](std::string_view k, const KeyIndex& ki) {
    out.emplace_back(std::string(k), ki);
    return true;
  });
  return out;
}

inline std::vector<std::pair<std::string, KeyIndex>> Dump(
    const std::map<std::string, KeyIndex>& m) {
  return {m.begin(), m.end()};
}

inline void ExpectSameDump(const std::vector<std::pair<std::string, KeyIndex>>& got,
                           const std::vector<std::pair<std::string, KeyIndex>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].first, want[i].first);
    ASSERT_TRUE(got[i].second == want[i].second)
        << got[i].first << ": " << got[i].second.DebugString() << " vs "
        << want[i].second.DebugString();
  }
}

}  // namespace capstan::index::test_util

#endif  // CAPSTAN_INDEX_TREE_INDEX_TEST_UTIL_H_
