// A storage::Backend for tests: forwards to a real backend, fails writes on
// demand (`fail`) and counts them (`writes`).
//
// Thread safety: as the wrapped backend. Test-only; not part of any library.

#ifndef CAPSTAN_MVCC_TEST_BACKEND_H_
#define CAPSTAN_MVCC_TEST_BACKEND_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "storage/backend.h"

namespace capstan::mvcc {

class TestBackend final : public storage::Backend {
 public:
  explicit TestBackend(std::unique_ptr<storage::Backend> base) : base_(std::move(base)) {}

  std::atomic<bool> fail{false};     // while set, Write fails
  std::atomic<int64_t> writes{0};    // Write calls so far

  absl::Status Write(storage::WriteBatch* batch) override {
    writes.fetch_add(1);
    if (fail.load()) return absl::UnavailableError("injected write failure");
    return base_->Write(batch);
  }
  absl::Status Get(storage::Cf cf, std::string_view key, std::string* value) const override {
    return base_->Get(cf, key, value);
  }
  std::vector<absl::Status> MultiGet(storage::Cf cf, const std::vector<std::string_view>& keys,
                                     std::vector<std::string>* values) const override {
    return base_->MultiGet(cf, keys, values);
  }
  std::unique_ptr<storage::Iterator> NewIterator(storage::Cf cf) const override {
    return base_->NewIterator(cf);
  }
  uint64_t SizeOnDisk() const override { return base_->SizeOnDisk(); }
  uint64_t LiveDataSize() const override { return base_->LiveDataSize(); }
  absl::Status CompactAll() override { return base_->CompactAll(); }
  absl::Status Checkpoint(const std::string& dir) override { return base_->Checkpoint(dir); }
  absl::Status Flush() override { return base_->Flush(); }
  const storage::BackendOptions& options() const override { return base_->options(); }

 private:
  std::unique_ptr<storage::Backend> base_;
};

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_TEST_BACKEND_H_
