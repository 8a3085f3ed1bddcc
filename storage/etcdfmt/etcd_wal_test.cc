// The etcd WAL reader on WALs written here as etcd's encoder writes them:
// the CRC chain across files, raft's overwrite of an uncommitted tail, a
// torn or cut last record (dropped, as etcd drops it) and damage anywhere
// else (refused). migrate_test.cc reads the WALs of a real, killed etcd.

#include "storage/etcdfmt/etcd_wal.h"

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "raftpb/raft.pb.h"
#include "walpb/record.pb.h"

namespace capstan::etcdfmt {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kMetadata = 1, kEntry = 2, kState = 3, kCrc = 4, kSnapshot = 5;

std::string EntryBytes(uint64_t term, uint64_t index, const std::string& data) {
  raftpb::Entry e;
  e.set_term(term);
  e.set_index(index);
  e.set_type(raftpb::EntryNormal);
  e.set_data(data);
  return e.SerializeAsString();
}

std::string StateBytes(uint64_t term, uint64_t commit) {
  raftpb::HardState s;
  s.set_term(term);
  s.set_commit(commit);
  return s.SerializeAsString();
}

// Builds WAL files as etcd does: each starts with the CRC record, then the
// metadata; the first one with an empty snapshot marker.
class WalWriter {
 public:
  void NewFile() {
    files_.emplace_back();
    AppendEtcdWalRecord(kCrc, "", &crc_, &files_.back());
    AppendEtcdWalRecord(kMetadata, "member-and-cluster", &crc_, &files_.back());
    if (files_.size() == 1) {
      AppendEtcdWalRecord(kSnapshot, walpb::Snapshot().SerializeAsString(), &crc_, &files_.back());
    }
  }
  void Entry(uint64_t term, uint64_t index, const std::string& data = "x") {
    AppendEtcdWalRecord(kEntry, EntryBytes(term, index, data), &crc_, &files_.back());
  }
  void State(uint64_t term, uint64_t commit) {
    AppendEtcdWalRecord(kState, StateBytes(term, commit), &crc_, &files_.back());
  }
  std::string& last() { return files_.back(); }
  std::vector<std::string>& files() { return files_; }

  // Writes the files into a fresh directory, each followed by `zeros`
  // bytes of preallocated space.
  std::string Write(const std::string& name, size_t zeros = 4096) {
    const std::string dir = ::testing::TempDir() + "/" + name;
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (size_t i = 0; i < files_.size(); ++i) {
      std::ofstream out(absl::StrFormat("%s/%016x-%016x.wal", dir, i, i * 10),
                        std::ios::binary);
      out << files_[i] << std::string(zeros, '\0');
    }
    std::ofstream(dir + "/0.tmp") << "preallocated next file, ignored";
    return dir;
  }

