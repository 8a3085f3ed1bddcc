// etcd v3 auth tokens and refusals over raw gRPC, against a real etcd and
// capstan started with the same flags: JWT tokens (keys made by openssl in
// the test) used by etcdctl, expired and tampered JWTs, expired simple tokens
// (--auth-token-ttl), watches on a forbidden prefix. The capstan.v1.Cache
// service's permission checks are capstan's own.

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "capstan/v1/cache.grpc.pb.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpc_reply.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "process_fixture.h"

namespace capstan::testing {
namespace {

using etcdserverpb::Auth;
using etcdserverpb::KV;

class AuthTokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
    CAPSTAN_REQUIRE_REFERENCE("etcdctl", EtcdctlBinary());
    CAPSTAN_REQUIRE_REFERENCE("capstan", CapstanBinary());
  }

  void StartBoth(const std::vector<std::string>& flags) {
    ServerOptions e = ServerOptions::Etcd();
    e.extra_args = flags;
    ServerOptions c = ServerOptions::Capstan();
    c.extra_args = flags;
    c.extra_args.push_back("--bcrypt-cost=4");
    // Started from this thread: a child dies with the thread that forked it.
    auto es = ServerProcess::Start(e);
    auto cs = ServerProcess::Start(c);
    ASSERT_TRUE(es.ok()) << es.status();
    ASSERT_TRUE(cs.ok()) << cs.status();
    servers_[0] = std::move(*es);
    servers_[1] = std::move(*cs);
  }

  // etcdctl on both servers; expects the same exit code and stdout and
  // returns them from capstan.
  std::string Etcdctl(const std::vector<std::string>& args) {
    std::string outs[2];
    int codes[2];
    for (int i = 0; i < 2; ++i) {
      std::vector<std::string> argv = {EtcdctlBinary(), "--endpoints=" + servers_[i]->endpoint(),
                                       "--command-timeout=5s"};
      argv.insert(argv.end(), args.begin(), args.end());
      CommandResult r = RunCommand(argv, "", std::chrono::seconds(20));
      outs[i] = r.out;
      codes[i] = r.exit.exited ? r.exit.exit_code : -1;
      // A failure's "Error: ..." line (etcdctl's retry logs before it vary).
      if (size_t at = r.err.rfind("Error:"); codes[i] != 0 && at != std::string::npos) {
        outs[i] += r.err.substr(at);
      }
    }
    EXPECT_EQ(outs[0], outs[1]) << "etcdctl " << absl::StrJoin(args, " ");
    EXPECT_EQ(codes[0], codes[1]) << "etcdctl " << absl::StrJoin(args, " ");
    return outs[1];
  }

  // Root with password rootpw, user u (password upw) with readwrite on the
  // "foo" prefix, auth on.
  void SetUpUsers() {
    Etcdctl({"user", "add", "root", "--new-user-password=rootpw"});
    Etcdctl({"user", "add", "u", "--new-user-password=upw"});
    Etcdctl({"role", "add", "r"});
    Etcdctl({"role", "grant-permission", "r", "readwrite", "foo", "--prefix"});
    Etcdctl({"user", "grant-role", "u", "r"});
    ASSERT_EQ(Etcdctl({"auth", "enable"}), "Authentication Enabled\n");
  }

  static absl::StatusOr<std::string> Token(const ServerProcess& s, const std::string& user,
                                           const std::string& password) {
    auto stub = Auth::NewStub(s.NewChannel());
    grpc::ClientContext ctx;
    etcdserverpb::AuthenticateRequest req;
    req.set_name(user);
    req.set_password(password);
    etcdserverpb::AuthenticateResponse resp;
    grpc::Status st = stub->Authenticate(&ctx, req, &resp);
    if (!st.ok()) return absl::UnknownError(st.error_message());
    return resp.token();
  }

  static Reply Get(const ServerProcess& s, const std::string& token, const std::string& key) {
    auto stub = KV::NewStub(s.NewChannel());
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("token", token);
    etcdserverpb::RangeRequest req;
    req.set_key(key);
    etcdserverpb::RangeResponse resp;
    return ReplyOf(stub->Range(&ctx, req, &resp));
  }

