#include "storage/backend.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rocksdb/cache.h"
#include "rocksdb/convenience.h"
#include "rocksdb/db.h"
#include "rocksdb/file_system.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/options.h"
#include "rocksdb/table.h"
#include "rocksdb/transaction_log.h"
#include "rocksdb/utilities/checkpoint.h"
#include "rocksdb/write_batch.h"
#include "storage/rocks_file_system.h"
#include "util/mutex.h"

namespace capstan::storage {
namespace {

// The error of key i of a MultiGetVisit, saying which key it was.
absl::Status MultiGetError(size_t i, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("key ", i, " of the batch: ", s.message()));
}

constexpr std::array<const char*, kNumCfs> kCfNames = {"key",  "meta",  "lease",
                                                        "auth", "alarm", "raft"};

rocksdb::Slice ToSlice(std::string_view s) { return rocksdb::Slice(s.data(), s.size()); }
std::string_view ToView(const rocksdb::Slice& s) { return std::string_view(s.data(), s.size()); }

absl::Status FromRocks(const rocksdb::Status& s) {
  if (s.ok()) return absl::OkStatus();
  if (s.IsNotFound()) return absl::NotFoundError(s.ToString());
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(s.ToString());
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(s.ToString());
  if (s.IsCorruption()) return absl::DataLossError(s.ToString());
  return absl::InternalError(s.ToString());
}

// One open RocksDB and the handles of its families. Shared by the backend
// and by each read running on it and each iterator made on it, so that a
// database replaced by ReplaceWith closes only when its last reader ends.
struct RocksInstance {
  RocksInstance(std::shared_ptr<rocksdb::Env> env, std::unique_ptr<rocksdb::DB> db,
                std::vector<rocksdb::ColumnFamilyHandle*> handles)
      : env(std::move(env)), db(std::move(db)), handles(std::move(handles)) {}
  ~RocksInstance() {
    for (auto* h : handles) {
      if (h != nullptr) db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    }
    db->Close().PermitUncheckedError();
  }
  RocksInstance(const RocksInstance&) = delete;
  RocksInstance& operator=(const RocksInstance&) = delete;

  rocksdb::ColumnFamilyHandle* handle(Cf cf) const { return handles[static_cast<int>(cf) + 1]; }

  // The Env the database does its I/O through; outlives it.
  const std::shared_ptr<rocksdb::Env> env;
  const std::unique_ptr<rocksdb::DB> db;
  // handles[0] is RocksDB's default family; handles[1 + Cf] are ours, null
  // for a family a read-only backend's files lack.
  const std::vector<rocksdb::ColumnFamilyHandle*> handles;
};

class RocksIterator final : public Iterator {
 public:
  // it reads instance's database, which it keeps open.
  RocksIterator(std::shared_ptr<RocksInstance> instance, rocksdb::Iterator* it)
      : instance_(std::move(instance)), it_(it) {}
  void Seek(std::string_view target) override { it_->Seek(ToSlice(target)); }
  void SeekToFirst() override { it_->SeekToFirst(); }
  void SeekToLast() override { it_->SeekToLast(); }
  bool Valid() const override { return it_->Valid(); }
  void Next() override { it_->Next(); }
  void Prev() override { it_->Prev(); }
  std::string_view key() const override { return ToView(it_->key()); }
  std::string_view value() const override { return ToView(it_->value()); }
  absl::Status status() const override { return FromRocks(it_->status()); }

 private:
  // Declared first: destroyed after the iterator.
  std::shared_ptr<RocksInstance> instance_;
  std::unique_ptr<rocksdb::Iterator> it_;
};

// What a read-only backend reads of a column family its files lack.
class EmptyIterator final : public Iterator {
 public:
  void Seek(std::string_view) override {}
  void SeekToFirst() override {}
  void SeekToLast() override {}
  bool Valid() const override { return false; }
  void Next() override {}
  void Prev() override {}
  std::string_view key() const override { return {}; }
  std::string_view value() const override { return {}; }
  absl::Status status() const override { return absl::OkStatus(); }
};

absl::Status MissingFamily() { return absl::NotFoundError("NotFound: "); }

// Opens the database in options.dir as Backend::Open describes.
absl::StatusOr<std::shared_ptr<RocksInstance>> OpenInstance(const BackendOptions& options);

class RocksBackend final : public Backend {
 public:
  RocksBackend(BackendOptions options, std::shared_ptr<RocksInstance> instance)
      : options_(std::move(options)), instance_(std::move(instance)) {
    write_options_.sync = options_.sync;
  }

