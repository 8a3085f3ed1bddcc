// BboltWriter: writes a bbolt file, the format of etcd's backend (and of
// `etcdctl snapshot save`), from data already in order. It is the writing
// side of BboltReader (bbolt_reader.h, which describes the format) and, like
// it, is written from bbolt's on-disk format without bbolt code.
//
// One pass, bounded memory: the top-level buckets come in name order and
// each bucket's entries in key order. Leaf pages go to the file as they
// fill: a leaf holds as many entries as fit in a page, and a leaf of
// entries bigger than that overflows into the pages after it, up to 8
// pages, so that they share the unused end of the last one.
// When a bucket ends, its branch pages are written above its leaves (only
// the first key of each child page is kept meanwhile). Finish writes the
// root bucket, an empty freelist and the two meta pages. An empty bucket is
// written inline, as bbolt writes one. bbolt itself (etcd, etcdctl) opens
// the result and may go on writing to it; it would only have filled the
// pages differently.
//
// Thread safety: none; one thread drives a writer.

#ifndef CAPSTAN_STORAGE_BBOLT_WRITER_H_
#define CAPSTAN_STORAGE_BBOLT_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace capstan::storage {

class BboltWriter {
 public:
  // Creates (or truncates) the file at path.
  static absl::StatusOr<std::unique_ptr<BboltWriter>> Create(const std::string& path,
                                                             uint32_t page_size = 4096);
  ~BboltWriter();
  BboltWriter(const BboltWriter&) = delete;
  BboltWriter& operator=(const BboltWriter&) = delete;

  // Starts the next top-level bucket, ending the previous one. Names must be
  // non-empty and ascend bytewise.
  absl::Status BeginBucket(std::string_view name);
  // Adds an entry to the current bucket. Keys must be non-empty and ascend
  // strictly (bytewise) within the bucket.
  absl::Status Put(std::string_view key, std::string_view value);
  // Ends the last bucket, writes the root bucket, the freelist and the meta
  // pages (transaction ids txid and txid + 1) and closes the file, synced
  // first if sync. Nothing may be added afterwards.
  absl::Status Finish(uint64_t txid, bool sync = true);

  // Bytes written so far: every page, so after Finish the file's size.
  uint64_t size() const { return next_page_ * page_size_; }

 private:
  class Tree;

  BboltWriter(int fd, std::string path, uint32_t page_size);
  absl::Status EndBucket();
  absl::Status WritePages(std::string* page);

  int fd_;
  const std::string path_;
  const uint32_t page_size_;
  uint64_t next_page_ = 2;  // pages 0 and 1 hold the meta pages
  uint64_t synced_ = 0;     // bytes sent to disk so far
  std::unique_ptr<Tree> bucket_;  // the bucket being written
  std::string bucket_name_;       // its name ("" before the first)
  std::string last_key_;          // the last key Put in it
  bool has_key_ = false;
  std::unique_ptr<Tree> root_;    // the root bucket: one entry per bucket
  bool finished_ = false;
};

}  // namespace capstan::storage

#endif  // CAPSTAN_STORAGE_BBOLT_WRITER_H_