  // The same Get on both servers, each with its own token for user.
  Reply GetBoth(const std::string tokens[2], const std::string& key) {
    Reply e = Get(*servers_[0], tokens[0], key);
    Reply c = Get(*servers_[1], tokens[1], key);
    EXPECT_EQ(e, c) << "etcd: " << e.ToString() << "\ncapstan: " << c.ToString();
    return c;
  }

  std::unique_ptr<ServerProcess> servers_[2];  // etcd, capstan
};

constexpr char kMakeRsaKey[] =
    "openssl genrsa -out jwt.key 2048 2>/dev/null && openssl rsa -in jwt.key -pubout -out jwt.pub "
    "2>/dev/null";

TEST_F(AuthTokenTest, JwtTokens) {
  TempDir keys("capstan-jwt-keys");
  CommandResult r = RunCommand({"/bin/sh", "-c", absl::StrCat("cd ", keys.path(), " && ", kMakeRsaKey)});
  ASSERT_TRUE(r.exit.exited && r.exit.exit_code == 0) << r.err;
  StartBoth({absl::StrCat("--auth-token=jwt,pub-key=", keys.path(), "/jwt.pub,priv-key=", keys.path(),
                          "/jwt.key,sign-method=RS256,ttl=2s")});
  SetUpUsers();
  EXPECT_EQ(Etcdctl({"--user=u:upw", "put", "foo1", "v"}), "OK\n");
  EXPECT_EQ(Etcdctl({"--user=u:upw", "get", "foo1", "--print-value-only"}), "v\n");
  EXPECT_EQ(Etcdctl({"--user=root:rootpw", "user", "list"}), "root\nu\n");
  EXPECT_TRUE(absl::StrContains(Etcdctl({"--user=u:upw", "put", "bar", "v"}),
                                "Error: etcdserver: permission denied"));
  EXPECT_TRUE(absl::StrContains(Etcdctl({"--user=u:wrong", "get", "foo1"}),
                                "Error: etcdserver: authentication failed, invalid user ID or password"));

  std::string tokens[2];
  for (int i = 0; i < 2; ++i) {
    auto t = Token(*servers_[i], "u", "upw");
    ASSERT_TRUE(t.ok()) << t.status();
    tokens[i] = *t;
  }
  // etcd's token layout: header and claims.
  std::vector<std::string> parts = absl::StrSplit(tokens[1], '.');
  ASSERT_EQ(parts.size(), 3u);
  std::string header, claims;
  ASSERT_TRUE(absl::WebSafeBase64Unescape(parts[0], &header));
  ASSERT_TRUE(absl::WebSafeBase64Unescape(parts[1], &claims));
  std::vector<std::string> etcd_parts = absl::StrSplit(tokens[0], '.');
  std::string etcd_header;
  ASSERT_TRUE(absl::WebSafeBase64Unescape(etcd_parts[0], &etcd_header));
  EXPECT_EQ(header, etcd_header);
  EXPECT_TRUE(absl::StrContains(claims, R"("username":"u")")) << claims;
  EXPECT_TRUE(absl::StrContains(claims, R"("revision":)")) << claims;
  EXPECT_TRUE(absl::StrContains(claims, R"("exp":)")) << claims;
  EXPECT_EQ(GetBoth(tokens, "foo1").code, 0);
  // Both servers share the key pair and saw the same auth changes (etcd's
  // AuthEnable keeps the revision): each accepts the other's token.
  std::string crossed[2] = {tokens[1], tokens[0]};
  std::string etcd_claims;
  ASSERT_TRUE(absl::WebSafeBase64Unescape(etcd_parts[1], &etcd_claims));
  EXPECT_EQ(etcd_claims.substr(etcd_claims.find("\"revision\"")),
            claims.substr(claims.find("\"revision\"")));
  Reply cross = GetBoth(crossed, "foo1");
  EXPECT_EQ(cross.code, 0) << cross.ToString();

  // Tampered: another user name in the claims, the signature kept.
  std::string forged[2];
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> p = absl::StrSplit(tokens[i], '.');
    std::string c;
    ASSERT_TRUE(absl::WebSafeBase64Unescape(p[1], &c));
    c.replace(c.find(R"("username":"u")"), 14, R"("username":"root")");
    forged[i] = absl::StrCat(p[0], ".", absl::WebSafeBase64Escape(c), ".", p[2]);
  }
  Reply tampered = GetBoth(forged, "foo1");
  EXPECT_EQ(tampered.message, "etcdserver: invalid auth token");
  // A garbled header.
  std::string garbled[2] = {"x" + tokens[0], "x" + tokens[1]};
  EXPECT_EQ(GetBoth(garbled, "foo1").message, "etcdserver: invalid auth token");

  // A JWT carries the auth revision it was issued at: after any auth change
  // it is refused until the client authenticates again.
  Etcdctl({"--user=root:rootpw", "role", "grant-permission", "r", "read", "baz"});
  EXPECT_EQ(GetBoth(tokens, "foo1").message, "etcdserver: revision of auth store is old");
  EXPECT_EQ(Etcdctl({"--user=u:upw", "get", "baz"}), "");

  // Expired after the 2s ttl.
  std::this_thread::sleep_for(std::chrono::milliseconds(3100));
  Reply expired = GetBoth(tokens, "foo1");
  EXPECT_EQ(expired.message, "etcdserver: invalid auth token");
  EXPECT_EQ(expired.code, grpc::UNAUTHENTICATED);
}