  absl::Status Write(WriteBatch* batch) override;

  absl::Status Get(Cf cf, std::string_view key, std::string* value) const override {
    const auto in = Current();
    if (in->handle(cf) == nullptr) return MissingFamily();
    return FromRocks(in->db->Get(rocksdb::ReadOptions(), in->handle(cf), ToSlice(key), value));
  }

  std::vector<absl::Status> MultiGet(Cf cf, const std::vector<std::string_view>& keys,
                                     std::vector<std::string>* values) const override {
    std::vector<rocksdb::PinnableSlice> pinned;
    std::vector<rocksdb::Status> st;
    const auto in = Current();
    PinnedMultiGet(*in, cf, keys, &pinned, &st);
    values->resize(keys.size());
    std::vector<absl::Status> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      out[i] = FromRocks(st[i]);
      if (st[i].ok()) (*values)[i].assign(pinned[i].data(), pinned[i].size());
    }
    return out;
  }

  absl::Status MultiGetVisit(
      Cf cf, const std::vector<std::string_view>& keys,
      absl::FunctionRef<void(size_t i, std::string_view value)> visit) const override {
    const auto in = Current();
    if (in->handle(cf) == nullptr) {
      return keys.empty() ? absl::OkStatus() : MultiGetError(0, MissingFamily());
    }
    std::vector<rocksdb::PinnableSlice> pinned;
    std::vector<rocksdb::Status> st;
    PinnedMultiGet(*in, cf, keys, &pinned, &st);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!st[i].ok()) return MultiGetError(i, FromRocks(st[i]));
      visit(i, std::string_view(pinned[i].data(), pinned[i].size()));
    }
    return absl::OkStatus();
  }

  absl::Status ScanVisit(
      Cf cf, const std::vector<std::string_view>& keys,
      absl::FunctionRef<void(size_t i, std::string_view value)> visit) const override {
    // Steps over unwanted entries before a seek is cheaper: a seek searches
    // every level's index and data block, a step parses one entry.
    constexpr int kMaxSteps = 16;
    const size_t n = keys.size();
    if (n == 0) return absl::OkStatus();
    const auto in = Current();
    if (in->handle(cf) == nullptr) return MultiGetError(0, MissingFamily());
    std::vector<uint32_t> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
    auto before = [&keys](uint32_t a, uint32_t b) { return keys[a] < keys[b]; };
    if (!std::is_sorted(order.begin(), order.end(), before)) {
      std::sort(order.begin(), order.end(), before);
    }
    // With pin_data a plain value (no merge operator, no blob files: all
    // Capstan writes) stays where it was read, in a pinned block or the
    // memtable's arena, until the iterator goes, so the keys can be visited
    // in their own order afterwards.
    std::string upper(keys[order[n - 1]]);
    upper.push_back('\0');
    const rocksdb::Slice upper_slice(upper);
    rocksdb::ReadOptions ro;
    ro.pin_data = true;
    ro.iterate_upper_bound = &upper_slice;
    std::unique_ptr<rocksdb::Iterator> it(in->db->NewIterator(ro, in->handle(cf)));
    std::vector<std::string_view> values(n);
    bool positioned = false;
    for (uint32_t i : order) {
      const rocksdb::Slice target = ToSlice(keys[i]);
      if (positioned) {
        for (int step = 0; step < kMaxSteps && it->Valid() && it->key().compare(target) < 0;
             ++step) {
          it->Next();
        }
      }
      if (!positioned || (it->Valid() && it->key().compare(target) < 0)) {
        it->Seek(target);
        positioned = true;
      }
      if (!it->Valid() || it->key() != target) {
        if (!it->status().ok()) return MultiGetError(i, FromRocks(it->status()));
        return MultiGetError(i, absl::NotFoundError("NotFound: "));
      }
      values[i] = ToView(it->value());
    }
    for (size_t i = 0; i < n; ++i) visit(i, values[i]);
    return absl::OkStatus();
  }

  // One RocksDB MultiGet: (*pinned)[i] holds keys[i]'s value, pinned in the
  // block cache or memtable, when (*st)[i] is OK.
  static void PinnedMultiGet(const RocksInstance& in, Cf cf,
                             const std::vector<std::string_view>& keys,
                             std::vector<rocksdb::PinnableSlice>* pinned,
                             std::vector<rocksdb::Status>* st) {
    const size_t n = keys.size();
    if (in.handle(cf) == nullptr) {
      *pinned = std::vector<rocksdb::PinnableSlice>(n);
      st->assign(n, rocksdb::Status::NotFound());
      return;
    }
    std::vector<rocksdb::Slice> slices;
    slices.reserve(n);
    for (auto k : keys) slices.push_back(ToSlice(k));
    *pinned = std::vector<rocksdb::PinnableSlice>(n);
    st->assign(n, rocksdb::Status());
    in.db->MultiGet(rocksdb::ReadOptions(), in.handle(cf), n, slices.data(), pinned->data(),
                    st->data(), /*sorted_input=*/false);
  }

  std::unique_ptr<Iterator> NewIterator(Cf cf) const override {
    auto in = Current();
    if (in->handle(cf) == nullptr) return std::make_unique<EmptyIterator>();
    rocksdb::ReadOptions ro;
    ro.fill_cache = true;
    rocksdb::Iterator* it = in->db->NewIterator(ro, in->handle(cf));
    return std::make_unique<RocksIterator>(std::move(in), it);
  }

  // Memtables are counted through the WAL that holds their data: the
  // memtable size properties report arena blocks allocated, not data.
  // What is not in table files yet: the WAL's bytes, or the memtables'
  // when batches skip the WAL (WriteBatch::set_wal), whichever is larger.
  static uint64_t WalBytes(const RocksInstance& in) {
    rocksdb::VectorLogPtr files;
    uint64_t total = 0;
    if (in.db->GetSortedWalFiles(files).ok()) {
      for (const auto& f : files) total += f->SizeFileBytes();
    }
    // A store that writes without a WAL (a Raft member's) holds its
    // unflushed data in the memtables only: their data's size, not the
    // memory they reserved (an arena block per family, about 1 MiB in all
    // after a few writes, which took a small quota at once).
    static const std::string kAfterEveryKey(64, '\xff');
    const rocksdb::Range everything("", kAfterEveryKey);
    uint64_t memtables = 0;
    for (auto* h : in.handles) {
      if (h == nullptr) continue;
      uint64_t count = 0, size = 0;
      in.db->GetApproximateMemTableStats(h, everything, &count, &size);
      memtables += size;
    }
    return std::max(total, memtables);
  }

  uint64_t SizeOnDisk() const override {
    const auto in = Current();
    uint64_t total = WalBytes(*in);
    for (auto* h : in->handles) {
      if (h == nullptr) continue;
      uint64_t v = 0;
      if (in->db->GetIntProperty(h, rocksdb::DB::Properties::kTotalSstFilesSize, &v)) total += v;
    }
    return total;
  }

  uint64_t LiveDataSize() const override {
    const auto in = Current();
    uint64_t total = WalBytes(*in);
    for (auto* h : in->handles) {
      if (h == nullptr) continue;
      uint64_t v = 0;
      if (in->db->GetIntProperty(h, rocksdb::DB::Properties::kEstimateLiveDataSize, &v)) {
        total += v;
      }
    }
    return total;
  }

  absl::Status CompactAll() override {
    rocksdb::CompactRangeOptions cro;
    cro.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
    const auto in = Current();
    for (auto* h : in->handles) {
      if (h == nullptr) continue;
      auto s = in->db->CompactRange(cro, h, nullptr, nullptr);
      if (!s.ok()) return FromRocks(s);
    }
    return absl::OkStatus();
  }

  absl::Status Checkpoint(const std::string& dir) override {
    rocksdb::Checkpoint* cp = nullptr;
    const auto in = Current();
    auto s = rocksdb::Checkpoint::Create(in->db.get(), &cp);
    if (!s.ok()) return FromRocks(s);
    std::unique_ptr<rocksdb::Checkpoint> owned(cp);
    return FromRocks(owned->CreateCheckpoint(dir));
  }

  absl::Status Flush() override {
    rocksdb::FlushOptions fo;
    fo.wait = true;
    const auto in = Current();
    std::vector<rocksdb::ColumnFamilyHandle*> present;
    for (auto* h : in->handles) {
      if (h != nullptr) present.push_back(h);
    }
    auto s = in->db->Flush(fo, present);
    if (!s.ok()) return FromRocks(s);
    return FromRocks(in->db->FlushWAL(/*sync=*/true));
  }

  absl::Status ReplaceWith(const std::string& dir) override;
  absl::Status ReclaimRange(Cf cf, std::string_view begin, std::string_view end) override;

  const BackendOptions& options() const override { return options_; }

 private:
  // The database calls use from now on; the caller holds it open.
  std::shared_ptr<RocksInstance> Current() const ABSL_LOCKS_EXCLUDED(instance_mu_) {
    util::MutexLock l(&instance_mu_);
    return instance_;
  }

  const BackendOptions options_;
  // A leaf lock: held only to copy or replace instance_.
  mutable util::Mutex instance_mu_;
  std::shared_ptr<RocksInstance> instance_ ABSL_GUARDED_BY(instance_mu_);
  rocksdb::WriteOptions write_options_;
