// TLS on client and metrics URLs, against a real etcd and against capstan
// with the same flags: certificates made in the test by the openssl command
// (a CA, a server certificate, client certificates that are valid, expired,
// revoked in a CRL, signed by another CA, or naming another address). Each
// server listens on http (for the fixture's readiness check) and on https,
// for client and for metrics URLs; every etcdctl call and every curl request
// over https must have the same outcome on both. With auth enabled, the
// verified client certificate's common name is the user.

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "process_fixture.h"
#include "test_certificates.h"

namespace capstan::testing {
namespace {

// Server and client certificates of "ca": crl.pem revokes revoked.pem,
// crl-expired.pem too but its next update was due in 2020, crl-none.pem
// revokes nothing. Leaf certificates name 127.0.0.1 and localhost, except
// farip (only 10.1.2.3) and nosan (no subject alternative name); foreign is
// signed by the second CA, "other".
TestCertificates Certificates() {
  TestCertificates certs;
  certs.leaves = {
      {.name = "server", .common_name = "localhost"},
      {.name = "root", .common_name = "root"},
      {.name = "user", .common_name = "u"},
      {.name = "expired", .common_name = "root", .not_after = "20200201000000Z"},
      {.name = "revoked", .common_name = "root"},
      {.name = "foreign", .common_name = "root", .issuer = "other"},
      {.name = "farip", .common_name = "root", .subject_alt_name = "IP:10.1.2.3"},
      {.name = "nosan", .common_name = "root", .subject_alt_name = ""},
  };
  certs.revoked = {"revoked"};
  certs.revocation_lists = {
      {.file = "crl-none.pem", .lists_revoked = false},
      {.file = "crl.pem"},
      {.file = "crl-expired.pem", .last_update = "20200101000000Z",
       .next_update = "20200201000000Z"},
  };
  return certs;
}

// Runs the real binary with ",https://127.0.0.1:<port>" appended to the
// fixture's client URLs and metrics URLs.
constexpr char kWrapper[] = R"sh(#!/bin/bash
args=(); prev=""
for a in "$@"; do
  if [ "$prev" = "--listen-client-urls" ] || [ "$prev" = "--advertise-client-urls" ]; then
    a="$a,https://127.0.0.1:TLS_PORT"
  elif [ "$prev" = "--listen-metrics-urls" ]; then
    a="$a,https://127.0.0.1:METRICS_PORT"
  fi
  args+=("$a"); prev="$a"
done
exec REAL "${args[@]}"
)sh";

struct Outcome {
  int code = -1;
  std::string out;
  std::string last_err;  // the last line of stderr: etcdctl's "Error: ..."
  std::string ToString() const {
    return absl::StrCat("exit ", code, "\nstdout:\n", out, "last stderr line: ", last_err);
  }
};

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new TempDir("capstan-tls-certs");
    const absl::Status made = MakeTestCertificates(certs_->path(), Certificates());
    ASSERT_TRUE(made.ok()) << made;
  }
  static void TearDownTestSuite() {
    delete certs_;
    certs_ = nullptr;
  }

  void SetUp() override {
    CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
    CAPSTAN_REQUIRE_REFERENCE("etcdctl", EtcdctlBinary());
    CAPSTAN_REQUIRE_REFERENCE("capstan", CapstanBinary());
  }

  static std::string Cert(const std::string& name) { return certs_->path() + "/" + name; }

  // Server TLS flags with client certificate authentication and the CRL.
  static std::vector<std::string> MutualTlsFlags() {
    return {"--cert-file=" + Cert("server.pem"), "--key-file=" + Cert("server.key"),
            "--trusted-ca-file=" + Cert("ca.pem"), "--client-cert-auth",
            "--client-crl-file=" + Cert("crl.pem")};
  }

  struct TlsServer {
    std::unique_ptr<TempDir> wrapper_dir;
    std::unique_ptr<ServerProcess> process;
    int tls_port = 0;
    int metrics_tls_port = 0;
    std::string endpoint() const { return absl::StrCat("https://127.0.0.1:", tls_port); }
    std::string metrics_url() const { return absl::StrCat("https://127.0.0.1:", metrics_tls_port); }
  };

  // Starts a server whose wrapper adds https client and metrics URLs on ports of
  // its own. ServerProcess::Start retries its own ports when one was taken by the
  // time the server bound it; a taken wrapper port is retried here, on new ones.
  static absl::StatusOr<TlsServer> Start(ServerFlavor flavor, const std::vector<std::string>& flags) {
    absl::StatusOr<TlsServer> s;
    for (int attempt = 0; attempt < 4; ++attempt) {
      s = StartOnce(flavor, flags);
      if (s.ok() || !IsPortInUseFailure(std::string(s.status().message()))) break;
    }
    return s;
  }

  static absl::StatusOr<TlsServer> StartOnce(ServerFlavor flavor, std::vector<std::string> flags) {
    TlsServer s;
    s.tls_port = PickFreePort();
    s.metrics_tls_port = PickFreePort();
    s.wrapper_dir = std::make_unique<TempDir>("capstan-tls-wrapper");
    const std::string wrapper = s.wrapper_dir->path() + "/server";
    std::string script = kWrapper;
    script.replace(script.find("TLS_PORT"), 8, std::to_string(s.tls_port));
    script.replace(script.find("METRICS_PORT"), 12, std::to_string(s.metrics_tls_port));
    script.replace(script.find("REAL"), 4,
                   flavor == ServerFlavor::kEtcd ? EtcdBinary() : CapstanBinary());
    std::ofstream(wrapper) << script;
    ::chmod(wrapper.c_str(), 0755);
    ServerOptions o = flavor == ServerFlavor::kEtcd ? ServerOptions::Etcd() : ServerOptions::Capstan();
    o.binary = wrapper;
    o.extra_args = std::move(flags);
    if (flavor == ServerFlavor::kCapstan) o.extra_args.push_back("--bcrypt-cost=4");
    auto p = ServerProcess::Start(o);
    if (!p.ok()) return p.status();
    s.process = std::move(*p);
    return s;
  }

  // etcdctl over https with the client certificate `client` ("" for none).
  static Outcome Etcdctl(const std::string& endpoint, const std::string& client,
                         const std::vector<std::string>& args, const std::string& ca = "ca") {
    std::vector<std::string> argv = {EtcdctlBinary(), "--endpoints=" + endpoint,
                                     "--dial-timeout=1s", "--command-timeout=3s",
                                     "--cacert=" + Cert(ca + ".pem")};
    if (!client.empty()) {
      argv.push_back("--cert=" + Cert(client + ".pem"));
      argv.push_back("--key=" + Cert(client + ".key"));
    }
    argv.insert(argv.end(), args.begin(), args.end());
    CommandResult r = RunCommand(argv, "", std::chrono::seconds(20));
    Outcome o;
    o.code = r.exit.exited ? r.exit.exit_code : -r.exit.term_signal;
    o.out = r.out;
    // etcdctl's zap retry logs carry timestamps and ids: skip them.
    for (absl::string_view line : absl::StrSplit(r.err, '\n', absl::SkipEmpty())) {
      if (!absl::StartsWith(line, "{\"level\"")) o.last_err = std::string(line);
    }
    return o;
  }

  // The same etcdctl call on both servers at once; expects the same outcome
  // and returns capstan's.
  Outcome Both(const std::string& client, const std::vector<std::string>& args,
               const std::string& ca = "ca") {
    auto e = std::async(std::launch::async, [&] { return Etcdctl(etcd_.endpoint(), client, args, ca); });
    Outcome c = Etcdctl(capstan_.endpoint(), client, args, ca);
    Outcome eo = e.get();
    const std::string what = absl::StrCat("cert ", client.empty() ? "(none)" : client, ": etcdctl ",
                                          absl::StrJoin(args, " "), "\netcd:\n", eo.ToString(),
                                          "\ncapstan:\n", c.ToString());
    EXPECT_EQ(eo.code, c.code) << what;
    EXPECT_EQ(eo.out, c.out) << what;
    EXPECT_EQ(eo.last_err, c.last_err) << what;
    return c;
  }

  // curl GET url+path (POST with a body `post`) with the client certificate
  // `client` ("" for none), trusting `ca` ("" to trust any server). The HTTP status, or "000" when
  // there was no HTTP response (a refused handshake, a closed connection).
  static std::string Curl(const std::string& url, const std::string& path,
                          const std::string& client, const std::string& ca = "ca",
                          std::string* body = nullptr, const std::string& post = "") {
    std::vector<std::string> argv = {"/usr/bin/curl", "-sS", "--max-time", "10",
                                     "-w", "\n%{http_code}"};
    if (!post.empty()) argv.insert(argv.end(), {"-d", post});
    if (ca.empty()) {
      argv.push_back("-k");
    } else {
      argv.insert(argv.end(), {"--cacert", Cert(ca + ".pem")});
    }
    if (!client.empty()) {
      argv.insert(argv.end(), {"--cert", Cert(client + ".pem"), "--key", Cert(client + ".key")});
    }
    argv.push_back(url + path);
    CommandResult r = RunCommand(argv, "", std::chrono::seconds(20));
    const size_t nl = r.out.rfind('\n');
    if (body) *body = r.out.substr(0, nl == std::string::npos ? 0 : nl);
    return nl == std::string::npos ? r.out : r.out.substr(nl + 1);
  }

  // The same request on both servers' https metrics URLs; expects the same
  // status and returns capstan's.
  std::string BothMetrics(const std::string& client, const std::string& path,
                          const std::string& ca = "ca") {
    auto e = std::async(std::launch::async,
                        [&] { return Curl(etcd_.metrics_url(), path, client, ca); });
    std::string c = Curl(capstan_.metrics_url(), path, client, ca);
    std::string eo = e.get();
    EXPECT_EQ(eo, c) << "cert " << (client.empty() ? "(none)" : client) << ", ca "
                     << (ca.empty() ? "(any)" : ca) << ": GET " << path;
    return c;
  }

  // Whether `openssl s_client` completes a handshake with the TLS 1.2 cipher
  // `cipher` (OpenSSL name) and the client certificate root.
  static bool Handshakes(int port, const std::string& cipher) {
    CommandResult r = RunCommand(
        {"/usr/bin/openssl", "s_client", "-connect", absl::StrCat("127.0.0.1:", port), "-tls1_2",
         "-cipher", cipher, "-CAfile", Cert("ca.pem"), "-cert", Cert("root.pem"), "-key",
         Cert("root.key"), "-brief"},
        "", std::chrono::seconds(10));
    return absl::StrContains(r.err, "CONNECTION ESTABLISHED");
  }

  void StartBoth(const std::vector<std::string>& flags) {
    auto e = Start(ServerFlavor::kEtcd, flags);
    ASSERT_TRUE(e.ok()) << e.status();
    etcd_ = std::move(*e);
    auto c = Start(ServerFlavor::kCapstan, flags);
    ASSERT_TRUE(c.ok()) << c.status();
    capstan_ = std::move(*c);
  }

  static TempDir* certs_;
  TlsServer etcd_, capstan_;
};

