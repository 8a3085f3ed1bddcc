#include "storage/bbolt_writer.h"

#include <unistd.h>

#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/bbolt_reader.h"

namespace capstan::storage {
namespace {

using Buckets = std::map<std::string, std::map<std::string, std::string>>;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/bbolt-writer-", getpid(), "-", name);
}

absl::Status Write(const std::string& path, const Buckets& buckets, uint32_t page_size,
                   uint64_t txid = 7) {
  auto w = BboltWriter::Create(path, page_size);
  if (!w.ok()) return w.status();
  for (const auto& [name, entries] : buckets) {
    if (auto s = (*w)->BeginBucket(name); !s.ok()) return s;
    for (const auto& [k, v] : entries) {
      if (auto s = (*w)->Put(k, v); !s.ok()) return s;
    }
  }
  return (*w)->Finish(txid);
}

// What the reader finds, in the same shape.
Buckets ReadBack(const BboltReader& r) {
  Buckets out;
  auto names = r.Buckets();
  EXPECT_TRUE(names.ok()) << names.status();
  if (!names.ok()) return out;
  for (const auto& name : *names) {
    auto& entries = out[name];
    auto s = r.ForEach({name}, [&](std::string_view k, std::string_view v, bool is_bucket) {
      EXPECT_FALSE(is_bucket);
      entries.emplace(std::string(k), std::string(v));
      return absl::OkStatus();
    });
    EXPECT_TRUE(s.ok()) << s;
  }
  return out;
}

TEST(BboltWriterTest, ReaderFindsEveryEntry) {
  std::mt19937_64 rng(42);
  for (uint32_t page_size : {1024u, 4096u}) {
    for (size_t keys : {0ul, 1ul, 7ul, 300ul, 20000ul}) {
      SCOPED_TRACE(absl::StrCat("page ", page_size, ", keys ", keys));
      Buckets want;
      want["alarm"];  // empty: written inline
      auto& big = want["key"];
      for (size_t i = 0; i < keys; ++i) {
        std::string k(17, '\0');
        for (char& c : k) c = static_cast<char>(rng());
        // Mostly small values, some far bigger than a page (overflow).
        const size_t size = rng() % 50 == 0 ? rng() % (3 * page_size) : rng() % 300;
        big[k] = std::string(size, static_cast<char>('a' + rng() % 26));
      }
      want["meta"]["consistent_index"] = std::string(8, '\x01');
      const std::string path = TempPath("every");
      ASSERT_TRUE(Write(path, want, page_size).ok());
      auto r = BboltReader::Open(path);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE((*r)->Check().ok()) << (*r)->Check();
      EXPECT_EQ((*r)->meta().page_size, page_size);
      EXPECT_EQ((*r)->meta().txid, 8u) << "the newer of the two meta pages";
      EXPECT_EQ((*r)->size() % page_size, 0u);
      EXPECT_EQ(ReadBack(**r), want);
      ::unlink(path.c_str());
    }
  }
}

TEST(BboltWriterTest, ManyBucketsAndLongKeysMakeBranchesEverywhere) {
  Buckets want;
  for (int b = 0; b < 600; ++b) {
    auto& entries = want[absl::StrCat("bucket-", 1000 + b)];
    for (int i = 0; i < b % 5; ++i) entries[absl::StrCat(std::string(400, 'k'), i)] = "v";
  }
  const std::string path = TempPath("branches");
  ASSERT_TRUE(Write(path, want, 1024).ok());
  auto r = BboltReader::Open(path);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE((*r)->Check().ok());
  EXPECT_EQ(ReadBack(**r), want);
  ::unlink(path.c_str());
}

TEST(BboltWriterTest, RefusesWhatBboltCannotHold) {
  const std::string path = TempPath("refuse");
  auto w = BboltWriter::Create(path);
  ASSERT_TRUE(w.ok());
  EXPECT_FALSE((*w)->Put("k", "v").ok()) << "no bucket begun";
  ASSERT_TRUE((*w)->BeginBucket("b").ok());
  EXPECT_FALSE((*w)->BeginBucket("a").ok()) << "buckets out of order";
  EXPECT_FALSE((*w)->BeginBucket("b").ok()) << "the same bucket twice";
  ASSERT_TRUE((*w)->Put("k2", "v").ok());
  EXPECT_FALSE((*w)->Put("k1", "v").ok()) << "keys out of order";
  EXPECT_FALSE((*w)->Put("k2", "v").ok()) << "the same key twice";
  EXPECT_FALSE((*w)->Put("", "v").ok()) << "empty key";
  ASSERT_TRUE((*w)->Finish(1).ok());
  EXPECT_FALSE((*w)->BeginBucket("c").ok()) << "after Finish";
  EXPECT_FALSE(BboltWriter::Create(path, 1000).ok()) << "page size not a power of two";
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace capstan::storage
