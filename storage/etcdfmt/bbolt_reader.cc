#include "storage/etcdfmt/bbolt_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace capstan::etcdfmt {

namespace {

constexpr uint64_t kPageHeaderSize = 16;
constexpr uint64_t kElementSize = 16;  // branch and leaf elements alike
constexpr uint64_t kMetaSize = 64;     // through the checksum
constexpr uint64_t kMetaChecksummed = 56;
constexpr uint64_t kBucketHeaderSize = 16;

constexpr uint16_t kBranchPage = 0x01;
constexpr uint16_t kLeafPage = 0x02;
constexpr uint32_t kBucketLeafFlag = 0x01;

constexpr uint32_t kMinPageSize = 512;
constexpr uint32_t kMaxPageSize = 1u << 20;
// Deeper trees or bucket nests than this are taken as corruption (a real
// bbolt tree of 4 KiB pages is a handful of levels deep; etcd nests no
// buckets). They also bound the recursion, hence the stack used.
constexpr int kMaxTreeDepth = 32;
constexpr int kMaxBucketDepth = 16;

uint16_t Le16(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint16_t>(u[0] | (u[1] << 8));
}
uint32_t Le32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint32_t>(u[0]) | (static_cast<uint32_t>(u[1]) << 8) |
         (static_cast<uint32_t>(u[2]) << 16) | (static_cast<uint32_t>(u[3]) << 24);
}
uint64_t Le64(const char* p) { return Le32(p) | (static_cast<uint64_t>(Le32(p + 4)) << 32); }

uint64_t Fnv64a(const char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 0x100000001b3ULL;
  }
  return h;
}

bool ValidPageSize(uint64_t ps) {
  return ps >= kMinPageSize && ps <= kMaxPageSize && (ps & (ps - 1)) == 0;
}

absl::Status Corrupt(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("corrupt bbolt file: ", what));
}

// Reads the meta page at byte offset `off`. Returns the reason it is not
// usable, or OK.
absl::Status ReadMeta(const char* data, uint64_t size, uint64_t off, BboltMeta* meta) {
  if (off > size || size - off < kPageHeaderSize + kMetaSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("no meta page at offset ", off, " (the file has ", size, " bytes)"));
  }
  const char* m = data + off + kPageHeaderSize;
  const uint32_t magic = Le32(m);
  if (magic != kBboltMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("bad magic 0x%08x (a bbolt file has 0x%08X)", magic, kBboltMagic));
  }
  const uint32_t version = Le32(m + 4);
  if (version != kBboltVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("unsupported bbolt version ", version, " (this reader reads version ",
                     kBboltVersion, ")"));
  }
  const uint64_t checksum = Le64(m + kMetaChecksummed);
  if (checksum != Fnv64a(m, kMetaChecksummed)) {
    return absl::DataLossError("meta checksum mismatch");
  }
  meta->page_size = Le32(m + 8);
  meta->flags = Le32(m + 12);
  meta->root = Le64(m + 16);
  // m + 24: the root bucket's sequence, unused.
  meta->freelist = Le64(m + 32);
  meta->high_water = Le64(m + 40);
  meta->txid = Le64(m + 48);
  if (!ValidPageSize(meta->page_size)) {
    return absl::DataLossError(absl::StrCat("meta gives an invalid page size ", meta->page_size));
  }
  return absl::OkStatus();
}

}  // namespace

// The bytes of the file: a read-only mapping, or a string owned in memory.
struct BboltReader::Mapping {
  ~Mapping() {
    if (addr != nullptr) munmap(addr, length);
  }
  void* addr = nullptr;
  size_t length = 0;
  std::string bytes;
};

// A page (or an inline bucket's page) as located in the file: `span` bytes
// starting at `p` belong to it.
struct PageRef {
  const char* p = nullptr;
  uint64_t span = 0;
  uint64_t id = 0;  // 0 for an inline page
};

