// BboltReader: a read-only reader of bbolt files, the B+tree format of
// etcd's backend (`member/snap/db`, and the body of `etcdctl snapshot save`).
//
// Written from bbolt's on-disk format (etcd-io/bbolt page.go, bucket.go,
// node.go, db.go, tx.go); no bbolt code is used. All integers are
// little-endian.
//
//   page header (16 bytes)   id u64, flags u16, count u16, overflow u32
//                            flags: branch 0x01, leaf 0x02, meta 0x04,
//                            freelist 0x10. A page with overflow N spans
//                            N + 1 consecutive pages.
//   meta (pages 0 and 1)     after the header: magic u32 (0xED0CDAED),
//                            version u32 (2), page_size u32, flags u32,
//                            root bucket {root pgid u64, sequence u64},
//                            freelist pgid u64, high-water pgid u64,
//                            txid u64, checksum u64 (FNV-64a of the 56
//                            bytes before it). The valid meta with the
//                            higher txid is the current one.
//   branch element (16)      pos u32, ksize u32, pgid u64; the key sits
//                            `pos` bytes after the element.
//   leaf element (16)        flags u32 (0x01: the value is a bucket), pos
//                            u32, ksize u32, vsize u32; key then value
//                            `pos` bytes after the element.
//   bucket value             {root pgid u64, sequence u64}; root 0 means an
//                            inline bucket whose leaf page follows the 16
//                            bytes inside the value itself.
//
// The reader trusts nothing in the file: every page id, element offset and
// size is bounds-checked, each page may be reached once per walk (no cycles,
// no shared subtrees) and keys must ascend, so a corrupt or hostile file
// gives a DataLoss/InvalidArgument status, never a crash or a hang.
//
// Thread safety: a BboltReader is immutable after Open; its const methods
// may be called from any number of threads at once.

#ifndef CAPSTAN_STORAGE_ETCDFMT_BBOLT_READER_H_
#define CAPSTAN_STORAGE_ETCDFMT_BBOLT_READER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace capstan::etcdfmt {

inline constexpr uint32_t kBboltMagic = 0xED0CDAED;
inline constexpr uint32_t kBboltVersion = 2;

// The meta page the reader uses (the valid one with the highest txid).
struct BboltMeta {
  uint32_t page_size = 0;
  uint32_t flags = 0;
  uint64_t root = 0;       // page of the root bucket
  uint64_t freelist = 0;   // page of the freelist (~0: not synced)
  uint64_t high_water = 0; // pages in use: every page id is below it
  uint64_t txid = 0;
  int meta_page = 0;       // 0 or 1: where it was read from
};

class BboltReader {
 public:
  // Opens the file at path read-only (O_RDONLY, mapped PROT_READ, never
  // written). If length is set, only the first `length` bytes are the bbolt
  // file (an etcd snapshot carries a checksum after them); it must not
  // exceed the file's size.
  // REQUIRES: nothing modifies or truncates the file while the reader lives
  // (stop etcd first, or read a snapshot).
  static absl::StatusOr<std::unique_ptr<BboltReader>> Open(const std::string& path,
                                                           std::optional<uint64_t> length = {});
  // Reads a bbolt file held in memory (tests, fuzzing). Takes ownership.
  static absl::StatusOr<std::unique_ptr<BboltReader>> FromBytes(std::string bytes);

  ~BboltReader();
  BboltReader(const BboltReader&) = delete;
  BboltReader& operator=(const BboltReader&) = delete;

  const BboltMeta& meta() const { return meta_; }
  // Size of the bbolt file in bytes.
  uint64_t size() const { return size_; }

  // Called for each entry of a bucket, in key order. is_bucket: the entry
  // is a nested bucket (value is its raw 16-byte header, plus the inline
  // page for an inline bucket). The views point into the file and stay
  // valid while the reader lives. A non-OK return stops the walk and is
  // returned by ForEach.
  using Visitor =
      std::function<absl::Status(std::string_view key, std::string_view value, bool is_bucket)>;

  // Walks the bucket reached from the root by `path` (bucket names, outer
  // first; empty: the root bucket, whose entries are the top-level
  // buckets). NotFound if a bucket on the path does not exist.
  absl::Status ForEach(const std::vector<std::string>& path, const Visitor& visit) const;

  // Whether the bucket at path exists.
  absl::StatusOr<bool> HasBucket(const std::vector<std::string>& path) const;

  // Names of the top-level buckets, in order.
  absl::StatusOr<std::vector<std::string>> Buckets() const;

  // Walks every page reachable from the root (every bucket, nested ones
  // included) and checks the structure: what `bbolt check` checks of the
  // tree, without the freelist. OK if the whole file is readable.
  absl::Status Check() const;

 private:
  class Walker;
  struct Mapping;

  BboltReader() = default;
  absl::Status Init();

  std::unique_ptr<Mapping> mapping_;
  const char* data_ = nullptr;
  uint64_t size_ = 0;
  BboltMeta meta_;
};

}  // namespace capstan::etcdfmt

#endif  // CAPSTAN_STORAGE_ETCDFMT_BBOLT_READER_H_
