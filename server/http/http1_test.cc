#include "server/http/http1.h"

#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/http/client_listener.h"

namespace capstan::server {
namespace {

using Result = HttpConnection::ReadResult;

// A connection over a socket pair: the test writes the client's bytes and
// reads what the server side answers.
class Http1Test : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0); }
  void TearDown() override {
    close(fds_[0]);
    if (fds_[1] >= 0) close(fds_[1]);
  }

  HttpConnection Connection(size_t max_body = 1 << 20, int idle_ms = 2000, int request_ms = 2000) {
    return HttpConnection(fds_[0], idle_ms, request_ms, max_body);
  }
  void ClientSends(const std::string& bytes) {
    ASSERT_EQ(write(fds_[1], bytes.data(), bytes.size()), static_cast<ssize_t>(bytes.size()));
  }
  void ClientCloses() {
    close(fds_[1]);
    fds_[1] = -1;
  }
  // What the server side wrote, as far as it is there.
  std::string ClientReads() {
    std::string out;
    char buf[65536];
    for (;;) {
      const ssize_t n = recv(fds_[1], buf, sizeof(buf), MSG_DONTWAIT);
      if (n <= 0) return out;
      out.append(buf, static_cast<size_t>(n));
    }
  }

  int fds_[2] = {-1, -1};
};

TEST_F(Http1Test, ContentLengthAndChunkedBodiesOnOneConnection) {
  HttpConnection c = Connection();
  ClientSends(
      "POST /v3/kv/range?exclude=NOSPACE&exclude=a%2Bb+c HTTP/1.1\r\nHost: x\r\n"
      "Content-Length: 5\r\n\r\nhello"
      "POST /v3/watch HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nTrailer: t\r\n\r\n"
      "GET /health HTTP/1.0\r\n\r\n");
  HttpRequest r;
  ASSERT_EQ(c.Read(&r), Result::kRequest);
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.path, "/v3/kv/range");
  EXPECT_EQ(r.body, "hello");
  EXPECT_TRUE(r.keep_alive);
  EXPECT_EQ(r.QueryValues("exclude"), (std::vector<std::string>{"NOSPACE", "a+b c"}));
  ASSERT_EQ(c.Read(&r), Result::kRequest);
  EXPECT_EQ(r.path, "/v3/watch");
  EXPECT_EQ(r.body, "abcde");
  ASSERT_EQ(c.Read(&r), Result::kRequest);
  EXPECT_TRUE(r.http10);
  EXPECT_FALSE(r.keep_alive);
  ClientCloses();
  EXPECT_EQ(c.Read(&r), Result::kClosed);
}

// What a proxy in front could read differently from Capstan is refused.
TEST_F(Http1Test, AmbiguousRequestsAreRefused) {
  for (const std::string head : {
           "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
           "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
           "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
           "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n",
           "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +3\r\n\r\n",
           "POST / HTTP/1.1\r\nHost: x\r\nX: a\r\n folded\r\n\r\n",
           "GET / HTTP/1.1\r\n\r\n",  // no Host
           "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
           "GET / HTTP/2.0\r\nHost: x\r\n\r\n",
           "GET /\r\n\r\n",
           "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
           "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
       }) {
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    HttpConnection c(fds[0], 500, 500, 1 << 20);
    ASSERT_EQ(write(fds[1], head.data(), head.size()), static_cast<ssize_t>(head.size()));
    HttpRequest r;
    EXPECT_EQ(c.Read(&r), Result::kBad) << head;
    close(fds[0]);
    close(fds[1]);
  }
}

TEST_F(Http1Test, Limits) {
  HttpConnection c = Connection(/*max_body=*/10);
  HttpRequest r;
  ClientSends("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 11\r\n\r\n");
  EXPECT_EQ(c.Read(&r), Result::kTooLarge);

  HttpConnection chunked = Connection(/*max_body=*/10);
  ClientSends("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n6\r\n");
  EXPECT_EQ(chunked.Read(&r), Result::kTooLarge);
}

TEST_F(Http1Test, HeaderLimits) {
  std::string many = "GET / HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 1001; ++i) many += "a:\r\n";
  std::string big = "GET / HTTP/1.1\r\nHost: x\r\nX: " + std::string(1 << 20, 'x') + "\r\n\r\n";
  for (const std::string& head : {many + "\r\n", big}) {
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    std::thread writer([&] { (void)!send(fds[1], head.data(), head.size(), MSG_NOSIGNAL); });
    HttpConnection c(fds[0], 2000, 2000, 1 << 20);
    HttpRequest r;
    EXPECT_EQ(c.Read(&r), Result::kHeadersTooLarge) << head.size();
    close(fds[0]);  // ends a writer still blocked
    writer.join();
    close(fds[1]);
  }
}

// A request that trickles in is cut off at its deadline, counted from its
// first byte, however often bytes arrive.
TEST_F(Http1Test, RequestDeadline) {
  HttpConnection c = Connection(1 << 20, /*idle_ms=*/2000, /*request_ms=*/300);
  std::thread trickle([this] {
    for (char ch : std::string("GET / HTTP/1.1\r\nHost: x\r\n")) {
      if (send(fds_[1], &ch, 1, MSG_NOSIGNAL) != 1) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
  });
  const auto start = std::chrono::steady_clock::now();
  HttpRequest r;
  EXPECT_NE(c.Read(&r), Result::kRequest);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1500));
  shutdown(fds_[0], SHUT_RDWR);
  trickle.join();
}

