#include "storage/etcdfmt/etcd_wal.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "util/crc32c.h"
#include "walpb/record.pb.h"

namespace capstan::etcdfmt {
namespace {

namespace fs = std::filesystem;

// etcd's record types (wal.go).
constexpr int64_t kMetadataType = 1;
constexpr int64_t kEntryType = 2;
constexpr int64_t kStateType = 3;
constexpr int64_t kCrcType = 4;
constexpr int64_t kSnapshotType = 5;

constexpr size_t kFrameBytes = 8;
constexpr size_t kSectorBytes = 512;
// etcd refuses records this large (maxWALEntrySizeLimit).
constexpr uint64_t kMaxRecordBytes = 10 << 20;

uint64_t ReadLittleEndian64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// etcd's isTornEntry: a record some 512-byte sector of which is all zeros
// was cut short by a crash (the sector was never written). offset is the
// record's offset in its file.
bool IsTorn(std::string_view record, size_t offset) {
  size_t at = 0;
  while (at < record.size()) {
    const size_t len = std::min(kSectorBytes - (offset + at) % kSectorBytes, record.size() - at);
    const std::string_view chunk = record.substr(at, len);
    if (std::all_of(chunk.begin(), chunk.end(), [](char c) { return c == 0; })) return true;
    at += len;
  }
  return false;
}

// A WAL file name: 16 hex digits, '-', 16 hex digits, ".wal".
bool IsWalName(const std::string& name) {
  if (name.size() != 16 + 1 + 16 + 4 || name.compare(33, 4, ".wal") != 0 || name[16] != '-') {
    return false;
  }
  for (size_t i = 0; i < 33; ++i) {
    if (i != 16 && !std::isxdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  return true;
}

}  // namespace

absl::Status DecodeEtcdWalFile(std::string_view data, bool last, uint32_t* crc, bool* torn,
                               const std::function<absl::Status(int64_t, std::string_view)>& on_record) {
  size_t off = 0;
  // A record that cannot be read. At the end of the last file it is a write
  // a crash cut short (the file ends inside it, or a sector of it was never
  // written): dropped, as etcd drops it. Anything else is damage.
  auto bad = [&](size_t record_off, std::string_view record, bool cut, std::string why) {
    if (last && (cut || IsTorn(record, record_off))) {
      *torn = true;
      return absl::OkStatus();
    }
    return absl::DataLossError(absl::StrCat("etcd WAL record at offset ", off, ": ", why));
  };
  while (off < data.size()) {
    if (data.size() - off < kFrameBytes) return bad(off, {}, true, "truncated length");
    const uint64_t word = ReadLittleEndian64(data.data() + off);
    if (word == 0) return absl::OkStatus();  // preallocated space: the file's end
    const uint64_t size = word & ~(uint64_t{0xff} << 56);
    const uint64_t pad = (word >> 63) != 0 ? (word >> 56) & 0x7 : 0;
    if (size + pad >= kMaxRecordBytes) {
      return absl::DataLossError(absl::StrCat("etcd WAL record at offset ", off, " claims ", size,
                                              " bytes, more than etcd writes"));
    }
    const size_t record_off = off + kFrameBytes;
    if (data.size() - record_off < size + pad) {
      return bad(record_off, data.substr(record_off), true, "truncated record");
    }
    const std::string_view bytes = data.substr(record_off, size + pad);
    walpb::Record rec;
    if (!rec.ParseFromArray(bytes.data(), static_cast<int>(size))) {
      if (auto s = bad(record_off, bytes, false, "not a walpb.Record"); !s.ok() || *torn) return s;
    }
    if (rec.type() == kCrcType) {
      // A new file: it goes on from the CRC the previous one ended with
      // (not checked for the first file read, whose predecessor is gone).
      if (*crc != 0 && rec.crc() != *crc) {
        return absl::DataLossError(absl::StrCat("etcd WAL CRC record at offset ", off,
                                                " does not match the previous file"));
      }
      *crc = rec.crc();
    } else {
      const uint32_t next = util::Crc32cExtend(*crc, rec.data());
      if (rec.crc() != next) {
        if (auto s = bad(record_off, bytes, false, "CRC mismatch"); !s.ok() || *torn) return s;
      }
      *crc = next;
      if (auto s = on_record(rec.type(), rec.data()); !s.ok()) return s;
    }
    off = record_off + size + pad;
  }
  return absl::OkStatus();
}

void AppendEtcdWalRecord(int64_t type, std::string_view data, uint32_t* crc, std::string* out) {
  walpb::Record rec;
  rec.set_type(type);
  if (type != kCrcType) {
    *crc = util::Crc32cExtend(*crc, data);
    rec.set_data(std::string(data));
  }
  rec.set_crc(*crc);
  std::string bytes = rec.SerializeAsString();
  const uint64_t pad = (8 - bytes.size() % 8) % 8;
  uint64_t word = bytes.size();
  if (pad != 0) word |= (0x80 | pad) << 56;
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(word >> (8 * i)));
  out->append(bytes);
  out->append(pad, '\0');
}

absl::StatusOr<EtcdWal> ReadEtcdWal(const std::string& wal_dir, uint64_t after_index) {
  EtcdWal wal;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(wal_dir, ec)) {
    if (e.is_regular_file() && IsWalName(e.path().filename().string())) {
      wal.files.push_back(e.path().string());
    }
  }
  if (ec) return absl::NotFoundError(absl::StrCat("cannot list ", wal_dir, ": ", ec.message()));
  std::sort(wal.files.begin(), wal.files.end());

  uint32_t crc = 0;
  auto on_record = [&](int64_t type, std::string_view data) -> absl::Status {
    switch (type) {
      case kEntryType: {
        raftpb::Entry e;
        if (!e.ParseFromArray(data.data(), static_cast<int>(data.size()))) {
          return absl::DataLossError("an etcd WAL entry record does not parse");
        }
        // Raft's log: this entry replaces the one at its index and every
        // later one.
        while (!wal.entries.empty() && wal.entries.back().index() >= e.index()) {
          wal.entries.pop_back();
        }
        wal.last_index = e.index();
        if (e.index() <= after_index) return absl::OkStatus();
        if (!wal.entries.empty() && wal.entries.back().index() + 1 != e.index()) {
          return absl::DataLossError(absl::StrCat("etcd WAL skips from entry ",
                                                  wal.entries.back().index(), " to ", e.index()));
        }
        wal.entries.push_back(std::move(e));
        return absl::OkStatus();
      }
      case kStateType:
        if (!wal.state.ParseFromArray(data.data(), static_cast<int>(data.size()))) {
          return absl::DataLossError("an etcd WAL hard state record does not parse");
        }
        return absl::OkStatus();
      case kMetadataType:  // the member and cluster ids, the same in every file
        wal.metadata = std::string(data);
        return absl::OkStatus();
      case kSnapshotType:  // where a segment starts; the entries say the same
        return absl::OkStatus();
      default:
        return absl::DataLossError(absl::StrCat("etcd WAL record of unknown type ", type));
    }
  };
  for (size_t i = 0; i < wal.files.size(); ++i) {
    std::ifstream in(wal.files[i], std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      return absl::DataLossError(absl::StrCat("cannot read ", wal.files[i]));
    }
    const bool last = i + 1 == wal.files.size();
    if (auto s = DecodeEtcdWalFile(data, last, &crc, &wal.torn_tail, on_record); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(wal.files[i], ": ", s.message()));
    }
  }
  return wal;
}

}  // namespace capstan::etcdfmt
