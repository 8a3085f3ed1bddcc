// Tests of the server-process harness itself, run with real etcd (skipped if
// it is missing): start/stop/kill/restart, data kept across a crash, and no
// server left behind when the test process dies without cleaning up.

#include "process_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "gtest/gtest.h"

namespace capstan::testing {
namespace {

bool ProcessAlive(pid_t pid) { return kill(pid, 0) == 0; }

// Waits up to `timeout` for `pid` to disappear.
bool WaitGone(pid_t pid, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (ProcessAlive(pid)) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

class ProcessFixtureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
  }
};

grpc::Status Put(ServerProcess& s, const std::string& k, const std::string& v) {
  auto kv = etcdserverpb::KV::NewStub(s.NewChannel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  etcdserverpb::PutRequest req;
  req.set_key(k);
  req.set_value(v);
  etcdserverpb::PutResponse resp;
  return kv->Put(&ctx, req, &resp);
}

std::string Get(ServerProcess& s, const std::string& k) {
  auto kv = etcdserverpb::KV::NewStub(s.NewChannel());
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  etcdserverpb::RangeRequest req;
  req.set_key(k);
  etcdserverpb::RangeResponse resp;
  if (!kv->Range(&ctx, req, &resp).ok() || resp.kvs_size() != 1) return "<none>";
  return resp.kvs(0).value();
}

TEST(PickFreePortTest, DistinctPorts) {
  std::set<int> ports;
  for (int i = 0; i < 50; ++i) EXPECT_TRUE(ports.insert(PickFreePort()).second);
}

// A port one test process picked is reserved from every other one until
// it exits: another process cannot take its lock, so its PickFreePort skips
// the port even while nothing listens on it.
TEST(PickFreePortTest, ReservedFromOtherProcessesUntilExit) {
  const int port = PickFreePort();
  const std::string path = absl::StrCat("/tmp/capstan-test-ports/", port);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // flock locks belong to the open file: this open is another one.
    const int fd = open(path.c_str(), O_RDWR);
    _exit(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "another process could take the reservation of port " << port;
}

TEST(RunCommandTest, CapturesOutputAndExitCode) {
  CommandResult r = RunCommand({"/bin/sh", "-c", "cat; echo out; echo err >&2; exit 3"}, "in\n");
  EXPECT_TRUE(r.exit.exited);
  EXPECT_EQ(r.exit.exit_code, 3);
  EXPECT_EQ(r.out, "in\nout\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_FALSE(r.timed_out);
}

TEST(RunCommandTest, StripsEtcdEnvironment) {
  setenv("ETCDCTL_ENDPOINTS", "http://example.invalid:1", 1);
  setenv("ETCD_NAME", "nope", 1);
  CommandResult r = RunCommand({"/bin/sh", "-c", "env | grep -c '^ETCD' || true"});
  unsetenv("ETCDCTL_ENDPOINTS");
  unsetenv("ETCD_NAME");
  EXPECT_EQ(r.out, "0\n");
}

TEST(RunCommandTest, TimesOut) {
  CommandResult r = RunCommand({"/bin/sleep", "30"}, "", std::chrono::milliseconds(200));
  EXPECT_TRUE(r.timed_out);
  EXPECT_FALSE(r.exit.exited);
}

TEST(ServerProcessTest, MissingBinaryIsAnError) {
  ServerOptions o = ServerOptions::Capstan();
  o.binary = "/nonexistent/capstan";
  auto s = ServerProcess::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find("/nonexistent/capstan"), std::string::npos);
}

TEST(ServerProcessTest, BadFlagReportsTheLog) {
  CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
  ServerOptions o = ServerOptions::Etcd();
  o.extra_args = {"--no-such-flag"};
  o.start_timeout = std::chrono::seconds(10);
  auto s = ServerProcess::Start(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("exited during start-up"), std::string::npos)
      << s.status();
}

TEST_F(ProcessFixtureTest, StartStop) {
  auto s = ServerProcess::Start(ServerOptions::Etcd());
  ASSERT_TRUE(s.ok()) << s.status();
  ServerProcess& server = **s;
  EXPECT_TRUE(server.running());
  EXPECT_TRUE(Put(server, "k", "v").ok());
  const pid_t pid = server.pid();
  ExitInfo e = server.Stop();
  EXPECT_FALSE(server.running());
  EXPECT_FALSE(ProcessAlive(pid));
  // etcd exits by re-raising SIGTERM after a clean shutdown.
  EXPECT_TRUE((e.exited && e.exit_code == 0) || e.term_signal == SIGTERM) << e.ToString();
  EXPECT_NE(server.ReadLog().find("capstan-test: starting"), std::string::npos);
}

TEST_F(ProcessFixtureTest, KillAndRestartKeepsDataAndPorts) {
  auto s = ServerProcess::Start(ServerOptions::Etcd());
  ASSERT_TRUE(s.ok()) << s.status();
  ServerProcess& server = **s;
  ASSERT_TRUE(Put(server, "k", "durable").ok());
  const int port = server.client_port();
  ExitInfo e = server.Kill();
  EXPECT_FALSE(e.exited);
  EXPECT_EQ(e.term_signal, SIGKILL);
  absl::Status r = server.Restart();
  ASSERT_TRUE(r.ok()) << r;
  EXPECT_EQ(server.client_port(), port);
  EXPECT_EQ(Get(server, "k"), "durable");
}

TEST_F(ProcessFixtureTest, RestartWhileRunningIsRefused) {
  auto s = ServerProcess::Start(ServerOptions::Etcd());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ((*s)->Restart().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(ProcessFixtureTest, DestructorKillsServerAndRemovesDir) {
  pid_t pid;
  std::string dir;
  {
    auto s = ServerProcess::Start(ServerOptions::Etcd());
    ASSERT_TRUE(s.ok()) << s.status();
    pid = (*s)->pid();
    dir = (*s)->dir();
  }
  EXPECT_TRUE(WaitGone(pid, std::chrono::seconds(5)));
  if (std::getenv("CAPSTAN_KEEP_TEST_DIRS") == nullptr) {
    EXPECT_NE(access(dir.c_str(), F_OK), 0);
  }
}

// No server outlives a test process that ends without any cleanup. The test
// runs itself again as a child with CAPSTAN_TEST_LEAK_CHILD set ("exit" or
// "sigkill"); the child starts etcd, prints its pid and dies without running
// destructors or atexit handlers. (One test in two roles, so that no test
// name exists only to be skipped.)
TEST_F(ProcessFixtureTest, ServerDiesWithTheTestProcess) {
  if (const char* mode = std::getenv("CAPSTAN_TEST_LEAK_CHILD"); mode != nullptr) {
    auto s = ServerProcess::Start(ServerOptions::Etcd());
    if (!s.ok()) _exit(2);
    std::printf("PID %d DIR %s\n", (*s)->pid(), (*s)->dir().c_str());
    std::fflush(stdout);
    if (std::string(mode) == "sigkill") raise(SIGKILL);
    _exit(0);  // no destructors, no atexit handlers
  }
  for (const char* mode : {"exit", "sigkill"}) {
    SCOPED_TRACE(mode);
    setenv("CAPSTAN_TEST_LEAK_CHILD", mode, 1);
    CommandResult r = RunCommand(
        {"/proc/self/exe", "--gtest_filter=ProcessFixtureTest.ServerDiesWithTheTestProcess"}, "",
        std::chrono::seconds(60));
    unsetenv("CAPSTAN_TEST_LEAK_CHILD");
    int pid = 0;
    const size_t at = r.out.find("PID ");
    ASSERT_NE(at, std::string::npos) << r.out << r.err;
    char dir[4096] = {0};
    ASSERT_EQ(std::sscanf(r.out.c_str() + at, "PID %d DIR %4095s", &pid, dir), 2) << r.out << r.err;
    ASSERT_GT(pid, 0);
    struct RemoveDir {  // the child could not clean up after itself
      std::string path;
      ~RemoveDir() { RemoveTree(path); }
    } remove_dir{dir};
    EXPECT_TRUE(WaitGone(pid, std::chrono::seconds(10)))
        << "etcd " << pid << " outlived the test process that started it";
    if (ProcessAlive(pid)) kill(pid, SIGKILL);
  }
}

}  // namespace
}  // namespace capstan::testing