TEST_F(AuthTokenTest, BadJwtOptionsStopCapstanWithEtcdsError) {
  for (const auto& [opt, text] : std::vector<std::pair<std::string, std::string>>{
           {"jwt", "auth: invalid auth options"},
           {"jwt,sign-method=RS256", "auth: missing key data"},
           {"jwt,sign-method=RS256,priv-key=/nonexistent", "auth: invalid auth options"},
           {"bogus", "auth: invalid auth options"}}) {
    SCOPED_TRACE(opt);
    ServerOptions o = ServerOptions::Capstan();
    o.extra_args = {"--auth-token=" + opt};
    o.start_timeout = std::chrono::milliseconds(5000);
    auto s = ServerProcess::Start(o);
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(absl::StrContains(s.status().message(), text)) << s.status();
  }
}

TEST_F(AuthTokenTest, ExpiredSimpleTokenAndForbiddenWatch) {
  StartBoth({"--auth-token-ttl=1"});
  SetUpUsers();
  std::string tokens[2];
  for (int i = 0; i < 2; ++i) {
    auto t = Token(*servers_[i], "u", "upw");
    ASSERT_TRUE(t.ok()) << t.status();
    tokens[i] = *t;
    auto wrong = Token(*servers_[i], "u", "nope");
    EXPECT_EQ(wrong.status().message(),
              "etcdserver: authentication failed, invalid user ID or password");
  }
  EXPECT_EQ(GetBoth(tokens, "foo").code, 0);
  // A neighbouring key and a range running past the grant.
  EXPECT_EQ(GetBoth(tokens, "fop").message, "etcdserver: permission denied");

  // Watches: a forbidden range is created and canceled at once with etcd's
  // reason; a permitted one is not.
  for (const auto& [key, end, forbidden] : std::vector<std::tuple<std::string, std::string, bool>>{
           {"bar", "bas", true}, {"foo", "fop", false}, {"fo", "fp", true}}) {
    SCOPED_TRACE(key);
    etcdserverpb::WatchResponse got[2];
    for (int i = 0; i < 2; ++i) {
      auto stub = etcdserverpb::Watch::NewStub(servers_[i]->NewChannel());
      grpc::ClientContext ctx;
      ctx.AddMetadata("token", tokens[i]);
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      auto stream = stub->Watch(&ctx);
      etcdserverpb::WatchRequest req;
      req.mutable_create_request()->set_key(key);
      req.mutable_create_request()->set_range_end(end);
      ASSERT_TRUE(stream->Write(req));
      ASSERT_TRUE(stream->Read(&got[i]));
      ctx.TryCancel();
    }
    EXPECT_EQ(got[0].created(), got[1].created());
    EXPECT_EQ(got[0].canceled(), got[1].canceled());
    EXPECT_EQ(got[0].cancel_reason(), got[1].cancel_reason());
    EXPECT_EQ(got[1].canceled(), forbidden);
    // etcd puts the whole gRPC error text into the reason.
    EXPECT_EQ(got[1].cancel_reason(),
              forbidden ? "rpc error: code = PermissionDenied desc = etcdserver: permission denied"
                        : "");
  }

  // etcd drops unused simple tokens after --auth-token-ttl (checked each
  // second).
  std::this_thread::sleep_for(std::chrono::milliseconds(3100));
  Reply expired = GetBoth(tokens, "foo");
  EXPECT_EQ(expired.message, "etcdserver: invalid auth token");
}