// One walk over the tree: remembers the pages reached so each is reached
// once (a cycle or a shared subtree is corruption).
class BboltReader::Walker {
 public:
  explicit Walker(const BboltReader& r) : r_(r), visited_(r.meta_.high_water, false) {}

  // Forgets the pages reached so far.
  void Reset() { visited_.assign(visited_.size(), false); }

  // The page with id `id`, bounds-checked, its header matching.
  absl::Status Page(uint64_t id, PageRef* out) {
    const uint64_t ps = r_.meta_.page_size;
    if (id < 2 || id >= r_.meta_.high_water) {
      return Corrupt(absl::StrCat("page id ", id, " is out of range [2, ", r_.meta_.high_water,
                                  ")"));
    }
    const char* p = r_.data_ + id * ps;
    if (Le64(p) != id) {
      return Corrupt(absl::StrCat("page ", id, " identifies itself as page ", Le64(p)));
    }
    const uint64_t overflow = Le32(p + 12);
    if (overflow >= r_.meta_.high_water - id) {
      return Corrupt(absl::StrCat("page ", id, " overflows by ", overflow,
                                  " pages past the end of the file"));
    }
    for (uint64_t i = id; i <= id + overflow; ++i) {
      if (visited_[i]) {
        return Corrupt(absl::StrCat("page ", i, " is reached twice (cycle or shared page)"));
      }
      visited_[i] = true;
    }
    *out = PageRef{p, (overflow + 1) * ps, id};
    return absl::OkStatus();
  }

  // Walks every entry under a bucket value (a bucket header, plus the inline
  // page when the root is 0).
  absl::Status WalkBucket(std::string_view value, const Visitor& visit, bool recurse, int depth) {
    PageRef page;
    if (auto s = BucketRoot(value, &page); !s.ok()) return s;
    std::string prev;
    bool first = true;
    return WalkNode(page, visit, recurse, depth, 0, &prev, &first);
  }

  // Locates the root page of a bucket from its value.
  absl::Status BucketRoot(std::string_view value, PageRef* page) {
    if (value.size() < kBucketHeaderSize) {
      return Corrupt(absl::StrCat("bucket header of ", value.size(), " bytes"));
    }
    const uint64_t root = Le64(value.data());
    if (root != 0) return Page(root, page);
    // Inline bucket: a leaf page stored in the value after the header.
    if (value.size() < kBucketHeaderSize + kPageHeaderSize) {
      return Corrupt("inline bucket too short for its page header");
    }
    *page = PageRef{value.data() + kBucketHeaderSize, value.size() - kBucketHeaderSize, 0};
    if (Le16(page->p + 8) != kLeafPage) return Corrupt("inline bucket page is not a leaf page");
    return absl::OkStatus();
  }

  // Finds the entry `key` in the bucket whose root is `page`. Sets *found.
  absl::Status Find(PageRef page, std::string_view key, std::string_view* value, bool* is_bucket,
                    bool* found, int depth) {
    *found = false;
    if (depth > kMaxTreeDepth) return Corrupt("tree deeper than 32 levels");
    const uint16_t flags = Le16(page.p + 8);
    const uint16_t count = Le16(page.p + 10);
    if (auto s = CheckNode(page, flags, count); !s.ok()) return s;
    if (flags == kBranchPage) {
      // The last child whose first key is <= key (or the first child).
      uint16_t pick = 0;
      for (uint16_t i = 0; i < count; ++i) {
        std::string_view k;
        uint64_t child;
        if (auto s = BranchElement(page, i, &k, &child); !s.ok()) return s;
        if (i == 0 || k <= key) pick = i;
        if (k > key) break;
      }
      std::string_view unused;
      uint64_t child;
      if (auto s = BranchElement(page, pick, &unused, &child); !s.ok()) return s;
      PageRef next;
      if (auto s = Page(child, &next); !s.ok()) return s;
      return Find(next, key, value, is_bucket, found, depth + 1);
    }
    for (uint16_t i = 0; i < count; ++i) {
      std::string_view k, v;
      uint32_t eflags;
      if (auto s = LeafElement(page, i, &k, &v, &eflags); !s.ok()) return s;
      if (k == key) {
        *value = v;
        *is_bucket = (eflags & kBucketLeafFlag) != 0;
        *found = true;
        return absl::OkStatus();
      }
      if (k > key) break;
    }
    return absl::OkStatus();
  }

