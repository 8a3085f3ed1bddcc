// Peer TLS from etcd's peer flags, between real transports on 127.0.0.1
// with certificates made by the openssl command: mutual TLS, the allowed CN
// on both sides, the CRL, a client certificate that must name its address,
// auto TLS; and how the flags resolve.

#include "server/peer/peer_tls.h"

#include <stdlib.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/peer/peer_testing.h"
#include "server/peer/peer_transport.h"
#include "tests/reference.h"

namespace capstan::server {
namespace {

using namespace peer_testing;  // NOLINT: the helpers of these tests

// Certificates made by openssl: a CA, "peer" certificates (CN "peer",
// for 127.0.0.1), "intruder" (CN "intruder", same CA), "revoked" (CN
// "peer", revoked by crl.pem), "foreign" (CN "peer", another CA), "farip"
// (CN "peer", naming only 10.1.2.3).
constexpr char kMakeCertificates[] = R"sh(
set -e
mkdir -p db && : > db/index.txt && echo 1000 > db/serial && echo 1000 > db/crlnumber
cat > ca.cnf <<'CNF'
[ca]
default_ca = testca
[testca]
dir = .
database = db/index.txt
serial = db/serial
crlnumber = db/crlnumber
new_certs_dir = db
default_md = sha256
policy = anything
copy_extensions = none
default_crl_days = 30
default_days = 30
unique_subject = no
[anything]
commonName = supplied
[leaf]
subjectAltName = IP:127.0.0.1,DNS:localhost
extendedKeyUsage = serverAuth,clientAuth
[farip]
subjectAltName = IP:10.1.2.3
extendedKeyUsage = serverAuth,clientAuth
CNF
ec="-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"
openssl req -x509 $ec -keyout ca.key -out ca.pem -days 30 -subj /CN=testca 2>/dev/null
openssl req -x509 $ec -keyout other.key -out other.pem -days 30 -subj /CN=otherca 2>/dev/null
leaf() {
  openssl req $ec -keyout $1.key -out $1.csr -subj /CN=$2 2>/dev/null
  openssl ca -batch -config ca.cnf -cert ${3:-ca}.pem -keyfile ${3:-ca}.key -extensions ${4:-leaf} \
    -in $1.csr -out $1.pem 2>/dev/null
}
leaf peer1 peer
leaf peer2 peer
leaf intruder intruder
leaf revoked peer
leaf foreign peer other
leaf farip peer ca farip
openssl ca -batch -config ca.cnf -cert ca.pem -keyfile ca.key -revoke revoked.pem 2>/dev/null
openssl ca -batch -config ca.cnf -cert ca.pem -keyfile ca.key -gencrl -out crl.pem 2>/dev/null
)sh";

class PeerTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    char dir[] = "/tmp/capstan-peer-tls-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = new std::string(dir);
    const std::string script = *dir_ + "/make.sh";
    FILE* f = std::fopen(script.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs(kMakeCertificates, f);
    std::fclose(f);
    const int rc = std::system(absl::StrCat("cd ", *dir_, " && PATH=/usr/bin:/bin bash make.sh").c_str());
    ASSERT_EQ(rc, 0);
  }
  static void TearDownTestSuite() {
    std::error_code ec;
    std::filesystem::remove_all(*dir_, ec);
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { CAPSTAN_REQUIRE_REFERENCE("openssl", "/usr/bin/openssl"); }

  // The peer flags of a member presenting `name`.pem, as ResolvePeerTls
  // makes them.
  static PeerTls Tls(const std::string& name, const std::string& ca = "ca") {
    ServerConfig config;
    config.peer_cert_file = *dir_ + "/" + name + ".pem";
    config.peer_key_file = *dir_ + "/" + name + ".key";
    config.peer_trusted_ca_file = *dir_ + "/" + ca + ".pem";
    config.peer_client_cert_auth = true;
    config.peer_cert_allowed_cn = "peer";
    config.peer_crl_file = *dir_ + "/crl.pem";
    auto tls = ResolvePeerTls(config);
    EXPECT_TRUE(tls.ok()) << tls.status();
    return *tls;
  }

  static std::string* dir_;
};
std::string* PeerTlsTest::dir_ = nullptr;

TEST_F(PeerTlsTest, MutualTlsAdmitsPeersAndRefusesOthers) {
  auto a = StartMember(1, kCluster, 0, Tls("peer1"));
  auto b = StartMember(2, kCluster, 0, Tls("peer2"));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(absl::StartsWith(a->url, "https://"));
  Connect(*a, *b);
  Connect(*b, *a);
  ASSERT_TRUE(WaitFor([&] {
    a->transport->Send({Message(1, 2, 1)});
    b->transport->Send({Message(2, 1, 1)});
    return b->recorder.CountFrom(1) > 0 && a->recorder.CountFrom(2) > 0;
  })) << a->errors.Describe(2);

  // Each of these dials b and is turned away at the handshake: a CN that is
  // not --peer-cert-allowed-cn, a certificate --peer-crl-file revokes, one
  // from a CA b does not trust, and none at all.
  struct Case {
    std::string name;
    std::optional<PeerTls> tls;
  };
  std::vector<Case> cases;
  PeerTls intruder = Tls("intruder");
  intruder.allowed_cn.clear();  // it accepts b; b must refuse it
  cases.push_back({"intruder", intruder});
  cases.push_back({"revoked", Tls("revoked")});
  PeerTls foreign = Tls("foreign");
  foreign.trusted_ca_file = *dir_ + "/ca.pem";  // it trusts b; b does not trust it
  cases.push_back({"foreign", foreign});
  uint64_t id = 10;
  {
    // The control: a third member made the same way with a good
    // certificate gets through.
    auto x = StartMember(++id, kCluster, 0, Tls("peer1"));
    ASSERT_NE(x, nullptr);
    Connect(*x, *b);
    ASSERT_TRUE(WaitFor([&] {
      x->transport->Send({Message(id, 2, 1)});
      return b->recorder.CountFrom(id) > 0;
    })) << x->errors.Describe(2);
  }
  for (auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto x = StartMember(++id, kCluster, 0, c.tls);
    ASSERT_NE(x, nullptr);
    Connect(*x, *b);
    ASSERT_TRUE(WaitFor([&] {
      x->transport->Send({Message(id, 2, 1)});
      return x->recorder.Unreachable(2) >= 2;
    }));
    EXPECT_EQ(b->recorder.CountFrom(id), 0u);
    // Turned away before any call: the connection fails, nothing is refused
    // by the service.
    EXPECT_FALSE(x->errors.Saw(2, absl::StatusCode::kFailedPrecondition, "cluster ID mismatch"));
  }
  // A plain-text member cannot talk to an https peer URL at all.
  auto plain = StartMember(20);
  ASSERT_NE(plain, nullptr);
  plain->transport->AddPeer(2, {absl::StrCat("http://127.0.0.1:", b->transport->BoundPorts()[0])});
  ASSERT_TRUE(WaitFor([&] {
    plain->transport->Send({Message(20, 2, 1)});
    return plain->recorder.Unreachable(2) >= 2;
  }));
  EXPECT_EQ(b->recorder.CountFrom(20), 0u);
}

TEST_F(PeerTlsTest, ClientCertificateMustNameTheCallersAddress) {
  std::ifstream in(*dir_ + "/peer1.pem");
  std::stringstream pem;
  pem << in.rdbuf();
  EXPECT_EQ(PeerAddressMismatch(pem.str(), "127.0.0.1"), "");
  EXPECT_EQ(PeerAddressMismatch(pem.str(), "10.9.9.9").substr(0, 30),
            "tls: \"10.9.9.9\" does not match");

  auto b = StartMember(2, kCluster, 0, Tls("peer2"));
  ASSERT_NE(b, nullptr);
  // farip calls from 127.0.0.1 with a certificate for 10.1.2.3 only: b's
  // listener refuses it in the handshake (and logs "x509: certificate is
  // valid for 10.1.2.3, not 127.0.0.1"), so x hears the alert.
  auto x = StartMember(3, kCluster, 0, Tls("farip"));
  ASSERT_NE(x, nullptr);
  Connect(*x, *b);
  ASSERT_TRUE(WaitFor([&] {
    x->transport->Send({Message(3, 2, 1)});
    return x->errors.Saw(2, absl::StatusCode::kUnavailable, "remote error: tls: bad certificate");
  })) << x->errors.Describe(2);
  EXPECT_EQ(b->recorder.CountFrom(3), 0u);

  // --peer-skip-client-san-verification lets it in.
  PeerTls skip = Tls("peer2");
  skip.check_client_san = false;
  auto c = StartMember(4, kCluster, 0, skip);
  ASSERT_NE(c, nullptr);
  x->transport->AddPeer(4, {c->url});
  ASSERT_TRUE(WaitFor([&] {
    x->transport->Send({Message(3, 4, 1)});
    return c->recorder.CountFrom(3) > 0;
  })) << x->errors.Describe(4);
}

TEST_F(PeerTlsTest, AllowedHostnameChecksTheSubjectAltNames) {
  // The certificates name localhost and 127.0.0.1.
  for (const auto& [hostname, admitted] :
       std::vector<std::pair<std::string, bool>>{{"localhost", true}, {"127.0.0.1", true},
                                                 {"etcd.example.com", false}}) {
    SCOPED_TRACE(hostname);
    PeerTls server = Tls("peer2");
    server.allowed_cn.clear();
    server.allowed_hostname = hostname;
    PeerTls client = Tls("peer1");
    client.allowed_cn.clear();
    auto b = StartMember(2, kCluster, 0, server);
    auto a = StartMember(1, kCluster, 0, client);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    Connect(*a, *b);
    if (admitted) {
      ASSERT_TRUE(WaitFor([&] {
        a->transport->Send({Message(1, 2, 1)});
        return b->recorder.CountFrom(1) > 0;
      })) << a->errors.Describe(2);
    } else {
      ASSERT_TRUE(WaitFor([&] {
        a->transport->Send({Message(1, 2, 1)});
        return a->recorder.Unreachable(2) >= 2;
      }));
      EXPECT_EQ(b->recorder.CountFrom(1), 0u);
    }
  }
}

TEST_F(PeerTlsTest, AllowedCnAlsoChecksThePeerDialed) {
  // As etcd's VerifyPeerCertificate does on both sides: a member allowing
  // only CN "peer" does not talk to a server presenting "intruder".
  PeerTls server = Tls("intruder");
  server.allowed_cn.clear();
  auto b = StartMember(2, kCluster, 0, server);
  auto a = StartMember(1, kCluster, 0, Tls("peer1"));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(*a, *b);
  ASSERT_TRUE(WaitFor([&] {
    a->transport->Send({Message(1, 2, 1)});
    return a->recorder.Unreachable(2) >= 2;
  }));
  EXPECT_EQ(b->recorder.CountFrom(1), 0u);
}

TEST(PeerTlsConfigTest, ResolvesEtcdsPeerFlags) {
  ServerConfig config;
  EXPECT_FALSE(HasPeerCertificate(config));
  config.peer_cert_file = "/c.pem";
  config.peer_key_file = "/k.pem";
  config.peer_trusted_ca_file = "/ca.pem";
  auto tls = ResolvePeerTls(config);
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE(tls->require_client_cert);  // a trusted CA alone requires client certificates
  EXPECT_EQ(tls->client_cert_file, "/c.pem");  // the peer certificate dials too
  config.peer_client_cert_file = "/cc.pem";
  config.peer_client_key_file = "/ck.pem";
  tls = ResolvePeerTls(config);
  ASSERT_TRUE(tls.ok());
  EXPECT_EQ(tls->client_cert_file, "/cc.pem");
  config.peer_cert_allowed_cn = "a";
  config.peer_cert_allowed_hostname = "b";
  tls = ResolvePeerTls(config);
  EXPECT_EQ(tls.status().message(),
            "AllowedCN and AllowedHostname are mutually exclusive (cn=\"a\", hostname=\"b\")");

  ServerConfig https;
  https.listen_peer_urls = {{"https", "127.0.0.1:0"}};
  auto options = PeerTransportOptionsFromConfig(https, 1, 2);
  EXPECT_EQ(options.status().message(),
            "cannot listen on TLS for 127.0.0.1:0: KeyFile and CertFile are not presented");
}

TEST(PeerTlsConfigTest, AutoTlsMakesASelfSignedPairAndSkipsVerification) {
  char dir[] = "/tmp/capstan-peer-auto-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  ServerConfig config;
  config.data_dir = dir;
  config.peer_auto_tls = true;
  config.listen_peer_urls = {{"https", "127.0.0.1:0"}};
  auto tls = ResolvePeerTls(config);
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE(tls->self_signed);
  EXPECT_EQ(tls->cert_file, std::string(dir) + "/fixtures/peer/cert.pem");
  // Two members on the pair talk to each other without a CA.
  auto a = StartMember(1, kCluster, 0, *tls);
  auto b = StartMember(2, kCluster, 0, *tls);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(*a, *b);
  ASSERT_TRUE(WaitFor([&] {
    a->transport->Send({Message(1, 2, 1)});
    return b->recorder.CountFrom(1) > 0;
  })) << a->errors.Describe(2);
  a.reset();
  b.reset();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}
}  // namespace
}  // namespace capstan::server
