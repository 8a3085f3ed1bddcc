// A server refuses to start on a client address another server listens on,
// in etcd's words, instead of sharing the port with it.

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "process_fixture.h"

namespace capstan::testing {
namespace {

class ListenTest : public ::testing::TestWithParam<ServerFlavor> {
 protected:
  void SetUp() override {
    CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
  }
};

TEST_P(ListenTest, ClientPortInUseIsRefused) {
  ServerOptions options =
      GetParam() == ServerFlavor::kEtcd ? ServerOptions::Etcd() : ServerOptions::Capstan();
  auto first = ServerProcess::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();

  const std::string dir = (*first)->dir() + "/second";
  const std::string other = "http://127.0.0.1:" + std::to_string(PickFreePort());
  std::vector<std::string> argv = {
      options.flavor == ServerFlavor::kEtcd ? EtcdBinary() : CapstanBinary(),
      "--data-dir", dir,
      "--listen-client-urls", (*first)->client_url(),
      "--advertise-client-urls", (*first)->client_url()};
  if (options.flavor == ServerFlavor::kEtcd) {
    argv.insert(argv.end(), {"--listen-peer-urls", other, "--initial-advertise-peer-urls", other,
                             "--initial-cluster", "default=" + other});
  } else {
    argv.insert(argv.end(), {"--listen-metrics-urls", other});
  }
  CommandResult second = RunCommand(argv, "", std::chrono::seconds(20));
  ASSERT_FALSE(second.timed_out) << "the second server kept running on a taken port";
  EXPECT_FALSE(second.exit.exited && second.exit.exit_code == 0) << second.exit.ToString();
  EXPECT_NE((second.out + second.err).find("address already in use"), std::string::npos)
      << second.out << second.err;
  EXPECT_TRUE((*first)->running());
}

INSTANTIATE_TEST_SUITE_P(Flavors, ListenTest,
                         ::testing::Values(ServerFlavor::kEtcd, ServerFlavor::kCapstan),
                         [](const auto& info) {
                           return info.param == ServerFlavor::kEtcd ? "Etcd" : "Capstan";
                         });

}  // namespace
}  // namespace capstan::testing