 private:
  uint32_t crc_ = 0;
  std::vector<std::string> files_;
};

std::vector<uint64_t> Indexes(const EtcdWal& wal) {
  std::vector<uint64_t> out;
  for (const auto& e : wal.entries) out.push_back(e.index());
  return out;
}

TEST(EtcdWalTest, ReadsEntriesAcrossFilesAfterTheIndexAsked) {
  WalWriter w;
  w.NewFile();
  for (uint64_t i = 1; i <= 5; ++i) w.Entry(1, i, "e" + std::to_string(i));
  w.State(1, 5);
  w.NewFile();
  for (uint64_t i = 6; i <= 9; ++i) w.Entry(1, i, "e" + std::to_string(i));
  w.State(1, 8);
  const std::string dir = w.Write("across");
  auto wal = ReadEtcdWal(dir, 3);
  ASSERT_TRUE(wal.ok()) << wal.status();
  EXPECT_EQ(wal->files.size(), 2u);
  EXPECT_EQ(Indexes(*wal), (std::vector<uint64_t>{4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(wal->entries.front().data(), "e4");
  EXPECT_EQ(wal->last_index, 9u);
  EXPECT_EQ(wal->state.commit(), 8u);
  EXPECT_FALSE(wal->torn_tail);
  // Everything applied already: nothing to keep.
  wal = ReadEtcdWal(dir, 9);
  ASSERT_TRUE(wal.ok());
  EXPECT_TRUE(wal->entries.empty());
  EXPECT_EQ(wal->last_index, 9u);
}

TEST(EtcdWalTest, ALaterEntryReplacesTheLogFromItsIndex) {
  WalWriter w;
  w.NewFile();
  for (uint64_t i = 1; i <= 6; ++i) w.Entry(1, i, "old");
  // A new leader (term 2) overwrote entries 4.. of an uncommitted tail.
  w.Entry(2, 4, "new4");
  w.Entry(2, 5, "new5");
  auto wal = ReadEtcdWal(w.Write("overwrite"), 2);
  ASSERT_TRUE(wal.ok()) << wal.status();
  EXPECT_EQ(Indexes(*wal), (std::vector<uint64_t>{3, 4, 5}));
  EXPECT_EQ(wal->entries[0].data(), "old");
  EXPECT_EQ(wal->entries[1].data(), "new4");
  EXPECT_EQ(wal->entries[2].term(), 2u);
  EXPECT_EQ(wal->last_index, 5u);
}

TEST(EtcdWalTest, DropsATornOrCutLastRecordOnly) {
  // A record of two sectors whose second sector was never written.
  WalWriter w;
  w.NewFile();
  w.Entry(1, 1);
  w.Entry(1, 2);
  const size_t start = w.last().size();
  w.Entry(1, 3, std::string(1500, 'z'));
  std::string& last = w.last();
  const size_t sector = (start + 8 + 512) / 512 * 512;  // a sector inside the record
  for (size_t i = sector; i < sector + 512 && i < last.size(); ++i) last[i] = '\0';
  auto wal = ReadEtcdWal(w.Write("torn"), 0);
  ASSERT_TRUE(wal.ok()) << wal.status();
  EXPECT_TRUE(wal->torn_tail);
  EXPECT_EQ(Indexes(*wal), (std::vector<uint64_t>{1, 2}));

  // Cut inside the record, with nothing after it.
  WalWriter cut;
  cut.NewFile();
  cut.Entry(1, 1);
  cut.Entry(1, 2, std::string(100, 'y'));
  cut.last().resize(cut.last().size() - 40);
  wal = ReadEtcdWal(cut.Write("cut", /*zeros=*/0), 0);
  ASSERT_TRUE(wal.ok()) << wal.status();
  EXPECT_TRUE(wal->torn_tail);
  EXPECT_EQ(Indexes(*wal), (std::vector<uint64_t>{1}));

  // The same tear in a file that is not the last one is damage.
  w.NewFile();
  w.Entry(1, 4);
  auto damaged = ReadEtcdWal(w.Write("torn-middle"), 0);
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss) << damaged.status();
}

TEST(EtcdWalTest, RefusesDamage) {
  // A flipped byte in a record's data, not a torn write: CRC mismatch.
  WalWriter w;
  w.NewFile();
  w.Entry(1, 1, "aaaaaaaa");
  w.Entry(1, 2, "bbbbbbbb");
  const size_t at = w.last().find("aaaaaaaa");
  ASSERT_NE(at, std::string::npos);
  w.last()[at] = 'c';
  auto wal = ReadEtcdWal(w.Write("flipped"), 0);
  EXPECT_EQ(wal.status().code(), absl::StatusCode::kDataLoss) << wal.status();
  EXPECT_NE(wal.status().message().find("CRC mismatch"), std::string::npos) << wal.status();

  // A file whose CRC record does not continue the previous file's.
  WalWriter chain;
  chain.NewFile();
  chain.Entry(1, 1);
  chain.NewFile();
  chain.Entry(1, 2);
  std::string& second = chain.files()[1];
  uint32_t bogus = 12345;
  std::string replaced;
  AppendEtcdWalRecord(kCrc, "", &bogus, &replaced);
  walpb::Record first;
  const uint64_t len = static_cast<unsigned char>(second[0]);  // a small record
  ASSERT_TRUE(first.ParseFromArray(second.data() + 8, static_cast<int>(len)));
  ASSERT_EQ(first.type(), kCrc);
  second.replace(0, replaced.size(), replaced);
  wal = ReadEtcdWal(chain.Write("chain"), 0);
  EXPECT_EQ(wal.status().code(), absl::StatusCode::kDataLoss) << wal.status();

  // Entries that skip an index.
  WalWriter gap;
  gap.NewFile();
  gap.Entry(1, 1);
  gap.Entry(1, 3);
  wal = ReadEtcdWal(gap.Write("gap"), 0);
  EXPECT_EQ(wal.status().code(), absl::StatusCode::kDataLoss) << wal.status();

  // A length word claiming more than etcd ever writes.
  WalWriter huge;
  huge.NewFile();
  huge.Entry(1, 1);
  for (char c : std::string("\x00\x00\x00\x01\x00\x00\x00\x00", 8)) huge.last().push_back(c);
  huge.last().append(64, 'q');
  wal = ReadEtcdWal(huge.Write("huge", 0), 0);
  EXPECT_EQ(wal.status().code(), absl::StatusCode::kDataLoss) << wal.status();

  EXPECT_EQ(ReadEtcdWal(::testing::TempDir() + "/no-such-wal-dir", 0).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace capstan::etcdfmt