// capstan.v1.Cache checks read permission on the listed or watched prefix.
TEST_F(AuthTokenTest, CacheServiceChecksReadPermission) {
  ServerOptions o = ServerOptions::Capstan();
  o.extra_args = {"--bcrypt-cost=4"};
  auto s = ServerProcess::Start(o);
  ASSERT_TRUE(s.ok()) << s.status();
  auto run = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {EtcdctlBinary(), "--endpoints=" + (*s)->endpoint()};
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = RunCommand(argv, "", std::chrono::seconds(20));
    EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 0) << absl::StrJoin(args, " ") << r.err;
  };
  run({"user", "add", "root", "--new-user-password=rootpw"});
  run({"user", "add", "reader", "--new-user-password=pw"});
  run({"user", "add", "other", "--new-user-password=pw"});
  run({"role", "add", "pods-default"});
  run({"role", "grant-permission", "pods-default", "read", "/registry/pods/default/", "--prefix"});
  run({"role", "add", "nodes"});
  run({"role", "grant-permission", "nodes", "read", "/registry/minions/", "--prefix"});
  run({"user", "grant-role", "reader", "pods-default"});
  run({"user", "grant-role", "other", "nodes"});
  run({"auth", "enable"});
  auto reader = Token(**s, "reader", "pw");
  auto other = Token(**s, "other", "pw");
  ASSERT_TRUE(reader.ok() && other.ok());

  auto cache = capstan::v1::Cache::NewStub((*s)->NewChannel());
  auto list = [&](const std::string& token, const std::string& prefix) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("token", token);
    capstan::v1::ListRequest req;
    req.set_prefix(prefix);
    capstan::v1::ListResponse resp;
    return ReplyOf(cache->List(&ctx, req, &resp));
  };
  EXPECT_EQ(list(*reader, "/registry/pods/default/").code, grpc::OK);
  Reply wider = list(*reader, "/registry/pods/");
  EXPECT_EQ(wider.code, grpc::PERMISSION_DENIED);
  EXPECT_EQ(wider.message, "etcdserver: permission denied");
  EXPECT_EQ(list(*other, "/registry/pods/default/").message, "etcdserver: permission denied");
  EXPECT_EQ(list(*other, "/registry/minions/").code, grpc::OK);
  EXPECT_EQ(list("", "/registry/pods/default/").message, "etcdserver: user name is empty");
  EXPECT_EQ(list("bogus.1", "/registry/pods/default/").message, "etcdserver: invalid auth token");

  auto watch = [&](const std::string& token, const std::string& prefix) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("token", token);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1500));
    capstan::v1::WatchRequest req;
    req.set_prefix(prefix);
    auto reader_stream = cache->Watch(&ctx, req);
    capstan::v1::WatchResponse resp;
    while (reader_stream->Read(&resp)) {
    }
    return ReplyOf(reader_stream->Finish());
  };
  // A permitted watch runs until the client's deadline.
  EXPECT_EQ(watch(*reader, "/registry/pods/default/").code, grpc::DEADLINE_EXCEEDED);
  Reply refused = watch(*reader, "/registry/pods/");
  EXPECT_EQ(refused.code, grpc::PERMISSION_DENIED);
  EXPECT_EQ(refused.message, "etcdserver: permission denied");
  EXPECT_EQ(watch(*other, "/registry/pods/default/").code, grpc::PERMISSION_DENIED);
}

}  // namespace
}  // namespace capstan::testing