TempDir* TlsTest::certs_ = nullptr;

TEST_F(TlsTest, ClientCertificatesAreVerified) {
  StartBoth(MutualTlsFlags());
  EXPECT_EQ(Both("root", {"put", "k", "v"}).out, "OK\n");
  EXPECT_EQ(Both("root", {"get", "k", "--print-value-only"}).out, "v\n");
  // Refused at the handshake: etcdctl gives up dialing.
  for (const std::string& bad : {std::string(""), std::string("foreign"), std::string("expired"),
                                 std::string("revoked")}) {
    SCOPED_TRACE(bad);
    Outcome o = Both(bad, {"get", "k"});
    EXPECT_NE(o.code, 0) << o.ToString();
    EXPECT_EQ(o.last_err, "Error: context deadline exceeded");
  }
  // A client that does not trust the server's CA.
  EXPECT_NE(Both("root", {"get", "k"}, "other").code, 0);

  // A plaintext client on the TLS port: etcdctl with only an http endpoint
  // (no TLS flags) fails on both servers.
  for (const TlsServer* s : {&etcd_, &capstan_}) {
    CommandResult plain = RunCommand(
        {EtcdctlBinary(), "--endpoints=http://127.0.0.1:" + std::to_string(s->tls_port),
         "--dial-timeout=1s", "--command-timeout=3s", "get", "k"},
        "", std::chrono::seconds(20));
    EXPECT_FALSE(plain.exit.exited && plain.exit.exit_code == 0)
        << (s == &etcd_ ? "etcd" : "capstan") << " served a plaintext client:\n" << plain.out;
  }
  auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", capstan_.tls_port),
                                     grpc::InsecureChannelCredentials());
  auto kv = etcdserverpb::KV::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  etcdserverpb::RangeRequest req;
  req.set_key("k");
  etcdserverpb::RangeResponse resp;
  grpc::Status s = kv->Range(&ctx, req, &resp);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.error_code() == grpc::UNAVAILABLE || s.error_code() == grpc::DEADLINE_EXCEEDED)
      << s.error_code() << " " << s.error_message();
}