#if defined(__SANITIZE_THREAD__)
  // Under ThreadSanitizer writes go one at a time: otherwise RocksDB's
  // write-group leader copies a concurrent writer's batch (the committer's
  // and the compactor's) with synchronization TSan cannot see, in Debian's
  // uninstrumented frames it often cannot name, so no suppression can single
  // those reports out. RocksDB's write group is not Capstan's to check.
  // It guards no state: it serializes the calls into RocksDB, a write held
  // under a lock on purpose (a TSan build only).
  util::Mutex tsan_write_mu_;
#endif
};

}  // namespace

struct WriteBatch::Rep {
  rocksdb::WriteBatch batch;
};

struct WriteBatchAccess {
  static rocksdb::WriteBatch* Rocks(WriteBatch* b) { return &b->rep_->batch; }
};

WriteBatch::WriteBatch() : rep_(std::make_unique<Rep>()) {}
WriteBatch::~WriteBatch() = default;

// Operations are staged directly into a rocksdb::WriteBatch by column family
// id: rocksdb::WriteBatch reads only the id and the comparator of a handle, so
// a minimal handle carrying the id lets batches be built without a DB.
namespace {
class IdHandle final : public rocksdb::ColumnFamilyHandle {
 public:
  explicit IdHandle(uint32_t id) : id_(id) {}
  const std::string& GetName() const override { return name_; }
  uint32_t GetID() const override { return id_; }
  rocksdb::Status GetDescriptor(rocksdb::ColumnFamilyDescriptor*) override {
    return rocksdb::Status::NotSupported();
  }
  const rocksdb::Comparator* GetComparator() const override {
    return rocksdb::BytewiseComparator();
  }

