#include "cmd/migrate/migrate.h"
#include "cmd/migrate/migrate_source.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "mvcc/kv_codec.h"
#include "mvcc/kv_store.h"
#include "mvcc/meta_keys.h"
#include "storage/backend.h"
#include "storage/data_dir.h"
#include "storage/etcdfmt/bbolt_reader.h"


namespace capstan::server {
namespace fs = std::filesystem;

using index::Revision;
using etcdfmt::BboltReader;
using storage::Cf;
using migrate_internal::ForEachKeyRecord;
using migrate_internal::kAlarmBucket;
using migrate_internal::kAuthBuckets;
using migrate_internal::kKeyBucket;
using migrate_internal::kLeaseBucket;
using migrate_internal::kMetaBucket;
using migrate_internal::ListMembers;
using migrate_internal::OpenSource;
using migrate_internal::ReadSourceMeta;
using migrate_internal::SourceMeta;
using migrate_internal::SourceRecord;
using migrate_internal::Sv;
using migrate_internal::ReplayEtcdWal;
using migrate_internal::VerifyAgainstSource;
using migrate_internal::WalDirOf;

namespace {

constexpr size_t kBatchBytes = 32 << 20;

// Writes records in batches of bounded size.
class BatchWriter {
 public:
  BatchWriter(storage::Backend* backend, int max_records)
      : backend_(backend), max_records_(max_records) {}
  absl::Status Put(Cf cf, std::string_view key, std::string_view value) {
    batch_.Put(cf, key, value);
    if (batch_.Count() >= max_records_ || batch_.ByteSize() >= kBatchBytes) return Flush();
    return absl::OkStatus();
  }
  absl::Status Flush() {
    if (batch_.Count() == 0) return absl::OkStatus();
    auto s = backend_->Write(&batch_);
    batch_.Clear();
    return s;
  }

 private:
  storage::Backend* backend_;
  const int max_records_;
  storage::WriteBatch batch_;
};

// Copies every carried-over record of the source into backend.
absl::Status CopyRecords(const BboltReader& r, storage::Backend* backend,
                         const MigrateOptions& options, MigrateReport* report) {
  auto buckets = r.Buckets();
  if (!buckets.ok()) return buckets.status();
  if (std::find(buckets->begin(), buckets->end(), kKeyBucket) == buckets->end()) {
    return absl::InvalidArgumentError(
        "not an etcd v3 backend: the bbolt file has no \"key\" bucket");
  }
  BatchWriter out(backend, options.batch_records);
  auto progress = [&options](const std::string& line) {
    if (options.progress) options.progress(line);
  };

  // key: records as they are.
  int64_t last_main = 0;
  auto s = ForEachKeyRecord(r, [&](const SourceRecord& rec) {
    last_main = rec.rev.main;
    if (++report->key_records % 1000000 == 0) {
      progress(absl::StrCat("copied ", report->key_records, " key records (revision ", last_main,
                            ")"));
    }
    return out.Put(Cf::kKey, rec.key_bytes, rec.record);
  });
  if (!s.ok()) return s;

  // meta: compaction marks and the consistent index.
  auto meta = ReadSourceMeta(r);
  if (!meta.ok()) return meta.status();
  for (const auto& [k, v] : meta->carried) {
    if (auto st = out.Put(Cf::kMeta, k, v); !st.ok()) return st;
  }
  for (auto& n : meta->not_carried) report->not_carried.push_back(std::move(n));
  report->compact_revision = std::max(meta->scheduled, meta->finished);
  report->current_revision = std::max<int64_t>({last_main, report->compact_revision, 1});
  report->consistent_index = meta->consistent_index.value_or(0);

  for (const std::string& bucket : *buckets) {
    if (bucket == kKeyBucket || bucket == kMetaBucket) continue;
    const bool is_auth = std::any_of(std::begin(kAuthBuckets), std::end(kAuthBuckets),
                                     [&bucket](const char* b) { return bucket == b; });
    uint64_t records = 0;
    s = r.ForEach({bucket}, [&](std::string_view k, std::string_view v, bool is_bucket) {
      if (is_bucket) {
        return absl::FailedPreconditionError(absl::StrCat(
            "bucket ", bucket, " holds a nested bucket, which no etcd version writes"));
      }
      ++records;
      if (bucket == kLeaseBucket) {
        int64_t id, ttl;
        if (k.size() != 8 || !lease::DecodeLeaseRecord(v, &id, &ttl) ||
            static_cast<uint64_t>(id) != util::ReadBigEndian64(k.data())) {
          return absl::DataLossError("the lease bucket holds a corrupt lease record");
        }
        ++report->leases;
        return out.Put(Cf::kLease, lease::LeaseKey(id), lease::EncodeLeaseRecord(id, ttl));
      }
      if (is_auth) {
        ++report->auth_records;
        return out.Put(Cf::kAuth, absl::StrCat(bucket, "/", Sv(k)), v);
      }
      if (bucket == kAlarmBucket) {
        ++report->alarms;
        return out.Put(Cf::kAlarm, k, v);
      }
      return absl::OkStatus();  // not carried over; counted below
    });
    if (!s.ok()) return s;
    const bool carried = is_auth || bucket == kLeaseBucket || bucket == kAlarmBucket;
    if (!carried) {
      report->not_carried.push_back(absl::StrCat("bucket ", bucket, " (", records,
                                                 records == 1 ? " record)" : " records)"));
    }
  }
  return out.Flush();
}

// The directory NEW must be new: absent, or an empty directory.
absl::Status CheckNewDataDir(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) return absl::OkStatus();
  if (!fs::is_directory(dir, ec)) {
    return absl::AlreadyExistsError(absl::StrCat("--data-dir ", dir.string(),
                                                 " exists and is not a directory"));
  }
  if (!fs::is_empty(dir, ec)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "--data-dir ", dir.string(),
        " is not empty: migrate into a new (or empty) directory; nothing was written"));
  }
  return absl::OkStatus();
}

