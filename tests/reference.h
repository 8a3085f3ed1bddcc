// What a test compares with or drives: its references (real etcd, etcdctl,
// Go, openssl, curl, ...). A missing reference must not let a test pass by
// not running:
//
//   TEST(GoSortTest, LeavesEqualElementsWhereGoDoes) {
//     CAPSTAN_REQUIRE_REFERENCE("go", FindInPath("go"));
//     ...
//
// On a developer's machine (CI unset) a missing reference skips the test
// with the reason; in CI (CI=true, as .ci/run sets it) it fails the test,
// naming what is missing. `make test` lists the skipped tests and their
// reasons at the end.
//
// A test that cannot run in an opt-in mode chosen by whoever runs it (such
// as CAPSTAN_DIFF_BOTH_ETCD, etcd on both sides of a differential test) is
// skipped with CAPSTAN_SKIP_IN_MODE(reason), in CI too: nothing is missing.
// (CI sets no such mode; `make test` under CI=true fails on any skip.)
//
// Header-only, needing only GoogleTest, so that the unit tests of any folder
// can use it without linking the test harness (capstan_testing).
//
// Thread safety: the functions are thread-safe. The macros return from the
// calling function, like GTEST_SKIP() and GTEST_FAIL(): use them in a TEST
// body, in SetUp(), or in a helper returning void.

#ifndef CAPSTAN_TESTS_REFERENCE_H_
#define CAPSTAN_TESTS_REFERENCE_H_

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include "gtest/gtest.h"

namespace capstan::testing {

// True when the environment says the run is CI's: CI is "true" or "1"
// (GitHub Actions, GitLab and .ci/run set CI=true). A missing reference then
// fails the test instead of skipping it.
inline bool InCi() {
  const char* ci = std::getenv("CI");
  if (ci == nullptr) return false;
  const std::string v(ci);
  return v == "true" || v == "TRUE" || v == "True" || v == "1";
}

// The path of the executable `name` in $PATH, or "" when there is none.
inline std::string FindInPath(std::string_view name) {
  const char* path = std::getenv("PATH");
  std::string_view dirs = path != nullptr ? path : "";
  while (true) {
    const size_t colon = dirs.find(':');
    std::string dir(dirs.substr(0, colon));
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + std::string(name);
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
    if (colon == std::string_view::npos) return "";
    dirs.remove_prefix(colon + 1);
  }
}

// "" when `path` names an executable file; otherwise why `what` is missing:
// "etcd not found at '/usr/bin/etcd'" ("go not found in $PATH" for an empty
// path).
inline std::string MissingReference(std::string_view what, const std::string& path) {
  if (!path.empty() && access(path.c_str(), X_OK) == 0) return "";
  std::string reason(what);
  reason += path.empty() ? " not found in $PATH" : " not found at '" + path + "'";
  return reason;
}

// The message a missing reference fails a CI run with.
inline std::string CiMissingReferenceMessage(const std::string& reason) {
  return "missing test reference: " + reason +
         " (CI=true: a missing reference fails the test instead of skipping it; "
         "scripts/deps.sh installs the references)";
}

}  // namespace capstan::testing

// Skips the current test because of `reason` (a std::string saying what is
// missing), or, in CI, fails it with that reason. For a check the caller
// makes itself (a server that could not be set up, a system limit).
#define CAPSTAN_REFERENCE_MISSING(reason)                                             \
  do {                                                                                \
    const std::string capstan_reference_reason_ = (reason);                           \
    if (::capstan::testing::InCi()) {                                                 \
      GTEST_FAIL() << ::capstan::testing::CiMissingReferenceMessage(                  \
          capstan_reference_reason_);                                                 \
    }                                                                                 \
    GTEST_SKIP() << capstan_reference_reason_;                                        \
  } while (0)

// Unless `path` names an executable, CAPSTAN_REFERENCE_MISSING with
// MissingReference(what, path).
#define CAPSTAN_REQUIRE_REFERENCE(what, path)                                         \
  do {                                                                                \
    const std::string capstan_reference_missing_ =                                    \
        ::capstan::testing::MissingReference((what), (path));                         \
    if (!capstan_reference_missing_.empty()) {                                        \
      CAPSTAN_REFERENCE_MISSING(capstan_reference_missing_);                          \
    }                                                                                 \
  } while (0)

// Skips the current test, in CI too, because of an opt-in mode of the run
// (not a missing reference): `reason` names the mode.
#define CAPSTAN_SKIP_IN_MODE(reason) GTEST_SKIP() << (reason)

#endif  // CAPSTAN_TESTS_REFERENCE_H_
