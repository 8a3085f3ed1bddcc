// Backend: Capstan's durable byte store, a thin layer over RocksDB.
//
// The backend knows column families and bytes, not revisions or keys of the
// KV space. RocksDB is a private dependency: nothing of it appears here.
//
// Thread safety: a Backend is safe for concurrent use from any number of
// threads without external synchronization. A WriteBatch is not: one thread
// builds it, then hands it to Write().

#ifndef CAPSTAN_STORAGE_BACKEND_H_
#define CAPSTAN_STORAGE_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace capstan::storage {

// Column families, in etcd's bucket layout.
enum class Cf : int {
  kKey = 0,    // revision bytes -> serialized mvccpb.KeyValue
  kMeta = 1,   // current/compaction revisions, member identity
  kLease = 2,  // lease id -> lease record
  kAuth = 3,   // users, roles, auth revision
  kAlarm = 4,  // active alarms
  // The Raft log: entries by index, hard state, snapshot metadata. Used by
  // the log's own backend only (<data-dir>/raft/, replication/raft_log.h);
  // empty in the data backend, so its hashes and snapshots do not change.
  kRaft = 5,
};
inline constexpr int kNumCfs = 6;

// A file system the backend does all its I/O through, in place of the
// operating system's. Opaque outside storage/: RocksDB's view of it is
// defined in storage/rocks_file_system.h. Made by storage/testing/fault_injection_fs.h
// for tests that fail writes, fsyncs or fill the disk.
class FileSystem {
 public:
  struct Rocks;
  virtual ~FileSystem() = default;
  // Owned by the file system; valid as long as it lives.
  virtual Rocks* rocks() = 0;
};

struct BackendOptions {
  // Directory holding the RocksDB files. Created if missing.
  std::string dir;
  // When false, writes are not fsynced (etcd's --unsafe-no-fsync): an
  // acknowledged write can be lost on power failure, not on a process crash.
  bool sync = true;
  // Block cache shared by every column family.
  size_t block_cache_bytes = 256 << 20;
  // Memtable size per column family.
  size_t write_buffer_bytes = 64 << 20;
  // Open without writing anything, as a checkpoint is read: Write fails.
  // A column family the files lack (one added by a later Capstan, such as
  // kRaft in a checkpoint made before it) reads as empty. A read-write open
  // creates it.
  bool read_only = false;
  // Null: the operating system's file system. Else every file the backend
  // touches goes through it; it must outlive the backend (holding it here
  // keeps it alive).
  std::shared_ptr<FileSystem> file_system;
};

class Backend;

// A set of updates applied atomically by Backend::Write.
class WriteBatch {
 public:
  WriteBatch();
  ~WriteBatch();
  WriteBatch(const WriteBatch&) = delete;
  WriteBatch& operator=(const WriteBatch&) = delete;

  void Put(Cf cf, std::string_view key, std::string_view value);
  void Delete(Cf cf, std::string_view key);
  // Deletes every key in [begin, end).
  void DeleteRange(Cf cf, std::string_view begin, std::string_view end);
  void Clear();
  // Number of updates staged.
  int Count() const;
  // Approximate encoded size in bytes.
  size_t ByteSize() const;
  // When false, Backend::Write does not fsync this batch even when the
  // backend is synced (a Raft Ready that needs no sync). Default true. An
  // unsynced batch reaches the RocksDB WAL in order: a later synced write
  // makes it durable too, and a crash loses a suffix of writes, never a hole.
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }
  // When false, the batch skips the RocksDB WAL: it is durable only once
  // its memtables are flushed (Backend::Flush, or RocksDB's own flushes).
  // For a store that another log holds the writes of until then (a Raft
  // member's store replays its Raft log after a crash). Column families
  // flush atomically, so a crash loses a suffix of such batches, never a
  // hole. Default true.
  void set_wal(bool wal) { wal_ = wal; }
  bool wal() const { return wal_; }

 private:
  friend struct WriteBatchAccess;
  struct Rep;
  std::unique_ptr<Rep> rep_;
  bool sync_ = true;
  bool wal_ = true;
};

// Iterates one column family in key order. Not thread-safe. The key and
// value views stay valid only until the next call that moves the iterator.
class Iterator {
 public:
  virtual ~Iterator() = default;
  virtual void Seek(std::string_view target) = 0;
  virtual void SeekToFirst() = 0;
  virtual void SeekToLast() = 0;
  virtual bool Valid() const = 0;
  virtual void Next() = 0;
  virtual void Prev() = 0;
  virtual std::string_view key() const = 0;
  virtual std::string_view value() const = 0;
  // The first error met while iterating, if any.
  virtual absl::Status status() const = 0;
};

class Backend {
 public:
  // Opens (or creates) the backend in options.dir.
  static absl::StatusOr<std::unique_ptr<Backend>> Open(const BackendOptions& options);

