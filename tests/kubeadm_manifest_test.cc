// Capstan started exactly as kubeadm's etcd static Pod starts etcd.
//
// The command lines are those of cmd/kubeadm/app/phases/etcd/local.go
// (getEtcdCommand; kubeadmutil.ArgumentsToCommand writes "--name=value"
// sorted by name): the etcd 3.5-era one of kubeadm 1.29-1.33
// (--experimental-initial-corrupt-check=true,
// --experimental-watch-progress-notify-interval=5s) and the one of 1.34+
// (--feature-gates=InitialCorruptCheck=true,
// --watch-progress-notify-interval=5s). Certificates are made by openssl in
// kubeadm's layout under <pki>/etcd: ca.crt/key, server.crt (SANs localhost,
// the node name, 127.0.0.1, ::1 and the advertise address), peer.crt,
// healthcheck-client.crt, and <pki>/apiserver-etcd-client.crt. The advertise
// address is 127.0.0.2, so that the client URLs are two, as kubeadm writes
// them ("https://127.0.0.1:C,https://<advertise>:C").
//
// Each server must come up, take a put and a get from etcdctl over mutual
// TLS with the API server's client certificate, and answer the probes the
// manifest declares, an httpGet on the metrics URL (http://127.0.0.1:M):
// /livez and /readyz (kubeadm 1.32+), /health?exclude=NOSPACE&serializable=true
// (liveness) and /health?serializable=false (startup) before. Their status
// and body are compared with real etcd 3.5.16 started with the 3.5-era line
// (3.5 refuses the 1.34+ flags).

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "http_client.h"
#include "process_fixture.h"

namespace capstan::testing {
namespace {

constexpr char kNode[] = "node1";
constexpr char kAdvertise[] = "127.0.0.2";

// kubeadm's etcd PKI (cmd/kubeadm/app/constants: EtcdCACertName "etcd/ca.crt",
// EtcdServerCertName "etcd/server.crt", EtcdPeerCertName "etcd/peer.crt",
// EtcdHealthcheckClientCertName "etcd/healthcheck-client.crt",
// APIServerEtcdClientCertName "apiserver-etcd-client.crt"), RSA 2048 as
// kubeadm's default.
constexpr char kMakePki[] = R"sh(
set -e
mkdir -p etcd
rsa="-newkey rsa:2048 -nodes"
openssl req -x509 $rsa -keyout etcd/ca.key -out etcd/ca.crt -days 30 -subj /CN=etcd-ca 2>/dev/null
# leaf PATH CN EXTENSIONS
leaf() {
  printf '%s\n' "$3" > $1.ext
  openssl req $rsa -keyout $1.key -out $1.csr -subj "/CN=$2" 2>/dev/null
  openssl x509 -req -in $1.csr -CA etcd/ca.crt -CAkey etcd/ca.key -CAcreateserial \
    -days 30 -extfile $1.ext -out $1.crt 2>/dev/null
}
sans="subjectAltName=DNS:localhost,DNS:NODE,IP:127.0.0.1,IP:0:0:0:0:0:0:0:1,IP:ADVERTISE"
leaf etcd/server NODE "$sans
extendedKeyUsage=serverAuth,clientAuth"
leaf etcd/peer NODE "$sans
extendedKeyUsage=serverAuth,clientAuth"
leaf etcd/healthcheck-client kube-etcd-healthcheck-client "extendedKeyUsage=clientAuth"
leaf apiserver-etcd-client kube-apiserver-etcd-client "extendedKeyUsage=clientAuth"
)sh";

enum class Era { k135, k134 };  // kubeadm 1.29-1.33 (etcd 3.5) and 1.34+ (etcd 3.6)

// A server started from a full command line, its output in a log file.
class Member {
 public:
  Member(const std::string& binary, std::vector<std::string> args, const std::string& log)
      : log_(log) {
    std::vector<std::string> argv = {binary};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<char*> cargv;
    for (std::string& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execv(cargv[0], cargv.data());
      ::_exit(127);
    }
    ::close(fd);
  }
  ~Member() {
    if (pid_ <= 0 || exited_) return;
    ::kill(pid_, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  Member(const Member&) = delete;
  Member& operator=(const Member&) = delete;

  bool Exited() {
    if (!exited_ && ::waitpid(pid_, nullptr, WNOHANG) == pid_) exited_ = true;
    return exited_;
  }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  bool exited_ = false;
};

HttpAnswer Get(int port, const std::string& path) {
  HttpClient c(port);
  if (!c.connected()) return {};
  return c.Request("GET", path, "", {}, std::chrono::seconds(5));
}

class KubeadmManifestTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki_ = new TempDir("capstan-kubeadm-pki");
    std::string script = kMakePki;
    for (const auto& [from, to] : {std::pair<std::string, std::string>{"NODE", kNode},
                                   {"ADVERTISE", kAdvertise}}) {
      for (size_t at; (at = script.find(from)) != std::string::npos;) script.replace(at, from.size(), to);
    }
    CommandResult r = RunCommand({"/bin/bash", "-c", absl::StrCat("cd ", pki_->path(), " && ", script)});
    ASSERT_TRUE(r.exit.exited && r.exit.exit_code == 0) << r.err;
  }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
  }