TEST_F(TlsTest, CommonNameIsTheUserWhenAuthIsOn) {
  StartBoth(MutualTlsFlags());
  Both("root", {"user", "add", "root", "--new-user-password=rootpw"});
  Both("root", {"user", "add", "u", "--new-user-password=upw"});
  Both("root", {"role", "add", "r"});
  Both("root", {"role", "grant-permission", "r", "readwrite", "foo", "--prefix"});
  Both("root", {"user", "grant-role", "u", "r"});
  EXPECT_EQ(Both("root", {"auth", "enable"}).out, "Authentication Enabled\n");

  // CN=root is the root user; CN=u is u: no password needed.
  EXPECT_EQ(Both("root", {"user", "list"}).out, "root\nu\n");
  EXPECT_EQ(Both("user", {"put", "foo1", "x"}).out, "OK\n");
  EXPECT_EQ(Both("user", {"get", "foo1", "--print-value-only"}).out, "x\n");
  Outcome denied = Both("user", {"put", "bar", "x"});
  EXPECT_EQ(denied.last_err, "Error: etcdserver: permission denied");
  EXPECT_NE(Both("user", {"user", "list"}).code, 0);
  // An explicit user and password take precedence over the certificate.
  EXPECT_NE(Both("root", {"--user=u:upw", "user", "list"}).code, 0);
  EXPECT_EQ(Both("user", {"--user=root:rootpw", "put", "bar", "y"}).out, "OK\n");
  // A user deleted while its certificate stays valid is refused.
  Both("root", {"user", "delete", "u"});
  EXPECT_EQ(Both("user", {"get", "foo1"}).last_err, "Error: etcdserver: permission denied");
}

