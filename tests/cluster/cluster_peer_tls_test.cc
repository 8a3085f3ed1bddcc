// Three Capstan members whose peer URLs are https with mutual TLS
// (--peer-cert-file, --peer-key-file, --peer-trusted-ca-file,
// --peer-client-cert-auth): they elect a leader, a write through one member
// is read linearizably at another; a fourth process whose certificate
// comes from another CA cannot join, and the refusal is logged on both
// sides as etcd logs it: "rejected connection on peer endpoint" by the
// members' listeners, "prober detected unhealthy status ... remote error:
// tls: bad certificate" by the process that was turned away.

#include <signal.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cluster/cluster_fixture.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "gtest/gtest.h"
#include "process_fixture.h"
#include "reference.h"
#include "test_certificates.h"

namespace capstan::testing::cluster {
namespace {

using Clock = std::chrono::steady_clock;

std::string ReadFile(const std::string& path) {
  FILE* f = fopen(path.c_str(), "r");
  if (f == nullptr) return "";
  std::string out;
  char buf[8192];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
  fclose(f);
  return out;
}

// A line of `log` holding every one of `parts`, or "".
std::string LineWith(const std::string& log, const std::vector<std::string>& parts) {
  size_t start = 0;
  while (start < log.size()) {
    size_t end = log.find('\n', start);
    if (end == std::string::npos) end = log.size();
    const std::string line = log.substr(start, end - start);
    bool all = true;
    for (const auto& p : parts) all = all && absl::StrContains(line, p);
    if (all) return line;
    start = end + 1;
  }
  return "";
}

template <typename Pred>
bool PollUntil(std::chrono::milliseconds timeout, Pred pred) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return pred();
}

class ClusterPeerTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CAPSTAN_REQUIRE_REFERENCE("capstan", CapstanBinary());
    CAPSTAN_REQUIRE_REFERENCE("openssl", kOpensslBinary);
    // "ca" signs the members' certificate (CN "peer", for 127.0.0.1 and
    // localhost); "other", a second CA, signs the intruder's.
    TestCertificates certs;
    certs.leaves = {{.name = "peer", .common_name = "peer"},
                    {.name = "intruder", .common_name = "peer", .issuer = "other"}};
    const absl::Status made = MakeTestCertificates(certs_.path(), certs);
    ASSERT_TRUE(made.ok()) << made;
  }

  std::string Cert(const std::string& name) const { return certs_.path() + "/" + name; }

  std::vector<std::string> PeerTlsFlags(const std::string& identity, const std::string& ca) const {
    return {"--peer-cert-file", Cert(identity + ".pem"), "--peer-key-file", Cert(identity + ".key"),
            "--peer-trusted-ca-file", Cert(ca + ".pem"), "--peer-client-cert-auth"};
  }

  TempDir certs_{"capstan-peer-tls-certs"};
};

TEST_F(ClusterPeerTlsTest, MembersReplicateOverMutualTlsAndRefuseAForeignCertificate) {
  ClusterOptions options = ClusterOptions::Capstan(3);
  options.peer_scheme = "https";
  options.extra_args = PeerTlsFlags("peer", "ca");
  auto cluster = Cluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  Cluster& c = **cluster;
  for (int i = 0; i < c.size(); ++i) EXPECT_TRUE(absl::StartsWith(c.peer_url(i), "https://"));
  auto leader = c.WaitForLeader(std::chrono::seconds(20));
  ASSERT_TRUE(leader.ok()) << leader.status();

  // Written through one member, read linearizably at another.
  const int writer = 0, reader = 2;
  {
    auto kv = etcdserverpb::KV::NewStub(c.NewChannel(writer));
    etcdserverpb::PutRequest put;
    put.set_key("peer-tls");
    put.set_value("over mutual TLS");
    etcdserverpb::PutResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status s = kv->Put(&context, put, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
  }
  {
    auto kv = etcdserverpb::KV::NewStub(c.NewChannel(reader));
    etcdserverpb::RangeRequest range;
    range.set_key("peer-tls");  // serializable false: linearizable
    etcdserverpb::RangeResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status s = kv->Range(&context, range, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    ASSERT_EQ(response.kvs_size(), 1);
    EXPECT_EQ(response.kvs(0).value(), "over mutual TLS");
  }

  // A fourth process trusts the members' CA but presents a certificate
  // from another: the members' listeners refuse it in the handshake.
  TempDir intruder_dir("capstan-peer-tls-intruder");
  const int client_port = PickFreePort(), peer_port = PickFreePort();
  const std::string intruder_peer = absl::StrCat("https://127.0.0.1:", peer_port);
  std::vector<std::string> peers;
  for (int i = 0; i < c.size(); ++i) peers.push_back(absl::StrCat(c.name(i), "=", c.peer_url(i)));
  peers.push_back("intruder=" + intruder_peer);
  const std::string client_url = absl::StrCat("http://127.0.0.1:", client_port);
  std::vector<std::string> argv = {
      CapstanBinary(), "--name", "intruder", "--data-dir", intruder_dir.path() + "/data",
      "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
      "--listen-peer-urls", intruder_peer, "--initial-advertise-peer-urls", intruder_peer,
      "--initial-cluster", absl::StrJoin(peers, ","),
      "--initial-cluster-token", options.cluster_token, "--initial-cluster-state", "new"};
  for (const auto& flag : PeerTlsFlags("intruder", "ca")) argv.push_back(flag);
  const std::string intruder_log = intruder_dir.path() + "/server.log";
  auto pid = SpawnChild(argv, intruder_log);
  ASSERT_TRUE(pid.ok()) << pid.status();

  // Each member's listener logs the refusal, with Go's error.
  const std::vector<std::string> refused = {
      "rejected connection on peer endpoint (remote-addr 127.0.0.1:",
      "tls: failed to verify certificate: x509: certificate signed by unknown authority"};
  for (int i = 0; i < c.size(); ++i) {
    EXPECT_TRUE(PollUntil(std::chrono::seconds(20),
                          [&] { return !LineWith(c.ReadLog(i), refused).empty(); }))
        << c.name(i) << "'s log:\n" << c.ReadLog(i, 3000);
  }
  // The process turned away hears the alert, as etcd's prober reports it
  // (every 5 s while it lasts).
  const std::vector<std::string> alerted = {"prober detected unhealthy status",
                                            "remote error: tls: bad certificate"};
  EXPECT_TRUE(PollUntil(std::chrono::seconds(20),
                        [&] { return !LineWith(ReadFile(intruder_log), alerted).empty(); }))
      << ReadFile(intruder_log);
  // A refusing member does not flood its log: at most one line per client
  // address and error every 5 s (the intruder retries several times a
  // second).
  for (int i = 0; i < c.size(); ++i) {
    const std::string log = c.ReadLog(i);
    size_t lines = 0;
    for (size_t at = log.find(refused[1]); at != std::string::npos;
         at = log.find(refused[1], at + 1)) {
      ++lines;
    }
    EXPECT_LE(lines, 6u) << c.name(i);
  }

  // The intruder never got in: the members are still the three, still
  // agreeing on their leader and serving writes.
  {
    auto cluster_api = etcdserverpb::Cluster::NewStub(c.NewChannel(reader));
    etcdserverpb::MemberListRequest request;
    etcdserverpb::MemberListResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    const grpc::Status s = cluster_api->MemberList(&context, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.members_size(), 3);
  }
  EXPECT_TRUE(c.WaitForLeader(std::chrono::seconds(10)).ok());
  kill(*pid, SIGKILL);
  ReapChild(*pid, /*block=*/true, nullptr);
}

}  // namespace
}  // namespace capstan::testing::cluster
