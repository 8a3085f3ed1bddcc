// The Raft stream (raft_stream.h) against a member's peer listener, and
// against hand-made ends: refusals with rafthttp's statuses and texts,
// messages in order across reads, a misaddressed message ending the
// stream, and both ends giving up a peer that stays silent.

#include "server/peer/raft_stream.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "server/peer/peer_protocol.h"
#include "server/peer/peer_testing.h"

namespace capstan::server::peer {
namespace {

using peer_testing::kCluster;
using peer_testing::Message;
using peer_testing::StartMember;
using peer_testing::WaitFor;

RaftStreamSender::Target TargetAt(int port) {
  RaftStreamSender::Target t;
  t.host = "127.0.0.1";
  t.port = port;
  return t;
}

absl::Status Open(int port, uint64_t cluster, uint64_t from, uint64_t to,
                  std::unique_ptr<RaftStreamSender>* out = nullptr,
                  absl::Duration silence = kRaftStreamTimeout) {
  auto dialed = RaftStreamSender::Dial(TargetAt(port), absl::Seconds(5));
  if (!dialed.ok()) return dialed.status();
  absl::Status s = (*dialed)->Start(TargetAt(port), cluster, from, to, absl::Seconds(5), silence);
  if (out != nullptr) *out = *std::move(dialed);
  return s;
}

// A blocking loopback connection to port with a 10 s receive timeout; -1
// when it cannot connect.
int ConnectTo(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

// Sends `request` and reads until the listener closes (or 10 s pass), or
// with head_only until the answer's head is in.
std::string Exchange(int port, const std::string& request, bool head_only = false) {
  const int fd = ConnectTo(port);
  if (fd < 0) return "cannot connect";
  EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string answer;
  char buf[1024];
  ssize_t n;
  while ((!head_only || answer.find("\r\n\r\n") == std::string::npos) &&
         (n = recv(fd, buf, sizeof buf, 0)) > 0) {
    answer.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return answer;
}

std::string Request(const std::string& cluster, const std::string& from, const std::string& to) {
  return absl::StrCat("GET /raft/stream/capstan HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Etcd-Cluster-ID: ",
                      cluster, "\r\nX-Server-From: ", from, "\r\nX-Raft-To: ", to, "\r\n\r\n");
}

TEST(RaftStreamTest, RefusalsAreRafthttpsStatusesAndTexts) {
  auto m1 = StartMember(1);
  ASSERT_NE(m1, nullptr);
  const int port = m1->transport->BoundPorts()[0];
  m1->transport->RemovePeer(3);

  EXPECT_EQ(Open(port, kCluster + 1, 2, 1), absl::FailedPreconditionError(kClusterIdMismatch));
  EXPECT_EQ(Open(port, kCluster, 3, 1), absl::PermissionDeniedError(kMemberRemoved));
  EXPECT_EQ(Open(port, kCluster, 2, 9), absl::FailedPreconditionError(kToFieldMismatch));
  EXPECT_TRUE(Open(port, kCluster, 2, 1).ok());

  const std::string cluster = IdText(kCluster);
  std::string answer = Exchange(port, Request(cluster, "not-an-id", "1"));
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 400 Bad Request\r\n")) << answer;
  EXPECT_TRUE(absl::EndsWith(answer, "\r\n\r\ninvalid from")) << answer;
  answer = Exchange(port, Request(IdText(kCluster + 1), "2", "1"));
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 412 Precondition Failed\r\n")) << answer;
  EXPECT_TRUE(absl::EndsWith(answer, "\r\n\r\ncluster ID mismatch")) << answer;
  answer = Exchange(port, Request(cluster, "3", "1"));
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 410 Gone\r\n")) << answer;
  answer = Exchange(port, "GET /raft/stream/message/2 HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 404 Not Found\r\n")) << answer;
  answer = Exchange(port, Request(cluster, "2", "1"), /*head_only=*/true);
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 200 OK\r\nX-Etcd-Cluster-ID: " + cluster)) << answer;
  EXPECT_EQ(m1->recorder.CountFrom(2), 0u);
}

TEST(RaftStreamTest, MessagesArriveInOrderAndAMisaddressedOneEndsTheStream) {
  auto m1 = StartMember(1);
  ASSERT_NE(m1, nullptr);
  std::unique_ptr<RaftStreamSender> stream;
  ASSERT_TRUE(Open(m1->transport->BoundPorts()[0], kCluster, 2, 1, &stream).ok());
  std::vector<std::string> batch;
  for (uint64_t i = 1; i <= 100; ++i) batch.push_back(Message(2, 1, i).bytes);
  ASSERT_TRUE(stream->Write(batch).ok());
  ASSERT_TRUE(stream->Write({}).ok());  // a link heartbeat, not a message
  // Larger than one read of the receiver.
  ASSERT_TRUE(stream->Write({Message(2, 1, 101, 300 << 10).bytes}).ok());
  ASSERT_TRUE(WaitFor([&] { return m1->recorder.CountFrom(2) == 101; }));
  std::vector<uint64_t> want;
  for (uint64_t i = 1; i <= 101; ++i) want.push_back(i);
  EXPECT_EQ(m1->recorder.From(2), want);
  EXPECT_EQ(m1->recorder.unparsed(), 0);

  // A message that says it is from member 3 on member 2's stream: the
  // receiver drops it and closes, and the sender's writes fail soon after.
  ASSERT_TRUE(stream->Write({Message(3, 1, 102).bytes}).ok());
  EXPECT_TRUE(WaitFor([&] { return !stream->Write({Message(2, 1, 103).bytes}).ok(); }));
  EXPECT_EQ(m1->recorder.CountFrom(2), 101u);
  EXPECT_EQ(m1->recorder.CountFrom(3), 0u);
}

TEST(RaftStreamTest, TryWriteLeavesWhatTheConnectionDidNotTake) {
  auto m1 = StartMember(1);
  ASSERT_NE(m1, nullptr);
  std::unique_ptr<RaftStreamSender> stream;
  ASSERT_TRUE(Open(m1->transport->BoundPorts()[0], kCluster, 2, 1, &stream).ok());
  // 8 MiB at once is more than a loopback connection's buffers hold.
  std::string rest;
  ASSERT_TRUE(stream->TryWrite({Message(2, 1, 1, 8 << 20).bytes}, &rest).ok());
  EXPECT_FALSE(rest.empty());
  if (!rest.empty()) {
    ASSERT_TRUE(stream->WriteRest(rest).ok());
  }
  ASSERT_TRUE(stream->TryWrite({Message(2, 1, 2).bytes, Message(2, 1, 3).bytes}, &rest).ok());
  if (!rest.empty()) {
    ASSERT_TRUE(stream->WriteRest(rest).ok());
  }
  ASSERT_TRUE(WaitFor([&] { return m1->recorder.CountFrom(2) == 3; }));
  EXPECT_EQ(m1->recorder.From(2), (std::vector<uint64_t>{1, 2, 3}));
  EXPECT_EQ(m1->recorder.unparsed(), 0);
}

TEST(RaftStreamTest, ASenderGivesUpAReceiverThatSendsNothing) {
  // A receiver that accepts the stream, then reads and never writes.
  int port = 0;
  const int listen_fd = peer_testing::ListenOnLoopback(&port);
  ASSERT_GE(listen_fd, 0);
  std::thread receiver([listen_fd] {
    const int fd = accept(listen_fd, nullptr, nullptr);
    if (fd < 0) return;
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string in;
    char buf[4096];
    ssize_t n;
    while (in.find("\r\n\r\n") == std::string::npos && (n = recv(fd, buf, sizeof buf, 0)) > 0) {
      in.append(buf, static_cast<size_t>(n));
    }
    const std::string ok = "HTTP/1.1 200 OK\r\n\r\n";
    send(fd, ok.data(), ok.size(), MSG_NOSIGNAL);
    while (recv(fd, buf, sizeof buf, 0) > 0) {
    }
    close(fd);
  });
  std::unique_ptr<RaftStreamSender> stream;
  const absl::Status opened =
      Open(port, kCluster, 2, 1, &stream, absl::Milliseconds(300));
  EXPECT_TRUE(opened.ok()) << opened;
  absl::Status last;
  if (opened.ok()) {
    EXPECT_TRUE(WaitFor([&] {
      last = stream->Write({});
      return !last.ok();
    }));
    EXPECT_TRUE(absl::StrContains(last.message(), "i/o timeout")) << last;
    stream.reset();  // closes: the receiver's reads end
  }
  receiver.join();
  close(listen_fd);
}

TEST(RaftStreamTest, AReceiverSendsHeartbeatsAndGivesUpASilentSender) {
  auto m1 = StartMember(1);
  ASSERT_NE(m1, nullptr);
  const int fd = ConnectTo(m1->transport->BoundPorts()[0]);
  ASSERT_GE(fd, 0);
  const std::string request = Request(IdText(kCluster), "2", "1");
  ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  // Then nothing: the receiver answers, sends its link heartbeats (zeros)
  // and closes once kRaftStreamTimeout passed without a byte from us.
  const absl::Time start = absl::Now();
  std::string in;
  char buf[1024];
  ssize_t n;
  while ((n = recv(fd, buf, sizeof buf, 0)) > 0) in.append(buf, static_cast<size_t>(n));
  const absl::Duration took = absl::Now() - start;
  close(fd);
  EXPECT_EQ(n, 0) << "the receiver did not close the stream";
  const size_t head = in.find("\r\n\r\n");
  ASSERT_NE(head, std::string::npos) << in;
  const std::string heartbeats = in.substr(head + 4);
  EXPECT_GE(heartbeats.size(), 8u);
  EXPECT_EQ(heartbeats.size() % 8, 0u);
  EXPECT_EQ(heartbeats.find_first_not_of('\0'), std::string::npos);
  EXPECT_GE(took, kRaftStreamTimeout - absl::Milliseconds(100));
  EXPECT_LT(took, kRaftStreamTimeout + absl::Seconds(4));
}

}  // namespace
}  // namespace capstan::server::peer