 private:
  uint32_t id_;
  std::string name_;
};

IdHandle* HandleFor(Cf cf) {
  // Column family ids are assigned in creation order: default is 0, then
  // kCfNames in order; Open() checks this holds.
  static IdHandle* handles[kNumCfs] = {new IdHandle(1), new IdHandle(2), new IdHandle(3),
                                       new IdHandle(4), new IdHandle(5), new IdHandle(6)};
  return handles[static_cast<int>(cf)];
}
}  // namespace

void WriteBatch::Put(Cf cf, std::string_view key, std::string_view value) {
  rep_->batch.Put(HandleFor(cf), ToSlice(key), ToSlice(value)).PermitUncheckedError();
}
void WriteBatch::Delete(Cf cf, std::string_view key) {
  rep_->batch.Delete(HandleFor(cf), ToSlice(key)).PermitUncheckedError();
}
void WriteBatch::DeleteRange(Cf cf, std::string_view begin, std::string_view end) {
  rep_->batch.DeleteRange(HandleFor(cf), ToSlice(begin), ToSlice(end)).PermitUncheckedError();
}
void WriteBatch::Clear() { rep_->batch.Clear(); }
int WriteBatch::Count() const { return static_cast<int>(rep_->batch.Count()); }
size_t WriteBatch::ByteSize() const { return rep_->batch.GetDataSize(); }

absl::Status RocksBackend::Write(WriteBatch* batch) {
#if defined(__SANITIZE_THREAD__)
  util::MutexLock l(&tsan_write_mu_);
#endif
  const auto in = Current();
  if (!batch->wal()) {
    rocksdb::WriteOptions no_wal = write_options_;
    no_wal.sync = false;
    no_wal.disableWAL = true;
    return FromRocks(in->db->Write(no_wal, WriteBatchAccess::Rocks(batch)));
  }
  if (batch->sync() || !write_options_.sync) {
    return FromRocks(in->db->Write(write_options_, WriteBatchAccess::Rocks(batch)));
  }
  rocksdb::WriteOptions unsynced = write_options_;
  unsynced.sync = false;
  return FromRocks(in->db->Write(unsynced, WriteBatchAccess::Rocks(batch)));
}

