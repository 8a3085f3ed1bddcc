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
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "mvcc/kv_codec.h"
#include "mvcc/meta_keys.h"
#include "mvcc/revision_key.h"
#include "openssl/evp.h"
#include "storage/etcdfmt/bbolt_reader.h"


namespace capstan::server::migrate_internal {
namespace fs = std::filesystem;

using index::Revision;
using etcdfmt::BboltReader;

namespace {

// etcdctl's snapshot files end with the SHA-256 of the bbolt file; etcdctl
// recognises them by their size: 32 past a multiple of 512.
constexpr uint64_t kSnapshotHashSize = 32;

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

}  // namespace

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
      m.consistent_index = util::ReadBigEndian64(v.data());
      m.carried.emplace_back(std::string(k), std::string(v));
    } else {
      m.not_carried.push_back(absl::StrCat("meta record ", Printable(k)));
    }
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return m;
}

std::string WalDirOf(const Source& source) {
  if (source.snapshot) return {};
  const fs::path snap = fs::path(source.file).parent_path();
  if (snap.filename() != "snap") return {};
  const fs::path wal = snap.parent_path() / "wal";
  std::error_code ec;
  return fs::is_directory(wal, ec) ? wal.string() : std::string();
}

absl::StatusOr<std::vector<std::string>> ListMembers(const etcdfmt::BboltReader& r) {
  std::vector<std::string> members;
  auto buckets = r.Buckets();
  if (!buckets.ok()) return buckets.status();
  if (std::find(buckets->begin(), buckets->end(), "members") == buckets->end()) return members;
  auto s = r.ForEach({"members"}, [&members](std::string_view k, std::string_view, bool) {
    members.emplace_back(k);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return members;
}

}  // namespace capstan::server::migrate_internal
