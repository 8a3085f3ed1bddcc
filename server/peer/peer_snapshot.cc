#include "server/peer/peer_snapshot.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "util/crc32c.h"

namespace capstan::server::peer {
namespace fs = std::filesystem;

absl::Status StreamSnapshotFiles(const std::string& dir, const std::string& message,
                                 int64_t rate_bytes_per_sec,
                                 const std::function<bool(const capstan::v1::SnapshotChunk&)>& write) {
  std::error_code ec;
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.is_regular_file()) names.push_back(e.path().filename().string());
  }
  if (ec) return absl::InternalError(absl::StrCat("listing ", dir, ": ", ec.message()));
  std::sort(names.begin(), names.end());
  const auto start = std::chrono::steady_clock::now();
  int64_t sent = 0;
  capstan::v1::SnapshotChunk last;
  std::string buffer(kSnapshotChunkBytes, '\0');
  for (const std::string& name : names) {
    std::ifstream in(fs::path(dir) / name, std::ios::binary);
    if (!in) return absl::InternalError(absl::StrCat("opening ", dir, "/", name));
    uint64_t offset = 0;
    for (;;) {
      in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
      const size_t n = static_cast<size_t>(in.gcount());
      if (n == 0 && offset > 0) break;
      capstan::v1::SnapshotChunk chunk;
      chunk.set_file(name);
      chunk.set_offset(offset);
      chunk.set_data(buffer.data(), n);
      chunk.set_crc32c(util::Crc32cExtend(0, chunk.data()));
      if (rate_bytes_per_sec > 0) {
        // Wait until the bytes sent so far fit the rate.
        const auto due = start + std::chrono::microseconds(sent * 1000000 / rate_bytes_per_sec);
        std::this_thread::sleep_until(due);
      }
      if (!write(chunk)) return absl::UnavailableError("the snapshot stream broke");
      sent += static_cast<int64_t>(n);
      offset += n;
      if (n < buffer.size()) break;
    }
    if (in.bad()) return absl::InternalError(absl::StrCat("reading ", dir, "/", name));
    (*last.mutable_file_sizes())[name] = offset;
  }
  last.set_last(true);
  last.set_message(message);
  if (!write(last)) return absl::UnavailableError("the snapshot stream broke");
  return absl::OkStatus();
}

absl::Status ReceiveSnapshotFiles(const std::string& dir,
                                  const std::function<bool(capstan::v1::SnapshotChunk*)>& read,
                                  std::string* message) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("creating ", dir, ": ", ec.message()));
  std::map<std::string, uint64_t> sizes;
  std::ofstream out;
  std::string open_name;
  capstan::v1::SnapshotChunk chunk;
  while (read(&chunk)) {
    if (chunk.last()) {
      if (out.is_open()) out.close();
      if (!out) return absl::InternalError("writing the snapshot failed");
      if (chunk.file_sizes().size() != sizes.size()) {
        return absl::InvalidArgumentError("snapshot chunk: the file list does not match the files");
      }
      for (const auto& [name, size] : chunk.file_sizes()) {
        auto it = sizes.find(name);
        if (it == sizes.end() || it->second != size ||
            fs::file_size(fs::path(dir) / name, ec) != size) {
          return absl::InvalidArgumentError(
              absl::StrCat("snapshot chunk: file ", name, " is not ", size, " bytes"));
        }
      }
      *message = std::move(*chunk.mutable_message());
      return absl::OkStatus();
    }
    const std::string& name = chunk.file();
    if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("snapshot chunk: bad file name \"", name, "\""));
    }
    if (util::Crc32cExtend(0, chunk.data()) != chunk.crc32c()) {
      return absl::InvalidArgumentError(
          absl::StrCat("snapshot chunk: CRC mismatch in ", name, " at offset ", chunk.offset()));
    }
    auto [it, added] = sizes.try_emplace(name, 0);
    if (it->second != chunk.offset()) {
      return absl::InvalidArgumentError(absl::StrCat("snapshot chunk: ", name, " offset ",
                                                     chunk.offset(), ", expected ", it->second));
    }
    if (name != open_name) {
      if (out.is_open()) out.close();
      if (!out) return absl::InternalError("writing the snapshot failed");
      out.open(fs::path(dir) / name, std::ios::binary | std::ios::app);
      open_name = name;
      if (!out) return absl::InternalError(absl::StrCat("creating ", dir, "/", name));
    }
    out.write(chunk.data().data(), static_cast<std::streamsize>(chunk.data().size()));
    if (!out) return absl::InternalError(absl::StrCat("writing ", dir, "/", name));
    it->second += chunk.data().size();
  }
  return absl::AbortedError("the snapshot stream ended before its last chunk");
}

}  // namespace capstan::server::peer