  virtual ~Backend() = default;

  // Applies the batch atomically. Returns only after the batch is durable
  // (WAL fsynced) unless the backend was opened with sync = false or the
  // batch says sync() == false.
  // After an error the backend must be considered failed: Capstan stops
  // acknowledging writes (fail-stop) rather than retrying.
  virtual absl::Status Write(WriteBatch* batch) = 0;

  // Reads the latest value of key. NotFound when absent.
  virtual absl::Status Get(Cf cf, std::string_view key, std::string* value) const = 0;

  // Reads many keys of one column family at once; (*values)[i] and the
  // returned statuses[i] answer keys[i].
  virtual std::vector<absl::Status> MultiGet(Cf cf, const std::vector<std::string_view>& keys,
                                             std::vector<std::string>* values) const = 0;

  // Reads many keys of one column family at once and hands each value to
  // visit(i, value), in the order of keys, without copying it into a string
  // first; value is valid only during the call. Stops at the first key that
  // cannot be read and returns its error (with the index in the message).
  // The default reads through MultiGet.
  virtual absl::Status MultiGetVisit(
      Cf cf, const std::vector<std::string_view>& keys,
      absl::FunctionRef<void(size_t i, std::string_view value)> visit) const;

  // As MultiGetVisit, but reads by walking one iterator through the keys in
  // their sorted order, stepping over what lies between them and seeking
  // across long gaps, rather than looking each key up on its own: cheaper
  // when most of the keys between the smallest and the largest are asked
  // for (a big Range of keys written together). When a key cannot be read,
  // the keys before it may not have been visited (RocksDB's visits none).
  // The default is MultiGetVisit.
  virtual absl::Status ScanVisit(
      Cf cf, const std::vector<std::string_view>& keys,
      absl::FunctionRef<void(size_t i, std::string_view value)> visit) const;

  // A new iterator over the latest data of cf. The caller owns it; it must
  // be destroyed before the Backend.
  virtual std::unique_ptr<Iterator> NewIterator(Cf cf) const = 0;

  // Total bytes on disk (SST files, WAL, manifest) and live data estimate.
  virtual uint64_t SizeOnDisk() const = 0;
  virtual uint64_t LiveDataSize() const = 0;

  // Compacts every column family fully, dropping deleted data: Capstan's
  // online defragmentation. Reads and writes continue meanwhile.
  virtual absl::Status CompactAll() = 0;

  // Writes a consistent point-in-time copy of the backend into dir, which
  // must not exist. Uses hard links where possible.
  virtual absl::Status Checkpoint(const std::string& dir) = 0;

  // Flushes memtables and syncs; used at clean shutdown.
  virtual absl::Status Flush() = 0;

  // Replaces every column family at once with the RocksDB files in dir (a
  // checkpoint of a backend, such as one received with a Raft snapshot) by
  // swapping the two directories, not by copying records: the cost is
  // syncing dir's files, two renames in one (renameat2's RENAME_EXCHANGE)
  // and opening dir's database. Calls from then on read and write the new
  // data; an iterator made before, and a read running meanwhile, keep the
  // replaced data until they end (the replaced database closes when its
  // last reader lets go). On OK, dir holds the replaced files, for the
  // caller to delete (open iterators do not mind: their files stay open).
  //
  // Crash safety: dir's files and dir are synced before the swap, the swap
  // is one atomic rename, and the parent directory is synced after it, so
  // a process that dies at any point reopens options().dir holding either
  // the old data or dir's, each whole (RocksDB recovers either from its
  // own WAL and manifest). Nothing is written to the old data once the
  // swap has begun, so its unsynced writes may be lost: the caller keeps
  // what tells it which data it has inside the data (the applied index).
  //
  // REQUIRES: no Write runs from the call until it returns; dir is not open
  // by any backend. A Flush, CompactAll or Checkpoint running meanwhile
  // may fail. Unimplemented, with nothing changed, when this backend cannot
  // swap (read-only, options().dir not a plain directory, dir on another
  // file system, or a file system without RENAME_EXCHANGE): the caller
  // copies the data instead. Any other error leaves the backend failed
  // (fail-stop): options().dir holds one of the two, whole, for a restart.
  // The default returns Unimplemented.
  virtual absl::Status ReplaceWith(const std::string& dir);

  // Gives back the disk space of deleted keys in [begin, end) of cf now,
  // rather than when RocksDB's own compactions reach them: drops the files
  // holding only keys of the range, then compacts what overlaps it. For a
  // range deleted as a whole (a compacted Raft log); reads and writes
  // continue meanwhile. The default does nothing.
  virtual absl::Status ReclaimRange(Cf cf, std::string_view begin, std::string_view end);

  virtual const BackendOptions& options() const = 0;
};

}  // namespace capstan::storage

#endif  // CAPSTAN_STORAGE_BACKEND_H_