TEST_F(Http1Test, Responses) {
  HttpConnection c = Connection();
  HttpResponse r;
  r.status = 404;
  r.headers = {{"Content-Type", "text/plain"}};
  r.body = "gone";
  ASSERT_TRUE(c.Write(r, /*keep_alive=*/false));
  std::string out = ClientReads();
  EXPECT_EQ(out.rfind("HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\nDate: ", 0), 0u) << out;
  EXPECT_NE(out.find("\r\nContent-Length: 4\r\nConnection: close\r\n\r\ngone"), std::string::npos)
      << out;

  // A status Go has no text for (grpc-gateway's 499 for Canceled).
  r.status = 499;
  ASSERT_TRUE(c.Write(r, true));
  out = ClientReads();
  EXPECT_EQ(out.rfind("HTTP/1.1 499 status code 499\r\n", 0), 0u) << out;
  r.status = 404;

  // HEAD: the length of the body, not the body.
  ASSERT_TRUE(c.Write(r, true, /*head_only=*/true));
  out = ClientReads();
  EXPECT_NE(out.find("Content-Length: 4\r\n\r\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("gone"), std::string::npos) << out;

  ASSERT_TRUE(c.BeginChunked(200, {}));
  ASSERT_TRUE(c.WriteChunk("{\"result\":1}\n"));
  ASSERT_TRUE(c.WriteChunk(""));  // nothing, not the last chunk
  ASSERT_TRUE(c.EndChunked());
  out = ClientReads();
  EXPECT_NE(out.find("Transfer-Encoding: chunked\r\n\r\nd\r\n{\"result\":1}\n\r\n0\r\n\r\n"),
            std::string::npos)
      << out;

  // HTTP/1.0 has no chunks: the body runs to the close.
  ASSERT_TRUE(c.BeginChunked(200, {}, /*http10=*/true));
  ASSERT_TRUE(c.WriteChunk("abc"));
  ASSERT_TRUE(c.EndChunked());
  out = ClientReads();
  EXPECT_NE(out.find("Connection: close\r\n\r\nabc"), std::string::npos) << out;
  EXPECT_EQ(out.find("Transfer-Encoding"), std::string::npos) << out;
}

TEST_F(Http1Test, PeerClosed) {
  HttpConnection c = Connection();
  EXPECT_FALSE(c.PeerClosed(0));
  ClientSends("GET / HTTP/1.1\r\n");  // a next request: not a close
  EXPECT_FALSE(c.PeerClosed(50));
  shutdown(fds_[1], SHUT_WR);
  EXPECT_TRUE(c.PeerClosed(1000));
}

// A ClientHello (the handshake message, without its record header) with
// the given ALPN protocols (none: no ALPN extension), after a server name
// extension as clients send one.
std::string ClientHello(const std::vector<std::string>& alpn) {
  auto u16 = [](size_t v) { return std::string{static_cast<char>(v >> 8), static_cast<char>(v)}; };
  std::string extensions;
  const std::string name = "localhost";
  const std::string server_name =
      u16(name.size() + 3) + std::string(1, '\0') + u16(name.size()) + name;
  extensions += u16(0) + u16(server_name.size()) + server_name;
  if (!alpn.empty()) {
    std::string list;
    for (const auto& p : alpn) list += std::string(1, static_cast<char>(p.size())) + p;
    extensions += u16(16) + u16(list.size() + 2) + u16(list.size()) + list;
  }
  std::string body = "\x03\x03" + std::string(32, 'r');  // version, random
  body += std::string(1, '\x20') + std::string(32, 's');     // session id
  body += u16(4) + "\x13\x01\x13\x02";                   // two cipher suites
  body += std::string("\x01\x00", 2);                      // null compression
  body += u16(extensions.size()) + extensions;
  const size_t n = body.size();
  return std::string{'\x01', static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                     static_cast<char>(n)} + body;
}

TEST(ClientHelloTest, GrpcClientsOfferHttp2Alone) {
  EXPECT_TRUE(ClientHelloIsGrpcs(ClientHello({"h2"})));               // Go's gRPC
  EXPECT_TRUE(ClientHelloIsGrpcs(ClientHello({"grpc-exp", "h2"})));   // C-core gRPC
  EXPECT_FALSE(ClientHelloIsGrpcs(ClientHello({"h2", "http/1.1"})));  // curl
  EXPECT_FALSE(ClientHelloIsGrpcs(ClientHello({"http/1.1"})));
  EXPECT_FALSE(ClientHelloIsGrpcs(ClientHello({})));  // no ALPN: openssl s_client
  EXPECT_FALSE(ClientHelloIsGrpcs(ClientHello({"h2c", "spdy/3"})));
  // Cut anywhere, or not a ClientHello: never an answer from past the end.
  const std::string hello = ClientHello({"grpc-exp", "h2"});
  for (size_t n = 0; n < hello.size(); ++n) {
    EXPECT_FALSE(ClientHelloIsGrpcs(std::string_view(hello).substr(0, n))) << n;
  }
  std::string server_hello = hello;
  server_hello[0] = '\x02';
  EXPECT_FALSE(ClientHelloIsGrpcs(server_hello));
}

}  // namespace
}  // namespace capstan::server
