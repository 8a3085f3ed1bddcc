#include "cmd/snapshot_command.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "cmd/migrate/migrate.h"
#include "cmd/migrate/migrate_source.h"
#include "membership/member.h"
#include "membership/member_table.h"
#include "mvcc/revision_key.h"
#include "server/config/config.h"
#include "server/config/validation.h"
#include "storage/backend.h"
#include "storage/data_dir.h"
#include "storage/etcdfmt/bbolt_reader.h"
#include "util/crc32c.h"

namespace capstan::server {
namespace fs = std::filesystem;

namespace {

constexpr char kSnapshotUsage[] =
    "Usage:\n"
    "  capstan snapshot restore FILE --data-dir DIR [--name NAME --initial-cluster NAME=URL,...\n"
    "      --initial-cluster-token TOKEN --initial-advertise-peer-urls URL]\n"
    "                                                        create DIR from a snapshot, as a\n"
    "                                                        member of a new cluster (etcd's\n"
    "                                                        defaults: default, http://localhost:2380)\n"
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
  RestoreIdentity identity;
  for (size_t i = 2; i < args.size(); ++i) {
    auto value = [&](const std::string& flag) -> std::string {
      if (args[i].rfind(flag + "=", 0) == 0) return args[i].substr(flag.size() + 1);
      if (args[i] == flag && i + 1 < args.size()) return args[++i];
      return "";
    };
    if (args[i].rfind("--data-dir", 0) == 0) {
      data_dir = value("--data-dir");
    } else if (args[i].rfind("--initial-cluster-token", 0) == 0) {
      identity.initial_cluster_token = value("--initial-cluster-token");
    } else if (args[i].rfind("--initial-cluster", 0) == 0) {
      identity.initial_cluster = value("--initial-cluster");
    } else if (args[i].rfind("--initial-advertise-peer-urls", 0) == 0) {
      identity.initial_advertise_peer_urls = value("--initial-advertise-peer-urls");
    } else if (args[i].rfind("--name", 0) == 0) {
      identity.name = value("--name");
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
    if (auto s = RestoreSnapshot(file, data_dir, identity); !s.ok()) {
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

absl::Status RestoreSnapshot(const std::string& file, const std::string& data_dir,
                             const RestoreIdentity& identity) {
  std::error_code ec;
  if (fs::exists(data_dir, ec)) {
    return absl::AlreadyExistsError(absl::StrCat("data-dir \"", data_dir, "\" exists"));
  }
  // The new cluster, checked before anything is written (etcd's restore
  // checks the same).
  auto cluster = config_internal::ParseInitialCluster(identity.initial_cluster);
  if (!cluster.ok()) return cluster.status();
  auto own_urls = ParseUrlList(identity.initial_advertise_peer_urls);
  if (!own_urls.ok()) return own_urls.status();
  std::vector<membership::ClusterMember> members;
  std::vector<uint64_t> ids;
  uint64_t own_id = 0;
  for (const auto& [name, urls] : *cluster) {
    membership::ClusterMember m;
    m.name = name;
    for (const auto& u : urls) m.peer_urls.push_back(u.String());
    std::sort(m.peer_urls.begin(), m.peer_urls.end());
    m.id = membership::EtcdMemberId(m.peer_urls, identity.initial_cluster_token);
    if (name == identity.name) {
      std::vector<std::string> own;
      for (const auto& u : *own_urls) own.push_back(u.String());
      std::sort(own.begin(), own.end());
      if (own != m.peer_urls) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--initial-cluster has ", name, "=", absl::StrJoin(m.peer_urls, ","),
            " but missing from --initial-advertise-peer-urls=",
            identity.initial_advertise_peer_urls));
      }
      own_id = m.id;
    }
    ids.push_back(m.id);
    members.push_back(std::move(m));
  }
  if (own_id == 0) {
    return absl::InvalidArgumentError(absl::StrCat("couldn't find local name \"", identity.name,
                                                   "\" in the initial cluster configuration"));
  }
  // etcd's format, whoever wrote it: what `capstan migrate` reads. The
  // member's ids are not carried: the restored member derives its own.
  MigrateOptions options;
  options.from = file;
  options.data_dir = data_dir;
  options.require_snapshot = true;
  if (auto s = MigrateFromEtcd(options).status(); !s.ok()) return s;
  storage::BackendOptions bo;
  bo.dir = storage::BackendDir(data_dir);
  auto backend = storage::Backend::Open(bo);
  if (!backend.ok()) return backend.status();
  if (auto s = membership::MemberTable::Reset(backend->get(), members); !s.ok()) return s;
  if (auto s = membership::StampIdentity(backend->get(), membership::EtcdClusterId(ids), own_id);
      !s.ok()) {
    return s;
  }
  for (const auto& m : members) {
    std::printf("added member %s %s to cluster %s\n", absl::StrCat(absl::Hex(m.id)).c_str(),
                absl::StrJoin(m.peer_urls, ",").c_str(),
                absl::StrCat(absl::Hex(membership::EtcdClusterId(ids))).c_str());
  }
  return (*backend)->Flush();
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
