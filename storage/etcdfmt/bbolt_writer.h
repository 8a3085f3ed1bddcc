// BboltWriter: writes a bbolt file, the format of etcd's backend (and of
// `etcdctl snapshot save`), from data already in order. It is the writing
// side of BboltReader (bbolt_reader.h, which describes the format) and, like
// it, is written from bbolt's on-disk format without bbolt code.
//
// One pass, bounded memory: the top-level buckets come in name order and
// each bucket's entries in key order. Pages go to a sink as they fill, in
// ascending page order from page 2: a leaf holds as many entries as fit in
// a page, and a leaf of entries bigger than that overflows into the pages
// after it, up to 8 pages, so that they share the unused end of the last
// one. When a bucket ends, its branch pages follow its leaves (only the
// first key of each child page is kept meanwhile). Finish writes the root
// bucket, an empty freelist, and last the two meta pages, 0 and 1, which
// name the root and the size. An empty bucket is written inline, as bbolt
// writes one. bbolt itself (etcd, etcdctl) opens the result and may go on
// writing to it; it would only have filled the pages differently.
//
// The layout depends only on the data, so a caller that needs the meta
// pages first (to stream the file) can write the same data twice: once to
// learn them, once to send the pages after them.
//
// Thread safety: none; one thread drives a writer.

#ifndef CAPSTAN_STORAGE_ETCDFMT_BBOLT_WRITER_H_
#define CAPSTAN_STORAGE_ETCDFMT_BBOLT_WRITER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace capstan::etcdfmt {

class BboltWriter {
 public:
  // Receives pages: their first page's id and their bytes (a whole number
  // of pages). A non-OK status stops the writer and is returned by the call
  // that wrote.
  using PageSink = std::function<absl::Status(uint64_t page_id, std::string_view pages)>;

  // REQUIRES: page_size is a power of two, at least 1024 (bbolt uses the
  // operating system's page size, 4096 on Linux).
  explicit BboltWriter(PageSink sink, uint32_t page_size = 4096);
  ~BboltWriter();
  BboltWriter(const BboltWriter&) = delete;
  BboltWriter& operator=(const BboltWriter&) = delete;

  // Starts the next top-level bucket, ending the previous one. Names must be
  // non-empty and ascend bytewise.
  absl::Status BeginBucket(std::string_view name);
  // Adds an entry to the current bucket. Keys must be non-empty and ascend
  // strictly (bytewise) within the bucket.
  absl::Status Put(std::string_view key, std::string_view value);
  // Ends the last bucket and writes the root bucket, the freelist and the
  // meta pages (transaction ids txid and txid + 1). Nothing may be added
  // afterwards.
  absl::Status Finish(uint64_t txid);

  // Bytes of the pages written so far: after Finish, the file's size.
  uint64_t size() const { return next_page_ * page_size_; }

 private:
  class Tree;

  absl::Status EndBucket();
  // Sends page (padded to whole pages, its header's id and overflow set)
  // as the next page.
  absl::Status WritePages(std::string* page);

  const PageSink sink_;
  const uint32_t page_size_;
  uint64_t next_page_ = 2;  // pages 0 and 1 hold the meta pages
  std::unique_ptr<Tree> bucket_;  // the bucket being written
  std::string bucket_name_;       // its name ("" before the first)
  std::string last_key_;          // the last key Put in it
  bool has_key_ = false;
  std::unique_ptr<Tree> root_;    // the root bucket: one entry per bucket
  bool finished_ = false;
};

}  // namespace capstan::etcdfmt

#endif  // CAPSTAN_STORAGE_ETCDFMT_BBOLT_WRITER_H_
