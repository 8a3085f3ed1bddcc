// A server refuses to start on a client, peer or metrics address another
// server listens on, in etcd's words, instead of sharing the port with it.

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

// The flags of a second one-member server whose client, peer and metrics
// URLs are new ports except the one named, which is the first server's.
enum class Taken { kClient, kPeer, kMetrics };

std::vector<std::string> SecondServerArgv(ServerFlavor flavor, const ServerProcess& first,
                                          Taken taken) {
  auto fresh = [] { return "http://127.0.0.1:" + std::to_string(PickFreePort()); };
  const std::string client = taken == Taken::kClient ? first.client_url() : fresh();
  const std::string peer = taken == Taken::kPeer ? first.peer_url() : fresh();
  const std::string metrics =
      taken == Taken::kMetrics ? "http://127.0.0.1:" + std::to_string(first.metrics_port())
                               : fresh();
  return {flavor == ServerFlavor::kEtcd ? EtcdBinary() : CapstanBinary(),
          "--data-dir", first.dir() + "/second",
          "--listen-client-urls", client, "--advertise-client-urls", client,
          "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
          "--initial-cluster", "default=" + peer,
          "--listen-metrics-urls", metrics};
}

// The second server exits on the taken port, saying so as etcd does, and
// never shares the port (gRPC and cpp-httplib would set SO_REUSEPORT).
void ExpectRefused(ServerFlavor flavor, Taken taken) {
  auto first = ServerProcess::Start(flavor == ServerFlavor::kEtcd ? ServerOptions::Etcd()
                                                                  : ServerOptions::Capstan());
  ASSERT_TRUE(first.ok()) << first.status();
  CommandResult second =
      RunCommand(SecondServerArgv(flavor, **first, taken), "", std::chrono::seconds(20));
  ASSERT_FALSE(second.timed_out) << "the second server kept running on a taken port";
  EXPECT_FALSE(second.exit.exited && second.exit.exit_code == 0) << second.exit.ToString();
  EXPECT_NE((second.out + second.err).find("bind: address already in use"), std::string::npos)
      << second.out << second.err;
  EXPECT_TRUE((*first)->running());
}

TEST_P(ListenTest, ClientPortInUseIsRefused) { ExpectRefused(GetParam(), Taken::kClient); }
TEST_P(ListenTest, PeerPortInUseIsRefused) { ExpectRefused(GetParam(), Taken::kPeer); }
TEST_P(ListenTest, MetricsPortInUseIsRefused) { ExpectRefused(GetParam(), Taken::kMetrics); }

INSTANTIATE_TEST_SUITE_P(Flavors, ListenTest,
                         ::testing::Values(ServerFlavor::kEtcd, ServerFlavor::kCapstan),
                         FlavorTestName());

}  // namespace
}  // namespace capstan::testing