TEST_F(TlsTest, AllowedHostname) {
  // The client certificates name localhost and 127.0.0.1.
  for (const std::string host : {"localhost", "127.0.0.1", "example.com"}) {
    SCOPED_TRACE(host);
    std::vector<std::string> flags = MutualTlsFlags();
    flags.push_back("--client-cert-allowed-hostname=" + host);
    StartBoth(flags);
    Outcome o = Both("root", {"put", "k", "v"});
    EXPECT_EQ(o.code == 0, host != "example.com") << o.ToString();
    etcd_.process->Stop();
    capstan_.process->Stop();
  }
}

TEST_F(TlsTest, TlsVersionAndCipherFlags) {
  CAPSTAN_REQUIRE_REFERENCE("openssl", "/usr/bin/openssl");
  // The default range and an explicit TLS1.3 maximum: TLS1.2 and TLS1.3
  // clients both connect.
  // --cipher-suites narrows the TLS1.2 suites.
  std::vector<std::string> flags = MutualTlsFlags();
  flags.push_back("--tls-max-version=TLS1.3");
  flags.push_back("--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256");
  auto c = Start(ServerFlavor::kCapstan, flags);
  ASSERT_TRUE(c.ok()) << c.status();
  for (const char* version : {"-tls1_2", "-tls1_3"}) {
    CommandResult r = RunCommand(
        {"/usr/bin/openssl", "s_client", "-connect", absl::StrCat("127.0.0.1:", c->tls_port),
         version, "-CAfile", Cert("ca.pem"), "-cert", Cert("root.pem"), "-key", Cert("root.key"),
         "-verify_return_error", "-brief"},
        "", std::chrono::seconds(10));
    // gRPC closes the connection once it sees no HTTP/2; the handshake is
    // what counts.
    EXPECT_TRUE(absl::StrContains(r.err, "Verification: OK")) << version << "\n" << r.err;
    EXPECT_TRUE(absl::StrContains(
        r.err, absl::StrCat("Protocol version: TLSv1.", version[6] == '2' ? "2" : "3")))
        << r.err;
    if (version[6] == '2') {
      EXPECT_TRUE(absl::StrContains(r.err, "Ciphersuite: ECDHE-ECDSA-AES128-GCM-SHA256")) << r.err;
    }
  }
  CommandResult other_suite = RunCommand(
      {"/usr/bin/openssl", "s_client", "-connect", absl::StrCat("127.0.0.1:", c->tls_port),
       "-tls1_2", "-cipher", "ECDHE-ECDSA-AES256-GCM-SHA384", "-CAfile", Cert("ca.pem"), "-cert",
       Cert("root.pem"), "-key", Cert("root.key"), "-brief"},
      "", std::chrono::seconds(10));
  EXPECT_FALSE(absl::StrContains(other_suite.err, "CONNECTION ESTABLISHED")) << other_suite.err;

  // TLS1.3 only, and TLS1.2 only: the other version's handshake fails
  // (etcd 3.4 has neither flag, so capstan alone).
  for (const std::string flag : {"--tls-min-version=TLS1.3", "--tls-max-version=TLS1.2"}) {
    SCOPED_TRACE(flag);
    std::vector<std::string> f = MutualTlsFlags();
    f.push_back(flag);
    auto limited = Start(ServerFlavor::kCapstan, f);
    ASSERT_TRUE(limited.ok()) << limited.status();
    for (const std::string version : {"1_2", "1_3"}) {
      CommandResult r = RunCommand(
          {"/usr/bin/openssl", "s_client", "-connect", absl::StrCat("127.0.0.1:", limited->tls_port),
           "-tls" + version, "-CAfile", Cert("ca.pem"), "-cert", Cert("root.pem"), "-key",
           Cert("root.key"), "-verify_return_error", "-brief"},
          "", std::chrono::seconds(10));
      const bool allowed = flag == "--tls-min-version=TLS1.3" ? version == "1_3" : version == "1_2";
      EXPECT_EQ(absl::StrContains(r.err, "Verification: OK"), allowed) << version << "\n" << r.err;
      if (allowed) {
        EXPECT_TRUE(absl::StrContains(r.err, absl::StrCat("Protocol version: TLSv1.", version.substr(2))))
            << r.err;
      }
    }
    // etcdctl (Go's TLS, offering both versions) still works.
    Outcome put = Etcdctl(limited->endpoint(), "root", {"put", "tls-version", "1"});
    EXPECT_EQ(put.code, 0) << put.ToString();
  }
  // etcd's validation of the values themselves.
  ServerOptions o = ServerOptions::Capstan();
  o.extra_args = {"--tls-min-version=TLS1.3", "--tls-max-version=TLS1.2"};
  o.start_timeout = std::chrono::milliseconds(5000);
  auto invalid = ServerProcess::Start(o);
  ASSERT_FALSE(invalid.ok());
  EXPECT_TRUE(absl::StrContains(invalid.status().message(),
                                "min version (TLS1.3) is greater than max version (TLS1.2)"))
      << invalid.status();
}


