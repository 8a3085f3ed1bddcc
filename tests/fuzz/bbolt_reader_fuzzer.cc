// The bbolt reader (storage/bbolt_reader, `capstan migrate --from-etcd`):
// any file opens or is refused, and an opened file can be checked and walked
// without crashing or reading outside it.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "storage/etcdfmt/bbolt_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto reader = capstan::etcdfmt::BboltReader::FromBytes(
      std::string(reinterpret_cast<const char*>(data), size));
  if (!reader.ok()) return 0;
  (*reader)->Check().IgnoreError();
  auto buckets = (*reader)->Buckets();
  if (!buckets.ok()) return 0;
  size_t entries = 0;
  for (const auto& b : *buckets) {
    (*reader)
        ->ForEach({b},
                  [&entries](std::string_view key, std::string_view value, bool is_bucket) {
                    entries += key.size() + value.size() + is_bucket;
                    return absl::OkStatus();
                  })
        .IgnoreError();
  }
  return 0;
}