  void SetUp() override {
    CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
    CAPSTAN_REQUIRE_REFERENCE("etcdctl", EtcdctlBinary());
    CAPSTAN_REQUIRE_REFERENCE("capstan", CapstanBinary());
  }

  static std::string Pki(const std::string& name) { return pki_->path() + "/" + name; }

  struct Ports {
    int client = PickFreePort();
    int peer = PickFreePort();
    int metrics = PickFreePort();
  };

  // getEtcdCommand's arguments for a first control-plane node, sorted by name.
  static std::vector<std::string> KubeadmArgs(Era era, const Ports& p, const std::string& data_dir) {
    const std::string client = absl::StrCat("https://", kAdvertise, ":", p.client);
    const std::string peer = absl::StrCat("https://", kAdvertise, ":", p.peer);
    std::vector<std::string> args = {
        "--advertise-client-urls=" + client,
        "--cert-file=" + Pki("etcd/server.crt"),
        "--client-cert-auth=true",
        "--data-dir=" + data_dir,
    };
    if (era == Era::k135) args.push_back("--experimental-initial-corrupt-check=true");
    if (era == Era::k135) args.push_back("--experimental-watch-progress-notify-interval=5s");
    if (era == Era::k134) args.push_back("--feature-gates=InitialCorruptCheck=true");
    for (const std::string& a : {
             "--initial-advertise-peer-urls=" + peer,
             absl::StrCat("--initial-cluster=", kNode, "=", peer),
             "--key-file=" + Pki("etcd/server.key"),
             absl::StrCat("--listen-client-urls=https://127.0.0.1:", p.client, ",", client),
             absl::StrCat("--listen-metrics-urls=http://127.0.0.1:", p.metrics),
             "--listen-peer-urls=" + peer,
             absl::StrCat("--name=", kNode),
             "--peer-cert-file=" + Pki("etcd/peer.crt"),
             std::string("--peer-client-cert-auth=true"),
             "--peer-key-file=" + Pki("etcd/peer.key"),
             "--peer-trusted-ca-file=" + Pki("etcd/ca.crt"),
             std::string("--snapshot-count=10000"),
             "--trusted-ca-file=" + Pki("etcd/ca.crt"),
         }) {
      args.push_back(a);
    }
    if (era == Era::k134) args.push_back("--watch-progress-notify-interval=5s");
    return args;
  }

  // Starts binary with kubeadm's command line and waits until /readyz on the
  // metrics URL answers 200 (or the server exits, or 30s pass).
  static std::unique_ptr<Member> StartMember(const std::string& binary, Era era, const Ports& p,
                                             const TempDir& dir) {
    auto m = std::make_unique<Member>(binary, KubeadmArgs(era, p, dir.path() + "/data"),
                                      dir.path() + "/server.log");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline && !m->Exited()) {
      if (Get(p.metrics, "/readyz").status == 200) return m;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << binary << " did not become ready; log:\n" << m->Log();
    return nullptr;
  }

