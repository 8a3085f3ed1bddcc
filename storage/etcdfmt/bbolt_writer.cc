#include "storage/etcdfmt/bbolt_writer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "storage/etcdfmt/bbolt_reader.h"

namespace capstan::etcdfmt {
namespace {

constexpr size_t kPageHeaderSize = 16;
constexpr size_t kElementSize = 16;  // a leaf or a branch element
constexpr uint16_t kBranchPage = 0x01;
constexpr uint16_t kLeafPage = 0x02;
constexpr uint16_t kMetaPage = 0x04;
constexpr uint16_t kFreelistPage = 0x10;
constexpr uint32_t kBucketLeafFlag = 0x01;
constexpr size_t kBucketHeaderSize = 16;  // root page id, sequence
// The most pages a leaf of large entries spans (see Tree::Fits).
constexpr size_t kMaxLeafPages = 8;

template <typename T>
void PutLittleEndian(T v, std::string* out) {
  for (size_t i = 0; i < sizeof(T); ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

template <typename T>
void SetLittleEndian(T v, std::string* out, size_t at) {
  for (size_t i = 0; i < sizeof(T); ++i) (*out)[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

// A page header: id, flags, count, overflow (the pages after the first).
void PutPageHeader(uint64_t id, uint16_t flags, uint16_t count, uint32_t overflow,
                   std::string* out) {
  PutLittleEndian(id, out);
  PutLittleEndian(flags, out);
  PutLittleEndian(count, out);
  PutLittleEndian(overflow, out);
}

uint64_t Fnv64a(std::string_view data) {
  uint64_t h = 14695981039346656037ULL;
  for (unsigned char c : data) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

}  // namespace

// The pages of one bucket's B+tree, written bottom up: leaves as they fill,
// then the branch levels above them.
class BboltWriter::Tree {
 public:
  Tree(BboltWriter* writer, uint32_t flags) : writer_(writer), element_flags_(flags) {}

  absl::Status Add(std::string_view key, std::string_view value) {
    const size_t bytes = kElementSize + key.size() + value.size();
    if (!entries_.empty() && !Fits(bytes)) {
      if (auto s = FlushLeaf(); !s.ok()) return s;
    }
    entries_.emplace_back(key, value);
    leaf_bytes_ += bytes;
    return absl::OkStatus();
  }

  // Writes what is left and the branch levels. The bucket's value in its
  // parent: the root page id, or for an empty bucket an inline empty leaf.
  absl::StatusOr<std::string> Finish() {
    if (auto s = FlushLeaf(); !s.ok()) return s;
    std::string header;
    if (children_.empty()) {
      PutLittleEndian<uint64_t>(0, &header);  // inline
      PutLittleEndian<uint64_t>(0, &header);  // sequence
      PutPageHeader(0, kLeafPage, 0, 0, &header);
      return header;
    }
    while (children_.size() > 1) {
      std::vector<std::pair<std::string, uint64_t>> level;
      level.swap(children_);
      size_t begin = 0;
      while (begin < level.size()) {
        size_t end = begin, bytes = kPageHeaderSize;
        // At least two children per branch page, as many as fit.
        auto fits = [&](size_t i) {
          return bytes + kElementSize + level[i].first.size() <= writer_->page_size_;
        };
        while (end < level.size() && (end - begin < 2 || fits(end))) {
          bytes += kElementSize + level[end].first.size();
          ++end;
        }
        // A lone child left over would make a branch of one: take it along.
        if (level.size() - end == 1) ++end;
        if (auto s = WriteBranch(level, begin, end); !s.ok()) return s;
        begin = end;
      }
    }
    PutLittleEndian<uint64_t>(children_[0].second, &header);
    PutLittleEndian<uint64_t>(0, &header);
    return header;
  }

 private:
  // Whether an entry of `bytes` joins the leaf being filled. A leaf fills a
  // page. One that already overflows a page (its entries are large) takes
  // entries up to kMaxLeafPages, so that the unused end of its last page is
  // shared by several of them rather than left after each.
  bool Fits(size_t bytes) const {
    const size_t page = writer_->page_size_;
    if (leaf_bytes_ + bytes <= page) return true;
    return leaf_bytes_ > page && leaf_bytes_ + bytes <= kMaxLeafPages * page;
  }

  absl::Status FlushLeaf() {
    if (entries_.empty()) return absl::OkStatus();
    const size_t n = entries_.size();
    std::string page;
    page.reserve(leaf_bytes_);
    PutPageHeader(0, kLeafPage, static_cast<uint16_t>(n), 0, &page);
    size_t data = kPageHeaderSize + n * kElementSize;
    for (size_t i = 0; i < n; ++i) {
      const size_t element = kPageHeaderSize + i * kElementSize;
      PutLittleEndian<uint32_t>(element_flags_, &page);
      PutLittleEndian<uint32_t>(static_cast<uint32_t>(data - element), &page);
      PutLittleEndian<uint32_t>(static_cast<uint32_t>(entries_[i].first.size()), &page);
      PutLittleEndian<uint32_t>(static_cast<uint32_t>(entries_[i].second.size()), &page);
      data += entries_[i].first.size() + entries_[i].second.size();
    }
    for (const auto& [key, value] : entries_) {
      page += key;
      page += value;
    }
    const uint64_t id = writer_->next_page_;
    if (auto s = writer_->WritePages(&page); !s.ok()) return s;
    children_.emplace_back(std::move(entries_.front().first), id);
    entries_.clear();
    leaf_bytes_ = kPageHeaderSize;
    return absl::OkStatus();
  }

  absl::Status WriteBranch(const std::vector<std::pair<std::string, uint64_t>>& level,
                           size_t begin, size_t end) {
    const size_t n = end - begin;
    std::string page;
    PutPageHeader(0, kBranchPage, static_cast<uint16_t>(n), 0, &page);
    size_t data = kPageHeaderSize + n * kElementSize;
    for (size_t i = 0; i < n; ++i) {
      const auto& [key, child] = level[begin + i];
      const size_t element = kPageHeaderSize + i * kElementSize;
      PutLittleEndian<uint32_t>(static_cast<uint32_t>(data - element), &page);
      PutLittleEndian<uint32_t>(static_cast<uint32_t>(key.size()), &page);
      PutLittleEndian<uint64_t>(child, &page);
      data += key.size();
    }
    for (size_t i = begin; i < end; ++i) page += level[i].first;
    const uint64_t id = writer_->next_page_;
    if (auto s = writer_->WritePages(&page); !s.ok()) return s;
    children_.emplace_back(level[begin].first, id);
    return absl::OkStatus();
  }

  BboltWriter* const writer_;
  const uint32_t element_flags_;
  std::vector<std::pair<std::string, std::string>> entries_;  // the leaf being filled
  size_t leaf_bytes_ = kPageHeaderSize;
  // The pages of the level being built: each one's first key and page id.
  std::vector<std::pair<std::string, uint64_t>> children_;
};

BboltWriter::BboltWriter(PageSink sink, uint32_t page_size)
    : sink_(std::move(sink)), page_size_(page_size),
      root_(std::make_unique<Tree>(this, kBucketLeafFlag)) {}

BboltWriter::~BboltWriter() = default;

absl::Status BboltWriter::WritePages(std::string* page) {
  const uint64_t pages = (page->size() + page_size_ - 1) / page_size_;
  SetLittleEndian<uint64_t>(next_page_, page, 0);
  SetLittleEndian<uint32_t>(static_cast<uint32_t>(pages - 1), page, 12);
  page->resize(pages * page_size_, '\0');
  if (auto s = sink_(next_page_, *page); !s.ok()) return s;
  next_page_ += pages;
  return absl::OkStatus();
}

absl::Status BboltWriter::BeginBucket(std::string_view name) {
  if (finished_) return absl::FailedPreconditionError("bbolt writer finished");
  if (name.empty() || (!bucket_name_.empty() && name <= std::string_view(bucket_name_))) {
    return absl::InvalidArgumentError(
        absl::StrCat("bbolt bucket \"", std::string(name), "\" does not follow \"",
                     bucket_name_, "\""));
  }
  if (auto s = EndBucket(); !s.ok()) return s;
  bucket_name_ = std::string(name);
  bucket_ = std::make_unique<Tree>(this, 0);
  return absl::OkStatus();
}

absl::Status BboltWriter::Put(std::string_view key, std::string_view value) {
  if (finished_ || !bucket_) return absl::FailedPreconditionError("no bbolt bucket begun");
  if (key.empty() || (has_key_ && key <= std::string_view(last_key_))) {
    return absl::InvalidArgumentError(
        absl::StrCat("bbolt bucket ", bucket_name_, ": keys out of order"));
  }
  last_key_.assign(key.data(), key.size());
  has_key_ = true;
  return bucket_->Add(key, value);
}

absl::Status BboltWriter::EndBucket() {
  if (!bucket_) return absl::OkStatus();
  auto value = bucket_->Finish();
  if (!value.ok()) return value.status();
  bucket_.reset();
  has_key_ = false;
  return root_->Add(bucket_name_, *value);
}

absl::Status BboltWriter::Finish(uint64_t txid) {
  if (finished_) return absl::FailedPreconditionError("bbolt writer finished");
  if (auto s = EndBucket(); !s.ok()) return s;
  finished_ = true;
  auto root = root_->Finish();
  if (!root.ok()) return root.status();
  // Its page id when there is one; an empty root is still written as a
  // page, since the meta page names the root by page id.
  uint64_t root_page = 0;
  for (int i = 7; i >= 0; --i) root_page = (root_page << 8) | static_cast<unsigned char>((*root)[i]);
  if (root_page == 0) {
    std::string empty;
    PutPageHeader(0, kLeafPage, 0, 0, &empty);
    root_page = next_page_;
    if (auto s = WritePages(&empty); !s.ok()) return s;
  }
  std::string freelist;
  PutPageHeader(0, kFreelistPage, 0, 0, &freelist);
  const uint64_t freelist_page = next_page_;
  if (auto s = WritePages(&freelist); !s.ok()) return s;

  const uint64_t high_water = next_page_;
  for (uint64_t meta_page = 0; meta_page < 2; ++meta_page) {
    std::string page;
    PutPageHeader(meta_page, kMetaPage, 0, 0, &page);
    const size_t meta = page.size();
    PutLittleEndian<uint32_t>(kBboltMagic, &page);
    PutLittleEndian<uint32_t>(kBboltVersion, &page);
    PutLittleEndian<uint32_t>(page_size_, &page);
    PutLittleEndian<uint32_t>(0, &page);  // flags
    PutLittleEndian<uint64_t>(root_page, &page);
    PutLittleEndian<uint64_t>(0, &page);  // the root bucket's sequence
    PutLittleEndian<uint64_t>(freelist_page, &page);
    PutLittleEndian<uint64_t>(high_water, &page);
    PutLittleEndian<uint64_t>(txid + meta_page, &page);
    PutLittleEndian<uint64_t>(Fnv64a(std::string_view(page).substr(meta)), &page);
    page.resize(page_size_, '\0');
    if (auto s = sink_(meta_page, page); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace capstan::etcdfmt
