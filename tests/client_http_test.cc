// The client URLs' HTTP side with non-default flags, and the connection
// handling behind it: --host-whitelist, --enable-grpc-gateway=false and
// malformed requests compared with etcd; --listen-client-http-urls, a
// client hanging up on a waiting Lock, shutdown with open HTTP streams, and
// connections that send nothing or half a preface.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "gtest/gtest.h"
#include "http_client.h"
#include "process_fixture.h"
#include "v3lockpb/v3lock.grpc.pb.h"

namespace capstan::testing {
namespace {

using namespace std::chrono_literals;

ServerOptions Options(ServerFlavor flavor, std::vector<std::string> extra) {
  ServerOptions o = flavor == ServerFlavor::kEtcd ? ServerOptions::Etcd() : ServerOptions::Capstan();
  o.extra_args = std::move(extra);
  return o;
}


class ClientHttpTest : public ::testing::Test {};

// One unary KV call through gRPC on the server's client URL.
template <typename Req, typename Resp>
grpc::Status KvCall(const ServerProcess& server,
                    grpc::Status (etcdserverpb::KV::Stub::*method)(grpc::ClientContext*, const Req&,
                                                                   Resp*),
                    const Req& req, Resp* resp, std::chrono::seconds timeout = 10s) {
  auto kv = etcdserverpb::KV::NewStub(server.NewChannel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  return ((*kv).*method)(&ctx, req, resp);
}

grpc::Status GrpcPut(const ServerProcess& server, const std::string& key,
                     std::chrono::seconds timeout = 10s) {
  etcdserverpb::PutRequest put;
  put.set_key(key);
  etcdserverpb::PutResponse resp;
  return KvCall(server, &etcdserverpb::KV::Stub::Put, put, &resp, timeout);
}

// The cases that compare with etcd need it; the others run without.
#define REQUIRE_ETCD() CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary())

// etcd's DNS-rebinding check: on a plain-http client URL, a Host outside
// --host-whitelist gets 421 and etcd's explanation, on both servers alike.
TEST_F(ClientHttpTest, HostWhitelist) {
  REQUIRE_ETCD();
  HttpAnswer refused[2], allowed[2];
  for (ServerFlavor f : {ServerFlavor::kEtcd, ServerFlavor::kCapstan}) {
    auto server = ServerProcess::Start(Options(f, {"--host-whitelist", "allowed.test"}));
    ASSERT_TRUE(server.ok()) << server.status();
    const int i = f == ServerFlavor::kEtcd ? 0 : 1;
    refused[i] = HttpRequestTo((*server)->client_port(), "GET", "/version", "",
                               {{"Host", "evil.test:2379"}});
    allowed[i] = HttpRequestTo((*server)->client_port(), "POST", "/v3/kv/range", R"({"key":"YQ=="})",
                               {{"Host", "allowed.test:2379"}});
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(refused[i].status, 421) << i;
    EXPECT_EQ(allowed[i].status, 200) << i << allowed[i].body;
  }
  EXPECT_EQ(refused[0].body, refused[1].body);
  EXPECT_TRUE(absl::StrContains(refused[1].body, "--host-whitelist \"evil.test\""))
      << refused[1].body;
}

// --enable-grpc-gateway=false takes /v3/ away and leaves the rest.
TEST_F(ClientHttpTest, GatewayDisabled) {
  REQUIRE_ETCD();
  for (ServerFlavor f : {ServerFlavor::kEtcd, ServerFlavor::kCapstan}) {
    auto server = ServerProcess::Start(Options(f, {"--enable-grpc-gateway=false"}));
    ASSERT_TRUE(server.ok()) << server.status();
    HttpAnswer range = HttpRequestTo((*server)->client_port(), "POST", "/v3/kv/range", "{}");
    EXPECT_EQ(range.status, 404) << FlavorName(f);
    EXPECT_EQ(range.body, "404 page not found\n") << FlavorName(f);
    HttpAnswer health = HttpRequestTo((*server)->client_port(), "GET", "/health");
    EXPECT_EQ(health.status, 200) << FlavorName(f);
  }
}

// A request whose headers do not parse gets 400 and the connection closes.
TEST_F(ClientHttpTest, MalformedRequest) {
  REQUIRE_ETCD();
  for (ServerFlavor f : {ServerFlavor::kEtcd, ServerFlavor::kCapstan}) {
    auto server = ServerProcess::Start(Options(f, {}));
    ASSERT_TRUE(server.ok()) << server.status();
    HttpClient client((*server)->client_port());
    ASSERT_TRUE(client.connected());
    HttpAnswer answer;
    ASSERT_TRUE(client.SendRaw("GET /version HTTP/1.1\r\nHost: x\r\nNo colon here\r\n\r\n"));
    ASSERT_TRUE(client.ReadHead(&answer, 10s)) << FlavorName(f);
    EXPECT_EQ(answer.status, 400) << FlavorName(f);
    EXPECT_EQ(answer.headers["connection"], "close") << FlavorName(f);
  }
}

// --max-request-bytes holds for gateway calls as for gRPC ones: a put over
// it is refused with etcd's error. A body far over it (past twice the limit
// and gRPC's allowance, room for base64) is refused before it is read.
TEST_F(ClientHttpTest, RequestSizeLimits) {
  REQUIRE_ETCD();
  const std::string put = absl::StrCat(R"({"key":"YQ==","value":")",
                                       absl::Base64Escape(std::string(2000, 'v')), R"("})");
  HttpAnswer too_large[2];
  for (ServerFlavor f : {ServerFlavor::kEtcd, ServerFlavor::kCapstan}) {
    auto server = ServerProcess::Start(Options(f, {"--max-request-bytes=1024"}));
    ASSERT_TRUE(server.ok()) << server.status();
    too_large[f == ServerFlavor::kEtcd ? 0 : 1] =
        HttpRequestTo((*server)->client_port(), "POST", "/v3/kv/put", put);
    if (f == ServerFlavor::kCapstan) {
      HttpClient client((*server)->client_port());
      ASSERT_TRUE(client.SendRaw(
          "POST /v3/kv/put HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{"));
      HttpAnswer refused;
      ASSERT_TRUE(client.ReadHead(&refused, 10s));
      EXPECT_EQ(refused.status, 413);
      EXPECT_EQ(refused.headers["connection"], "close");
    }
  }
  EXPECT_EQ(too_large[0].status, 400) << too_large[0].body;
  EXPECT_EQ(too_large[0].body, too_large[1].body);
  EXPECT_EQ(too_large[0].status, too_large[1].status);
}

// With --listen-client-http-urls, HTTP is served there and the client URL
// speaks gRPC only.
TEST_F(ClientHttpTest, SeparateHttpUrls) {
  const int http_port = PickFreePort();
  auto server = ServerProcess::Start(Options(
      ServerFlavor::kCapstan,
      {"--listen-client-http-urls", absl::StrCat("http://127.0.0.1:", http_port)}));
  ASSERT_TRUE(server.ok()) << server.status();
  HttpAnswer put = HttpRequestTo(http_port, "POST", "/v3/kv/put", R"({"key":"YQ==","value":"Yg=="})");
  EXPECT_EQ(put.status, 200) << put.body;
  // The put is there through gRPC on the client URL.
  etcdserverpb::RangeRequest req;
  req.set_key("a");
  etcdserverpb::RangeResponse resp;
  ASSERT_TRUE(KvCall(**server, &etcdserverpb::KV::Stub::Range, req, &resp).ok());
  ASSERT_EQ(resp.kvs_size(), 1);
  EXPECT_EQ(resp.kvs(0).value(), "b");
  // gRPC's own listener takes the connection but does not speak HTTP/1.1.
  HttpClient client((*server)->client_port());
  ASSERT_TRUE(client.connected());
  HttpAnswer answer;
  ASSERT_TRUE(client.Send("GET", "/health", ""));
  EXPECT_FALSE(client.ReadHead(&answer, 3s));
  EXPECT_EQ(answer.status, 0);
  HttpAnswer health = HttpRequestTo(http_port, "GET", "/health");
  EXPECT_EQ(health.status, 200);
}

// An HTTP client that hangs up on a Lock still waiting cancels it: its key
// is deleted (etcd's gateway cancels the call's context, and so does
// Capstan's).
TEST_F(ClientHttpTest, HangingUpCancelsAWaitingLock) {
  REQUIRE_ETCD();
  for (ServerFlavor f : {ServerFlavor::kEtcd, ServerFlavor::kCapstan}) {
    auto server = ServerProcess::Start(Options(f, {}));
    ASSERT_TRUE(server.ok()) << server.status();
    const int port = (*server)->client_port();
    HttpAnswer held = HttpRequestTo(port, "POST", "/v3/lock/lock", R"({"name":"bA=="})");
    ASSERT_EQ(held.status, 200) << held.body;
    const std::string count_body = absl::StrCat(R"({"key":"bA==","range_end":")",
                                                absl::Base64Escape("m"), R"(","count_only":true})");
    auto count = [&] {
      HttpAnswer a = HttpRequestTo(port, "POST", "/v3/kv/range", count_body);
      return a.body;
    };
    {
      HttpClient waiter(port);
      ASSERT_TRUE(waiter.Send("POST", "/v3/lock/lock", R"({"name":"bA=="})"));
      auto deadline = std::chrono::steady_clock::now() + 10s;
      while (!absl::StrContains(count(), R"("count":"2")") &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(20ms);
      }
      ASSERT_TRUE(absl::StrContains(count(), R"("count":"2")")) << FlavorName(f) << count();
    }  // hangs up
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!absl::StrContains(count(), R"("count":"1")") &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(20ms);
    }
    EXPECT_TRUE(absl::StrContains(count(), R"("count":"1")")) << FlavorName(f) << count();
  }
}

