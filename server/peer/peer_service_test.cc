// The peer service seen from a raw capstan.v1.Peer client: rafthttp's
// refusals of a Raft stream and of its messages, with etcd's texts;
// snapshots received whole, one at a time, refused like Raft streams, and a
// broken or pending snapshot stream neither wedges the service nor holds up
// Stop; lease calls without a handler.

#include "server/peer/peer_service.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "capstan/v1/peer.grpc.pb.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "server/peer/peer_protocol.h"
#include "server/peer/peer_snapshot.h"
#include "server/peer/peer_testing.h"
#include "util/mutex.h"

namespace capstan::server {
namespace {
namespace fs = std::filesystem;

using namespace peer_testing;  // NOLINT: the helpers of these tests

// What on_snapshot was handed: the sender, the MsgSnap and the files.
struct ReceivedSnapshot {
  uint64_t from;
  std::string message;
  std::map<std::string, std::string> files;
};

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class PeerServiceTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kLocal = 2;

  void SetUp() override {
    char dir[] = "/tmp/capstan-peer-service-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    root_ = dir;
  }
  void TearDown() override {
    if (member_) member_->transport->Stop();
    fs::remove_all(root_);
  }

  // Starts member kLocal of kCluster; it takes snapshots into
  // root/snap.tmp when accept_snapshots.
  void StartLocal(bool accept_snapshots = true) {
    member_ = std::make_unique<Member>();
    member_->id = kLocal;
    PeerTransportOptions o;
    o.member_id = kLocal;
    o.cluster_id = kCluster;
    o.listen_peer_urls = {{"http", "127.0.0.1:0"}};
    member_->transport = std::make_unique<PeerTransport>(std::move(o));
    replication::TransportHandler h = member_->recorder.Handler();
    if (accept_snapshots) {
      h.snapshot_dir = (root_ / "snap.tmp").string();
      h.on_snapshot = [this, dir = h.snapshot_dir](uint64_t from, std::string message) {
        // Takes the files out of the directory, as the replicator does.
        const fs::path taken = root_ / absl::StrCat("snap.recv.", Snapshots().size());
        fs::rename(dir, taken);
        ReceivedSnapshot got{from, std::move(message), {}};
        for (const auto& entry : fs::directory_iterator(taken)) {
          got.files[entry.path().filename().string()] = ReadFile(entry.path());
        }
        util::MutexLock l(&mu_);
        snapshots_.push_back(std::move(got));
        return absl::OkStatus();
      };
    }
    ASSERT_TRUE(member_->transport->Start(std::move(h)).ok());
    member_->url = absl::StrCat("http://127.0.0.1:", member_->transport->BoundPorts()[0]);
    stub_ = capstan::v1::Peer::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", member_->transport->BoundPorts()[0]),
                            grpc::InsecureChannelCredentials()));
  }

  // A call from `from` of `cluster` to `to`; from nullopt: no from at all.
  static std::unique_ptr<grpc::ClientContext> Call(std::optional<uint64_t> from,
                                                   uint64_t cluster = kCluster,
                                                   uint64_t to = kLocal) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->AddMetadata(peer::kClusterIdKey, peer::IdText(cluster));
    if (from) context->AddMetadata(peer::kFromKey, peer::IdText(*from));
    context->AddMetadata(peer::kToKey, peer::IdText(to));
    return context;
  }

  // A Raft stream with these batches: the status it ends with, and
  // whether it was accepted (its initial metadata names the cluster).
  grpc::Status RaftStream(grpc::ClientContext* context,
                          const std::vector<std::vector<std::string>>& batches,
                          bool* accepted) {
    capstan::v1::RaftStreamEnd end;
    auto writer = stub_->Raft(context, &end);
    writer->WaitForInitialMetadata();
    const auto& initial = context->GetServerInitialMetadata();
    auto it = initial.find(peer::kClusterIdKey);
    *accepted = it != initial.end() &&
                std::string(it->second.data(), it->second.size()) == peer::IdText(kCluster);
    for (const auto& messages : batches) {
      capstan::v1::RaftBatch batch;
      for (const auto& m : messages) batch.add_messages(m);
      if (!writer->Write(batch)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  // A Snapshot stream of these chunks (written whatever the receiver says
  // meanwhile): the status it ends with.
  grpc::Status SnapshotStream(grpc::ClientContext* context,
                              const std::vector<capstan::v1::SnapshotChunk>& chunks) {
    capstan::v1::SnapshotEnd end;
    auto writer = stub_->Snapshot(context, &end);
    for (const auto& c : chunks) {
      if (!writer->Write(c)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  }

  // The chunks StreamSnapshotFiles makes of these files (name -> bytes)
  // and message.
  std::vector<capstan::v1::SnapshotChunk> Chunks(const std::map<std::string, std::string>& files,
                                                 const std::string& message) {
    const fs::path dir = root_ / absl::StrCat("send.", ++sends_);
    fs::create_directories(dir);
    for (const auto& [name, bytes] : files) WriteFile(dir / name, bytes);
    std::vector<capstan::v1::SnapshotChunk> chunks;
    absl::Status s = peer::StreamSnapshotFiles(dir.string(), message, 0,
                                               [&](const capstan::v1::SnapshotChunk& c) {
                                                 chunks.push_back(c);
                                                 return true;
                                               });
    EXPECT_TRUE(s.ok()) << s;
    return chunks;
  }

  std::vector<ReceivedSnapshot> Snapshots() {
    util::MutexLock l(&mu_);
    return snapshots_;
  }

  fs::path root_;
  int sends_ = 0;
  std::unique_ptr<Member> member_;
  std::unique_ptr<capstan::v1::Peer::Stub> stub_;
  util::Mutex mu_;
  std::vector<ReceivedSnapshot> snapshots_ ABSL_GUARDED_BY(mu_);
};

TEST_F(PeerServiceTest, RaftStreamsAreRefusedWithEtcdsTexts) {
  StartLocal();
  bool accepted = true;
  // Another cluster: refused before anything is read, without the
  // initial metadata that accepts a stream.
  grpc::Status s =
      RaftStream(Call(1, kCluster + 1).get(), {{Message(1, kLocal, 1).bytes}}, &accepted);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "cluster ID mismatch");
  EXPECT_FALSE(accepted);
  s = RaftStream(Call(std::nullopt).get(), {{Message(1, kLocal, 1).bytes}}, &accepted);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "invalid from");
  EXPECT_FALSE(accepted);
  s = RaftStream(Call(1, kCluster, kLocal + 1).get(), {{Message(1, kLocal, 1).bytes}}, &accepted);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "to field mismatch");
  EXPECT_FALSE(accepted);
  member_->transport->RemovePeer(3);
  s = RaftStream(Call(3).get(), {{Message(3, kLocal, 1).bytes}}, &accepted);
  EXPECT_EQ(s.error_code(), grpc::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), "the member has been permanently removed from the cluster");
  EXPECT_FALSE(accepted);
  EXPECT_EQ(member_->recorder.CountFrom(1), 0u);
  EXPECT_EQ(member_->recorder.CountFrom(3), 0u);
}