// https metrics URLs serve with the client TLS settings: the certificate,
// client certificate authentication, the CRL. Unlike the client URLs, they
// also refuse a client certificate naming addresses that are not the
// client's (etcd's checkSAN).
TEST_F(TlsTest, HttpsMetricsUseTheClientTlsSettings) {
  CAPSTAN_REQUIRE_REFERENCE("curl", "/usr/bin/curl");
  StartBoth(MutualTlsFlags());
  for (const std::string path : {"/metrics", "/health"}) {
    SCOPED_TRACE(path);
    EXPECT_EQ(BothMetrics("root", path), "200");
    EXPECT_EQ(BothMetrics("user", path), "200");
    EXPECT_EQ(BothMetrics("nosan", path), "200");
    for (const std::string bad : {"", "foreign", "expired", "revoked", "farip"}) {
      EXPECT_EQ(BothMetrics(bad, path), "000") << bad;
    }
    // A client that does not trust the server's CA.
    EXPECT_EQ(BothMetrics("root", path, "other"), "000");
  }
  std::string etcd_body, capstan_body;
  ASSERT_EQ(Curl(etcd_.metrics_url(), "/health", "root", "ca", &etcd_body), "200");
  ASSERT_EQ(Curl(capstan_.metrics_url(), "/health", "root", "ca", &capstan_body), "200");
  EXPECT_TRUE(absl::StrContains(etcd_body, "\"health\":\"true\"")) << etcd_body;
  EXPECT_TRUE(absl::StrContains(capstan_body, "\"health\":\"true\"")) << capstan_body;

  // Plain http on the https port: the connection closes without a response.
  for (const TlsServer* s : {&etcd_, &capstan_}) {
    EXPECT_EQ(Curl(absl::StrCat("http://127.0.0.1:", s->metrics_tls_port), "/health", "", ""),
              "000");
  }
  // The http metrics URL beside it stays plain.
  for (const TlsServer* s : {&etcd_, &capstan_}) {
    EXPECT_EQ(Curl(absl::StrCat("http://127.0.0.1:", s->process->metrics_port()), "/health", "",
                   ""),
              "200");
  }
}

TEST_F(TlsTest, HttpsMetricsWithoutClientCertificateAuth) {
  CAPSTAN_REQUIRE_REFERENCE("curl", "/usr/bin/curl");
  StartBoth({"--cert-file=" + Cert("server.pem"), "--key-file=" + Cert("server.key")});
  for (const std::string client : {"", "root", "foreign", "expired", "revoked", "farip"}) {
    EXPECT_EQ(BothMetrics(client, "/metrics"), "200") << client;
  }
  EXPECT_EQ(BothMetrics("", "/health", "other"), "000");
}

TEST_F(TlsTest, HttpsMetricsAllowedHostnameAndCipherSuites) {
  CAPSTAN_REQUIRE_REFERENCE("curl", "/usr/bin/curl");
  CAPSTAN_REQUIRE_REFERENCE("openssl", "/usr/bin/openssl");
  for (const std::string host : {"localhost", "example.com"}) {
    SCOPED_TRACE(host);
    std::vector<std::string> flags = MutualTlsFlags();
    flags.push_back("--client-cert-allowed-hostname=" + host);
    flags.push_back("--cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256");
    StartBoth(flags);
    EXPECT_EQ(BothMetrics("root", "/metrics"), host == "localhost" ? "200" : "000");
    for (const std::string cipher : {"ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384"}) {
      const bool etcd = Handshakes(etcd_.metrics_tls_port, cipher);
      EXPECT_EQ(etcd, Handshakes(capstan_.metrics_tls_port, cipher)) << cipher;
      EXPECT_EQ(etcd, host == "localhost" && cipher == "ECDHE-ECDSA-AES128-GCM-SHA256") << cipher;
    }
    etcd_.process->Stop();
    capstan_.process->Stop();
  }
}

