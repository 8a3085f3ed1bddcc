// The Kubernetes object field extractors (watchcache/index_extractor): any
// stored value, protobuf or JSON or neither, is read without crashing, and
// what is extracted points into the value or into `owned`, with labels
// sorted and unique.

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string_view>
#include <vector>

#include "watchcache/index_extractor.h"

namespace {

using capstan::watchcache::Extracted;
using capstan::watchcache::IndexExtractor;

bool Inside(std::string_view part, std::string_view value, const Extracted& out) {
  auto within = [&](std::string_view whole) {
    return part.data() >= whole.data() && part.data() + part.size() <= whole.data() + whole.size();
  };
  if (part.empty() || within(value)) return true;
  for (const auto& s : out.owned) {
    if (within(s)) return true;
  }
  return false;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto* extractors = [] {
    auto* v = new std::vector<std::unique_ptr<IndexExtractor>>;
    for (const auto& spec : capstan::watchcache::DefaultResources()) {
      v->push_back(std::make_unique<IndexExtractor>(spec));
    }
    return v;
  }();
  const std::string_view value(reinterpret_cast<const char*>(data), size);
  Extracted out;
  for (const auto& e : *extractors) {
    out.Clear();
    const bool decoded = e->Extract(value, &out);
    if (decoded != out.decoded) std::abort();
    if (!decoded) continue;
    for (const auto& f : out.fields) {
      if (f && !Inside(*f, value, out)) std::abort();
    }
    for (size_t i = 0; i < out.labels.size(); ++i) {
      if (!Inside(out.labels[i].first, value, out) || !Inside(out.labels[i].second, value, out)) {
        std::abort();
      }
      if (i > 0 && !(out.labels[i - 1].first < out.labels[i].first)) std::abort();
    }
  }
  return 0;
}