TEST_F(PeerServiceTest, RaftStreamDeliversInOrderAndStopsAtABadMessage) {
  StartLocal();
  bool accepted = false;
  // A stream the sender closes ends OK, everything delivered in order.
  grpc::Status s = RaftStream(
      Call(1).get(),
      {{Message(1, kLocal, 1).bytes, Message(1, kLocal, 2).bytes}, {Message(1, kLocal, 3).bytes}},
      &accepted);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(accepted);
  EXPECT_EQ(member_->recorder.From(1), (std::vector<uint64_t>{1, 2, 3}));

  // A message to another member: the stream ends with etcd's text; what
  // came before it was delivered, nothing after it is.
  s = RaftStream(Call(1).get(),
                 {{Message(1, kLocal, 4).bytes, Message(1, kLocal + 1, 5).bytes,
                   Message(1, kLocal, 6).bytes},
                  {Message(1, kLocal, 7).bytes}},
                 &accepted);
  EXPECT_TRUE(accepted);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "to field mismatch");
  EXPECT_EQ(member_->recorder.From(1), (std::vector<uint64_t>{1, 2, 3, 4}));

  // A message whose `from` is not the stream's sender.
  s = RaftStream(Call(1).get(), {{Message(3, kLocal, 8).bytes}}, &accepted);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "to field mismatch");
  // Bytes that are no raftpb.Message (a truncated varint).
  s = RaftStream(Call(1).get(), {{std::string("\x08\xff", 2)}}, &accepted);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "error unmarshalling raft message");
  EXPECT_EQ(member_->recorder.From(1), (std::vector<uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(member_->recorder.CountFrom(3), 0u);
}

TEST_F(PeerServiceTest, SnapshotsArriveWholeOverTheTransport) {
  StartLocal();
  auto sender = StartMember(1);
  ASSERT_NE(sender, nullptr);
  Connect(*sender, *member_);
  const std::map<std::string, std::string> files = {
      {"CURRENT", "MANIFEST-000001\n"},
      {"000007.sst", std::string(3 * peer::kSnapshotChunkBytes / 2, 's')},
      {"empty", ""}};
  const fs::path dir = root_ / "checkpoint";
  fs::create_directories(dir);
  for (const auto& [name, bytes] : files) WriteFile(dir / name, bytes);
  for (uint64_t seq : {10, 11}) {
    absl::Status s =
        sender->transport->SendSnapshot(kLocal, dir.string(), Message(1, kLocal, seq).bytes, 0);
    ASSERT_TRUE(s.ok()) << s;
  }
  std::vector<ReceivedSnapshot> got = Snapshots();
  ASSERT_EQ(got.size(), 2u);
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].from, 1u);
    EXPECT_EQ(got[i].message, Message(1, kLocal, 10 + i).bytes);
    EXPECT_EQ(got[i].files, files);
  }
}

