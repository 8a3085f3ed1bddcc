#include "storage/backend.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "storage/data_dir.h"

namespace capstan::storage {
namespace {

class BackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/capstan-backend-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Backend> OpenBackend() {
    BackendOptions options;
    options.dir = dir_ + "/db";
    auto b = Backend::Open(options);
    EXPECT_TRUE(b.ok()) << b.status();
    return std::move(*b);
  }

  // Writes key/value pairs of the key family in one batch.
  static void PutKeys(Backend* b,
                      std::initializer_list<std::pair<std::string, std::string>> pairs) {
    WriteBatch batch;
    for (const auto& [k, v] : pairs) batch.Put(Cf::kKey, k, v);
    ASSERT_TRUE(b->Write(&batch).ok());
  }

  std::string dir_;
};

TEST_F(BackendTest, WritesAreAtomicAndSurviveReopen) {
  {
    auto b = OpenBackend();
    WriteBatch batch;
    batch.Put(Cf::kKey, "k1", "v1");
    batch.Put(Cf::kMeta, "k1", "meta");
    batch.Put(Cf::kLease, "l", "lease");
    EXPECT_EQ(batch.Count(), 3);
    ASSERT_TRUE(b->Write(&batch).ok());
  }
  auto b = OpenBackend();
  std::string v;
  ASSERT_TRUE(b->Get(Cf::kKey, "k1", &v).ok());
  EXPECT_EQ(v, "v1");
  ASSERT_TRUE(b->Get(Cf::kMeta, "k1", &v).ok());
  EXPECT_EQ(v, "meta");
  ASSERT_TRUE(b->Get(Cf::kLease, "l", &v).ok());
  EXPECT_EQ(v, "lease");
  EXPECT_TRUE(absl::IsNotFound(b->Get(Cf::kAuth, "k1", &v)));
}

TEST_F(BackendTest, FamiliesAreSeparate) {
  auto b = OpenBackend();
  WriteBatch batch;
  batch.Put(Cf::kKey, "a", "1");
  ASSERT_TRUE(b->Write(&batch).ok());
  std::string v;
  EXPECT_TRUE(absl::IsNotFound(b->Get(Cf::kMeta, "a", &v)));
}

TEST_F(BackendTest, IteratorAndDeleteRange) {
  auto b = OpenBackend();
  WriteBatch batch;
  for (char c = 'a'; c <= 'f'; ++c) batch.Put(Cf::kKey, std::string(1, c), std::string(2, c));
  ASSERT_TRUE(b->Write(&batch).ok());
  WriteBatch del;
  del.DeleteRange(Cf::kKey, "b", "d");
  del.Delete(Cf::kKey, "f");
  ASSERT_TRUE(b->Write(&del).ok());
  auto it = b->NewIterator(Cf::kKey);
  std::string seen;
  for (it->SeekToFirst(); it->Valid(); it->Next()) seen += it->key();
  EXPECT_TRUE(it->status().ok());
  EXPECT_EQ(seen, "ade");
  it->Seek("c");
  ASSERT_TRUE(it->Valid());
  EXPECT_EQ(it->key(), "d");
  EXPECT_EQ(it->value(), "dd");
}

TEST_F(BackendTest, MultiGetAnswersEachKey) {
  auto b = OpenBackend();
  PutKeys(b.get(), {{"x", "1"}, {"z", "3"}});
  std::vector<std::string> values;
  auto st = b->MultiGet(Cf::kKey, {"z", "y", "x"}, &values);
  ASSERT_EQ(st.size(), 3u);
  EXPECT_TRUE(st[0].ok());
  EXPECT_EQ(values[0], "3");
  EXPECT_TRUE(absl::IsNotFound(st[1]));
  EXPECT_TRUE(st[2].ok());
  EXPECT_EQ(values[2], "1");
}

TEST_F(BackendTest, MultiGetVisitHandsValuesInKeyOrder) {
  auto b = OpenBackend();
  WriteBatch batch;
  for (int i = 0; i < 1000; ++i) batch.Put(Cf::kKey, absl::StrCat("k", i), absl::StrCat("v", i));
  ASSERT_TRUE(b->Write(&batch).ok());
  std::vector<std::string> keys;
  for (int i = 999; i >= 0; i -= 3) keys.push_back(absl::StrCat("k", i));
  std::vector<std::string_view> views(keys.begin(), keys.end());
  std::vector<std::pair<size_t, std::string>> seen;
  ASSERT_TRUE(b->MultiGetVisit(Cf::kKey, views, [&](size_t i, std::string_view value) {
                 seen.emplace_back(i, std::string(value));
               }).ok());
  ASSERT_EQ(seen.size(), keys.size());
  for (size_t i = 0; i < seen.size(); ++i) {
    EXPECT_EQ(seen[i].first, i);
    EXPECT_EQ("v" + keys[i].substr(1), seen[i].second);
  }
}

TEST_F(BackendTest, MultiGetVisitStopsAtAMissingKey) {
  auto b = OpenBackend();
  PutKeys(b.get(), {{"x", "1"}});
  int visited = 0;
  auto s = b->MultiGetVisit(Cf::kKey, {"x", "missing", "x"},
                            [&](size_t, std::string_view) { ++visited; });
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_NE(s.message().find("key 1"), std::string_view::npos) << s;
  EXPECT_EQ(visited, 1);
}

// Values big enough to span many blocks, half in SST files and half in the
// memtable, asked for out of order, with runs, gaps longer than a walk takes
// before it seeks, and a repeated key: each value is still whole when it is
// visited, after the walk has moved past its block.
TEST_F(BackendTest, ScanVisitHandsValuesInKeyOrderFromFilesAndMemtable) {
  auto b = OpenBackend();
  auto value_of = [](int i) { return std::string(1000, static_cast<char>('a' + i % 26)) + std::to_string(i); };
  auto key_of = [](int i) { return absl::StrFormat("k%05d", i); };
  WriteBatch files;
  for (int i = 0; i < 2000; i += 2) files.Put(Cf::kKey, key_of(i), value_of(i));
  ASSERT_TRUE(b->Write(&files).ok());
  ASSERT_TRUE(b->CompactAll().ok());
  WriteBatch memtable;
  for (int i = 1; i < 2000; i += 2) memtable.Put(Cf::kKey, key_of(i), value_of(i));
  ASSERT_TRUE(b->Write(&memtable).ok());

  std::vector<int> wanted;
  for (int i = 1999; i >= 1000; --i) wanted.push_back(i);     // a dense run, backwards
  for (int i = 0; i < 1000; i += 37) wanted.push_back(i);     // gaps: seeks
  wanted.push_back(1500);                                     // asked twice
  std::vector<std::string> keys;
  for (int i : wanted) keys.push_back(key_of(i));
  std::vector<std::string_view> views(keys.begin(), keys.end());
  size_t next = 0;
  ASSERT_TRUE(b->ScanVisit(Cf::kKey, views, [&](size_t i, std::string_view value) {
                 ASSERT_EQ(i, next++);
                 EXPECT_EQ(value, value_of(wanted[i])) << keys[i];
               }).ok());
  EXPECT_EQ(next, keys.size());
}

TEST_F(BackendTest, ScanVisitVisitsNothingWhenAKeyIsMissing) {
  auto b = OpenBackend();
  PutKeys(b.get(), {{"a", "1"}, {"c", "3"}});
  int visited = 0;
  auto s = b->ScanVisit(Cf::kKey, {"a", "b", "c"}, [&](size_t, std::string_view) { ++visited; });
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_NE(s.message().find("key 1"), std::string_view::npos) << s;
  EXPECT_EQ(visited, 0);
  // Past the last key in the family.
  s = b->ScanVisit(Cf::kKey, {"a", "d"}, [&](size_t, std::string_view) { ++visited; });
  EXPECT_TRUE(absl::IsNotFound(s)) << s;
  EXPECT_NE(s.message().find("key 1"), std::string_view::npos) << s;
  EXPECT_EQ(visited, 0);
}

TEST_F(BackendTest, CheckpointIsAConsistentCopy) {
  auto b = OpenBackend();
  WriteBatch batch;
  batch.Put(Cf::kKey, "k", "before");
  ASSERT_TRUE(b->Write(&batch).ok());
  ASSERT_TRUE(b->Checkpoint(dir_ + "/cp").ok());
  WriteBatch later;
  later.Put(Cf::kKey, "k", "after");
  ASSERT_TRUE(b->Write(&later).ok());
  BackendOptions options;
  options.dir = dir_ + "/cp";
  auto copy = Backend::Open(options);
  ASSERT_TRUE(copy.ok()) << copy.status();
  std::string v;
  ASSERT_TRUE((*copy)->Get(Cf::kKey, "k", &v).ok());
  EXPECT_EQ(v, "before");
}

TEST_F(BackendTest, CompactAllKeepsLiveData) {
  auto b = OpenBackend();
  for (int round = 0; round < 3; ++round) {
    WriteBatch batch;
    for (int i = 0; i < 1000; ++i) batch.Put(Cf::kKey, "key" + std::to_string(i), std::string(100, 'a' + round));
    ASSERT_TRUE(b->Write(&batch).ok());
    ASSERT_TRUE(b->Flush().ok());
  }
  ASSERT_TRUE(b->CompactAll().ok());
  std::string v;
  ASSERT_TRUE(b->Get(Cf::kKey, "key7", &v).ok());
  EXPECT_EQ(v, std::string(100, 'c'));
  EXPECT_GT(b->SizeOnDisk(), 0u);
}

// Batches written without the WAL (a Raft member's store) are counted by
// their data while they sit in the memtables, not by the memory the
// memtables reserved: the quota is checked against this size.
TEST_F(BackendTest, SizeOnDiskCountsUnflushedDataNotReservedMemory) {
  auto b = OpenBackend();
  const uint64_t empty = b->SizeOnDisk();
  for (Cf cf : {Cf::kKey, Cf::kMeta, Cf::kLease}) {
    WriteBatch batch;
    batch.set_wal(false);
    batch.Put(cf, "k", std::string(100, 'v'));
    ASSERT_TRUE(b->Write(&batch).ok());
  }
  const uint64_t grown = b->SizeOnDisk() - empty;
  EXPECT_GT(grown, 300u);
  EXPECT_LT(grown, 4096u) << "three writes of 100 bytes count as " << grown << " bytes";
}

// A data dir made before the raft family existed: RocksDB files with the
// default family and the five of that layout, written with RocksDB directly.
void MakeOldLayout(const std::string& dir) {
  rocksdb::DBOptions options;
  options.create_if_missing = true;
  options.create_missing_column_families = true;
  std::vector<rocksdb::ColumnFamilyDescriptor> descriptors;
  for (const char* name : {"default", "key", "meta", "lease", "auth", "alarm"}) {
    descriptors.emplace_back(name, rocksdb::ColumnFamilyOptions());
  }
  rocksdb::DB* raw = nullptr;
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  ASSERT_TRUE(rocksdb::DB::Open(options, dir, descriptors, &handles, &raw).ok());
  ASSERT_TRUE(raw->Put(rocksdb::WriteOptions(), handles[1], "k", "old").ok());
  for (auto* h : handles) ASSERT_TRUE(raw->DestroyColumnFamilyHandle(h).ok());
  ASSERT_TRUE(raw->Close().ok());
  delete raw;
}

TEST_F(BackendTest, ReadOnlyOpenOfAnOldLayoutReadsTheMissingFamilyAsEmpty) {
  MakeOldLayout(dir_ + "/db");
  BackendOptions options;
  options.dir = dir_ + "/db";
  options.read_only = true;
  auto b = Backend::Open(options);
  ASSERT_TRUE(b.ok()) << b.status();
  std::string v;
  ASSERT_TRUE((*b)->Get(Cf::kKey, "k", &v).ok());
  EXPECT_EQ(v, "old");
  EXPECT_TRUE(absl::IsNotFound((*b)->Get(Cf::kRaft, "k", &v)));
  std::vector<std::string> values;
  auto statuses = (*b)->MultiGet(Cf::kRaft, {"a", "b"}, &values);
  ASSERT_EQ(statuses.size(), 2u);
  EXPECT_TRUE(absl::IsNotFound(statuses[0]));
  auto it = (*b)->NewIterator(Cf::kRaft);
  it->SeekToFirst();
  EXPECT_FALSE(it->Valid());
  EXPECT_TRUE(it->status().ok());
}

TEST_F(BackendTest, ReadWriteOpenOfAnOldLayoutAddsTheRaftFamily) {
  MakeOldLayout(dir_ + "/db");
  {
    auto b = OpenBackend();
    ASSERT_NE(b, nullptr);
    std::string v;
    ASSERT_TRUE(b->Get(Cf::kKey, "k", &v).ok());
    EXPECT_EQ(v, "old");
    WriteBatch batch;
    batch.Put(Cf::kRaft, "r", "log");
    batch.Put(Cf::kAlarm, "a", "");
    ASSERT_TRUE(b->Write(&batch).ok());
  }
  auto b = OpenBackend();
  ASSERT_NE(b, nullptr);
  std::string v;
  ASSERT_TRUE(b->Get(Cf::kRaft, "r", &v).ok());
  EXPECT_EQ(v, "log");
  ASSERT_TRUE(b->Get(Cf::kAlarm, "a", &v).ok());
  EXPECT_TRUE(absl::IsNotFound(b->Get(Cf::kRaft, "k", &v)));
}

TEST_F(BackendTest, DataDirKeepsTheRaftLogApart) {
  const std::string root = dir_ + "/data";
  ASSERT_TRUE(PrepareDataDir(root).ok());
  EXPECT_EQ(BackendDir(root), root + "/db");
  EXPECT_EQ(RaftLogDir(root), root + "/raft");
  BackendOptions data;
  data.dir = BackendDir(root);
  BackendOptions log;
  log.dir = RaftLogDir(root);
  {
    auto d = Backend::Open(data);
    ASSERT_TRUE(d.ok()) << d.status();
    auto l = Backend::Open(log);
    ASSERT_TRUE(l.ok()) << l.status();
  }
  // A data dir holding both is still Capstan's.
  EXPECT_TRUE(PrepareDataDir(root).ok());
}

// A backend at dir holding generation gen: "gen" -> gen in every family
// our checks read, and 200 keys of the key family.
void WriteGeneration(const std::string& dir, const std::string& gen) {
  BackendOptions options;
  options.dir = dir;
  auto b = Backend::Open(options);
  ASSERT_TRUE(b.ok()) << b.status();
  WriteBatch batch;
  batch.Put(Cf::kMeta, "gen", gen);
  batch.Put(Cf::kLease, "gen", gen);
  for (int i = 0; i < 200; ++i) batch.Put(Cf::kKey, absl::StrFormat("%s%04d", gen, i), gen);
  ASSERT_TRUE((*b)->Write(&batch).ok());
}

// The generation the backend holds, "" when it holds none whole.
std::string GenerationOf(Backend* b) {
  std::string gen, lease;
  if (!b->Get(Cf::kMeta, "gen", &gen).ok() || !b->Get(Cf::kLease, "gen", &lease).ok() ||
      lease != gen) {
    return "";
  }
  int n = 0;
  auto it = b->NewIterator(Cf::kKey);
  for (it->SeekToFirst(); it->Valid(); it->Next(), ++n) {
    if (it->key() != absl::StrFormat("%s%04d", gen, n) || it->value() != gen) return "";
  }
  return it->status().ok() && n == 200 ? gen : "";
}

TEST_F(BackendTest, ReplaceWithSwapsTheDataAndEarlierReadersKeepTheirs) {
  WriteGeneration(dir_ + "/db", "old");
  WriteGeneration(dir_ + "/new", "new");
  auto b = OpenBackend();
  auto before = b->NewIterator(Cf::kKey);
  before->SeekToFirst();
  ASSERT_TRUE(before->Valid());

  ASSERT_TRUE(b->ReplaceWith(dir_ + "/new").ok());
  EXPECT_EQ(GenerationOf(b.get()), "new");
  // The iterator made before reads the replaced data to its end.
  int n = 0;
  for (; before->Valid(); before->Next()) {
    EXPECT_EQ(before->value(), "old");
    ++n;
  }
  EXPECT_EQ(n, 200);
  before.reset();
  // Writes go to the new data, and all of it is there after a reopen; the
  // directory given holds the replaced data.
  PutKeys(b.get(), {{"zz", "after"}});
  b.reset();
  b = OpenBackend();
  std::string v;
  ASSERT_TRUE(b->Get(Cf::kKey, "zz", &v).ok());
  EXPECT_EQ(v, "after");
  ASSERT_TRUE(b->Get(Cf::kMeta, "gen", &v).ok());
  EXPECT_EQ(v, "new");
  BackendOptions replaced;
  replaced.dir = dir_ + "/new";
  auto old = Backend::Open(replaced);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(GenerationOf(old->get()), "old");
}

TEST_F(BackendTest, ReplaceWithTwiceWhileTheFirstDataIsStillRead) {
  WriteGeneration(dir_ + "/db", "a");
  WriteGeneration(dir_ + "/b", "b");
  WriteGeneration(dir_ + "/c", "c");
  auto b = OpenBackend();
  auto first = b->NewIterator(Cf::kKey);
  first->SeekToFirst();
  ASSERT_TRUE(b->ReplaceWith(dir_ + "/b").ok());
  auto second = b->NewIterator(Cf::kKey);
  second->SeekToFirst();
  // The replaced databases stay open (their readers hold them) while a
  // third opens at the same path.
  ASSERT_TRUE(b->ReplaceWith(dir_ + "/c").ok());
  EXPECT_EQ(GenerationOf(b.get()), "c");
  ASSERT_TRUE(first->Valid() && second->Valid());
  EXPECT_EQ(first->value(), "a");
  EXPECT_EQ(second->value(), "b");
  // The lock still keeps a second backend out of the directory.
  BackendOptions same;
  same.dir = dir_ + "/db";
  EXPECT_FALSE(Backend::Open(same).ok());
}

TEST_F(BackendTest, ReplaceWithFromAnotherFileSystemChangesNothing) {
  struct stat shm {}, tmp {};
  if (::stat("/dev/shm", &shm) != 0 || ::stat(dir_.c_str(), &tmp) != 0 ||
      shm.st_dev == tmp.st_dev) {
    GTEST_SKIP() << "no second file system at /dev/shm";
  }
  char tmpl[] = "/dev/shm/capstan-backend-XXXXXX";
  const std::string other = mkdtemp(tmpl);
  WriteGeneration(dir_ + "/db", "old");
  WriteGeneration(other + "/new", "new");
  auto b = OpenBackend();
  EXPECT_TRUE(absl::IsUnimplemented(b->ReplaceWith(other + "/new")));
  EXPECT_EQ(GenerationOf(b.get()), "old");
  PutKeys(b.get(), {{"zz", "still writable"}});
  std::filesystem::remove_all(other);
}

// A process that dies anywhere in ReplaceWith leaves the backend's
// directory holding one generation whole, and the other directory the
// other one: the child swaps the two back and forth until a thread of its
// own ends it at a random moment (as a kill would: no destructor runs).
TEST_F(BackendTest, ACrashDuringReplaceWithLeavesEitherDataWhole) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  WriteGeneration(dir_ + "/db", "x");
  WriteGeneration(dir_ + "/other", "y");
  // The child re-runs this test from the start: it finds the directories
  // through the environment.
  ASSERT_EQ(::setenv("CAPSTAN_SWAP_CRASH_DIR", dir_.c_str(), 1), 0);
  std::mt19937 rng(20261127);
  for (int round = 0; round < 12; ++round) {
    const int delay_us = std::uniform_int_distribution<int>(0, 30000)(rng);
    EXPECT_EXIT(
        {
          const std::string dir = ::getenv("CAPSTAN_SWAP_CRASH_DIR");
          BackendOptions options;
          options.dir = dir + "/db";
          auto b = std::move(Backend::Open(options).value());
          std::thread killer([delay_us] {
            std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
            ::_exit(0);
          });
          killer.detach();
          for (;;) {
            if (!b->ReplaceWith(dir + "/other").ok()) ::_exit(3);
          }
        },
        ::testing::ExitedWithCode(0), "");
    BackendOptions db;
    db.dir = dir_ + "/db";
    BackendOptions other;
    other.dir = dir_ + "/other";
    auto a = Backend::Open(db);
    ASSERT_TRUE(a.ok()) << a.status();
    auto o = Backend::Open(other);
    ASSERT_TRUE(o.ok()) << o.status();
    const std::string ga = GenerationOf(a->get()), go = GenerationOf(o->get());
    EXPECT_TRUE((ga == "x" && go == "y") || (ga == "y" && go == "x"))
        << "round " << round << ": db holds \"" << ga << "\", other \"" << go << "\"";
  }
  ::unsetenv("CAPSTAN_SWAP_CRASH_DIR");
}

}  // namespace
}  // namespace capstan::storage
