// DiskFaultSwitch: a test hook that lets a fault campaign fail a running
// member's disk. With CAPSTAN_TEST_DISK_FAULT_FILE=<path> in the environment,
// the member's storage (its store and its Raft log) goes through one
// storage::FaultInjectionFs, and the content of <path>, read every 50 ms,
// sets its fault: "write-error" (appends fail with EIO), "sync-error" (fsyncs
// fail with EIO), "no-space" (appends fail with ENOSPC), "down" (every write
// fails); anything else, or no file, is no fault. What the member does then
// is what it does on a real failing disk (docs/RELIABILITY.md: the store
// fails stop, a Raft log that cannot be written stops the member).
// Without the variable nothing changes and no thread runs.
//
// Thread safety: made and destroyed by main(), around the server; the poller
// runs on a thread of its own.

#ifndef CAPSTAN_CMD_DISK_FAULT_SWITCH_H_
#define CAPSTAN_CMD_DISK_FAULT_SWITCH_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "storage/testing/fault_injection_fs.h"
#include "util/mutex.h"

namespace capstan::cmd {

class DiskFaultSwitch {
 public:
  static constexpr char kEnvironmentVariable[] = "CAPSTAN_TEST_DISK_FAULT_FILE";

  // A switch on the file the environment names, or null when it names none.
  static std::unique_ptr<DiskFaultSwitch> FromEnvironment();
  ~DiskFaultSwitch();
  DiskFaultSwitch(const DiskFaultSwitch&) = delete;
  DiskFaultSwitch& operator=(const DiskFaultSwitch&) = delete;

  std::shared_ptr<storage::FileSystem> file_system() const { return fs_; }

 private:
  explicit DiskFaultSwitch(std::string path);
  void Poll();

  const std::string path_;
  const std::shared_ptr<storage::FaultInjectionFs> fs_;
  util::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread poller_;
};

}  // namespace capstan::cmd

#endif  // CAPSTAN_CMD_DISK_FAULT_SWITCH_H_
