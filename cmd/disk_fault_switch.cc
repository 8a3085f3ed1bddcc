#include "cmd/disk_fault_switch.h"

#include <cstdlib>
#include <fstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"
#include "util/thread_name.h"

namespace capstan::cmd {
namespace {

using Fault = storage::FaultInjectionFs::Fault;

Fault ReadFault(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  in >> word;
  word = absl::AsciiStrToLower(word);
  if (word == "write-error") return Fault::kWriteError;
  if (word == "sync-error") return Fault::kSyncError;
  if (word == "no-space") return Fault::kNoSpace;
  if (word == "down") return Fault::kInactive;
  return Fault::kNone;
}

const char* FaultText(Fault f) {
  switch (f) {
    case Fault::kNone: return "none";
    case Fault::kWriteError: return "write-error";
    case Fault::kSyncError: return "sync-error";
    case Fault::kNoSpace: return "no-space";
    case Fault::kInactive: return "down";
  }
  return "?";
}

}  // namespace

std::unique_ptr<DiskFaultSwitch> DiskFaultSwitch::FromEnvironment() {
  const char* path = std::getenv(kEnvironmentVariable);
  if (path == nullptr || *path == '\0') return nullptr;
  return std::unique_ptr<DiskFaultSwitch>(new DiskFaultSwitch(path));
}

DiskFaultSwitch::DiskFaultSwitch(std::string path)
    : path_(std::move(path)), fs_(storage::FaultInjectionFs::Create()) {
  SPDLOG_WARN("{} is set: the storage's faults follow {} (a test hook)", kEnvironmentVariable,
              path_);
  fs_->SetFault(ReadFault(path_));
  poller_ = NamedThread("disk-faults", [this] { Poll(); });
}

DiskFaultSwitch::~DiskFaultSwitch() {
  {
    util::MutexLock l(&mu_);
    stopping_ = true;
  }
  poller_.join();
}

void DiskFaultSwitch::Poll() {
  Fault current = ReadFault(path_);
  while (true) {
    {
      util::MutexLock l(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), absl::Milliseconds(50))) return;
    }
    const Fault next = ReadFault(path_);
    if (next == current) continue;
    SPDLOG_WARN("injected disk fault: {} (was {})", FaultText(next), FaultText(current));
    fs_->SetFault(next);
    current = next;
  }
}

}  // namespace capstan::cmd
