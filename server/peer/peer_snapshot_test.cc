// StreamSnapshotFiles and ReceiveSnapshotFiles over an in-memory stream:
// files of every shape arrive byte for byte, every chunk's CRC-32C is the
// one util::Crc32cExtend computes, and a damaged chunk is refused.

#include "server/peer/peer_snapshot.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "util/crc32c.h"

namespace capstan::server::peer {
namespace {
namespace fs = std::filesystem;

class PeerSnapshotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/capstan-peer-snapshot-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    root_ = dir;
    fs::create_directories(root_ / "send");
  }
  void TearDown() override { fs::remove_all(root_); }

  void WriteFile(const std::string& name, const std::string& bytes) {
    std::ofstream out(root_ / "send" / name, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    files_[name] = bytes;
  }

  static std::string ReadFile(const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  // Streams root/send into chunks_, checking each chunk as it goes.
  void Stream() {
    absl::Status s = StreamSnapshotFiles((root_ / "send").string(), "the message", 0,
                                         [this](const capstan::v1::SnapshotChunk& c) {
                                           chunks_.push_back(c);
                                           return true;
                                         });
    ASSERT_TRUE(s.ok()) << s;
  }

  absl::Status Receive(std::string* message) {
    size_t next = 0;
    return ReceiveSnapshotFiles(
        (root_ / "recv").string(),
        [&](capstan::v1::SnapshotChunk* c) {
          if (next == chunks_.size()) return false;
          *c = chunks_[next++];
          return true;
        },
        message);
  }

  fs::path root_;
  std::map<std::string, std::string> files_;
  std::vector<capstan::v1::SnapshotChunk> chunks_;
};

std::string Bytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1103515245 + 12345;
    s[i] = static_cast<char>(seed >> 16);
  }
  return s;
}

TEST_F(PeerSnapshotTest, FilesOfEverySizeArriveWhole) {
  WriteFile("empty", "");
  WriteFile("one", Bytes(1, 1));
  WriteFile("seven", Bytes(7, 2));
  WriteFile("nine", Bytes(9, 3));
  WriteFile("chunk", Bytes(kSnapshotChunkBytes, 4));
  WriteFile("large", Bytes(2 * kSnapshotChunkBytes + 13, 5));
  Stream();

  // 1 chunk for each small file and for "chunk", 3 for "large", and the
  // last message.
  ASSERT_EQ(chunks_.size(), 4u + 1u + 3u + 1u);
  for (size_t i = 0; i + 1 < chunks_.size(); ++i) {
    const capstan::v1::SnapshotChunk& c = chunks_[i];
    EXPECT_LE(c.data().size(), kSnapshotChunkBytes);
    EXPECT_EQ(c.crc32c(), util::Crc32cExtend(0, c.data())) << c.file() << " at " << c.offset();
  }
  ASSERT_TRUE(chunks_.back().last());
  EXPECT_EQ(chunks_.back().file_sizes().size(), files_.size());

  std::string message;
  absl::Status s = Receive(&message);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(message, "the message");
  for (const auto& [name, bytes] : files_) {
    EXPECT_EQ(ReadFile(root_ / "recv" / name), bytes) << name;
  }
}

TEST_F(PeerSnapshotTest, DamagedChunkIsRefused) {
  WriteFile("data", Bytes(3 * kSnapshotChunkBytes / 2, 6));
  Stream();
  ASSERT_GE(chunks_.size(), 2u);
  (*chunks_[1].mutable_data())[17] ^= 1;
  std::string message;
  absl::Status s = Receive(&message);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("CRC mismatch in data at offset 1048576"), std::string::npos) << s;
}

TEST_F(PeerSnapshotTest, StreamWithoutItsLastMessageIsAborted) {
  WriteFile("data", Bytes(100, 7));
  Stream();
  chunks_.pop_back();
  std::string message;
  EXPECT_EQ(Receive(&message).code(), absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace capstan::server::peer
