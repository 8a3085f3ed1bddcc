#include "server/migrate.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "etcdserverpb/rpc.pb.h"
#include "mvcc/crc32c.h"
#include "mvcc/kv_codec.h"
#include "mvcc/kv_store.h"
#include "mvcc/lessor.h"
#include "mvcc/meta_keys.h"
#include "mvcc/revision_key.h"
#include "openssl/evp.h"
#include "server/data_dir.h"
#include "storage/backend.h"
#include "storage/bbolt_reader.h"

namespace capstan::server {
namespace fs = std::filesystem;

using index::Revision;
using storage::BboltReader;
using storage::Cf;

namespace {

// etcd's bucket names.
constexpr char kKeyBucket[] = "key";
constexpr char kMetaBucket[] = "meta";
constexpr char kLeaseBucket[] = "lease";
constexpr char kAlarmBucket[] = "alarm";
constexpr const char* kAuthBuckets[] = {"auth", "authUsers", "authRoles"};

// etcdctl's snapshot files end with the SHA-256 of the bbolt file; etcdctl
// recognises them by their size: 32 past a multiple of 512.
constexpr uint64_t kSnapshotHashSize = 32;

constexpr size_t kBatchBytes = 32 << 20;

// Abseil here has its own string_view; keys go into messages escaped.
absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }
std::string Printable(std::string_view s) { return absl::CHexEscape(Sv(s)); }
constexpr int kMaxMismatchExamples = 20;

// ---- The source: an opened bbolt file, locked against a running etcd. ----

struct Source {
  ~Source() {
    if (lock_fd >= 0) ::close(lock_fd);
  }
  std::string file;
  bool snapshot = false;
  int lock_fd = -1;
  std::unique_ptr<BboltReader> reader;
};

absl::Status CheckSnapshotHash(const std::string& file, int fd, uint64_t body) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  std::string buf(1 << 20, '\0');
  uint64_t off = 0;
  while (off < body) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buf.size(), body - off));
    const ssize_t n = pread(fd, buf.data(), want, static_cast<off_t>(off));
    if (n <= 0) {
      EVP_MD_CTX_free(ctx);
      return absl::DataLossError(absl::StrCat("cannot read ", file, ": ", std::strerror(errno)));
    }
    EVP_DigestUpdate(ctx, buf.data(), static_cast<size_t>(n));
    off += static_cast<uint64_t>(n);
  }
  unsigned char sum[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, sum, &len);
  EVP_MD_CTX_free(ctx);
  char stored[kSnapshotHashSize];
  if (pread(fd, stored, kSnapshotHashSize, static_cast<off_t>(body)) !=
          static_cast<ssize_t>(kSnapshotHashSize) ||
      len != kSnapshotHashSize || std::memcmp(stored, sum, kSnapshotHashSize) != 0) {
    return absl::DataLossError(absl::StrCat(
        "snapshot ", file,
        ": sha256 checksum mismatch (the file is corrupt or truncated; save it again with "
        "`etcdctl snapshot save`)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Source>> OpenSource(const std::string& from) {
  std::error_code ec;
  auto src = std::make_unique<Source>();
  if (fs::is_directory(from, ec)) {
    for (const char* rel : {"member/snap/db", "snap/db"}) {
      if (fs::is_regular_file(fs::path(from) / rel, ec)) {
        src->file = (fs::path(from) / rel).string();
        break;
      }
    }
    if (src->file.empty()) {
      return absl::NotFoundError(absl::StrCat(
          "no etcd data in ", from, ": expected its backend at ", from, "/member/snap/db"));
    }
  } else if (fs::is_regular_file(from, ec)) {
    src->file = from;
  } else {
    return absl::NotFoundError(absl::StrCat("--from-etcd ", from, ": no such file or directory"));
  }
  src->lock_fd = ::open(src->file.c_str(), O_RDONLY | O_CLOEXEC);
  if (src->lock_fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", src->file, ": ", std::strerror(errno)));
  }
  // etcd (bbolt) holds an exclusive lock on its db while it runs. A shared
  // lock, held for the whole migration, keeps etcd from starting on it too.
  if (flock(src->lock_fd, LOCK_SH | LOCK_NB) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        src->file, " is locked: an etcd is still running on it. Stop etcd first, or migrate from "
                   "a snapshot (`etcdctl snapshot save FILE`)"));
  }
  struct stat st;
  if (fstat(src->lock_fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("cannot stat ", src->file));
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::optional<uint64_t> length;
  if (size % 512 == kSnapshotHashSize) {
    if (auto s = CheckSnapshotHash(src->file, src->lock_fd, size - kSnapshotHashSize); !s.ok()) {
      return s;
    }
    src->snapshot = true;
    length = size - kSnapshotHashSize;
  }
  auto reader = BboltReader::Open(src->file, length);
  if (!reader.ok()) return reader.status();
  src->reader = std::move(*reader);
  return src;
}

// ---- Records of the source, decoded. ----

struct SourceRecord {
  Revision rev;
  bool tombstone = false;
  std::string_view key_bytes;  // the 17/18-byte revision key
  std::string_view record;     // the stored mvccpb.KeyValue
  std::string_view key;        // the KV key, inside record
  int64_t lease = 0;
};

// Visits the key bucket in order, checking every record.
absl::Status ForEachKeyRecord(const BboltReader& r,
                              const std::function<absl::Status(const SourceRecord&)>& fn) {
  return r.ForEach({kKeyBucket}, [&fn](std::string_view k, std::string_view v, bool is_bucket) {
    if (is_bucket) return absl::DataLossError("the key bucket holds a nested bucket");
    SourceRecord rec;
    if (!mvcc::ParseRevisionKey(k, &rec.rev, &rec.tombstone)) {
      return absl::DataLossError(
          absl::StrCat("the key bucket holds a key that is not a revision (", k.size(), " bytes)"));
    }
    mvcc::KeyValueView kv;
    if (!mvcc::DecodeKeyValue(v, &kv) || kv.key.empty()) {
      return absl::DataLossError(
          absl::StrCat("the record at revision ", rec.rev.main, "_", rec.rev.sub,
                       " is not an mvccpb.KeyValue"));
    }
    if (!rec.tombstone && kv.mod_revision != rec.rev.main) {
      return absl::DataLossError(absl::StrCat("the record at revision ", rec.rev.main,
                                              " has mod_revision ", kv.mod_revision));
    }
    rec.key_bytes = k;
    rec.record = v;
    rec.key = kv.key;
    rec.lease = kv.lease;
    return fn(rec);
  });
}

struct SourceMeta {
  int64_t scheduled = 0, finished = 0;
  std::optional<uint64_t> consistent_index;
  std::vector<std::pair<std::string, std::string>> carried;  // as written to kMeta
  std::vector<std::string> not_carried;
};

absl::StatusOr<SourceMeta> ReadSourceMeta(const BboltReader& r) {
  SourceMeta m;
  auto has = r.HasBucket({kMetaBucket});
  if (!has.ok()) return has.status();
  if (!*has) return m;
  auto s = r.ForEach({kMetaBucket}, [&m](std::string_view k, std::string_view v, bool is_bucket) {
    if (is_bucket) return absl::DataLossError("the meta bucket holds a nested bucket");
    Revision rev;
    bool tombstone;
    if (k == mvcc::kScheduledCompactKey || k == mvcc::kFinishedCompactKey) {
      if (!mvcc::ParseRevisionKey(v, &rev, &tombstone) || tombstone || rev.main < 0) {
        return absl::DataLossError(absl::StrCat("meta record ", Printable(k), " is not a revision"));
      }
      (k == mvcc::kScheduledCompactKey ? m.scheduled : m.finished) = rev.main;
      m.carried.emplace_back(std::string(k), mvcc::EncodeMetaRevision(rev.main));
    } else if (k == mvcc::kConsistentIndexKey) {
      if (v.size() != 8) return absl::DataLossError("meta record consistent_index is not 8 bytes");
      m.consistent_index = mvcc::ReadBigEndian64(v.data());
      m.carried.emplace_back(std::string(k), std::string(v));
    } else {
      m.not_carried.push_back(absl::StrCat("meta record ", Printable(k)));
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return m;
}

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
        if (k.size() != 8 || !mvcc::DecodeLeaseRecord(v, &id, &ttl) ||
            static_cast<uint64_t>(id) != mvcc::ReadBigEndian64(k.data())) {
          return absl::DataLossError("the lease bucket holds a corrupt lease record");
        }
        ++report->leases;
        return out.Put(Cf::kLease, mvcc::LeaseKey(id), mvcc::EncodeLeaseRecord(id, ttl));
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

// ---- Verification. ----

void Mismatch(MigrateReport* report, std::string what) {
  ++report->mismatches;
  if (report->mismatch_examples.size() < kMaxMismatchExamples) {
    report->mismatch_examples.push_back(std::move(what));
  }
}

// Describes how a Range answer differs from the model's live keys.
std::string DescribeRangeDiff(int64_t rev, const mvcc::RangeResult& got,
                              const std::map<std::string_view, std::string_view>& live) {
  std::string text = absl::StrCat("revision ", rev, ": full Range differs: capstan count ",
                                  got.count, " (", got.num_kvs, " kvs), etcd count ", live.size());
  etcdserverpb::RangeResponse parsed;
  if (!parsed.ParseFromString(got.kvs_wire)) return text + "; capstan's kvs do not parse";
  auto it = live.begin();
  for (int i = 0; i < parsed.kvs_size(); ++i, ++it) {
    if (it == live.end()) return absl::StrCat(text, "; extra key ", Printable(parsed.kvs(i).key()));
    if (parsed.kvs(i).key() != it->first) {
      return absl::StrCat(text, "; first differing key: capstan ", Printable(parsed.kvs(i).key()),
                          ", etcd ", Printable(it->first));
    }
    if (parsed.kvs(i).SerializeAsString() != it->second) {
      return absl::StrCat(text, "; key ", Printable(it->first), " has different bytes");
    }
  }
  if (it != live.end()) return absl::StrCat(text, "; missing key ", Printable(it->first));
  return text;
}

std::string ExpectedWire(const std::map<std::string_view, std::string_view>& live) {
  std::string wire;
  for (const auto& [k, record] : live) mvcc::AppendRecordField(2, record, false, &wire);
  return wire;
}

absl::Status Verify(const BboltReader& r, const std::string& data_dir, int64_t stride,
                    MigrateReport* report) {
  if (stride < 1) stride = 1;
  // The source model: every record, in revision order.
  std::vector<SourceRecord> records;
  if (auto s = ForEachKeyRecord(r, [&records](const SourceRecord& rec) {
        records.push_back(rec);
        return absl::OkStatus();
      });
      !s.ok()) {
    return s;
  }
  auto meta = ReadSourceMeta(r);
  if (!meta.ok()) return meta.status();
  const int64_t compact = std::max(meta->scheduled, meta->finished);
  const int64_t current =
      std::max<int64_t>({records.empty() ? 0 : records.back().rev.main, compact, 1});

  // The store, opened as a server would but never serving; lease expiry is
  // pushed out of reach so verification writes nothing.
  storage::BackendOptions bopts;
  bopts.dir = BackendDir(data_dir);
  auto backend = storage::Backend::Open(bopts);
  if (!backend.ok()) return backend.status();
  mvcc::KvStoreOptions sopts;
  sopts.lease_check_interval = absl::Hours(24 * 365);
  auto opened = mvcc::KvStore::Open(sopts, std::move(*backend));
  if (!opened.ok()) return opened.status();
  mvcc::KvStore& store = **opened;
  store.WaitCompactionDone();  // an interrupted etcd compaction is resumed on open

  if (store.Rev() != current) {
    Mismatch(report, absl::StrCat("current revision: capstan ", store.Rev(), ", etcd ", current));
  }
  if (store.CompactRev() != compact) {
    Mismatch(report, absl::StrCat("compact revision: capstan ", store.CompactRev(), ", etcd ",
                                  compact));
  }
  if (store.AppliedIndex() != meta->consistent_index.value_or(0)) {
    Mismatch(report, absl::StrCat("consistent index: capstan ", store.AppliedIndex(), ", etcd ",
                                  meta->consistent_index.value_or(0)));
  }

  // Range at every retained revision.
  std::map<std::string_view, std::string_view> live;
  size_t next = 0;
  auto apply_through = [&](int64_t rev, std::vector<const SourceRecord*>* changed) {
    for (; next < records.size() && records[next].rev.main <= rev; ++next) {
      const SourceRecord& rec = records[next];
      if (rec.tombstone) {
        live.erase(rec.key);
      } else {
        live[rec.key] = rec.record;
      }
      if (changed != nullptr) changed->push_back(&rec);
    }
  };
  const int64_t first = std::max<int64_t>(compact, 1);
  apply_through(first - 1, nullptr);
  report->first_revision_checked = first;
  for (int64_t rev = first; rev <= current; ++rev) {
    std::vector<const SourceRecord*> changed;
    apply_through(rev, &changed);
    ++report->revisions_checked;
    const bool full = stride == 1 || rev == first || rev == current || (rev - first) % stride == 0;
    if (full) {
      ++report->full_ranges_checked;
      etcdserverpb::RangeRequest req;
      req.set_key(std::string(1, '\0'));
      req.set_range_end(std::string(1, '\0'));
      req.set_revision(rev);
      mvcc::RangeResult got;
      if (auto s = store.Range(req, &got); !s.ok()) {
        Mismatch(report, absl::StrCat("revision ", rev, ": Range failed: ", s.message()));
        continue;
      }
      if (got.count != static_cast<int64_t>(live.size()) ||
          got.num_kvs != static_cast<int>(live.size()) || got.kvs_wire != ExpectedWire(live)) {
        Mismatch(report, DescribeRangeDiff(rev, got, live));
      }
      continue;
    }
    for (const SourceRecord* rec : changed) {
      etcdserverpb::RangeRequest req;
      req.set_key(std::string(rec->key));
      req.set_revision(rev);
      mvcc::RangeResult got;
      auto s = store.Range(req, &got);
      auto it = live.find(rec->key);
      std::string want;
      if (it != live.end()) mvcc::AppendRecordField(2, it->second, false, &want);
      if (!s.ok() || got.kvs_wire != want) {
        Mismatch(report, absl::StrCat("revision ", rev, ": key ", Printable(rec->key), " differs"));
      }
    }
  }
  report->live_keys = static_cast<int64_t>(live.size());

  // HashKV with etcd's algorithm over the source (etcd's store.hashByRev,
  // the same in 3.4 and 3.5): CRC-32C of "key" and of every record up to
  // the hash revision, leaving out records at or below the compaction
  // revision that are not in treeIndex.Keep(hash revision), i.e. not the
  // latest record of a key live at the hash revision. (Keep is taken at the
  // hash revision, not at the compaction revision: a record kept by the
  // compaction but superseded since is left out.)
  absl::flat_hash_map<std::string_view, const SourceRecord*> latest;
  for (const SourceRecord& rec : records) {
    if (rec.rev.main > current) break;
    latest[rec.key] = &rec;
  }
  absl::flat_hash_set<Revision> keep;
  for (const auto& [k, rec] : latest) {
    if (!rec->tombstone) keep.insert(rec->rev);
  }
  uint32_t h = mvcc::Crc32cExtend(0, kKeyBucket);
  for (const SourceRecord& rec : records) {
    if (rec.rev.main > current) break;
    if (rec.rev.main <= compact && !keep.empty() && !keep.contains(rec.rev)) continue;
    h = mvcc::Crc32cExtend(h, rec.key_bytes);
    h = mvcc::Crc32cExtend(h, rec.record);
  }
  report->source_hash = h;
  uint32_t capstan_hash = 0;
  int64_t hash_compact = 0, hash_rev = 0;
  if (auto s = store.HashKV(0, &capstan_hash, &hash_compact, &hash_rev); !s.ok()) {
    Mismatch(report, absl::StrCat("HashKV failed: ", s.message()));
  } else {
    report->capstan_hash = capstan_hash;
    if (capstan_hash != h || hash_rev != current) {
      Mismatch(report, absl::StrFormat("HashKV: capstan %u at revision %d, etcd %u at revision %d",
                                       capstan_hash, hash_rev, h, current));
    }
  }

  // Leases, with the keys attached to them (each live key's latest record
  // names its lease, as etcd's restore reads it).
  std::map<int64_t, std::vector<std::string>> lease_keys;
  {
    absl::flat_hash_map<std::string_view, int64_t> key_lease;
    for (const SourceRecord& rec : records) {
      if (rec.tombstone || rec.lease == 0) {
        key_lease.erase(rec.key);
      } else {
        key_lease[rec.key] = rec.lease;
      }
    }
    for (const auto& [k, id] : key_lease) lease_keys[id].emplace_back(k);
    for (auto& [id, keys] : lease_keys) std::sort(keys.begin(), keys.end());
  }
  uint64_t source_leases = 0;
  auto has_lease = r.HasBucket({kLeaseBucket});
  if (!has_lease.ok()) return has_lease.status();
  if (*has_lease) {
    auto s = r.ForEach({kLeaseBucket}, [&](std::string_view, std::string_view v, bool) {
      int64_t id, ttl;
      if (!mvcc::DecodeLeaseRecord(v, &id, &ttl)) return absl::DataLossError("corrupt lease");
      ++source_leases;
      auto info = store.lessor()->Get(id, /*with_keys=*/true);
      if (!info.has_value()) {
        Mismatch(report, absl::StrFormat("lease %x is missing", id));
        return absl::OkStatus();
      }
      if (info->granted_ttl != ttl) {
        Mismatch(report, absl::StrFormat("lease %x: TTL capstan %d, etcd %d", id,
                                         info->granted_ttl, ttl));
      }
      if (info->keys != lease_keys[id]) {
        Mismatch(report, absl::StrFormat("lease %x: capstan holds %d keys, etcd %d", id,
                                         info->keys.size(), lease_keys[id].size()));
      }
      ++report->leases_checked;
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
  }
  if (store.lessor()->size() != source_leases) {
    Mismatch(report, absl::StrCat("leases: capstan ", store.lessor()->size(), ", etcd ",
                                  source_leases));
  }

  // Auth and alarm records, byte for byte.
  uint64_t auth = 0;
  for (const char* bucket : kAuthBuckets) {
    auto has = r.HasBucket({bucket});
    if (!has.ok()) return has.status();
    if (!*has) continue;
    auto s = r.ForEach({bucket}, [&](std::string_view k, std::string_view v, bool) {
      ++auth;
      std::string got;
      const std::string key = absl::StrCat(bucket, "/", Sv(k));
      if (!store.backend()->Get(Cf::kAuth, key, &got).ok() || got != v) {
        Mismatch(report, absl::StrCat("auth record ", Printable(key), " differs"));
      }
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
  }
  uint64_t capstan_auth = 0;
  {
    auto it = store.backend()->NewIterator(Cf::kAuth);
    for (it->SeekToFirst(); it->Valid(); it->Next()) ++capstan_auth;
  }
  if (capstan_auth != auth) {
    Mismatch(report, absl::StrCat("auth records: capstan ", capstan_auth, ", etcd ", auth));
  }
  uint64_t alarms = 0;
  auto has_alarm = r.HasBucket({kAlarmBucket});
  if (!has_alarm.ok()) return has_alarm.status();
  if (*has_alarm) {
    auto s = r.ForEach({kAlarmBucket}, [&alarms](std::string_view, std::string_view, bool) {
      ++alarms;
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
  }
  if (store.Alarms().size() != alarms) {
    Mismatch(report, absl::StrCat("alarms: capstan ", store.Alarms().size(), ", etcd ", alarms));
  }
  report->verified = true;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MigrateReport> MigrateFromEtcd(const MigrateOptions& options) {
  if (options.from.empty()) return absl::InvalidArgumentError("--from-etcd is required");
  if (options.data_dir.empty()) return absl::InvalidArgumentError("--data-dir is required");
  const fs::path target = Normalized(options.data_dir);
  if (auto s = CheckNewDataDir(target); !s.ok()) return s;
  auto source = OpenSource(options.from);
  if (!source.ok()) return source.status();
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
  if (auto s = PrepareDataDir(tmp.string()); !s.ok()) return fail(s);
  {
    storage::BackendOptions bopts;
    bopts.dir = BackendDir(tmp.string());
    bopts.sync = false;  // one Flush at the end makes it all durable
    auto backend = storage::Backend::Open(bopts);
    if (!backend.ok()) return fail(backend.status());
    if (auto s = CopyRecords(reader, backend->get(), options, &report); !s.ok()) return fail(s);
    if (auto s = (*backend)->Flush(); !s.ok()) return fail(s);
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
  if (options.verify) {
    if (options.progress) options.progress("verifying");
    if (auto s = Verify(reader, target.string(), options.verify_stride, &report); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("verification failed to run: ", s.message()));
    }
  }
  return report;
}

absl::Status VerifyMigration(const std::string& from, const std::string& data_dir,
                             int64_t verify_stride, MigrateReport* report) {
  auto source = OpenSource(from);
  if (!source.ok()) return source.status();
  report->source_file = (*source)->file;
  report->snapshot = (*source)->snapshot;
  return Verify(*(*source)->reader, data_dir, verify_stride, report);
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
  if (!r.verified) return out;
  absl::StrAppendFormat(&out, "verify revisions:  %d checked (%d..%d), %d with a full Range\n",
                        r.revisions_checked, r.first_revision_checked,
                        r.first_revision_checked + r.revisions_checked - 1,
                        r.full_ranges_checked);
  absl::StrAppendFormat(&out, "verify keys:       %d live at the current revision\n", r.live_keys);
  absl::StrAppendFormat(&out, "verify leases:     %d\n", r.leases_checked);
  absl::StrAppendFormat(&out, "verify HashKV:     etcd %d, capstan %d (%s)\n", r.source_hash,
                        r.capstan_hash, r.source_hash == r.capstan_hash ? "equal" : "DIFFERENT");
  absl::StrAppendFormat(&out, "verify mismatches: %d\n", r.mismatches);
  for (const auto& m : r.mismatch_examples) absl::StrAppend(&out, "  mismatch: ", m, "\n");
  return out;
}

namespace {

constexpr char kMigrateUsage[] =
    "Usage:\n"
    "  capstan migrate --from-etcd SRC --data-dir NEW [--verify] [--verify-stride N]\n"
    "SRC is a stopped etcd's data directory (its member/snap/db is read), an etcd bbolt db\n"
    "file, or a file written by `etcdctl snapshot save`. It is only read.\n"
    "NEW must not exist (or be empty); start capstan on it with your etcd flags afterwards.\n"
    "--verify compares the result with SRC at every retained revision and by HashKV;\n"
    "--verify-stride N compares a full Range at every Nth revision only (and the changed\n"
    "keys at every revision). See docs/MIGRATION.md.\n";

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