// --auto-tls's self-signed certificate serves the metrics URLs too.
TEST_F(TlsTest, HttpsMetricsWithAutoTls) {
  CAPSTAN_REQUIRE_REFERENCE("curl", "/usr/bin/curl");
  StartBoth({"--auto-tls"});
  EXPECT_EQ(BothMetrics("", "/health", ""), "200");
  EXPECT_EQ(BothMetrics("", "/health", "ca"), "000");
}

// An https metrics URL without a certificate stops the server at start, with
// etcd's error.
TEST_F(TlsTest, HttpsMetricsNeedACertificate) {
  for (ServerFlavor flavor : {ServerFlavor::kEtcd, ServerFlavor::kCapstan}) {
    SCOPED_TRACE(FlavorName(flavor));
    TempDir dir("capstan-tls-start");
    const std::string client = absl::StrCat("http://127.0.0.1:", PickFreePort());
    const std::string peer = absl::StrCat("http://127.0.0.1:", PickFreePort());
    const int metrics_port = PickFreePort();
    CommandResult r = RunCommand(
        {flavor == ServerFlavor::kEtcd ? EtcdBinary() : CapstanBinary(), "--name=default",
         "--data-dir=" + dir.path() + "/data", "--listen-client-urls=" + client,
         "--advertise-client-urls=" + client, "--listen-peer-urls=" + peer,
         "--initial-advertise-peer-urls=" + peer, "--initial-cluster=default=" + peer,
         absl::StrCat("--listen-metrics-urls=https://127.0.0.1:", metrics_port)},
        "", std::chrono::seconds(30));
    EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 1) << r.exit.ToString() << "\n" << r.err;
    // etcd 3.5's text (3.4 said "cannot listen on TLS for 127.0.0.1:PORT:
    // KeyFile and CertFile are not presented").
    EXPECT_TRUE(absl::StrContains(r.err,
                                  "client TLS key/cert (--cert-file, --key-file) must be provided "
                                  "for metrics secure url"))
        << r.err;
  }
}


// As in etcd, a trusted CA alone (without --client-cert-auth) makes TLS
// listeners require a verified client certificate.
TEST_F(TlsTest, TrustedCaAloneRequiresClientCertificates) {
  CAPSTAN_REQUIRE_REFERENCE("curl", "/usr/bin/curl");
  StartBoth({"--cert-file=" + Cert("server.pem"), "--key-file=" + Cert("server.key"),
             "--trusted-ca-file=" + Cert("ca.pem")});
  EXPECT_EQ(Both("root", {"put", "k", "v"}).out, "OK\n");
  EXPECT_EQ(Both("", {"get", "k"}).last_err, "Error: context deadline exceeded");
  EXPECT_EQ(Both("foreign", {"get", "k"}).last_err, "Error: context deadline exceeded");
  EXPECT_EQ(BothMetrics("root", "/metrics"), "200");
  EXPECT_EQ(BothMetrics("", "/metrics"), "000");
  EXPECT_EQ(BothMetrics("foreign", "/metrics"), "000");
}