void SyncDir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    fsync(fd);
    ::close(fd);
  }
}

fs::path Normalized(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();
  return p;
}

}  // namespace

absl::StatusOr<MigrateReport> MigrateFromEtcd(const MigrateOptions& options) {
  if (options.from.empty()) return absl::InvalidArgumentError("--from-etcd is required");
  if (options.data_dir.empty()) return absl::InvalidArgumentError("--data-dir is required");
  const fs::path target = Normalized(options.data_dir);
  if (auto s = CheckNewDataDir(target); !s.ok()) return s;
  auto source = OpenSource(options.from);
  if (!source.ok()) return source.status();
  if (options.require_snapshot && !(*source)->snapshot) {
    return absl::InvalidArgumentError(
        absl::StrCat(options.from, " has no SHA-256 trailer, so it is not a snapshot (a db file is "
                                   "migrated with `capstan migrate --from-etcd`)"));
  }
  const BboltReader& reader = *(*source)->reader;

  MigrateReport report;
  report.source_file = (*source)->file;
  report.snapshot = (*source)->snapshot;
  report.page_size = reader.meta().page_size;
  report.txid = reader.meta().txid;

  // Build the new directory under a temporary name beside the target, then
  // rename it into place: NEW is either absent/empty or complete.
  const fs::path tmp = fs::path(absl::StrCat(target.string(), ".migrating-", getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  auto fail = [&tmp](absl::Status s) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);
    return s;
  };
  if (auto s = storage::PrepareDataDir(tmp.string()); !s.ok()) return fail(s);
  {
    storage::BackendOptions bopts;
    bopts.dir = storage::BackendDir(tmp.string());
    bopts.sync = false;  // one Flush at the end makes it all durable
    auto backend = storage::Backend::Open(bopts);
    if (!backend.ok()) return fail(backend.status());
    if (auto s = CopyRecords(reader, backend->get(), options, &report); !s.ok()) return fail(s);
    if (auto s = (*backend)->Flush(); !s.ok()) return fail(s);
  }
  if (options.verify) {
    if (options.progress) options.progress("verifying");
    if (auto s = VerifyAgainstSource(reader, tmp.string(), options.verify_stride, &report);
        !s.ok()) {
      return fail(absl::Status(s.code(), absl::StrCat("verification failed to run: ", s.message())));
    }
  }
  const std::string wal_dir = WalDirOf(**source);
  if (!wal_dir.empty() && options.skip_wal) {
    report.wal_skipped_dir = wal_dir;
  } else if (!wal_dir.empty()) {
    auto members = ListMembers(reader);
    if (!members.ok()) return fail(members.status());
    if (options.progress) options.progress(absl::StrCat("replaying the etcd WAL in ", wal_dir));
    if (auto s = ReplayEtcdWal(wal_dir, tmp.string(), report.consistent_index, *members, &report);
        !s.ok()) {
      return fail(absl::Status(s.code(), absl::StrCat("replaying the etcd WAL: ", s.message())));
    }
  }
  SyncDir(tmp);
  fs::rename(tmp, target, ec);
  if (ec) {
    return fail(absl::InternalError(absl::StrCat("cannot rename ", tmp.string(), " to ",
                                                 target.string(), ": ", ec.message())));
  }
  if (target.has_parent_path()) SyncDir(target.parent_path());
  if (options.progress) {
    options.progress(absl::StrCat("migrated ", report.key_records, " key records into ",
                                  target.string()));
  }
  return report;
}