// Shutdown ends HTTP streams (a watch, an observer) as it ends gRPC ones,
// without waiting for their clients.
TEST_F(ClientHttpTest, ShutdownEndsHttpStreams) {
  auto server = ServerProcess::Start(Options(ServerFlavor::kCapstan, {}));
  ASSERT_TRUE(server.ok()) << server.status();
  HttpClient watch((*server)->client_port());
  ASSERT_TRUE(watch.Send("POST", "/v3/watch", R"({"create_request":{"key":"YQ=="}})"));
  HttpAnswer head;
  ASSERT_TRUE(watch.ReadHead(&head, 10s));
  std::vector<std::string> lines;
  ASSERT_TRUE(watch.ReadLines(1, &lines, 10s));
  HttpClient quiet((*server)->client_port());  // connected, never asks
  ASSERT_TRUE(quiet.connected());
  const auto start = std::chrono::steady_clock::now();
  ExitInfo exit = (*server)->Stop();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(exit.exited && exit.exit_code == 0) << exit.ToString();
  EXPECT_LT(took, 3s);
  // The stream has ended (the connection closed), not merely gone quiet.
  const auto read_start = std::chrono::steady_clock::now();
  EXPECT_FALSE(watch.ReadLines(1, &lines, 5s));
  EXPECT_LT(std::chrono::steady_clock::now() - read_start, 1s);
}