namespace {

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", strerror(errno)));
}

absl::Status SyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open", path);
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  return rc == 0 ? absl::OkStatus() : Errno("cannot sync", path);
}

// Syncs every file of dir, then dir itself.
absl::Status SyncTree(const std::string& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file()) continue;
    if (auto s = SyncPath(entry.path().string(), O_RDONLY); !s.ok()) return s;
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", dir, ": ", ec.message()));
  return SyncPath(dir, O_RDONLY | O_DIRECTORY);
}

std::string ParentOf(const std::string& path) {
  std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();  // a trailing slash
  std::filesystem::path parent = p.parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

bool Exchange(const std::string& a, const std::string& b) {
  return ::renameat2(AT_FDCWD, a.c_str(), AT_FDCWD, b.c_str(), RENAME_EXCHANGE) == 0;
}

// Unimplemented when dir cannot be swapped with live (see ReplaceWith),
// before anything is changed.
absl::Status CheckSwappable(const std::string& live, const std::string& dir) {
  struct stat a {}, b {};
  if (::lstat(live.c_str(), &a) != 0) return Errno("cannot stat", live);
  if (::lstat(dir.c_str(), &b) != 0) return Errno("cannot stat", dir);
  if (!S_ISDIR(a.st_mode) || !S_ISDIR(b.st_mode)) {
    return absl::UnimplementedError(
        absl::StrCat("cannot swap ", dir, " with ", live, ": not both plain directories"));
  }
  if (a.st_dev != b.st_dev) {
    return absl::UnimplementedError(
        absl::StrCat("cannot swap ", dir, " with ", live, ": not on one file system"));
  }
  // Whether the file system exchanges directories: two empty ones beside
  // the live directory are swapped first.
  std::string probe = absl::StrCat(ParentOf(live), "/.capstan-exchange-XXXXXX");
  if (::mkdtemp(probe.data()) == nullptr) return Errno("cannot create", probe);
  const std::string other = probe + ".b";
  absl::Status result = absl::OkStatus();
  if (::mkdir(other.c_str(), 0700) != 0) {
    result = Errno("cannot create", other);
  } else if (!Exchange(probe, other)) {
    result = absl::UnimplementedError(absl::StrCat(
        "cannot swap directories in ", ParentOf(live), ": renameat2 RENAME_EXCHANGE: ",
        strerror(errno)));
  }
  ::rmdir(other.c_str());
  ::rmdir(probe.c_str());
  return result;
}

}  // namespace

absl::Status RocksBackend::ReplaceWith(const std::string& dir) {
  if (options_.read_only) return absl::UnimplementedError("a read-only backend is never replaced");
  if (auto s = CheckSwappable(options_.dir, dir); !s.ok()) return s;
  // The new data is durable before it becomes the backend's.
  if (auto s = SyncTree(dir); !s.ok()) return s;

  // From here on the old database writes no file: its flushes and
  // compactions stop (a running compaction is abandoned; a new Flush fails)
  // and it deletes no file, even when it closes, so nothing it does by
  // name can touch the directory that takes its name. Reads go on.
  const std::shared_ptr<RocksInstance> old = Current();
  if (auto s = old->db->DisableFileDeletions(); !s.ok()) return FromRocks(s);
  rocksdb::CancelAllBackgroundWork(old->db.get(), /*wait=*/true);

  // The one step a crash sees: before it options_.dir is the old data,
  // after it dir's, each whole.
  if (!Exchange(dir, options_.dir)) {
    return Errno(absl::StrCat("cannot swap ", dir, " with"), options_.dir);
  }
  if (auto s = SyncPath(ParentOf(options_.dir), O_RDONLY | O_DIRECTORY); !s.ok()) return s;
  if (ParentOf(dir) != ParentOf(options_.dir)) {
    if (auto s = SyncPath(ParentOf(dir), O_RDONLY | O_DIRECTORY); !s.ok()) return s;
  }

  auto fresh = OpenInstance(options_);
  if (!fresh.ok()) {
    return absl::Status(fresh.status().code(),
                        absl::StrCat("opening the data swapped into ", options_.dir, ": ",
                                     fresh.status().message()));
  }
  util::MutexLock l(&instance_mu_);
  instance_ = *std::move(fresh);
  return absl::OkStatus();
}

