// CHECK: a broken invariant is a crash with a message, not a Status.

#ifndef CAPSTAN_UTIL_CHECK_H_
#define CAPSTAN_UTIL_CHECK_H_

#include <cstdio>
#include <cstdlib>
#include <sstream>

namespace capstan::internal {

// Collects a message, prints it with the failed condition and aborts.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond) {
    stream_ << file << ":" << line << ": CHECK failed: " << cond << " ";
  }
  [[noreturn]] ~CheckFailure() {
    std::fprintf(stderr, "%s\n", stream_.str().c_str());
    std::fflush(stderr);
    std::abort();
  }
  std::ostream& stream() { return stream_; }

 private:
  std::ostringstream stream_;
};

}  // namespace capstan::internal

#define CHECK(cond) \
  while (!(cond)) ::capstan::internal::CheckFailure(__FILE__, __LINE__, #cond).stream()

#endif  // CAPSTAN_UTIL_CHECK_H_