int ConnectTo(int port, const std::string& first) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  if (!first.empty() && send(fd, first.data(), first.size(), MSG_NOSIGNAL) < 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// The caps on connections hold without locking anyone out: past 1,024
// connections that have not spoken the longest-silent one is dropped for
// each new one, and past 512 HTTP connections a new one is told 503.
TEST_F(ClientHttpTest, ConnectionCaps) {
  rlimit nofile{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &nofile), 0);
  nofile.rlim_cur = nofile.rlim_max;
  setrlimit(RLIMIT_NOFILE, &nofile);
  if (nofile.rlim_cur < 2000) {
    CAPSTAN_REFERENCE_MISSING(absl::StrCat("an open file limit of 2000 (the hard limit is ",
                                           nofile.rlim_cur, ")"));
  }
  auto server = ServerProcess::Start(Options(ServerFlavor::kCapstan, {}));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->client_port();

  std::vector<int> silent;
  for (int i = 0; i < 1100; ++i) {
    const int fd = ConnectTo(port, "");
    ASSERT_GE(fd, 0) << i;
    silent.push_back(fd);
  }
  // The first ones were dropped to make room: they read end of stream.
  pollfd first{silent[0], POLLIN, 0};
  ASSERT_EQ(poll(&first, 1, 10000), 1);
  char c;
  EXPECT_EQ(recv(silent[0], &c, 1, 0), 0);
  // gRPC and HTTP clients still get in.
  grpc::Status put_status = GrpcPut(**server, "k");
  EXPECT_TRUE(put_status.ok()) << put_status.error_message();
  EXPECT_EQ(HttpRequestTo(port, "GET", "/version").status, 200);
  for (int fd : silent) close(fd);

  // 512 HTTP connections, each in the middle of a request.
  std::vector<int> http;
  for (int i = 0; i < 512; ++i) {
    const int fd = ConnectTo(port, "GET /version HTTP/1.1\r\n");
    ASSERT_GE(fd, 0) << i;
    http.push_back(fd);
  }
  HttpAnswer busy;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  do {  // until the server has taken all 512 in
    busy = HttpRequestTo(port, "GET", "/version");
  } while (busy.status == 200 && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(busy.status, 503);
  EXPECT_EQ(busy.body, "too many connections");
  for (int fd : http) close(fd);
  HttpAnswer again;
  const auto deadline2 = std::chrono::steady_clock::now() + 10s;
  do {  // their threads end as their clients go
    again = HttpRequestTo(port, "GET", "/version");
  } while (again.status != 200 && std::chrono::steady_clock::now() < deadline2);
  EXPECT_EQ(again.status, 200);
  EXPECT_TRUE((*server)->running());
}

// Connections that send nothing, half of HTTP/2's preface or garbage
// neither hold up nor break the others.
TEST_F(ClientHttpTest, QuietAndPartialConnectionsDoNotBlockOthers) {
  auto server = ServerProcess::Start(Options(ServerFlavor::kCapstan, {}));
  ASSERT_TRUE(server.ok()) << server.status();
  std::vector<int> fds;
  for (const std::string& first : std::vector<std::string>{"", "P", "PR", std::string("\0\1\2", 3)}) {
    const int fd = ConnectTo((*server)->client_port(), first);
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
  }
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    grpc::Status put_status = GrpcPut(**server, "k" + std::to_string(i), 5s);
    EXPECT_TRUE(put_status.ok()) << put_status.error_code() << " " << put_status.error_message();
    HttpAnswer version = HttpRequestTo((*server)->client_port(), "GET", "/version");
    EXPECT_EQ(version.status, 200);
  }
  // Well under the 10 s a silent connection is given to speak.
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  for (int fd : fds) close(fd);
  EXPECT_TRUE((*server)->running());
}

}  // namespace
}  // namespace capstan::testing
