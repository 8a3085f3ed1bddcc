#include "bench/loadgen/timeline.h"

namespace capstan::bench {

void Timeline::Record(Clock::time_point at, uint64_t value) {
  const auto since = at - start_;
  const size_t second =
      since.count() <= 0
          ? 0
          : static_cast<size_t>(std::chrono::duration_cast<std::chrono::seconds>(since).count());
  std::lock_guard<std::mutex> lock(mu_);
  if (second >= seconds_.size()) seconds_.resize(second + 1);
  if (seconds_[second] == nullptr) seconds_[second] = std::make_unique<Histogram>();
  seconds_[second]->Record(value);
}

std::vector<double> Timeline::Counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<double> out(seconds_.size(), 0);
  for (size_t i = 0; i < seconds_.size(); ++i) {
    if (seconds_[i] != nullptr) out[i] = static_cast<double>(seconds_[i]->Count());
  }
  return out;
}

std::vector<double> Timeline::PercentileMs(double p) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<double> out(seconds_.size(), 0);
  for (size_t i = 0; i < seconds_.size(); ++i) {
    if (seconds_[i] != nullptr) out[i] = seconds_[i]->Percentile(p) / 1e6;
  }
  return out;
}

}  // namespace capstan::bench