absl::Status RocksBackend::ReclaimRange(Cf cf, std::string_view begin, std::string_view end) {
  const auto in = Current();
  if (in->handle(cf) == nullptr || !(begin < end)) return absl::OkStatus();
  const rocksdb::Slice b = ToSlice(begin), e = ToSlice(end);
  // Whole files inside the range go without being read (end excluded).
  if (auto s = rocksdb::DeleteFilesInRange(in->db.get(), in->handle(cf), &b, &e,
                                           /*include_end=*/false);
      !s.ok()) {
    return FromRocks(s);
  }
  // What is left overlaps the range's edges or sits in young files: a
  // compaction of the range drops the deleted keys and their tombstone.
  rocksdb::CompactRangeOptions cro;
  cro.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForceOptimized;
  return FromRocks(in->db->CompactRange(cro, in->handle(cf), &b, &e));
}

absl::Status Backend::ReplaceWith(const std::string& dir) {
  return absl::UnimplementedError(absl::StrCat("this backend cannot take the files in ", dir));
}

absl::Status Backend::ReclaimRange(Cf, std::string_view, std::string_view) {
  return absl::OkStatus();
}

absl::Status Backend::MultiGetVisit(
    Cf cf, const std::vector<std::string_view>& keys,
    absl::FunctionRef<void(size_t i, std::string_view value)> visit) const {
  std::vector<std::string> values;
  auto statuses = MultiGet(cf, keys, &values);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (!statuses[i].ok()) return MultiGetError(i, statuses[i]);
    visit(i, values[i]);
  }
  return absl::OkStatus();
}

absl::Status Backend::ScanVisit(
    Cf cf, const std::vector<std::string_view>& keys,
    absl::FunctionRef<void(size_t i, std::string_view value)> visit) const {
  return MultiGetVisit(cf, keys, visit);
}

namespace {

// RocksDB's lock of a database directory (its LOCK file) taken as an
// open-file-description lock (F_OFD_SETLK): owned by the database that took
// it, released when that database closes. RocksDB's own lock is a POSIX
// record lock plus a process-wide table of locked paths, which refuses a
// database opened at a path an open one already locked, even when the path
// names another directory by then: exactly what ReplaceWith does, while
// readers keep the replaced database open. OFD locks conflict with each
// other and with POSIX locks on the same file, in this process or another,
// so two backends still cannot open one directory.
class DirLockFileSystem final : public rocksdb::FileSystemWrapper {
 public:
  explicit DirLockFileSystem(std::shared_ptr<rocksdb::FileSystem> target)
      : rocksdb::FileSystemWrapper(std::move(target)) {}

  static const char* kClassName() { return "CapstanDirLockFileSystem"; }
  const char* Name() const override { return kClassName(); }