 private:
  absl::Status CheckNode(const PageRef& page, uint16_t flags, uint16_t count) {
    if (flags != kBranchPage && flags != kLeafPage) {
      return Corrupt(absl::StrFormat("page %d has flags 0x%02x where a branch or leaf page belongs",
                                     page.id, flags));
    }
    if (kPageHeaderSize + count * kElementSize > page.span) {
      return Corrupt(absl::StrCat("page ", page.id, " claims ", count,
                                  " elements, more than fit in it"));
    }
    if (flags == kBranchPage && count == 0) {
      return Corrupt(absl::StrCat("branch page ", page.id, " has no elements"));
    }
    return absl::OkStatus();
  }

  absl::Status BranchElement(const PageRef& page, uint16_t i, std::string_view* key,
                             uint64_t* child) {
    const uint64_t elem = kPageHeaderSize + i * kElementSize;
    const uint64_t pos = Le32(page.p + elem);
    const uint64_t ksize = Le32(page.p + elem + 4);
    *child = Le64(page.p + elem + 8);
    if (elem + pos + ksize > page.span) {
      return Corrupt(absl::StrCat("branch page ", page.id, " element ", i, " points outside it"));
    }
    *key = std::string_view(page.p + elem + pos, ksize);
    return absl::OkStatus();
  }

  absl::Status LeafElement(const PageRef& page, uint16_t i, std::string_view* key,
                           std::string_view* value, uint32_t* flags) {
    const uint64_t elem = kPageHeaderSize + i * kElementSize;
    *flags = Le32(page.p + elem);
    const uint64_t pos = Le32(page.p + elem + 4);
    const uint64_t ksize = Le32(page.p + elem + 8);
    const uint64_t vsize = Le32(page.p + elem + 12);
    if (elem + pos + ksize + vsize > page.span) {
      return Corrupt(absl::StrCat(page.id == 0 ? "inline bucket page" : "leaf page ",
                                  page.id == 0 ? "" : absl::StrCat(page.id), " element ", i,
                                  " points outside it"));
    }
    *key = std::string_view(page.p + elem + pos, ksize);
    *value = std::string_view(page.p + elem + pos + ksize, vsize);
    return absl::OkStatus();
  }

  // Walks the subtree rooted at page in key order.
  absl::Status WalkNode(const PageRef& page, const Visitor& visit, bool recurse, int bucket_depth,
                        int tree_depth, std::string* prev, bool* first) {
    if (tree_depth > kMaxTreeDepth) return Corrupt("tree deeper than 32 levels");
    const uint16_t flags = Le16(page.p + 8);
    const uint16_t count = Le16(page.p + 10);
    if (auto s = CheckNode(page, flags, count); !s.ok()) return s;
    if (page.id == 0 && flags != kLeafPage) return Corrupt("inline bucket page is not a leaf page");
    if (flags == kBranchPage) {
      for (uint16_t i = 0; i < count; ++i) {
        std::string_view k;
        uint64_t child;
        if (auto s = BranchElement(page, i, &k, &child); !s.ok()) return s;
        PageRef next;
        if (auto s = Page(child, &next); !s.ok()) return s;
        if (auto s = WalkNode(next, visit, recurse, bucket_depth, tree_depth + 1, prev, first);
            !s.ok()) {
          return s;
        }
      }
      return absl::OkStatus();
    }
    for (uint16_t i = 0; i < count; ++i) {
      std::string_view k, v;
      uint32_t eflags;
      if (auto s = LeafElement(page, i, &k, &v, &eflags); !s.ok()) return s;
      if (!*first && k <= std::string_view(*prev)) {
        return Corrupt(absl::StrCat("keys out of order in page ", page.id));
      }
      *first = false;
      prev->assign(k);
      const bool is_bucket = (eflags & kBucketLeafFlag) != 0;
      if (visit) {
        if (auto s = visit(k, v, is_bucket); !s.ok()) return s;
      }
      if (is_bucket && recurse) {
        if (bucket_depth >= kMaxBucketDepth) {
          return Corrupt("buckets nested deeper than 16 levels");
        }
        if (auto s = WalkBucket(v, Visitor(), true, bucket_depth + 1); !s.ok()) return s;
      }
    }
    return absl::OkStatus();
  }

