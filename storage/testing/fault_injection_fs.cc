#include "storage/testing/fault_injection_fs.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "storage/rocks_file_system.h"

namespace capstan::storage {

using rocksdb::IODebugContext;
using rocksdb::IOOptions;
using rocksdb::IOStatus;
using rocksdb::Slice;

class FaultInjectionFs::Impl final : public rocksdb::FileSystemWrapper {
 public:
  Impl() : rocksdb::FileSystemWrapper(rocksdb::FileSystem::Default()) {}

  const char* Name() const override { return "CapstanFaultInjectionFs"; }

  void SetFault(Fault f) { fault_.store(f); }

  void HoldSyncs(bool hold) {
    std::lock_guard<std::mutex> l(hold_mu_);
    held_ = hold;
    passes_ = 0;
    hold_cv_.notify_all();
  }
  void PassSyncs(int n) {
    std::lock_guard<std::mutex> l(hold_mu_);
    passes_ += n;
    hold_cv_.notify_all();
  }
  int SyncsWaiting() const {
    std::lock_guard<std::mutex> l(hold_mu_);
    return waiting_;
  }
  void WaitWhileHeld() {
    std::unique_lock<std::mutex> l(hold_mu_);
    ++waiting_;
    hold_cv_.wait(l, [this] { return !held_ || passes_ > 0; });
    if (held_) --passes_;
    --waiting_;
  }
  int64_t InjectedFailures() const { return injected_.load(); }

  // The injected error for an operation of class `op`, or OK.
  IOStatus Inject(Fault op) {
    const Fault f = fault_.load();
    if (f == Fault::kInactive) return Failed(IOStatus::IOError("injected: file system inactive"));
    if (f != op) return IOStatus::OK();
    switch (f) {
      case Fault::kWriteError:
        return Failed(IOStatus::IOError("injected: write failed: Input/output error"));
      case Fault::kSyncError:
        return Failed(IOStatus::IOError("injected: fsync failed: Input/output error"));
      case Fault::kNoSpace:
        return Failed(IOStatus::NoSpace("injected: No space left on device"));
      default:
        return IOStatus::OK();
    }
  }
  // Appends and syncs: kNoSpace fails appends the way kWriteError does.
  IOStatus InjectAppend() {
    if (fault_.load() == Fault::kNoSpace) return Inject(Fault::kNoSpace);
    return Inject(Fault::kWriteError);
  }

  void Appended(const std::string& name, uint64_t n) {
    std::lock_guard<std::mutex> l(mu_);
    files_[name].size += n;
  }
  void Synced(const std::string& name) {
    std::lock_guard<std::mutex> l(mu_);
    auto& f = files_[name];
    f.synced = f.size;
  }
  void Truncated(const std::string& name, uint64_t size) {
    std::lock_guard<std::mutex> l(mu_);
    auto& f = files_[name];
    f.size = size;
    f.synced = std::min(f.synced, size);
  }

  int64_t UnsyncedBytes() const {
    std::lock_guard<std::mutex> l(mu_);
    int64_t total = 0;
    for (const auto& [name, f] : files_) total += static_cast<int64_t>(f.size - f.synced);
    return total;
  }

  absl::Status DropUnsyncedData() {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [name, f] : files_) {
      if (f.size == f.synced) continue;
      if (::truncate(name.c_str(), static_cast<off_t>(f.synced)) != 0 && errno != ENOENT) {
        return absl::InternalError(absl::StrCat("truncate ", name, ": ", std::strerror(errno)));
      }
      f.size = f.synced;
    }
    return absl::OkStatus();
  }

