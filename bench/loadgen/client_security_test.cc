#include "bench/loadgen/client_security.h"

#include <gtest/gtest.h>

#include "bench/loadgen/flags.h"
#include "bench/loadgen/workload.h"

namespace capstan::bench {
namespace {

TEST(ClientSecurityTest, EtcdBenchmarkFlagsFillTheSecurityOptions) {
  GlobalOptions g;
  FlagSet f;
  g.Register(f);
  std::vector<std::string> positional;
  ASSERT_TRUE(f.Parse({"--cacert", "ca.pem", "--cert=c.pem", "--key", "k.pem", "--user", "root:pw",
                       "put"},
                      &positional, /*stop_at_positional=*/true)
                  .ok());
  EXPECT_EQ(g.security.ca_file, "ca.pem");
  EXPECT_EQ(g.security.cert_file, "c.pem");
  EXPECT_EQ(g.security.key_file, "k.pem");
  EXPECT_EQ(g.security.user, "root:pw");
  EXPECT_EQ(positional, std::vector<std::string>{"put"});
}

TEST(ClientSecurityTest, TlsIsOnWithACaACertOrAnHttpsEndpoint) {
  ClientSecurity none;
  EXPECT_FALSE(none.UsesTls("127.0.0.1:2379"));
  EXPECT_FALSE(none.UsesTls("http://127.0.0.1:2379"));
  EXPECT_TRUE(none.UsesTls("https://127.0.0.1:2379"));
  EXPECT_TRUE(ClientSecurity{.ca_file = "ca.pem"}.UsesTls("127.0.0.1:2379"));
  EXPECT_TRUE(ClientSecurity{.cert_file = "c.pem"}.UsesTls("127.0.0.1:2379"));
}

TEST(ClientSecurityTest, BadFilesAndPairsAreErrors) {
  EXPECT_EQ(MakeChannelCredentials({.cert_file = "c.pem"}, "127.0.0.1:1").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeChannelCredentials({.ca_file = "/nonexistent/ca.pem"}, "127.0.0.1:1").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(MakeChannelCredentials({}, "127.0.0.1:1").ok());
}

TEST(ClientSecurityTest, UserNeedsAPassword) {
  auto s = AuthTokenSource::Create("root", "127.0.0.1:1", grpc::InsecureChannelCredentials());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ClientSecurityTest, OnlyEtcdsInvalidTokenErrorIsRetried) {
  EXPECT_TRUE(IsInvalidAuthToken(
      grpc::Status(grpc::UNAUTHENTICATED, "etcdserver: invalid auth token")));
  EXPECT_FALSE(IsInvalidAuthToken(
      grpc::Status(grpc::INVALID_ARGUMENT, "etcdserver: authentication failed, invalid user ID or password")));
  EXPECT_FALSE(IsInvalidAuthToken(grpc::Status::OK));
}

}  // namespace
}  // namespace capstan::bench