  // etcdctl with the API server's client certificate against the client URL
  // on 127.0.0.1.
  static CommandResult Etcdctl(const Ports& p, std::vector<std::string> args) {
    std::vector<std::string> argv = {EtcdctlBinary(),
                                     absl::StrCat("--endpoints=https://127.0.0.1:", p.client),
                                     "--cacert=" + Pki("etcd/ca.crt"),
                                     "--cert=" + Pki("apiserver-etcd-client.crt"),
                                     "--key=" + Pki("apiserver-etcd-client.key"),
                                     "--dial-timeout=3s", "--command-timeout=5s"};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, "", std::chrono::seconds(20));
  }

  // The probe paths kubeadm's manifests have declared.
  static std::vector<std::string> ProbePaths() {
    return {"/livez", "/readyz", "/health?exclude=NOSPACE&serializable=true",
            "/health?serializable=false"};
  }

  // Starts binary with the era's command line; a put and a get over mutual
  // TLS; returns "<path> <status> <body>" for each probe.
  static std::vector<std::string> Exercise(const std::string& binary, Era era) {
    TempDir dir("capstan-kubeadm");
    Ports p;
    std::unique_ptr<Member> m = StartMember(binary, era, p, dir);
    if (m == nullptr) return {};
    CommandResult put = Etcdctl(p, {"put", "/registry/ns/default", "v1"});
    EXPECT_TRUE(put.exit.exited && put.exit.exit_code == 0) << put.err << "\nlog:\n" << m->Log();
    EXPECT_EQ(put.out, "OK\n");
    CommandResult get = Etcdctl(p, {"get", "/registry/ns/default"});
    EXPECT_TRUE(get.exit.exited && get.exit.exit_code == 0) << get.err;
    EXPECT_EQ(get.out, "/registry/ns/default\nv1\n");
    // The advertised URL (127.0.0.2) serves too.
    CommandResult via_advertised = RunCommand(
        {EtcdctlBinary(), absl::StrCat("--endpoints=https://", kAdvertise, ":", p.client),
         "--cacert=" + Pki("etcd/ca.crt"), "--cert=" + Pki("etcd/healthcheck-client.crt"),
         "--key=" + Pki("etcd/healthcheck-client.key"), "--dial-timeout=3s", "get",
         "/registry/ns/default", "--print-value-only"},
        "", std::chrono::seconds(20));
    EXPECT_EQ(via_advertised.out, "v1\n") << via_advertised.err;
    // Without a client certificate the server refuses (client-cert-auth=true).
    CommandResult anonymous = RunCommand(
        {EtcdctlBinary(), absl::StrCat("--endpoints=https://127.0.0.1:", p.client),
         "--cacert=" + Pki("etcd/ca.crt"), "--dial-timeout=2s", "--command-timeout=3s", "get",
         "/registry/ns/default"},
        "", std::chrono::seconds(20));
    EXPECT_FALSE(anonymous.exit.exited && anonymous.exit.exit_code == 0) << anonymous.out;

    std::vector<std::string> probes;
    for (const std::string& path : ProbePaths()) {
      HttpAnswer a = Get(p.metrics, path);
      EXPECT_EQ(a.status, 200) << binary << " " << path << ": " << a.body;
      // A kubelet httpGet probe looks at the status only. /livez and /readyz
      // are compared without their line end here (etcd's body is "ok\n");
      // their exact answers belong to the health endpoints' own tests.
      const absl::string_view body = absl::StartsWith(path, "/health")
                                         ? absl::string_view(a.body)
                                         : absl::StripTrailingAsciiWhitespace(a.body);
      probes.push_back(absl::StrCat(path, " ", a.status, " ", body));
    }
    EXPECT_FALSE(m->Exited()) << m->Log();
    return probes;
  }

  static TempDir* pki_;
};

TempDir* KubeadmManifestTest::pki_ = nullptr;

// kubeadm 1.29-1.33: real etcd 3.5.16 and Capstan, the same command line,
// the same probe answers.
TEST_F(KubeadmManifestTest, Kubeadm133CommandLineMatchesEtcd) {
  const std::vector<std::string> etcd = Exercise(EtcdBinary(), Era::k135);
  const std::vector<std::string> capstan = Exercise(CapstanBinary(), Era::k135);
  ASSERT_EQ(etcd.size(), ProbePaths().size());
  EXPECT_EQ(capstan, etcd);
}

// kubeadm 1.34+: etcd 3.6's flags. Capstan answers the probes as etcd 3.5.16
// does for the older command line.
TEST_F(KubeadmManifestTest, Kubeadm134CommandLineStartsAndServes) {
  const std::vector<std::string> etcd = Exercise(EtcdBinary(), Era::k135);
  const std::vector<std::string> capstan = Exercise(CapstanBinary(), Era::k134);
  ASSERT_EQ(etcd.size(), ProbePaths().size());
  EXPECT_EQ(capstan, etcd);
}

// etcd 3.5.16 refuses kubeadm 1.34's command line, which Capstan takes.
TEST_F(KubeadmManifestTest, Etcd35RefusesTheFeatureGatesFlag) {
  Ports p;
  TempDir dir("capstan-kubeadm");
  CommandResult r = RunCommand([&] {
    std::vector<std::string> argv = {EtcdBinary()};
    for (const std::string& a : KubeadmArgs(Era::k134, p, dir.path() + "/data")) argv.push_back(a);
    return argv;
  }(), "", std::chrono::seconds(20));
  EXPECT_TRUE(r.exit.exited && r.exit.exit_code == 2) << r.exit.ToString();
  EXPECT_EQ(r.err.substr(0, r.err.find('\n')), "flag provided but not defined: -feature-gates");
}

}  // namespace
}  // namespace capstan::testing