  IOStatus NewWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                           std::unique_ptr<rocksdb::FSWritableFile>* result,
                           IODebugContext* dbg) override {
    if (auto s = Inject(Fault::kInactive); !s.ok()) return s;
    std::unique_ptr<rocksdb::FSWritableFile> file;
    auto s = target()->NewWritableFile(name, options, &file, dbg);
    if (!s.ok()) return s;
    {
      std::lock_guard<std::mutex> l(mu_);
      files_[name] = FileState{};  // created empty (or truncated)
    }
    *result = std::make_unique<File>(this, name, std::move(file));
    return s;
  }

  IOStatus ReopenWritableFile(const std::string& name, const rocksdb::FileOptions& options,
                              std::unique_ptr<rocksdb::FSWritableFile>* result,
                              IODebugContext* dbg) override {
    if (auto s = Inject(Fault::kInactive); !s.ok()) return s;
    std::unique_ptr<rocksdb::FSWritableFile> file;
    auto s = target()->ReopenWritableFile(name, options, &file, dbg);
    if (!s.ok()) return s;
    uint64_t size = 0;
    target()->GetFileSize(name, IOOptions(), &size, dbg).PermitUncheckedError();
    {
      std::lock_guard<std::mutex> l(mu_);
      auto& f = files_[name];
      if (f.size != size) f = FileState{size, size};  // not written by us: durable
    }
    *result = std::make_unique<File>(this, name, std::move(file));
    return s;
  }

  IOStatus RenameFile(const std::string& from, const std::string& to, const IOOptions& options,
                      IODebugContext* dbg) override {
    if (auto s = Inject(Fault::kInactive); !s.ok()) return s;
    auto s = target()->RenameFile(from, to, options, dbg);
    if (s.ok()) {
      std::lock_guard<std::mutex> l(mu_);
      if (auto it = files_.find(from); it != files_.end()) {
        files_[to] = it->second;
        files_.erase(it);
      } else {
        files_.erase(to);
      }
    }
    return s;
  }

  IOStatus DeleteFile(const std::string& name, const IOOptions& options,
                      IODebugContext* dbg) override {
    if (auto s = Inject(Fault::kInactive); !s.ok()) return s;
    auto s = target()->DeleteFile(name, options, dbg);
    if (s.ok()) {
      std::lock_guard<std::mutex> l(mu_);
      files_.erase(name);
    }
    return s;
  }

 private:
  struct FileState {
    uint64_t size = 0;    // bytes appended so far
    uint64_t synced = 0;  // size at the last sync
  };

  // A writable file that asks the file system before each append or sync.
  class File final : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    File(Impl* fs, std::string name, std::unique_ptr<rocksdb::FSWritableFile> target)
        : rocksdb::FSWritableFileOwnerWrapper(std::move(target)), fs_(fs), name_(std::move(name)) {}

    IOStatus Append(const Slice& data, const IOOptions& options, IODebugContext* dbg) override {
      if (auto s = fs_->InjectAppend(); !s.ok()) return s;
      auto s = target()->Append(data, options, dbg);
      if (s.ok()) fs_->Appended(name_, data.size());
      return s;
    }
    IOStatus Append(const Slice& data, const IOOptions& options,
                    const rocksdb::DataVerificationInfo& info, IODebugContext* dbg) override {
      if (auto s = fs_->InjectAppend(); !s.ok()) return s;
      auto s = target()->Append(data, options, info, dbg);
      if (s.ok()) fs_->Appended(name_, data.size());
      return s;
    }
    IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                              IODebugContext* dbg) override {
      if (auto s = fs_->InjectAppend(); !s.ok()) return s;
      auto s = target()->PositionedAppend(data, offset, options, dbg);
      if (s.ok()) fs_->Truncated(name_, offset + data.size());
      return s;
    }
    IOStatus PositionedAppend(const Slice& data, uint64_t offset, const IOOptions& options,
                              const rocksdb::DataVerificationInfo& info,
                              IODebugContext* dbg) override {
      if (auto s = fs_->InjectAppend(); !s.ok()) return s;
      auto s = target()->PositionedAppend(data, offset, options, info, dbg);
      if (s.ok()) fs_->Truncated(name_, offset + data.size());
      return s;
    }
    IOStatus Truncate(uint64_t size, const IOOptions& options, IODebugContext* dbg) override {
      if (auto s = fs_->InjectAppend(); !s.ok()) return s;
      auto s = target()->Truncate(size, options, dbg);
      if (s.ok()) fs_->Truncated(name_, size);
      return s;
    }
    IOStatus Sync(const IOOptions& options, IODebugContext* dbg) override {
      fs_->WaitWhileHeld();
      if (auto s = fs_->Inject(Fault::kSyncError); !s.ok()) return s;
      auto s = target()->Sync(options, dbg);
      if (s.ok()) fs_->Synced(name_);
      return s;
    }
    IOStatus Fsync(const IOOptions& options, IODebugContext* dbg) override {
      fs_->WaitWhileHeld();
      if (auto s = fs_->Inject(Fault::kSyncError); !s.ok()) return s;
      auto s = target()->Fsync(options, dbg);
      if (s.ok()) fs_->Synced(name_);
      return s;
    }
    // sync_file_range writes back without a durability promise: no sync.
    IOStatus RangeSync(uint64_t offset, uint64_t nbytes, const IOOptions& options,
                       IODebugContext* dbg) override {
      if (auto s = fs_->Inject(Fault::kSyncError); !s.ok()) return s;
      return target()->RangeSync(offset, nbytes, options, dbg);
    }

   private:
    Impl* const fs_;
    const std::string name_;
  };

  IOStatus Failed(IOStatus s) {
    injected_.fetch_add(1);
    return s;
  }

  mutable std::mutex hold_mu_;
  std::condition_variable hold_cv_;
  bool held_ = false;  // guarded by hold_mu_, as the two below
  int passes_ = 0;
  int waiting_ = 0;
  std::atomic<Fault> fault_{Fault::kNone};
  std::atomic<int64_t> injected_{0};
  mutable std::mutex mu_;
  std::map<std::string, FileState> files_;  // by path, guarded by mu_
};

std::shared_ptr<FaultInjectionFs> FaultInjectionFs::Create() {
  return std::shared_ptr<FaultInjectionFs>(new FaultInjectionFs());
}

FaultInjectionFs::FaultInjectionFs() : impl_(std::make_shared<Impl>()), rocks_(new Rocks) {
  rocks_->fs = impl_;
  rocks_->env = rocksdb::NewCompositeEnv(rocks_->fs);
}

FaultInjectionFs::~FaultInjectionFs() = default;

void FaultInjectionFs::SetFault(Fault fault) { impl_->SetFault(fault); }
int64_t FaultInjectionFs::InjectedFailures() const { return impl_->InjectedFailures(); }
void FaultInjectionFs::HoldSyncs(bool hold) { impl_->HoldSyncs(hold); }
void FaultInjectionFs::PassSyncs(int n) { impl_->PassSyncs(n); }
int FaultInjectionFs::SyncsWaiting() const { return impl_->SyncsWaiting(); }
int64_t FaultInjectionFs::UnsyncedBytes() const { return impl_->UnsyncedBytes(); }
absl::Status FaultInjectionFs::DropUnsyncedData() { return impl_->DropUnsyncedData(); }
FileSystem::Rocks* FaultInjectionFs::rocks() { return rocks_.get(); }

}  // namespace capstan::storage
