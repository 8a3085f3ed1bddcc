// FaultInjectionFs: a storage::FileSystem over the operating system's that
// fails writes, fsyncs or fills the disk on demand and can drop the data a
// crash would lose (RocksDB's FaultInjectionTestFS, reduced to what Capstan's
// reliability tests need). Test-only (capstan_storage_testing, which the
// capstan binary links for its disk-fault test hook, cmd/disk_fault_switch.h);
// its users need no RocksDB headers.
//
// It keeps, for every file written through it, the size the file had at its
// last sync: DropUnsyncedData() cuts each file back to that size, which is
// what survives a power failure when directory entries are durable (directory
// fsyncs are not modelled).
//
// Thread safety: every method may be called from any thread while a backend
// does I/O through the file system.

#ifndef CAPSTAN_STORAGE_TESTING_FAULT_INJECTION_FS_H_
#define CAPSTAN_STORAGE_TESTING_FAULT_INJECTION_FS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "storage/backend.h"

namespace capstan::storage {

class FaultInjectionFs final : public FileSystem {
 public:
  enum class Fault {
    kNone,
    kWriteError,  // appends to files fail with an I/O error (EIO)
    kSyncError,   // fsync/fdatasync of files fail with an I/O error
    kNoSpace,     // appends fail with "No space left on device" (ENOSPC)
    kInactive,    // every write, sync and new file fails: the machine is down
  };

  static std::shared_ptr<FaultInjectionFs> Create();
  ~FaultInjectionFs() override;

  // Injects fault into every later operation it concerns, until changed.
  void SetFault(Fault fault);
  // Operations failed by injection so far.
  int64_t InjectedFailures() const;
  // A disk that stalls: while held, every sync (fsync, fdatasync) of a file
  // waits until it is released, or until PassSyncs lets it through.
  void HoldSyncs(bool hold);
  // Lets `n` syncs through (those waiting first), the later ones still held.
  void PassSyncs(int n);
  // The syncs waiting now.
  int SyncsWaiting() const;
  // Bytes appended to files but not yet synced, over every file.
  int64_t UnsyncedBytes() const;

  // Simulates the crash: cuts every file written through the file system
  // back to its size at its last sync (files never synced become empty).
  // REQUIRES: no backend has the files open; close it first, under kInactive
  // so that closing writes nothing more.
  absl::Status DropUnsyncedData();

  Rocks* rocks() override;

 private:
  class Impl;
  FaultInjectionFs();
  std::shared_ptr<Impl> impl_;
  std::unique_ptr<Rocks> rocks_;
};

}  // namespace capstan::storage

#endif  // CAPSTAN_STORAGE_TESTING_FAULT_INJECTION_FS_H_
