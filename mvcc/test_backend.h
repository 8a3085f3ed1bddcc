// A storage::Backend for tests: forwards to a real backend, fails writes on
// demand (`fail`) and counts them (`writes`); counts the records read from
// the key column family (`key_reads`) and, while `fail_key_reads` is set,
// fails every such read (a Range that must not read a value).
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
  mutable std::atomic<int64_t> key_reads{0};  // records asked of the key family, iterators opened on it
  std::atomic<bool> fail_key_reads{false};
  // While set, ReplaceWith answers Unimplemented (a backend that cannot
  // swap directories), so the store copies records instead.
  std::atomic<bool> refuse_replace{false};

  absl::Status Write(storage::WriteBatch* batch) override {
    writes.fetch_add(1);
    if (fail.load()) return absl::UnavailableError("injected write failure");
    return base_->Write(batch);
  }
  absl::Status Get(storage::Cf cf, std::string_view key, std::string* value) const override {
    if (auto s = KeyRead(cf, 1); !s.ok()) return s;
    return base_->Get(cf, key, value);
  }
  std::vector<absl::Status> MultiGet(storage::Cf cf, const std::vector<std::string_view>& keys,
                                     std::vector<std::string>* values) const override {
    if (auto s = KeyRead(cf, keys.size()); !s.ok()) {
      values->assign(keys.size(), std::string());
      return std::vector<absl::Status>(keys.size(), s);
    }
    return base_->MultiGet(cf, keys, values);
  }
  absl::Status MultiGetVisit(
      storage::Cf cf, const std::vector<std::string_view>& keys,
      absl::FunctionRef<void(size_t i, std::string_view value)> visit) const override {
    if (auto s = KeyRead(cf, keys.size()); !s.ok()) return s;
    return base_->MultiGetVisit(cf, keys, visit);
  }
  absl::Status ScanVisit(
      storage::Cf cf, const std::vector<std::string_view>& keys,
      absl::FunctionRef<void(size_t i, std::string_view value)> visit) const override {
    if (auto s = KeyRead(cf, keys.size()); !s.ok()) return s;
    return base_->ScanVisit(cf, keys, visit);
  }
  std::unique_ptr<storage::Iterator> NewIterator(storage::Cf cf) const override {
    // An iterator cannot fail here: it is counted, and a test that forbids
    // key reads checks the count.
    if (cf == storage::Cf::kKey) key_reads.fetch_add(1);
    return base_->NewIterator(cf);
  }
  uint64_t SizeOnDisk() const override { return base_->SizeOnDisk(); }
  uint64_t LiveDataSize() const override { return base_->LiveDataSize(); }
  absl::Status CompactAll() override { return base_->CompactAll(); }
  absl::Status Checkpoint(const std::string& dir) override { return base_->Checkpoint(dir); }
  absl::Status Flush() override { return base_->Flush(); }
  absl::Status ReplaceWith(const std::string& dir) override {
    if (refuse_replace.load()) return storage::Backend::ReplaceWith(dir);
    return base_->ReplaceWith(dir);
  }
  absl::Status ReclaimRange(storage::Cf cf, std::string_view begin,
                            std::string_view end) override {
    return base_->ReclaimRange(cf, begin, end);
  }
  const storage::BackendOptions& options() const override { return base_->options(); }

 private:
  absl::Status KeyRead(storage::Cf cf, size_t records) const {
    if (cf != storage::Cf::kKey) return absl::OkStatus();
    key_reads.fetch_add(static_cast<int64_t>(records));
    if (fail_key_reads.load()) return absl::InternalError("a record of the key family was read");
    return absl::OkStatus();
  }

  std::unique_ptr<storage::Backend> base_;
};

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_TEST_BACKEND_H_