// etcd's checkCRL looks at serial numbers only and reads the list at every
// handshake: a list past its next update still revokes what it names and
// admits everyone else, and a list replaced while the server runs counts
// from the next connection on.
TEST_F(TlsTest, CrlRevokesBySerialAndIsReadAtEveryHandshake) {
  TempDir dir("capstan-tls-crl");
  const std::string crl = dir.path() + "/crl.pem";
  std::filesystem::copy_file(Cert("crl-expired.pem"), crl);
  std::vector<std::string> flags = MutualTlsFlags();
  flags.back() = "--client-crl-file=" + crl;
  StartBoth(flags);
  EXPECT_EQ(Both("root", {"put", "k", "v"}).out, "OK\n");
  EXPECT_EQ(Both("revoked", {"get", "k"}).last_err, "Error: context deadline exceeded");
  EXPECT_EQ(BothMetrics("root", "/health"), "200");
  EXPECT_EQ(BothMetrics("revoked", "/health"), "000");

  std::filesystem::copy_file(Cert("crl-none.pem"), crl,
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_EQ(Both("revoked", {"get", "k", "--print-value-only"}).out, "v\n");
  EXPECT_EQ(BothMetrics("revoked", "/health"), "200");

  std::filesystem::copy_file(Cert("crl.pem"), crl, std::filesystem::copy_options::overwrite_existing);
  EXPECT_EQ(Both("revoked", {"get", "k"}).last_err, "Error: context deadline exceeded");
  EXPECT_EQ(Both("root", {"get", "k", "--print-value-only"}).out, "v\n");
}

// HTTP on an https client URL, beside gRPC on the same port, as etcd
// serves it: the same client certificate checks, the JSON gateway,
// /health and /metrics. curl offers HTTP/1.1 and HTTP/2 (etcd picks HTTP/2,
// Capstan HTTP/1.1); etcdctl's gRPC goes on working on the port.
TEST_F(TlsTest, HttpOnHttpsClientUrls) {
  CAPSTAN_REQUIRE_REFERENCE("curl", "/usr/bin/curl");
  StartBoth(MutualTlsFlags());
  auto both = [&](const std::string& client, const std::string& path, const std::string& post,
                  std::string* etcd_body, std::string* capstan_body) {
    auto e = std::async(std::launch::async, [&] {
      return Curl(etcd_.endpoint(), path, client, "ca", etcd_body, post);
    });
    const std::string c = Curl(capstan_.endpoint(), path, client, "ca", capstan_body, post);
    const std::string eo = e.get();
    EXPECT_EQ(eo, c) << "cert " << (client.empty() ? "(none)" : client) << ": " << path;
    return c;
  };
  std::string e, c;
  for (const std::string client : {"", "foreign", "expired", "revoked"}) {
    EXPECT_EQ(both(client, "/health", "", &e, &c), "000") << client;
  }
  EXPECT_EQ(both("root", "/health", "", &e, &c), "200");
  EXPECT_TRUE(absl::StrContains(c, "\"health\":\"true\"")) << c;  // 3.5 adds "reason"
  EXPECT_EQ(both("root", "/metrics", "", &e, &c), "200");
  EXPECT_TRUE(absl::StrContains(c, "etcd_server_has_leader 1")) << c.substr(0, 300);
  // foo=bar through the gateway, read back by the gateway and by etcdctl.
  EXPECT_EQ(both("root", "/v3/kv/put", R"({"key":"Zm9v","value":"YmFy"})", &e, &c), "200");
  EXPECT_TRUE(absl::StrContains(c, "\"revision\":\"2\"")) << c;
  EXPECT_EQ(both("root", "/v3/kv/range", R"({"key":"Zm9v"})", &e, &c), "200");
  EXPECT_TRUE(absl::StrContains(c, "\"value\":\"YmFy\"")) << c;
  EXPECT_EQ(both("root", "/v3/kv/range", R"({"key":1})", &e, &c), "400");
  EXPECT_EQ(Both("root", {"get", "foo", "--print-value-only"}).out, "bar\n");
  // A client that names no protocol by ALPN speaks HTTP/1.1 to both.
  for (const TlsServer* s : {&etcd_, &capstan_}) {
    CommandResult r = RunCommand({"/usr/bin/curl", "-sS", "--no-alpn", "--max-time", "10",
                                  "--cacert", Cert("ca.pem"), "--cert", Cert("root.pem"), "--key",
                                  Cert("root.key"), "-w", "\n%{http_code}",
                                  s->endpoint() + "/health"});
    EXPECT_TRUE(absl::EndsWith(r.out, "\n200")) << FlavorName(s->process->flavor()) << ": "
                                                 << r.out << r.err;
  }
}

// --listen-client-http-urls on https: HTTP there with the client TLS
// settings (the same client certificate checks), gRPC alone on the client
// URLs, as etcd serves them.
TEST_F(TlsTest, HttpsClientHttpUrls) {
  CAPSTAN_REQUIRE_REFERENCE("curl", "/usr/bin/curl");
  const int etcd_http = PickFreePort();
  const int capstan_http = PickFreePort();
  auto with_http = [&](int port) {
    std::vector<std::string> flags = MutualTlsFlags();
    flags.push_back(absl::StrCat("--listen-client-http-urls=https://127.0.0.1:", port));
    return flags;
  };
  auto e = Start(ServerFlavor::kEtcd, with_http(etcd_http));
  ASSERT_TRUE(e.ok()) << e.status();
  etcd_ = std::move(*e);
  auto c = Start(ServerFlavor::kCapstan, with_http(capstan_http));
  ASSERT_TRUE(c.ok()) << c.status();
  capstan_ = std::move(*c);
  const std::string etcd_url = absl::StrCat("https://127.0.0.1:", etcd_http);
  const std::string capstan_url = absl::StrCat("https://127.0.0.1:", capstan_http);
  std::string eb, cb;
  EXPECT_EQ(Curl(etcd_url, "/health", "root", "ca", &eb), "200");
  EXPECT_EQ(Curl(capstan_url, "/health", "root", "ca", &cb), "200");
  EXPECT_TRUE(absl::StrContains(cb, "\"health\":\"true\"")) << cb;
  EXPECT_EQ(Curl(capstan_url, "/v3/kv/put", "root", "ca", &cb, R"({"key":"Zm9v","value":"YmFy"})"),
            "200");
  EXPECT_EQ(Curl(etcd_url, "/v3/kv/put", "root", "ca", &eb, R"({"key":"Zm9v","value":"YmFy"})"),
            "200");
  for (const std::string bad : {"", "foreign", "expired", "revoked"}) {
    EXPECT_EQ(Curl(etcd_url, "/health", bad), "000") << bad;
    EXPECT_EQ(Curl(capstan_url, "/health", bad), "000") << bad;
  }
  // Plain http on the https port gets no HTTP answer.
  for (int port : {etcd_http, capstan_http}) {
    EXPECT_EQ(Curl(absl::StrCat("http://127.0.0.1:", port), "/health", "", ""), "000") << port;
  }
  // gRPC on the client URL reads what HTTP wrote.
  EXPECT_EQ(Both("root", {"get", "foo", "--print-value-only"}).out, "bar\n");
}

// etcd's --auto-tls replaces all the client TLS settings with the
// self-signed pair: client certificates are then neither required nor
// checked, whatever --client-cert-auth and --trusted-ca-file say.
TEST_F(TlsTest, AutoTlsDropsClientCertificateAuth) {
  CAPSTAN_REQUIRE_REFERENCE("curl", "/usr/bin/curl");
  StartBoth({"--auto-tls", "--client-cert-auth", "--trusted-ca-file=" + Cert("ca.pem"),
             "--client-crl-file=" + Cert("crl.pem")});
  for (const std::string client : {"", "root", "revoked", "foreign"}) {
    SCOPED_TRACE(client);
    for (const TlsServer* s : {&etcd_, &capstan_}) {
      // Trust the server's own self-signed certificate.
      const std::string cert = s->process->data_dir() + "/fixtures/client/cert.pem";
      std::vector<std::string> argv = {EtcdctlBinary(), "--endpoints=" + s->endpoint(),
                                       "--dial-timeout=2s", "--command-timeout=3s",
                                       "--cacert=" + cert};
      if (!client.empty()) {
        argv.push_back("--cert=" + Cert(client + ".pem"));
        argv.push_back("--key=" + Cert(client + ".key"));
      }
      argv.insert(argv.end(), {"put", "k", "v"});
      CommandResult r = RunCommand(argv, "", std::chrono::seconds(20));
      EXPECT_EQ(r.out, "OK\n") << FlavorName(s->process->flavor()) << "\n" << r.err;
    }
    EXPECT_EQ(BothMetrics(client, "/health", ""), "200");
  }
}


// https metrics URLs enforce the TLS version limits, as the client URLs do
// (TlsVersionAndCipherFlags). etcd 3.4 has neither flag: capstan alone.
TEST_F(TlsTest, HttpsMetricsEnforceTlsVersions) {
  CAPSTAN_REQUIRE_REFERENCE("openssl", "/usr/bin/openssl");
  for (const std::string flag : {"--tls-min-version=TLS1.3", "--tls-max-version=TLS1.2"}) {
    SCOPED_TRACE(flag);
    const int port = PickFreePort();
    ServerOptions o = ServerOptions::Capstan();
    o.extra_args = {"--cert-file=" + Cert("server.pem"), "--key-file=" + Cert("server.key"), flag,
                    absl::StrCat("--listen-metrics-urls=https://127.0.0.1:", port)};
    auto c = ServerProcess::Start(o);
    ASSERT_TRUE(c.ok()) << c.status();
    for (const std::string version : {"1_2", "1_3"}) {
      CommandResult r = RunCommand({"/usr/bin/openssl", "s_client", "-connect",
                                    absl::StrCat("127.0.0.1:", port), "-tls" + version, "-CAfile",
                                    Cert("ca.pem"), "-brief"},
                                   "", std::chrono::seconds(10));
      const bool allowed = flag == "--tls-min-version=TLS1.3" ? version == "1_3" : version == "1_2";
      EXPECT_EQ(absl::StrContains(r.err, "CONNECTION ESTABLISHED"), allowed)
          << version << "\n" << r.err;
    }
  }
}

}  // namespace
}  // namespace capstan::testing