  rocksdb::IOStatus LockFile(const std::string& fname, const rocksdb::IOOptions&,
                             rocksdb::FileLock** lock, rocksdb::IODebugContext*) override {
    *lock = nullptr;
    const int fd = ::open(fname.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return rocksdb::IOStatus::IOError("while open a file for lock: " + fname, strerror(errno));
    struct flock f {};
    f.l_type = F_WRLCK;
    f.l_whence = SEEK_SET;
    if (::fcntl(fd, F_OFD_SETLK, &f) != 0) {
      const int saved = errno;
      ::close(fd);
      return rocksdb::IOStatus::IOError("lock " + fname, strerror(saved));
    }
    *lock = new Lock(fd);
    return rocksdb::IOStatus::OK();
  }

  rocksdb::IOStatus UnlockFile(rocksdb::FileLock* lock, const rocksdb::IOOptions&,
                               rocksdb::IODebugContext*) override {
    delete static_cast<Lock*>(lock);  // closing the descriptor releases the lock
    return rocksdb::IOStatus::OK();
  }

 private:
  class Lock final : public rocksdb::FileLock {
   public:
    explicit Lock(int fd) : fd_(fd) {}
    ~Lock() override { ::close(fd_); }

   private:
    const int fd_;
  };
};

absl::StatusOr<std::shared_ptr<RocksInstance>> OpenInstance(const BackendOptions& options) {
  if (::mkdir(options.dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("cannot create ", options.dir, ": ", strerror(errno)));
  }
  std::shared_ptr<rocksdb::FileSystem> fs =
      options.file_system ? options.file_system->rocks()->fs : rocksdb::FileSystem::Default();
  std::shared_ptr<rocksdb::Env> env =
      rocksdb::NewCompositeEnv(std::make_shared<DirLockFileSystem>(std::move(fs)));
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.max_background_jobs = 2;
  // Compactions are background work: at the lowest CPU priority they take
  // only what requests leave (after a bulk load they took both cores of a
  // 3-member cluster for 1.5 s, and every write waited). If they fall
  // behind, RocksDB's level-0 triggers slow writes down until they catch
  // up. Flushes (the high pool) keep normal priority: a memtable that is
  // not flushed in time stops writes at once. The pools are the process's.
  rocksdb::Env::Default()->LowerThreadPoolCPUPriority(rocksdb::Env::Priority::LOW,
                                                      rocksdb::CpuPriority::kLow);
  db_options.bytes_per_sync = 1 << 20;
  db_options.max_total_wal_size = 256 << 20;
  db_options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  db_options.keep_log_file_num = 3;
  // Batches written without the WAL (WriteBatch::set_wal) survive a crash
  // only as flushed: every family flushes at once, so what survives is the
  // same prefix of batches in all of them.
  db_options.atomic_flush = true;
  db_options.env = env.get();

  auto cache = rocksdb::NewLRUCache(options.block_cache_bytes);
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = cache;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  table.block_size = 16 << 10;
  table.cache_index_and_filter_blocks = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;

  rocksdb::ColumnFamilyOptions cf_options;
  cf_options.write_buffer_size = options.write_buffer_bytes;
  cf_options.level_compaction_dynamic_level_bytes = true;
  cf_options.compression = rocksdb::kLZ4Compression;
  cf_options.bottommost_compression = rocksdb::kZSTD;
  cf_options.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));

  // A data dir made before a family was added gets it at a read-write open
  // (create_missing_column_families, with the next id: families are only
  // ever appended). A read-only open cannot create it: it opens the
  // families the files have and reads a missing one as empty.
  std::vector<bool> present(kNumCfs, true);
  if (options.read_only) {
    std::vector<std::string> existing;
    auto ls = rocksdb::DB::ListColumnFamilies(db_options, options.dir, &existing);
    if (!ls.ok()) return FromRocks(ls);
    for (int i = 0; i < kNumCfs; ++i) {
      present[i] = std::find(existing.begin(), existing.end(), kCfNames[i]) != existing.end();
    }
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  descriptors.emplace_back(rocksdb::kDefaultColumnFamilyName, cf_options);
  for (int i = 0; i < kNumCfs; ++i) {
    if (present[i]) descriptors.emplace_back(kCfNames[i], cf_options);
  }

  rocksdb::DB* raw = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> opened;
  auto s = options.read_only
               ? rocksdb::DB::OpenForReadOnly(db_options, options.dir, descriptors, &opened, &raw)
               : rocksdb::DB::Open(db_options, options.dir, descriptors, &opened, &raw);
  if (!s.ok()) return FromRocks(s);
  std::unique_ptr<rocksdb::DB> db(raw);
  std::vector<rocksdb::ColumnFamilyHandle*> handles(1 + kNumCfs, nullptr);
  handles[0] = opened[0];
  for (int i = 0, next = 1; i < kNumCfs; ++i) {
    if (present[i]) handles[i + 1] = opened[next++];
  }
  for (int i = 0; i < kNumCfs; ++i) {
    if (handles[i + 1] == nullptr) continue;
    if (handles[i + 1]->GetID() != HandleFor(static_cast<Cf>(i))->GetID()) {
      for (auto* h : opened) db->DestroyColumnFamilyHandle(h).PermitUncheckedError();
      return absl::FailedPreconditionError(
          absl::StrCat("column family ", kCfNames[i], " has unexpected id ", handles[i + 1]->GetID()));
    }
  }
  return std::make_shared<RocksInstance>(std::move(env), std::move(db), std::move(handles));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> Backend::Open(const BackendOptions& options) {
  auto instance = OpenInstance(options);
  if (!instance.ok()) return instance.status();
  return std::unique_ptr<Backend>(std::make_unique<RocksBackend>(options, *std::move(instance)));
}

}  // namespace capstan::storage
