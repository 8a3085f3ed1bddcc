#include "storage/etcdfmt/bbolt_writer.h"

#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "storage/etcdfmt/bbolt_reader.h"

namespace capstan::etcdfmt {
namespace {

using Buckets = std::map<std::string, std::map<std::string, std::string>>;

// A sink that builds the file in memory, each page at its place.
BboltWriter::PageSink ToString(std::string* file, uint32_t page_size) {
  return [file, page_size](uint64_t id, std::string_view pages) {
    const size_t at = id * page_size;
    if (file->size() < at + pages.size()) file->resize(at + pages.size());
    file->replace(at, pages.size(), pages);
    return absl::OkStatus();
  };
}

absl::StatusOr<std::string> Write(const Buckets& buckets, uint32_t page_size, uint64_t txid = 7) {
  std::string file;
  BboltWriter w(ToString(&file, page_size), page_size);
  for (const auto& [name, entries] : buckets) {
    if (auto s = w.BeginBucket(name); !s.ok()) return s;
    for (const auto& [k, v] : entries) {
      if (auto s = w.Put(k, v); !s.ok()) return s;
    }
  }
  if (auto s = w.Finish(txid); !s.ok()) return s;
  EXPECT_EQ(w.size(), file.size());
  return file;
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
      auto file = Write(want, page_size);
      ASSERT_TRUE(file.ok()) << file.status();
      auto r = BboltReader::FromBytes(*std::move(file));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_TRUE((*r)->Check().ok()) << (*r)->Check();
      EXPECT_EQ((*r)->meta().page_size, page_size);
      EXPECT_EQ((*r)->meta().txid, 8u) << "the newer of the two meta pages";
      EXPECT_EQ((*r)->size() % page_size, 0u);
      EXPECT_EQ(ReadBack(**r), want);
    }
  }
}

TEST(BboltWriterTest, ManyBucketsAndLongKeysMakeBranchesEverywhere) {
  Buckets want;
  for (int b = 0; b < 600; ++b) {
    auto& entries = want[absl::StrCat("bucket-", 1000 + b)];
    for (int i = 0; i < b % 5; ++i) entries[absl::StrCat(std::string(400, 'k'), i)] = "v";
  }
  auto file = Write(want, 1024);
  ASSERT_TRUE(file.ok()) << file.status();
  auto r = BboltReader::FromBytes(*std::move(file));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE((*r)->Check().ok());
  EXPECT_EQ(ReadBack(**r), want);
}

TEST(BboltWriterTest, RefusesWhatBboltCannotHold) {
  std::string file;
  BboltWriter w(ToString(&file, 4096));
  EXPECT_FALSE(w.Put("k", "v").ok()) << "no bucket begun";
  ASSERT_TRUE(w.BeginBucket("b").ok());
  EXPECT_FALSE(w.BeginBucket("a").ok()) << "buckets out of order";
  EXPECT_FALSE(w.BeginBucket("b").ok()) << "the same bucket twice";
  ASSERT_TRUE(w.Put("k2", "v").ok());
  EXPECT_FALSE(w.Put("k1", "v").ok()) << "keys out of order";
  EXPECT_FALSE(w.Put("k2", "v").ok()) << "the same key twice";
  EXPECT_FALSE(w.Put("", "v").ok()) << "empty key";
  ASSERT_TRUE(w.Finish(1).ok());
  EXPECT_FALSE(w.BeginBucket("c").ok()) << "after Finish";
}

TEST(BboltWriterTest, SinkErrorsStopTheWriter) {
  int pages = 0;
  BboltWriter w([&](uint64_t, std::string_view) {
    return ++pages > 3 ? absl::CancelledError("stream gone") : absl::OkStatus();
  });
  ASSERT_TRUE(w.BeginBucket("key").ok());
  absl::Status s;
  for (int i = 0; s.ok() && i < 1000; ++i) {
    s = w.Put(absl::StrCat("k", 100000 + i), std::string(500, 'v'));
  }
  EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_EQ(pages, 4);
}

}  // namespace
}  // namespace capstan::etcdfmt
