#include "lease/clock.h"

#include <type_traits>

namespace capstan::lease {
namespace {

class MonotonicClock final : public Clock {
 public:
  constexpr MonotonicClock() = default;
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

// Constant-initialized and never destroyed, so that it outlives every
// lessor, even one torn down after static destructors have run.
static_assert(std::is_trivially_destructible_v<MonotonicClock>);
constexpr MonotonicClock kMonotonic;

}  // namespace

const Clock* Clock::Monotonic() { return &kMonotonic; }

}  // namespace capstan::lease
