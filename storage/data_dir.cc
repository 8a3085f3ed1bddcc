#include "storage/data_dir.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace capstan::storage {
namespace fs = std::filesystem;

namespace {
constexpr char kMarkerFile[] = "capstan.version";
constexpr char kMarker[] = "capstan-data 1";
}  // namespace

std::string BackendDir(const std::string& dir) { return (fs::path(dir) / "db").string(); }

std::string RaftLogDir(const std::string& dir) { return (fs::path(dir) / "raft").string(); }

absl::Status PrepareDataDir(const std::string& dir) {
  std::error_code ec;
  const fs::path root(dir);
  if (!fs::exists(root, ec)) {
    fs::create_directories(root, ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot create data dir ", dir, ": ", ec.message()));
    fs::permissions(root, fs::perms::owner_all, ec);
  } else if (!fs::is_directory(root, ec)) {
    return absl::FailedPreconditionError(absl::StrCat("data dir ", dir, " is not a directory"));
  }

  const fs::path marker = root / kMarkerFile;
  if (fs::exists(marker, ec)) {
    std::ifstream in(marker);
    std::stringstream text;
    text << in.rdbuf();
    std::string content = text.str();
    while (!content.empty() && (content.back() == '\n' || content.back() == ' ')) content.pop_back();
    if (content != kMarker) {
      return absl::FailedPreconditionError(absl::StrCat(
          "data dir ", dir, " has format '", content, "', this capstan reads '", kMarker, "'"));
    }
    return absl::OkStatus();
  }

  if (fs::exists(root / "member" / "snap" / "db", ec) || fs::exists(root / "member" / "wal", ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data dir ", dir,
        " holds an etcd data directory (member/snap/db, member/wal); capstan does not open etcd's "
        "bbolt files in place. Point --data-dir at a new directory (migration from etcd keeps every "
        "revision: see docs/MIGRATION.md)"));
  }
  if (!fs::is_empty(root, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data dir ", dir, " is not empty and holds no ", kMarkerFile,
        "; refusing to use a directory that is not a Capstan data directory"));
  }
  std::ofstream out(marker);
  out << kMarker << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", marker.string()));
  return absl::OkStatus();
}

}  // namespace capstan::storage