std::string FormatMigrateReport(const MigrateReport& r) {
  std::string out = absl::StrFormat(
      "source:            %s (%s; bbolt page size %d, txid %d)\n", r.source_file,
      r.snapshot ? "etcdctl snapshot, sha256 verified" : "etcd backend", r.page_size, r.txid);
  absl::StrAppendFormat(&out, "key records:       %d (current revision %d, compacted at %d)\n",
                        r.key_records, r.current_revision, r.compact_revision);
  absl::StrAppendFormat(&out, "leases:            %d\n", r.leases);
  absl::StrAppendFormat(&out, "auth records:      %d\n", r.auth_records);
  absl::StrAppendFormat(&out, "alarms:            %d\n", r.alarms);
  absl::StrAppendFormat(&out, "consistent index:  %d\n", r.consistent_index);
  absl::StrAppendFormat(&out, "not carried over:  %s\n",
                        r.not_carried.empty() ? "-" : absl::StrJoin(r.not_carried, ", "));
  if (r.verified) {
    absl::StrAppendFormat(&out, "verify revisions:  %d checked (%d..%d), %d with a full Range\n",
                          r.revisions_checked, r.first_revision_checked,
                          r.first_revision_checked + r.revisions_checked - 1,
                          r.full_ranges_checked);
    absl::StrAppendFormat(&out, "verify keys:       %d live at revision %d\n", r.live_keys,
                          r.current_revision);
    absl::StrAppendFormat(&out, "verify leases:     %d\n", r.leases_checked);
    absl::StrAppendFormat(&out, "verify HashKV:     etcd %d, capstan %d (%s)\n", r.source_hash,
                          r.capstan_hash, r.source_hash == r.capstan_hash ? "equal" : "DIFFERENT");
    absl::StrAppendFormat(&out, "verify mismatches: %d\n", r.mismatches);
    for (const auto& m : r.mismatch_examples) absl::StrAppend(&out, "  mismatch: ", m, "\n");
  }
  if (!r.wal_skipped_dir.empty()) {
    absl::StrAppend(&out, "wal:               ", r.wal_skipped_dir,
                    " NOT REPLAYED (--skip-wal): what etcd logged after the db's consistent index, "
                    "acknowledged writes included, is not migrated\n");
  } else if (r.wal_dir.empty()) {
    absl::StrAppend(&out, "wal:               - (",
                    r.snapshot ? "a snapshot has none" : "no member/wal beside the db", ")\n");
  } else {
    absl::StrAppendFormat(&out, "wal:               %s (%d files; last entry %d, commit %d%s)\n",
                          r.wal_dir, r.wal_files, r.wal_last_index, r.wal_commit_index,
                          r.wal_torn_tail ? "; a torn last record dropped" : "");
    const std::string uncommitted =
        r.wal_uncommitted == 0 ? "" : absl::StrCat(", ", r.wal_uncommitted, " uncommitted left out");
    absl::StrAppendFormat(&out,
                          "wal replayed:      %d entries after the consistent index: %d applied, "
                          "%d refused as etcd refuses them, %d without v3 data%s\n",
                          r.wal_entries, r.wal_replayed, r.wal_refused, r.wal_skipped, uncommitted);
    for (const auto& refusal : r.wal_refusals) absl::StrAppend(&out, "  refused: ", refusal, "\n");
    if (r.wal_last_revision != 0) {
      absl::StrAppendFormat(&out, "wal revisions:     %d..%d (current revision now %d)\n",
                            r.wal_first_revision, r.wal_last_revision, r.wal_last_revision);
    }
  }
  return out;
}

