#include "storage/backend.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rocksdb/cache.h"
#include "rocksdb/db.h"
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

class RocksIterator final : public Iterator {
 public:
  explicit RocksIterator(rocksdb::Iterator* it) : it_(it) {}
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

class RocksBackend final : public Backend {
 public:
  RocksBackend(BackendOptions options, std::unique_ptr<rocksdb::DB> db,
               std::vector<rocksdb::ColumnFamilyHandle*> handles)
      : options_(std::move(options)), db_(std::move(db)), handles_(std::move(handles)) {
    write_options_.sync = options_.sync;
  }

  ~RocksBackend() override {
    for (auto* h : handles_) {
      if (h != nullptr) db_->DestroyColumnFamilyHandle(h).PermitUncheckedError();
    }
    db_->Close().PermitUncheckedError();
  }

  absl::Status Write(WriteBatch* batch) override;

  absl::Status Get(Cf cf, std::string_view key, std::string* value) const override {
    if (handle(cf) == nullptr) return MissingFamily();
    return FromRocks(db_->Get(rocksdb::ReadOptions(), handle(cf), ToSlice(key), value));
  }

  std::vector<absl::Status> MultiGet(Cf cf, const std::vector<std::string_view>& keys,
                                     std::vector<std::string>* values) const override {
    std::vector<rocksdb::PinnableSlice> pinned;
    std::vector<rocksdb::Status> st;
    PinnedMultiGet(cf, keys, &pinned, &st);
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
    if (handle(cf) == nullptr) {
      return keys.empty() ? absl::OkStatus() : MultiGetError(0, MissingFamily());
    }
    std::vector<rocksdb::PinnableSlice> pinned;
    std::vector<rocksdb::Status> st;
    PinnedMultiGet(cf, keys, &pinned, &st);
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
    if (handle(cf) == nullptr) return MultiGetError(0, MissingFamily());
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
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, handle(cf)));
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
  void PinnedMultiGet(Cf cf, const std::vector<std::string_view>& keys,
                      std::vector<rocksdb::PinnableSlice>* pinned,
                      std::vector<rocksdb::Status>* st) const {
    const size_t n = keys.size();
    if (handle(cf) == nullptr) {
      *pinned = std::vector<rocksdb::PinnableSlice>(n);
      st->assign(n, rocksdb::Status::NotFound());
      return;
    }
    std::vector<rocksdb::Slice> slices;
    slices.reserve(n);
    for (auto k : keys) slices.push_back(ToSlice(k));
    *pinned = std::vector<rocksdb::PinnableSlice>(n);
    st->assign(n, rocksdb::Status());
    db_->MultiGet(rocksdb::ReadOptions(), handle(cf), n, slices.data(), pinned->data(), st->data(),
                  /*sorted_input=*/false);
  }

  std::unique_ptr<Iterator> NewIterator(Cf cf) const override {
    if (handle(cf) == nullptr) return std::make_unique<EmptyIterator>();
    rocksdb::ReadOptions ro;
    ro.fill_cache = true;
    return std::make_unique<RocksIterator>(db_->NewIterator(ro, handle(cf)));
  }

  // Memtables are counted through the WAL that holds their data: the
  // memtable size properties report arena blocks allocated, not data.
  uint64_t WalBytes() const {
    rocksdb::VectorLogPtr files;
    uint64_t total = 0;
    if (const_cast<rocksdb::DB*>(db_.get())->GetSortedWalFiles(files).ok()) {
      for (const auto& f : files) total += f->SizeFileBytes();
    }
    return total;
  }

  uint64_t SizeOnDisk() const override {
    uint64_t total = WalBytes();
    for (auto* h : handles_) {
      if (h == nullptr) continue;
      uint64_t v = 0;
      if (db_->GetIntProperty(h, rocksdb::DB::Properties::kTotalSstFilesSize, &v)) total += v;
    }
    return total;
  }

  uint64_t LiveDataSize() const override {
    uint64_t total = WalBytes();
    for (auto* h : handles_) {
      if (h == nullptr) continue;
      uint64_t v = 0;
      if (db_->GetIntProperty(h, rocksdb::DB::Properties::kEstimateLiveDataSize, &v)) total += v;
    }
    return total;
  }

  absl::Status CompactAll() override {
    rocksdb::CompactRangeOptions cro;
    cro.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
    for (auto* h : handles_) {
      if (h == nullptr) continue;
      auto s = db_->CompactRange(cro, h, nullptr, nullptr);
      if (!s.ok()) return FromRocks(s);
    }
    return absl::OkStatus();
  }

  absl::Status Checkpoint(const std::string& dir) override {
    rocksdb::Checkpoint* cp = nullptr;
    auto s = rocksdb::Checkpoint::Create(db_.get(), &cp);
    if (!s.ok()) return FromRocks(s);
    std::unique_ptr<rocksdb::Checkpoint> owned(cp);
    return FromRocks(owned->CreateCheckpoint(dir));
  }

  absl::Status Flush() override {
    rocksdb::FlushOptions fo;
    fo.wait = true;
    std::vector<rocksdb::ColumnFamilyHandle*> present;
    for (auto* h : handles_) {
      if (h != nullptr) present.push_back(h);
    }
    auto s = db_->Flush(fo, present);
    if (!s.ok()) return FromRocks(s);
    return FromRocks(db_->FlushWAL(/*sync=*/true));
  }

  const BackendOptions& options() const override { return options_; }

 private:
  rocksdb::ColumnFamilyHandle* handle(Cf cf) const { return handles_[static_cast<int>(cf) + 1]; }

  const BackendOptions options_;
  std::unique_ptr<rocksdb::DB> db_;
  // handles_[0] is RocksDB's default family; handles_[1 + Cf] are ours,
  // null for a family a read-only backend's files lack.
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
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
  if (!batch->wal()) {
    rocksdb::WriteOptions no_wal = write_options_;
    no_wal.sync = false;
    no_wal.disableWAL = true;
    return FromRocks(db_->Write(no_wal, WriteBatchAccess::Rocks(batch)));
  }
  if (batch->sync() || !write_options_.sync) {
    return FromRocks(db_->Write(write_options_, WriteBatchAccess::Rocks(batch)));
  }
  rocksdb::WriteOptions unsynced = write_options_;
  unsynced.sync = false;
  return FromRocks(db_->Write(unsynced, WriteBatchAccess::Rocks(batch)));
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

absl::StatusOr<std::unique_ptr<Backend>> Backend::Open(const BackendOptions& options) {
  if (::mkdir(options.dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return absl::InternalError(absl::StrCat("cannot create ", options.dir, ": ", strerror(errno)));
  }
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = true;
  db_options.create_missing_column_families = true;
  db_options.max_background_jobs = 2;
  db_options.bytes_per_sync = 1 << 20;
  db_options.max_total_wal_size = 256 << 20;
  db_options.info_log_level = rocksdb::InfoLogLevel::WARN_LEVEL;
  db_options.keep_log_file_num = 3;
  // Batches written without the WAL (WriteBatch::set_wal) survive a crash
  // only as flushed: every family flushes at once, so what survives is the
  // same prefix of batches in all of them.
  db_options.atomic_flush = true;
  if (options.file_system) db_options.env = options.file_system->rocks()->env.get();

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
  return std::unique_ptr<Backend>(
      std::make_unique<RocksBackend>(options, std::move(db), std::move(handles)));
}

}  // namespace capstan::storage