TEST_F(PeerServiceTest, SnapshotsAreRefusedLikeRaftStreams) {
  StartLocal();
  const std::vector<capstan::v1::SnapshotChunk> chunks =
      Chunks({{"data", "bytes"}}, Message(3, kLocal, 1).bytes);
  ASSERT_EQ(chunks.size(), 2u);
  grpc::Status s = SnapshotStream(Call(3, kCluster + 1).get(), chunks);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "cluster ID mismatch");
  member_->transport->RemovePeer(4);
  s = SnapshotStream(Call(4).get(), Chunks({{"data", "bytes"}}, Message(4, kLocal, 1).bytes));
  EXPECT_EQ(s.error_code(), grpc::PERMISSION_DENIED);
  EXPECT_EQ(s.error_message(), "the member has been permanently removed from the cluster");
  // A MsgSnap for another member, or from another sender than the call's.
  s = SnapshotStream(Call(3).get(), Chunks({{"data", "bytes"}}, Message(3, kLocal + 5, 1).bytes));
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "to field mismatch");
  s = SnapshotStream(Call(1).get(), chunks);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "to field mismatch");
  // A damaged chunk.
  std::vector<capstan::v1::SnapshotChunk> damaged = chunks;
  damaged[0].set_crc32c(damaged[0].crc32c() + 1);
  s = SnapshotStream(Call(3).get(), damaged);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "snapshot chunk: CRC mismatch in data at offset 0");
  EXPECT_TRUE(Snapshots().empty());
  // The same stream, whole, is taken.
  s = SnapshotStream(Call(3).get(), chunks);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(Snapshots().size(), 1u);

  // A member that takes no snapshots says so.
  member_->transport->Stop();
  StartLocal(/*accept_snapshots=*/false);
  s = SnapshotStream(Call(3).get(), chunks);
  EXPECT_EQ(s.error_code(), grpc::UNIMPLEMENTED);
  EXPECT_EQ(s.error_message(), "snapshots are not accepted");
}

