// Peer TLS from etcd's peer flags, between real transports on 127.0.0.1
// with certificates made by the openssl command: mutual TLS, the allowed CN
// on both sides, the CRL, a client certificate that must name its address,
// auto TLS; a first connection that carries what was queued before it; the
// listener's handshake (HandshakeAsServer) in Go's words when the dialer
// hangs up or sends no certificate, and its ends at the stop fd and the
// deadline; and how the flags resolve.

#include "server/peer/peer_tls.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "openssl/ssl.h"
#include "server/peer/peer_testing.h"
#include "server/peer/peer_tls_handshake.h"
#include "server/peer/peer_transport.h"
#include "tests/process_fixture.h"
#include "tests/reference.h"
#include "tests/test_certificates.h"

namespace capstan::server {
namespace {

using namespace peer_testing;  // NOLINT: the helpers of these tests
using capstan::testing::kOpensslBinary;
using capstan::testing::MakeTestCertificates;
using capstan::testing::TempDir;
using capstan::testing::TestCertificates;

// A connected pair of local sockets: `server`, non-blocking, for
// HandshakeAsServer, and `client`. Both closed with the pair.
struct SocketPair {
  SocketPair() {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0) return;
    server = fds[0];
    client = fds[1];
    fcntl(server, F_SETFL, fcntl(server, F_GETFL) | O_NONBLOCK);
  }
  ~SocketPair() {
    if (server >= 0) close(server);
    if (client >= 0) close(client);
  }
  int server = -1;
  int client = -1;
};

struct SslFree {
  void operator()(SSL* ssl) const { SSL_free(ssl); }
};
using SslPtr = std::unique_ptr<SSL, SslFree>;

// A client session of ctx on fd that has sent its ClientHello and waits for
// the server's answer (fd is made non-blocking for that).
SslPtr SendClientHello(SSL_CTX* ctx, int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  SslPtr ssl(SSL_new(ctx));
  SSL_set_fd(ssl.get(), fd);
  const int ret = SSL_connect(ssl.get());
  EXPECT_EQ(ret, -1);
  EXPECT_EQ(SSL_get_error(ssl.get(), ret), SSL_ERROR_WANT_READ);
  return ssl;
}

class PeerTlsTest : public ::testing::Test {
 protected:
  // Certificates of "ca": "peer1" and "peer2" (CN "peer", for 127.0.0.1
  // and localhost), "intruder" (CN "intruder"), "revoked" (CN "peer",
  // revoked by crl.pem), "farip" (CN "peer", naming only 10.1.2.3); and
  // "foreign" (CN "peer") of another CA, "other".
  static void SetUpTestSuite() {
    certs_ = new TempDir("capstan-peer-tls");
    TestCertificates certs;
    certs.leaves = {{.name = "peer1", .common_name = "peer"},
                    {.name = "peer2", .common_name = "peer"},
                    {.name = "intruder", .common_name = "intruder"},
                    {.name = "revoked", .common_name = "peer"},
                    {.name = "foreign", .common_name = "peer", .issuer = "other"},
                    {.name = "farip", .common_name = "peer", .subject_alt_name = "IP:10.1.2.3"}};
    certs.revoked = {"revoked"};
    certs.revocation_lists = {{.file = "crl.pem"}};
    const absl::Status made = MakeTestCertificates(certs_->path(), certs);
    ASSERT_TRUE(made.ok()) << made;
  }
  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
  }
  void SetUp() override { CAPSTAN_REQUIRE_REFERENCE("openssl", kOpensslBinary); }

  // The peer flags of a member presenting `name`.pem, as ResolvePeerTls
  // makes them.
  static PeerTls Tls(const std::string& name, const std::string& ca = "ca") {
    ServerConfig config;
    config.peer_cert_file = Cert(name + ".pem");
    config.peer_key_file = Cert(name + ".key");
    config.peer_trusted_ca_file = Cert(ca + ".pem");
    config.peer_client_cert_auth = true;
    config.peer_cert_allowed_cn = "peer";
    config.peer_crl_file = Cert("crl.pem");
    auto tls = ResolvePeerTls(config);
    EXPECT_TRUE(tls.ok()) << tls.status();
    return *tls;
  }

  static std::string Cert(const std::string& file) { return certs_->path() + "/" + file; }

  static TempDir* certs_;
};
TempDir* PeerTlsTest::certs_ = nullptr;

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
  foreign.trusted_ca_file = Cert("ca.pem");  // it trusts b; b does not trust it
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
  std::ifstream in(Cert("peer1.pem"));
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

TEST_F(PeerTlsTest, FirstConnectionCarriesWhatWasQueuedBeforeIt) {
  // A failed connection attempt drops the messages queued for it, so the
  // message sent before the first https connection exists arrives only if
  // that connection (the probe's handshake, then gRPC's: TLS and the
  // HTTP/2 settings through the listener) succeeds at once.
  std::unique_ptr<Member> a, b;
  ASSERT_NO_FATAL_FAILURE(StartConnectedPair(&a, &b, Tls("peer1"), Tls("peer2")));
  a->transport->Send({Message(1, 2, 7)});
  ASSERT_TRUE(WaitFor([&] {
    return b->recorder.CountFrom(1) > 0 || a->recorder.Unreachable(2) > 0;
  }));
  EXPECT_EQ(b->recorder.From(1), std::vector<uint64_t>{7}) << a->errors.Describe(2);
  EXPECT_EQ(a->recorder.Unreachable(2), 0) << a->errors.Describe(2);
  EXPECT_EQ(a->errors.Count(2), 0u) << a->errors.Describe(2);
}