  const BboltReader& r_;
  std::vector<bool> visited_;
};

BboltReader::~BboltReader() = default;

absl::StatusOr<std::unique_ptr<BboltReader>> BboltReader::Open(const std::string& path,
                                                               std::optional<uint64_t> length) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  uint64_t size = static_cast<uint64_t>(st.st_size);
  if (length.has_value()) {
    if (*length > size) {
      ::close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(path, " has ", size, " bytes, fewer than the ", *length, " expected"));
    }
    size = *length;
  }
  if (size == 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is empty: not a bbolt file"));
  }
  void* addr = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (addr == MAP_FAILED) {
    return absl::InternalError(absl::StrCat("cannot map ", path, ": ", std::strerror(err)));
  }
  auto reader = std::unique_ptr<BboltReader>(new BboltReader());
  reader->mapping_ = std::make_unique<Mapping>();
  reader->mapping_->addr = addr;
  reader->mapping_->length = size;
  reader->data_ = static_cast<const char*>(addr);
  reader->size_ = size;
  if (auto s = reader->Init(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  }
  return reader;
}

absl::StatusOr<std::unique_ptr<BboltReader>> BboltReader::FromBytes(std::string bytes) {
  auto reader = std::unique_ptr<BboltReader>(new BboltReader());
  reader->mapping_ = std::make_unique<Mapping>();
  reader->mapping_->bytes = std::move(bytes);
  reader->data_ = reader->mapping_->bytes.data();
  reader->size_ = reader->mapping_->bytes.size();
  if (auto s = reader->Init(); !s.ok()) return s;
  return reader;
}

