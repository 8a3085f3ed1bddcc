#include "cmd/snapshot_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cmd/migrate/migrate.h"
#include "cmd/migrate/migrate_source.h"
#include "mvcc/revision_key.h"
#include "storage/etcdfmt/bbolt_reader.h"
#include "util/crc32c.h"

namespace capstan::server {
namespace fs = std::filesystem;

namespace {

constexpr char kSnapshotUsage[] =
    "Usage:\n"
    "  capstan snapshot restore FILE --data-dir DIR          create DIR from a snapshot\n"
    "  capstan snapshot status FILE [-w simple|table|json]   describe it, as etcdctl\n"
    "A snapshot is the file `etcdctl snapshot save` writes, from Capstan or from etcd.\n";

// `capstan snapshot ...`: offline tools for snapshot files.
}  // namespace

int SnapshotCommand(const std::vector<std::string>& args) {
  if (args.size() < 2 || (args[0] != "restore" && args[0] != "status")) {
    std::fputs(kSnapshotUsage, stderr);
    return 2;
  }
  const std::string file = args[1];
  std::string data_dir, format = "simple";
  for (size_t i = 2; i < args.size(); ++i) {
    auto value = [&](const std::string& flag) -> std::string {
      if (args[i].rfind(flag + "=", 0) == 0) return args[i].substr(flag.size() + 1);
      if (args[i] == flag && i + 1 < args.size()) return args[++i];
      return "";
    };
    if (args[i].rfind("--data-dir", 0) == 0) {
      data_dir = value("--data-dir");
    } else if (args[i].rfind("-w", 0) == 0 || args[i].rfind("--write-out", 0) == 0) {
      format = args[i].rfind("-w", 0) == 0 ? value("-w") : value("--write-out");
    } else {
      std::fprintf(stderr, "unknown flag %s\n%s", args[i].c_str(), kSnapshotUsage);
      return 2;
    }
  }
  if (args[0] == "restore") {
    if (data_dir.empty()) {
      std::fprintf(stderr, "--data-dir is required\n%s", kSnapshotUsage);
      return 2;
    }
    if (auto s = RestoreSnapshot(file, data_dir); !s.ok()) {
      std::fprintf(stderr, "Error: %s\n", std::string(s.message()).c_str());
      return 1;
    }
    std::printf("restored snapshot %s into %s\n", file.c_str(), data_dir.c_str());
    return 0;
  }
  auto st = ReadSnapshotStatus(file);
  if (!st.ok()) {
    std::fprintf(stderr, "Error: %s\n", std::string(st.status().message()).c_str());
    return 1;
  }
  auto text = FormatSnapshotStatus(*st, format);
  if (!text.ok()) {
    std::fprintf(stderr, "Error: %s\n", std::string(text.status().message()).c_str());
    return 1;
  }
  std::fputs(text->c_str(), stdout);
  return 0;
}

absl::Status RestoreSnapshot(const std::string& file, const std::string& data_dir) {
  std::error_code ec;
  if (fs::exists(data_dir, ec)) {
    return absl::AlreadyExistsError(absl::StrCat("data-dir \"", data_dir, "\" exists"));
  }
  // etcd's format, whoever wrote it: what `capstan migrate` reads. The
  // member's ids are not carried: the restored member derives its own.
  MigrateOptions options;
  options.from = file;
  options.data_dir = data_dir;
  options.require_snapshot = true;
  return MigrateFromEtcd(options).status();
}

// As `etcdctl snapshot status`: bbolt's check, then over every bucket in name
// order the CRC-32C of its name and of each key and value, the number of
// records, and the main revision of the last key of "key"; the size is the
// bbolt file's pages, without the checksum.
absl::StatusOr<SnapshotStatus> ReadSnapshotStatus(const std::string& file) {
  // As the migration opens it: the trailer, if the size says there is one,
  // checked and left out.
  auto source = migrate_internal::OpenSource(file);
  if (!source.ok()) return source.status();
  const etcdfmt::BboltReader& reader = *(*source)->reader;
  if (auto s = reader.Check(); !s.ok()) return s;
  auto buckets = reader.Buckets();
  if (!buckets.ok()) return buckets.status();
  SnapshotStatus st;
  st.total_size = static_cast<int64_t>(reader.meta().high_water * reader.meta().page_size);
  uint32_t crc = 0;
  for (const std::string& name : *buckets) {
    crc = util::Crc32cExtend(crc, name);
    const bool key_bucket = name == "key";
    auto s = reader.ForEach({name}, [&](std::string_view k, std::string_view v, bool) {
      crc = util::Crc32cExtend(util::Crc32cExtend(crc, k), v);
      if (key_bucket && k.size() >= 8) {
        st.revision = static_cast<int64_t>(util::ReadBigEndian64(k.data()));
      }
      ++st.total_keys;
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
  }
  st.hash = crc;
  return st;
}

namespace {

// go-humanize's Bytes, which etcdctl prints sizes with: SI units, one
// decimal below 10.
std::string HumanBytes(uint64_t n) {
  if (n < 10) return absl::StrCat(n, " B");
  static constexpr const char* kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
  int e = static_cast<int>(std::floor(std::log(static_cast<double>(n)) / std::log(1000.0)));
  const double value = std::floor(static_cast<double>(n) / std::pow(1000.0, e) * 10 + 0.5) / 10;
  if (value < 10) return absl::StrFormat("%.1f %s", value, kUnits[e]);
  return absl::StrFormat("%.0f %s", value, kUnits[e]);
}

// tablewriter as etcdctl sets it up: borders, headers centred, cells
// right-aligned, one space of padding.
std::string Table(const std::vector<std::string>& header, const std::vector<std::string>& row) {
  std::vector<size_t> width(header.size());
  for (size_t i = 0; i < header.size(); ++i) width[i] = std::max(header[i].size(), row[i].size());
  std::string rule = "+";
  for (size_t w : width) rule += std::string(w + 2, '-') + "+";
  rule += "\n";
  auto line = [&](const std::vector<std::string>& cells, bool centre) {
    std::string out = "|";
    for (size_t i = 0; i < cells.size(); ++i) {
      const size_t gap = width[i] - cells[i].size();
      const size_t left = centre ? gap / 2 : gap;
      out += " " + std::string(left, ' ') + cells[i] + std::string(gap - left, ' ') + " |";
    }
    return out + "\n";
  };
  return rule + line(header, true) + rule + line(row, false) + rule;
}

}  // namespace

absl::StatusOr<std::string> FormatSnapshotStatus(const SnapshotStatus& st,
                                                 std::string_view format) {
  const std::string hash = absl::StrCat(absl::Hex(st.hash));
  const std::string size = HumanBytes(static_cast<uint64_t>(st.total_size));
  if (format == "simple") {
    return absl::StrCat(hash, ", ", st.revision, ", ", st.total_keys, ", ", size, "\n");
  }
  if (format == "table") {
    return Table({"HASH", "REVISION", "TOTAL KEYS", "TOTAL SIZE"},
                 {hash, absl::StrCat(st.revision), absl::StrCat(st.total_keys), size});
  }
  if (format == "json") {
    return absl::StrCat("{\"hash\":", st.hash, ",\"revision\":", st.revision,
                        ",\"totalKey\":", st.total_keys, ",\"totalSize\":", st.total_size, "}\n");
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown output format ", std::string(format)));
}

}  // namespace capstan::server