TEST_F(PeerTlsTest, ABurstLargerThanTheConnectionTakesArrivesInOrder) {
  // On TLS a write the connection does not take at once is retried with the
  // same bytes, by the sender's thread.
  std::unique_ptr<Member> a, b;
  ASSERT_NO_FATAL_FAILURE(StartConnectedPair(&a, &b, Tls("peer1"), Tls("peer2")));
  ExpectABurstInOrder(*a, *b);
}

TEST_F(PeerTlsTest, ClientHangingUpMidHandshakeIsEofAsInGo) {
  // The listener's side of a dialer that gave up after its ClientHello (as
  // gRPC does when its connect deadline passes): etcd logs "EOF", or
  // "unexpected EOF" when the dialer stopped inside a record. OpenSSL
  // answers the EOF with an alert of its own (decode_error), which is not
  // the dialer's "remote error".
  auto server = peer::NewPeerServerContext(Tls("peer2"));
  auto client = peer::NewPeerClientContext(Tls("peer1"));
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(client.ok()) << client.status();
  for (const bool whole_record : {true, false}) {
    SCOPED_TRACE(whole_record ? "after the ClientHello" : "inside the ClientHello");
    SocketPair pair;
    ASSERT_GE(pair.server, 0);
    SslPtr dialer;
    if (whole_record) {
      dialer = SendClientHello(client->get(), pair.client);
    } else {
      // A handshake record's header announcing 512 bytes, and 3 of them.
      const unsigned char partial[] = {0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01};
      ASSERT_EQ(write(pair.client, partial, sizeof partial), static_cast<ssize_t>(sizeof partial));
    }
    ASSERT_EQ(shutdown(pair.client, SHUT_WR), 0);
    SSL* ssl = nullptr;
    const peer::HandshakeResult result = peer::HandshakeAsServer(
        server->get(), pair.server, "127.0.0.1", absl::Seconds(10), -1, &ssl);
    EXPECT_EQ(ssl, nullptr);
    EXPECT_EQ(result.error, whole_record ? "EOF" : "unexpected EOF");
  }
}

TEST_F(PeerTlsTest, ClientWithoutCertificateIsRefusedInGosWords) {
  // A dialer presenting no certificate: the listener's own refusal, not the
  // certificate_required alert it sent read back as the dialer's.
  auto server = peer::NewPeerServerContext(Tls("peer2"));
  ASSERT_TRUE(server.ok()) << server.status();
  peer::SslCtxPtr client(SSL_CTX_new(TLS_client_method()));
  ASSERT_NE(client, nullptr);
  SSL_CTX_set_verify(client.get(), SSL_VERIFY_NONE, nullptr);
  SocketPair pair;
  ASSERT_GE(pair.server, 0);
  peer::HandshakeResult result;
  SSL* ssl = nullptr;
  std::thread listener([&] {
    result = peer::HandshakeAsServer(server->get(), pair.server, "127.0.0.1", absl::Seconds(10),
                                     -1, &ssl);
  });
  SslPtr dialer(SSL_new(client.get()));
  SSL_set_fd(dialer.get(), pair.client);
  SSL_connect(dialer.get());  // succeeds in TLS 1.3: the refusal comes after
  listener.join();
  EXPECT_EQ(ssl, nullptr);
  EXPECT_EQ(result.error, "tls: client didn't provide a certificate");
  EXPECT_FALSE(result.peer_sent_certificate);
}

TEST_F(PeerTlsTest, HandshakeEndsAtTheStopFdOrTheDeadline) {
  auto server = peer::NewPeerServerContext(Tls("peer2"));
  auto client = peer::NewPeerClientContext(Tls("peer1"));
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(client.ok()) << client.status();
  {
    // A dialer that went silent after its ClientHello and a listener
    // stopping: the handshake ends at once rather than at its 10 s
    // deadline ("i/o timeout").
    SocketPair pair;
    ASSERT_GE(pair.server, 0);
    SslPtr dialer = SendClientHello(client->get(), pair.client);
    const int stop = eventfd(1, EFD_CLOEXEC);  // readable
    ASSERT_GE(stop, 0);
    SSL* ssl = nullptr;
    const peer::HandshakeResult result = peer::HandshakeAsServer(
        server->get(), pair.server, "127.0.0.1", absl::Seconds(10), stop, &ssl);
    close(stop);
    EXPECT_EQ(ssl, nullptr);
    EXPECT_EQ(result.error, "use of closed network connection");
  }
  {
    // Silent from the start, no stop fd: the deadline.
    SocketPair pair;
    ASSERT_GE(pair.server, 0);
    SSL* ssl = nullptr;
    const peer::HandshakeResult result = peer::HandshakeAsServer(
        server->get(), pair.server, "127.0.0.1", absl::Milliseconds(1), -1, &ssl);
    EXPECT_EQ(ssl, nullptr);
    EXPECT_EQ(result.error, "i/o timeout");
  }
}

TEST_F(PeerTlsTest, ProbeEndsAtItsDeadline) {
  auto client = peer::NewPeerClientContext(Tls("peer1"));
  ASSERT_TRUE(client.ok()) << client.status();
  // A listener that never answers: the kernel completes the connection,
  // nobody speaks TLS. The probe fails at its deadline, not a read later.
  int port = 0;
  const int listener = peer_testing::ListenOnLoopback(&port);
  ASSERT_GE(listener, 0);
  const absl::Time start = absl::Now();
  EXPECT_EQ(peer::ProbePeer(client->get(), "127.0.0.1", port, absl::Milliseconds(200)),
            "i/o timeout");
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
  close(listener);
  // Nobody listening: Go's dial error.
  EXPECT_EQ(peer::ProbePeer(client->get(), "127.0.0.1", port, absl::Milliseconds(200)),
            absl::StrCat("dial tcp 127.0.0.1:", port, ": connect: connection refused"));
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