TEST_F(PeerServiceTest, SnapshotsAreReceivedOneAtATimeAndABrokenOneIsDropped) {
  StartLocal();
  const std::map<std::string, std::string> first_files = {{"a", "first"}};
  const std::map<std::string, std::string> second_files = {{"b", "second"}};
  const auto first = Chunks(first_files, Message(1, kLocal, 1).bytes);
  const auto second = Chunks(second_files, Message(3, kLocal, 2).bytes);
  ASSERT_EQ(first.size(), 2u);
  ASSERT_EQ(second.size(), 2u);

  // The first stream sends its file and holds; once the receiver has
  // begun writing it, a second stream sends everything.
  auto first_context = Call(1);
  capstan::v1::SnapshotEnd first_end;
  auto first_writer = stub_->Snapshot(first_context.get(), &first_end);
  ASSERT_TRUE(first_writer->Write(first[0]));
  ASSERT_TRUE(WaitFor([&] { return fs::exists(root_ / "snap.tmp" / "a"); }));
  auto second_context = Call(3);
  capstan::v1::SnapshotEnd second_end;
  auto second_writer = stub_->Snapshot(second_context.get(), &second_end);
  for (const auto& c : second) second_writer->Write(c);
  second_writer->WritesDone();
  // The first finishes; then the second is received, into a directory of
  // its own: neither saw the other's files.
  ASSERT_TRUE(first_writer->Write(first[1]));
  first_writer->WritesDone();
  grpc::Status s = first_writer->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  s = second_writer->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  std::vector<ReceivedSnapshot> got = Snapshots();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].from, 1u);
  EXPECT_EQ(got[0].files, first_files);
  EXPECT_EQ(got[1].from, 3u);
  EXPECT_EQ(got[1].files, second_files);

  // A stream that breaks before its last message hands nothing on, and the
  // next snapshot is received as usual.
  auto broken_context = Call(1);
  capstan::v1::SnapshotEnd broken_end;
  auto broken_writer = stub_->Snapshot(broken_context.get(), &broken_end);
  ASSERT_TRUE(broken_writer->Write(first[0]));
  ASSERT_TRUE(WaitFor([&] { return fs::exists(root_ / "snap.tmp" / "a"); }));
  broken_context->TryCancel();
  EXPECT_FALSE(broken_writer->Finish().ok());
  auto next_context = Call(3);
  capstan::v1::SnapshotEnd next_end;
  auto next_writer = stub_->Snapshot(next_context.get(), &next_end);
  for (const auto& c : second) next_writer->Write(c);
  next_writer->WritesDone();
  s = next_writer->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  got = Snapshots();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[2].files, second_files);
}

TEST_F(PeerServiceTest, StopEndsSnapshotStreamsInProgressAndWaiting) {
  StartLocal();
  const auto chunks = Chunks({{"a", "bytes"}}, Message(1, kLocal, 1).bytes);
  ASSERT_EQ(chunks.size(), 2u);
  // One stream being received (its file begun), one waiting its turn.
  auto receiving_context = Call(1);
  capstan::v1::SnapshotEnd receiving_end;
  auto receiving = stub_->Snapshot(receiving_context.get(), &receiving_end);
  ASSERT_TRUE(receiving->Write(chunks[0]));
  ASSERT_TRUE(WaitFor([&] { return fs::exists(root_ / "snap.tmp" / "a"); }));
  auto waiting_context = Call(1);
  capstan::v1::SnapshotEnd waiting_end;
  auto waiting = stub_->Snapshot(waiting_context.get(), &waiting_end);
  for (const auto& c : chunks) waiting->Write(c);
  waiting->WritesDone();
  // Stop returns (it waits for every call to end) and both calls fail.
  member_->transport->Stop();
  EXPECT_FALSE(receiving->Finish().ok());
  EXPECT_FALSE(waiting->Finish().ok());
  EXPECT_TRUE(Snapshots().empty());
}

TEST_F(PeerServiceTest, LeaseCallsWithoutAHandlerAreUnimplemented) {
  StartLocal();
  etcdserverpb::LeaseKeepAliveRequest renew;
  etcdserverpb::LeaseKeepAliveResponse renewed;
  grpc::Status s = stub_->LeaseRenew(Call(1).get(), renew, &renewed);
  EXPECT_EQ(s.error_code(), grpc::UNIMPLEMENTED);
  EXPECT_EQ(s.error_message(), "no lease handler");
  etcdserverpb::LeaseTimeToLiveRequest ttl;
  etcdserverpb::LeaseTimeToLiveResponse ttl_response;
  s = stub_->LeaseTimeToLive(Call(1, kCluster + 1).get(), ttl, &ttl_response);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION);
  EXPECT_EQ(s.error_message(), "cluster ID mismatch");
}

}  // namespace
}  // namespace capstan::server
