#include "storage/etcdfmt/bbolt_reader.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "etcdctl_command.h"
#include "etcdserverpb/rpc.pb.h"
#include "gtest/gtest.h"
#include "mvccpb/kv.pb.h"

namespace capstan::etcdfmt {
namespace {

namespace fs = std::filesystem;

// ---- A bbolt writer for tests: builds files with every structure the
// reader must handle (branch pages, overflow pages, nested and inline
// buckets), laid out as bbolt lays them out. ----

void Put16(std::string* s, size_t at, uint16_t v) {
  for (int i = 0; i < 2; ++i) (*s)[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void Put32(std::string* s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) (*s)[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void Put64(std::string* s, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) (*s)[at + i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint64_t Get64(const std::string& s, size_t at) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

uint64_t Fnv64a(const char* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(p[i]);
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Recomputes the checksum of the meta page at byte offset off.
void FixMetaChecksum(std::string* file, size_t off) {
  Put64(file, off + 16 + 56, Fnv64a(file->data() + off + 16, 56));
}

struct TestBucket {
  std::map<std::string, std::string> values;
  std::map<std::string, TestBucket> buckets;
};

class BboltBuilder {
 public:
  BboltBuilder(uint32_t page_size, size_t leaf_max, size_t branch_max)
      : ps_(page_size), leaf_max_(leaf_max), branch_max_(branch_max) {}

  std::string Build(const TestBucket& root) {
    file_.assign(3 * ps_, '\0');
    // Page 2: an empty freelist.
    Put64(&file_, 2 * ps_, 2);
    Put16(&file_, 2 * ps_ + 8, 0x10);
    const std::string root_value = BucketValue(root, /*allow_inline=*/false);
    const uint64_t root_page = Get64(root_value, 0);
    const uint64_t high_water = file_.size() / ps_;
    for (uint64_t m = 0; m < 2; ++m) {
      const size_t off = m * ps_;
      Put64(&file_, off, m);
      Put16(&file_, off + 8, 0x04);
      const size_t b = off + 16;
      Put32(&file_, b, 0xED0CDAED);
      Put32(&file_, b + 4, 2);
      Put32(&file_, b + 8, ps_);
      Put64(&file_, b + 16, root_page);
      Put64(&file_, b + 32, 2);  // freelist
      Put64(&file_, b + 40, high_water);
      Put64(&file_, b + 48, m == 0 ? 8 : 7);  // meta 0 is the newer one
      FixMetaChecksum(&file_, off);
    }
    return file_;
  }

 private:
  struct Entry {
    std::string key, value;
    uint32_t flags = 0;
  };

  static std::string LeafPage(const std::vector<Entry>& entries) {
    std::string page(16 + 16 * entries.size(), '\0');
    Put16(&page, 8, 0x02);
    Put16(&page, 10, static_cast<uint16_t>(entries.size()));
    for (size_t i = 0; i < entries.size(); ++i) {
      const size_t elem = 16 + 16 * i;
      Put32(&page, elem, entries[i].flags);
      Put32(&page, elem + 4, static_cast<uint32_t>(page.size() - elem));
      Put32(&page, elem + 8, static_cast<uint32_t>(entries[i].key.size()));
      Put32(&page, elem + 12, static_cast<uint32_t>(entries[i].value.size()));
      page += entries[i].key;
      page += entries[i].value;
    }
    return page;
  }

  static std::string BranchPage(const std::vector<std::pair<std::string, uint64_t>>& children) {
    std::string page(16 + 16 * children.size(), '\0');
    Put16(&page, 8, 0x01);
    Put16(&page, 10, static_cast<uint16_t>(children.size()));
    for (size_t i = 0; i < children.size(); ++i) {
      const size_t elem = 16 + 16 * i;
      Put32(&page, elem, static_cast<uint32_t>(page.size() - elem));
      Put32(&page, elem + 4, static_cast<uint32_t>(children[i].first.size()));
      Put64(&page, elem + 8, children[i].second);
      page += children[i].first;
    }
    return page;
  }

  // Appends a page (with overflow pages when it needs them); returns its id.
  uint64_t AddPage(std::string page) {
    const uint64_t id = file_.size() / ps_;
    const uint64_t pages = (page.size() + ps_ - 1) / ps_;
    Put64(&page, 0, id);
    Put32(&page, 12, static_cast<uint32_t>(pages - 1));
    page.resize(pages * ps_, '\0');
    file_ += page;
    return id;
  }

  std::string BucketValue(const TestBucket& b, bool allow_inline) {
    std::vector<Entry> entries;
    for (const auto& [k, v] : b.values) entries.push_back({k, v, 0});
    for (const auto& [k, child] : b.buckets) entries.push_back({k, BucketValue(child, true), 1});
    std::sort(entries.begin(), entries.end(),
              [](const Entry& x, const Entry& y) { return x.key < y.key; });
    std::string header(16, '\0');
    const std::string leaf = LeafPage(entries);
    if (allow_inline && b.buckets.empty() && 16 + leaf.size() <= ps_ / 4) {
      return header + leaf;  // inline: root 0, the page in the value
    }
    std::vector<std::pair<std::string, uint64_t>> level;
    for (size_t i = 0; i < entries.size() || i == 0; i += leaf_max_) {
      std::vector<Entry> chunk(entries.begin() + std::min(i, entries.size()),
                               entries.begin() + std::min(i + leaf_max_, entries.size()));
      level.emplace_back(chunk.empty() ? "" : chunk[0].key, AddPage(LeafPage(chunk)));
      if (entries.empty()) break;
    }
    while (level.size() > 1) {
      std::vector<std::pair<std::string, uint64_t>> up;
      for (size_t i = 0; i < level.size(); i += branch_max_) {
        std::vector<std::pair<std::string, uint64_t>> chunk(
            level.begin() + i, level.begin() + std::min(i + branch_max_, level.size()));
        up.emplace_back(chunk[0].first, AddPage(BranchPage(chunk)));
      }
      level = std::move(up);
    }
    Put64(&header, 0, level[0].second);
    return header;
  }

  const uint32_t ps_;
  const size_t leaf_max_, branch_max_;
  std::string file_;
};

// A tree using every structure: many keys (branch pages, two levels), a
// value larger than a page (overflow), a nested bucket on its own pages, an
// inline bucket, an empty inline bucket.
TestBucket SampleTree() {
  TestBucket root;
  TestBucket& key = root.buckets["key"];
  for (int i = 0; i < 500; ++i) {
    key.values[absl::StrCat("k", 10000 + i)] = std::string(20 + i % 50, static_cast<char>('a' + i % 26));
  }
  key.values["k99999-big"] = std::string(10000, 'B');
  TestBucket& outer = root.buckets["outer"];
  for (int i = 0; i < 40; ++i) outer.values[absl::StrCat("o", i)] = std::string(100, 'o');
  outer.buckets["inner"].values["x"] = "1";   // inline
  outer.buckets["inner"].values["y"] = "2";
  outer.buckets["deep"].buckets["deeper"].values["z"] = "3";
  root.buckets["alarm"];  // empty, inline
  root.buckets["meta"].values["consistent_index"] = std::string(8, '\x01');
  return root;
}

std::map<std::string, std::string> ReadAll(const BboltReader& r,
                                           const std::vector<std::string>& path) {
  std::map<std::string, std::string> out;
  auto s = r.ForEach(path, [&out](std::string_view k, std::string_view v, bool is_bucket) {
    out[std::string(k)] = is_bucket ? "<bucket>" : std::string(v);
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(BboltReaderSynthetic, ReadsEveryStructure) {
  for (uint32_t ps : {4096u, 1024u, 16384u}) {
    const TestBucket tree = SampleTree();
    auto reader = BboltReader::FromBytes(BboltBuilder(ps, 16, 8).Build(tree));
    ASSERT_TRUE(reader.ok()) << reader.status();
    const BboltReader& r = **reader;
    EXPECT_EQ(r.meta().page_size, ps);
    EXPECT_EQ(r.meta().txid, 8u);
    EXPECT_EQ(r.meta().meta_page, 0);
    ASSERT_TRUE(r.Check().ok()) << r.Check();
    auto buckets = r.Buckets();
    ASSERT_TRUE(buckets.ok());
    EXPECT_EQ(*buckets, (std::vector<std::string>{"alarm", "key", "meta", "outer"}));
    auto key = ReadAll(r, {"key"});
    EXPECT_EQ(key.size(), 501u);
    EXPECT_EQ(key, tree.buckets.at("key").values);
    EXPECT_EQ(key["k99999-big"], std::string(10000, 'B'));
    auto outer = ReadAll(r, {"outer"});
    EXPECT_EQ(outer.size(), 42u);
    EXPECT_EQ(outer["inner"], "<bucket>");
    EXPECT_EQ(ReadAll(r, {"outer", "inner"}),
              (std::map<std::string, std::string>{{"x", "1"}, {"y", "2"}}));
    EXPECT_EQ(ReadAll(r, {"outer", "deep", "deeper"}),
              (std::map<std::string, std::string>{{"z", "3"}}));
    EXPECT_TRUE(ReadAll(r, {"alarm"}).empty());
    EXPECT_TRUE(*r.HasBucket({"outer", "deep"}));
    EXPECT_FALSE(*r.HasBucket({"outer", "nope"}));
    EXPECT_FALSE(*r.HasBucket({"key", "k10000"}));  // a plain key is not a bucket
    EXPECT_TRUE(absl::IsNotFound(r.ForEach({"missing"}, nullptr)));
  }
}

TEST(BboltReaderSynthetic, UsesTheNewerValidMeta) {
  std::string file = BboltBuilder(4096, 16, 8).Build(SampleTree());
  // Meta 1 is older (txid 7). Break meta 0's checksum: meta 1 is used.
  std::string broken = file;
  broken[16 + 20] ^= 0x40;
  auto r = BboltReader::FromBytes(broken);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->meta().meta_page, 1);
  EXPECT_EQ((*r)->meta().txid, 7u);
  // Make meta 1 the newer one: it wins.
  std::string newer = file;
  Put64(&newer, 4096 + 16 + 48, 9);
  FixMetaChecksum(&newer, 4096);
  r = BboltReader::FromBytes(newer);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->meta().meta_page, 1);
  EXPECT_EQ((*r)->meta().txid, 9u);
}

TEST(BboltReaderSynthetic, RefusesCorruptFilesClearly) {
  const std::string file = BboltBuilder(4096, 16, 8).Build(SampleTree());
  auto expect_error = [](const std::string& bytes, const std::string& text) {
    auto r = BboltReader::FromBytes(bytes);
    ASSERT_FALSE(r.ok()) << "expected an error mentioning " << text;
    EXPECT_NE(r.status().message().find(text), std::string::npos) << r.status();
  };
  expect_error("", "too small");
  expect_error(file.substr(0, 50), "too small");
  expect_error(std::string(8192, 'x'), "not a bbolt file");
  expect_error(file.substr(0, file.size() / 2), "truncated");
  std::string magic = file;
  Put32(&magic, 16, 0x12345678);
  Put32(&magic, 4096 + 16, 0x12345678);
  expect_error(magic, "bad magic 0x12345678");
  std::string checksum = file;
  checksum[16 + 40] ^= 1;
  checksum[4096 + 16 + 40] ^= 1;
  expect_error(checksum, "checksum");
  std::string version = file;
  Put32(&version, 20, 3);
  FixMetaChecksum(&version, 0);
  Put32(&version, 4096 + 20, 3);
  FixMetaChecksum(&version, 4096);
  expect_error(version, "unsupported bbolt version 3");
  // A valid meta naming a root page past the end.
  std::string root = file;
  Put64(&root, 16 + 16, 1u << 30);
  FixMetaChecksum(&root, 0);
  Put64(&root, 4096 + 16 + 16, 1u << 30);
  FixMetaChecksum(&root, 4096);
  expect_error(root, "root bucket page");
  // A branch element pointing at itself: a cycle, reported, not followed.
  auto r = BboltReader::FromBytes(file);
  ASSERT_TRUE(r.ok());
  const uint64_t root_page = (*r)->meta().root;
  std::string cycle = file;
  Put16(&cycle, root_page * 4096 + 8, 0x01);  // turn the root leaf into a branch...
  Put64(&cycle, root_page * 4096 + 16 + 8, root_page);  // ...whose first child is itself
  auto rc = BboltReader::FromBytes(cycle);
  ASSERT_TRUE(rc.ok());
  EXPECT_FALSE((*rc)->Check().ok());
  EXPECT_FALSE((*rc)->Buckets().ok());
}

// Feeds garbage to every entry point; the reader must answer (an error or
// data), never crash, hang or read out of bounds (run under ASan to see).
struct FuzzStats {
  int files = 0, opened = 0, checked = 0;
};

void Exercise(const std::string& bytes, FuzzStats* stats) {
  ++stats->files;
  auto r = BboltReader::FromBytes(bytes);
  if (!r.ok()) return;
  ++stats->opened;
  if ((*r)->Check().ok()) ++stats->checked;
  auto buckets = (*r)->Buckets();
  if (!buckets.ok()) return;
  for (const auto& b : *buckets) {
    size_t n = 0;
    (*r)->ForEach({b}, [&n](std::string_view k, std::string_view v, bool) {
            n += k.size() + v.size();
            return absl::OkStatus();
          }).IgnoreError();
    (*r)->HasBucket({b, "inner"}).IgnoreError();
  }
}

// CAPSTAN_FUZZ_ROUNDS_X=N runs N times the rounds (longer fuzzing, e.g.
// under ASan).
int FuzzRounds(int rounds) {
  const char* x = std::getenv("CAPSTAN_FUZZ_ROUNDS_X");
  return x != nullptr && std::atoi(x) > 0 ? rounds * std::atoi(x) : rounds;
}

void FuzzFile(const std::string& file, uint32_t ps, int rounds, uint64_t seed) {
  rounds = FuzzRounds(rounds);
  std::mt19937_64 rng(seed);
  FuzzStats stats;
  for (int round = 0; round < rounds; ++round) {
    std::string bytes = file;
    const int mode = round % 4;
    if (mode == 0) {  // random bit flips anywhere
      const int flips = 1 + static_cast<int>(rng() % 16);
      for (int i = 0; i < flips; ++i) bytes[rng() % bytes.size()] ^= static_cast<char>(1 << (rng() % 8));
    } else if (mode == 1) {  // bit flips in pages past the metas
      const int flips = 1 + static_cast<int>(rng() % 32);
      for (int i = 0; i < flips; ++i) {
        bytes[2 * ps + rng() % (bytes.size() - 2 * ps)] ^= static_cast<char>(1 << (rng() % 8));
      }
    } else if (mode == 2) {  // garbage meta fields that still checksum
      for (size_t off : {size_t{0}, size_t{ps}}) {
        bytes[off + 16 + 8 + rng() % 48] ^= static_cast<char>(1 << (rng() % 8));
        FixMetaChecksum(&bytes, off);
      }
    } else {  // a whole page replaced by random bytes
      const size_t page = 2 + rng() % (bytes.size() / ps - 2);
      for (size_t i = 0; i < ps; ++i) bytes[page * ps + i] = static_cast<char>(rng());
      if (rng() % 2) Put64(&bytes, page * ps, page);  // keep the id right, so it is parsed
    }
    Exercise(bytes, &stats);
  }
  // Random files, some with valid metas over random pages.
  for (int round = 0; round < rounds / 4; ++round) {
    std::string bytes(ps * (2 + rng() % 8), '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    if (round % 2 == 0) {
      bytes.replace(0, 2 * ps, file.substr(0, 2 * ps));
      for (size_t off : {size_t{0}, size_t{ps}}) {
        Put64(&bytes, off + 16 + 40, bytes.size() / ps);
        FixMetaChecksum(&bytes, off);
      }
    }
    Exercise(bytes, &stats);
  }
  // How deep the garbage got: files that opened, and that passed Check.
  std::printf("fuzz: %d files, %d opened, %d passed Check\n", stats.files, stats.opened,
              stats.checked);
  EXPECT_GT(stats.opened, 0);
}

TEST(BboltReaderFuzz, RandomAndBitFlippedSyntheticFiles) {
  FuzzFile(BboltBuilder(1024, 8, 4).Build(SampleTree()), 1024, 2000, 1);
}

// ---- Files written by a real etcd. ----

using Etcd = testing::EtcdctlServer;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

class BboltReaderEtcd : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!Etcd::EtcdAvailable()) return;
    char tmpl[] = "/tmp/capstan-bbolt-XXXXXX";
    dir_ = new std::string(mkdtemp(tmpl));
    etcd_ = new Etcd();
    Etcd& etcd = *etcd_;
    ASSERT_TRUE(etcd.Start().ok()) << "etcd did not start";
    // Enough keys for branch pages, a value larger than a page (overflow
    // pages), a delete, a lease with a key, auth records.
    for (int t = 0; t < 4; ++t) {
      std::string txn = "\n";
      for (int i = 0; i < 60; ++i) {
        txn += absl::StrCat("put /registry/pods/ns", t, "/pod", i, " ", std::string(80, 'a' + t),
                            "\n");
      }
      etcd.Ctl("txn", txn + "\n\n");
    }
    etcd.Ctl("put /big " + std::string(20000, 'B'));
    etcd.Ctl("del /registry/pods/ns0/pod7");
    lease_id_ = static_cast<uint64_t>(etcd.Grant(3600));
    etcd.Ctl(absl::StrFormat("put /leased v --lease=%x", lease_id_));
    etcd.Ctl("user add alice:secret");
    range_ = new etcdserverpb::RangeResponse(etcd.GetAll(0));
    etcd.Ctl(absl::StrCat("snapshot save ", *dir_, "/snap.db"));
    etcd.Stop();
  }
  static void TearDownTestSuite() {
    if (dir_ != nullptr) fs::remove_all(*dir_);
    delete etcd_;
    etcd_ = nullptr;
    delete dir_;
    delete range_;
    dir_ = nullptr;
    range_ = nullptr;
  }
  void SetUp() override {
    CAPSTAN_REQUIRE_REFERENCE("etcd", testing::EtcdBinary());
    CAPSTAN_REQUIRE_REFERENCE("etcdctl", testing::EtcdctlBinary());
    ASSERT_NE(dir_, nullptr);
  }

  static Etcd* etcd_;  // stopped after set-up; its data dir lives until tear-down
  static std::string* dir_;
  static etcdserverpb::RangeResponse* range_;
  static uint64_t lease_id_;
};
Etcd* BboltReaderEtcd::etcd_ = nullptr;
std::string* BboltReaderEtcd::dir_ = nullptr;
etcdserverpb::RangeResponse* BboltReaderEtcd::range_ = nullptr;
uint64_t BboltReaderEtcd::lease_id_ = 0;

void CheckEtcdFile(const BboltReader& r, const etcdserverpb::RangeResponse& range,
                   uint64_t lease_id) {
  EXPECT_EQ(r.meta().page_size, 4096u);
  ASSERT_TRUE(r.Check().ok()) << r.Check();
  auto buckets = r.Buckets();
  ASSERT_TRUE(buckets.ok()) << buckets.status();
  for (const char* b : {"key", "meta", "lease", "auth", "authUsers", "authRoles", "alarm"}) {
    EXPECT_NE(std::find(buckets->begin(), buckets->end(), b), buckets->end()) << b;
  }
  // The key bucket holds revision keys in order; the latest record of each
  // live key is what etcd answered.
  std::map<std::string, mvccpb::KeyValue> latest;
  int64_t last_main = 0;
  size_t records = 0;
  auto s = r.ForEach({"key"}, [&](std::string_view k, std::string_view v, bool is_bucket) {
    EXPECT_FALSE(is_bucket);
    EXPECT_TRUE(k.size() == 17 || (k.size() == 18 && k[17] == 't'));
    EXPECT_EQ(k[8], '_');
    int64_t main = 0;
    for (int i = 0; i < 8; ++i) main = (main << 8) | static_cast<unsigned char>(k[i]);
    EXPECT_GE(main, last_main);
    last_main = main;
    mvccpb::KeyValue kv;
    EXPECT_TRUE(kv.ParseFromArray(v.data(), static_cast<int>(v.size())));
    if (k.size() == 18) {
      latest.erase(kv.key());
    } else {
      latest[kv.key()] = kv;
    }
    ++records;
    return absl::OkStatus();
  });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(last_main, range.header().revision());
  ASSERT_EQ(latest.size(), static_cast<size_t>(range.kvs_size()));
  for (const auto& kv : range.kvs()) {
    ASSERT_TRUE(latest.count(kv.key())) << kv.key();
    EXPECT_EQ(latest[kv.key()].SerializeAsString(), kv.SerializeAsString()) << kv.key();
  }
  EXPECT_EQ(latest["/big"].value(), std::string(20000, 'B'));  // read through overflow pages
  // The lease, the meta records, auth.
  std::map<std::string, std::string> leases;
  ASSERT_TRUE(r.ForEach({"lease"}, [&](std::string_view k, std::string_view v, bool) {
                 leases[std::string(k)] = std::string(v);
                 return absl::OkStatus();
               }).ok());
  ASSERT_EQ(leases.size(), 1u);
  std::string id(8, '\0');
  for (int i = 0; i < 8; ++i) id[i] = static_cast<char>((lease_id >> (56 - 8 * i)) & 0xff);
  EXPECT_TRUE(leases.count(id));
  std::map<std::string, std::string> meta;
  ASSERT_TRUE(r.ForEach({"meta"}, [&](std::string_view k, std::string_view v, bool) {
                 meta[std::string(k)] = std::string(v);
                 return absl::OkStatus();
               }).ok());
  EXPECT_EQ(meta["consistent_index"].size(), 8u);
  bool alice = false;
  ASSERT_TRUE(r.ForEach({"authUsers"}, [&](std::string_view k, std::string_view, bool) {
                 alice |= k == "alice";
                 return absl::OkStatus();
               }).ok());
  EXPECT_TRUE(alice);
}

TEST_F(BboltReaderEtcd, ReadsTheDataDirDb) {
  auto r = BboltReader::Open(etcd_->db_path());
  ASSERT_TRUE(r.ok()) << r.status();
  CheckEtcdFile(**r, *range_, lease_id_);
}

TEST_F(BboltReaderEtcd, ReadsTheSnapshotWithoutItsChecksum) {
  const std::string snap = *dir_ + "/snap.db";
  const uint64_t size = fs::file_size(snap);
  ASSERT_EQ(size % 512, 32u);
  auto r = BboltReader::Open(snap, size - 32);
  ASSERT_TRUE(r.ok()) << r.status();
  CheckEtcdFile(**r, *range_, lease_id_);
  EXPECT_FALSE(BboltReader::Open(snap, size + 1).ok());
}

TEST_F(BboltReaderEtcd, NeverWritesTheSource) {
  const std::string db = etcd_->db_path();
  const std::string before = ReadFile(db);
  const auto mtime = fs::last_write_time(db);
  {
    auto r = BboltReader::Open(db);
    ASSERT_TRUE(r.ok());
    ASSERT_TRUE((*r)->Check().ok());
  }
  EXPECT_EQ(ReadFile(db), before);
  EXPECT_EQ(fs::last_write_time(db), mtime);
}

TEST_F(BboltReaderEtcd, RefusesCorruptEtcdFiles) {
  const std::string file = ReadFile(etcd_->db_path());
  // Cut inside the pages in use (bbolt may have grown the file beyond them).
  auto whole = BboltReader::FromBytes(file);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const uint64_t in_use = (*whole)->meta().high_water * (*whole)->meta().page_size;
  ASSERT_GT(in_use, 4u * (*whole)->meta().page_size);
  auto truncated = BboltReader::FromBytes(file.substr(0, in_use / 2));
  ASSERT_FALSE(truncated.ok());
  EXPECT_NE(truncated.status().message().find("truncated"), std::string::npos)
      << truncated.status();
  std::string magic = file;
  magic[16] ^= 0x5a;
  magic[4096 + 16] ^= 0x5a;
  auto bad_magic = BboltReader::FromBytes(magic);
  ASSERT_FALSE(bad_magic.ok());
  EXPECT_NE(bad_magic.status().message().find("not a bbolt file"), std::string::npos)
      << bad_magic.status();
  std::string sum = file;
  sum[16 + 48] ^= 1;  // txid byte of meta 0
  auto one_bad = BboltReader::FromBytes(sum);
  ASSERT_TRUE(one_bad.ok()) << "one valid meta is enough";
  EXPECT_EQ((*one_bad)->meta().meta_page, 1);
  sum[4096 + 16 + 48] ^= 1;
  auto both_bad = BboltReader::FromBytes(sum);
  ASSERT_FALSE(both_bad.ok());
  EXPECT_NE(both_bad.status().message().find("checksum"), std::string::npos) << both_bad.status();
}

TEST_F(BboltReaderEtcd, FuzzedEtcdFilesNeverCrash) {
  // The pages in use only: etcd grows its file far beyond them, and every
  // round copies and parses the whole file.
  const std::string file = ReadFile(etcd_->db_path());
  auto whole = BboltReader::FromBytes(file);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const uint64_t in_use = (*whole)->meta().high_water * (*whole)->meta().page_size;
  ASSERT_LE(in_use, file.size());
  FuzzFile(file.substr(0, in_use), 4096, 1200, 7);
}

}  // namespace
}  // namespace capstan::etcdfmt