namespace {

constexpr char kMigrateUsage[] =
    "Usage:\n"
    "  capstan migrate --from-etcd SRC --data-dir NEW [--verify] [--verify-stride N] [--skip-wal]\n"
    "SRC is a stopped etcd's data directory (its member/snap/db is read, then the requests\n"
    "its member/wal holds beyond the db are applied, as etcd applies them when it starts),\n"
    "an etcd bbolt db file, or a file written by `etcdctl snapshot save`. It is only read.\n"
    "NEW must not exist (or be empty); start capstan on it with your etcd flags afterwards.\n"
    "--verify compares the copy of SRC's db with it at every retained revision and by\n"
    "HashKV, before the WAL is applied;\n"
    "--verify-stride N compares a full Range at every Nth revision only (and the changed\n"
    "keys at every revision). --skip-wal migrates the db alone, without what the WAL holds\n"
    "beyond it (for a WAL etcd itself could not read; writes etcd acknowledged are lost).\n"
    "See docs/MIGRATION.md.\n";

}  // namespace

int MigrateCommand(const std::vector<std::string>& args) {
  MigrateOptions options;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const std::string& flag, std::string* out) {
      if (a.rfind(flag + "=", 0) == 0) {
        *out = a.substr(flag.size() + 1);
        return true;
      }
      if (a == flag && i + 1 < args.size()) {
        *out = args[++i];
        return true;
      }
      return false;
    };
    std::string stride;
    if (a == "--help" || a == "-h") {
      std::fputs(kMigrateUsage, stdout);
      return 0;
    } else if (a == "--verify") {
      options.verify = true;
    } else if (a == "--skip-wal") {
      options.skip_wal = true;
    } else if (value("--from-etcd", &options.from) || value("--data-dir", &options.data_dir)) {
    } else if (value("--verify-stride", &stride)) {
      options.verify_stride = std::atoll(stride.c_str());
      if (options.verify_stride < 1) {
        std::fprintf(stderr, "--verify-stride must be a positive number\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "unknown or incomplete flag %s\n%s", a.c_str(), kMigrateUsage);
      return 2;
    }
  }
  if (options.from.empty() || options.data_dir.empty()) {
    std::fprintf(stderr, "--from-etcd and --data-dir are required\n%s", kMigrateUsage);
    return 2;
  }
  options.progress = [](const std::string& line) {
    std::fprintf(stderr, "%s\n", line.c_str());
  };
  auto report = MigrateFromEtcd(options);
  if (!report.ok()) {
    std::fprintf(stderr, "Error: %s\n", std::string(report.status().message()).c_str());
    return 1;
  }
  std::fputs(FormatMigrateReport(*report).c_str(), stdout);
  if (report->verified && report->mismatches > 0) {
    std::fprintf(stderr, "Error: verification found %lld mismatches\n",
                 static_cast<long long>(report->mismatches));
    return 1;
  }
  return 0;
}

}  // namespace capstan::server