absl::Status BboltReader::Init() {
  // Meta page 0 sits at offset 0 and names the page size, which places
  // meta page 1. If meta 0 is damaged, look for meta 1 at every page size
  // bbolt could have used, as bbolt itself falls back to the other meta.
  BboltMeta m0, m1;
  absl::Status s0 = ReadMeta(data_, size_, 0, &m0);
  absl::Status s1 = absl::NotFoundError("meta page 1 not found");
  if (s0.ok()) {
    s1 = ReadMeta(data_, size_, m0.page_size, &m1);
    if (s1.ok() && m1.page_size != m0.page_size) {
      s1 = absl::DataLossError("meta page 1 disagrees on the page size");
    }
  } else {
    for (uint64_t ps = kMinPageSize; ps <= kMaxPageSize; ps *= 2) {
      BboltMeta m;
      absl::Status s = ReadMeta(data_, size_, ps, &m);
      if (s.ok() && m.page_size == ps) {
        m1 = m;
        s1 = s;
        break;
      }
      if (ps == 4096) s1 = s;  // the reason to report: bbolt's usual page size
    }
  }
  m0.meta_page = 0;
  m1.meta_page = 1;
  if (!s0.ok() && !s1.ok()) {
    if (size_ < kPageHeaderSize + kMetaSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("not a bbolt file: ", size_, " bytes is too small"));
    }
    if (absl::IsInvalidArgument(s0)) {
      return absl::InvalidArgumentError(absl::StrCat("not a bbolt file: ", s0.message()));
    }
    if (absl::IsFailedPrecondition(s0)) return s0;
    return Corrupt(absl::StrCat("no valid meta page (meta 0: ", s0.message(),
                                "; meta 1: ", s1.message(), ")"));
  }
  if (s0.ok() && s1.ok()) {
    meta_ = m1.txid > m0.txid ? m1 : m0;
  } else {
    meta_ = s0.ok() ? m0 : m1;
  }
  const uint64_t ps = meta_.page_size;
  if (meta_.high_water < 2 || meta_.high_water > size_ / ps) {
    if (meta_.high_water > size_ / ps) {
      return Corrupt(absl::StrCat("truncated: meta page ", meta_.meta_page, " (txid ", meta_.txid,
                                  ") says ", meta_.high_water, " pages of ", ps, " bytes (",
                                  meta_.high_water * ps, " bytes) but the file has ", size_,
                                  " bytes"));
    }
    return Corrupt(absl::StrCat("high-water mark ", meta_.high_water, " below the meta pages"));
  }
  if (meta_.root < 2 || meta_.root >= meta_.high_water) {
    return Corrupt(absl::StrCat("root bucket page ", meta_.root, " is out of range [2, ",
                                meta_.high_water, ")"));
  }
  if (meta_.freelist != ~uint64_t{0} &&
      (meta_.freelist < 2 || meta_.freelist >= meta_.high_water)) {
    return Corrupt(absl::StrCat("freelist page ", meta_.freelist, " is out of range"));
  }
  return absl::OkStatus();
}

namespace {

// The root bucket's header, as a bucket value: its root page from the meta.
std::string RootBucketHeader(uint64_t root) {
  std::string header(kBucketHeaderSize, '\0');
  for (int b = 0; b < 8; ++b) header[b] = static_cast<char>((root >> (8 * b)) & 0xff);
  return header;
}

}  // namespace

absl::Status BboltReader::ForEach(const std::vector<std::string>& path,
                                  const Visitor& visit) const {
  Walker walker(*this);
  std::string value_holder = RootBucketHeader(meta_.root);
  std::string_view bucket = value_holder;
  for (const std::string& name : path) {
    PageRef page;
    if (auto s = walker.BucketRoot(bucket, &page); !s.ok()) return s;
    std::string_view value;
    bool is_bucket = false, found = false;
    if (auto s = walker.Find(page, name, &value, &is_bucket, &found, 0); !s.ok()) return s;
    if (!found || !is_bucket) {
      return absl::NotFoundError(absl::StrCat("bucket \"", name, "\" not found"));
    }
    // The search marked the pages it reached; the walk below starts over.
    walker.Reset();
    bucket = value;
  }
  return walker.WalkBucket(bucket, visit, /*recurse=*/false, 0);
}

absl::StatusOr<bool> BboltReader::HasBucket(const std::vector<std::string>& path) const {
  auto s = ForEach(path, [](std::string_view, std::string_view, bool) {
    return absl::CancelledError("found");  // stop at once: existence is all we want
  });
  if (s.ok() || absl::IsCancelled(s)) return true;
  if (absl::IsNotFound(s)) return false;
  return s;
}

absl::StatusOr<std::vector<std::string>> BboltReader::Buckets() const {
  std::vector<std::string> names;
  auto s = ForEach({}, [&names](std::string_view key, std::string_view, bool is_bucket) {
    if (!is_bucket) return Corrupt(absl::StrCat("the root bucket holds a plain key"));
    names.emplace_back(key);
    return absl::OkStatus();
  });
  if (!s.ok()) return s;
  return names;
}

absl::Status BboltReader::Check() const {
  Walker walker(*this);
  return walker.WalkBucket(RootBucketHeader(meta_.root), Visitor(), /*recurse=*/true, 0);
}

}  // namespace capstan::etcdfmt
