// Differential Watch tests through etcdctl: `etcdctl watch -w json` run in
// the background against etcd and Capstan, the same writes made, its JSON
// lines compared with ids removed (see diff_watch_test.cc).

#include <fcntl.h>
#include <unistd.h>

#include "diff_watch.h"

extern char** environ;

namespace capstan::testing {
namespace {

// ===========================================================================
// etcdctl watch -w json, in the background

// A command running in the background; stdout is read as lines.
class BackgroundCommand {
 public:
  explicit BackgroundCommand(const std::vector<std::string>& argv) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2 failed";
      return;
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::string_view(*e).substr(0, 4) != "ETCD") env.emplace_back(*e);
    }
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int devnull = open("/dev/null", O_RDONLY);
      dup2(devnull, 0);
      dup2(out[1], 1);
      dup2(err[1], 2);
      execve(args[0], args.data(), envp.data());
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    out_reader_ = std::thread([this, fd = out[0]] { Pump(fd, &out_); });
    err_reader_ = std::thread([this, fd = err[0]] { Pump(fd, &err_); });
  }
  ~BackgroundCommand() { Stop(); }

  // Waits until stdout holds at least n complete lines, stdout closed, or
  // timeout. Returns the complete lines.
  std::vector<std::string> Lines(size_t n, Clock::duration timeout = kEventWait) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, timeout, [&] { return LinesLocked().size() >= n || closed_ == 2; });
    return LinesLocked();
  }
  // Ends the command (SIGTERM if it still runs) and returns how it ended.
  ExitInfo Stop() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGTERM);
      Reap();
    }
    if (out_reader_.joinable()) out_reader_.join();
    if (err_reader_.joinable()) err_reader_.join();
    return exit_;
  }
  // Waits for the command to end by itself.
  ExitInfo Wait() {
    if (pid_ > 0 && !reaped_) Reap();
    return Stop();
  }
  std::string err() {
    std::lock_guard<std::mutex> l(mu_);
    return err_;
  }

 private:
  void Pump(int fd, std::string* into) {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) break;
      std::lock_guard<std::mutex> l(mu_);
      into->append(buf, static_cast<size_t>(n));
      cv_.notify_all();
    }
    close(fd);
    std::lock_guard<std::mutex> l(mu_);
    ++closed_;
    cv_.notify_all();
  }
  void Reap() {
    int status = 0;
    if (waitpid(pid_, &status, 0) == pid_) {
      exit_.exited = WIFEXITED(status);
      exit_.exit_code = exit_.exited ? WEXITSTATUS(status) : 0;
      exit_.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    }
    reaped_ = true;
  }
  std::vector<std::string> LinesLocked() const {
    std::vector<std::string> lines;
    size_t start = 0;
    for (size_t nl; (nl = out_.find('\n', start)) != std::string::npos; start = nl + 1) {
      lines.push_back(out_.substr(start, nl - start));
    }
    return lines;
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  ExitInfo exit_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string out_, err_;  // guarded by mu_
  int closed_ = 0;         // pipes at EOF; guarded by mu_
  std::thread out_reader_, err_reader_;
};

// etcdctl's JSON without cluster_id, member_id and raft_term.
void StripIds(google::protobuf::Value* v) {
  if (v->has_struct_value()) {
    auto* fields = v->mutable_struct_value()->mutable_fields();
    for (const char* k : {"cluster_id", "member_id", "raft_term"}) fields->erase(k);
    for (auto& [k, child] : *fields) StripIds(&child);
  } else if (v->has_list_value()) {
    for (auto& child : *v->mutable_list_value()->mutable_values()) StripIds(&child);
  }
}

::testing::AssertionResult SameJsonLines(const std::vector<std::string>& e,
                                         const std::vector<std::string>& c) {
  if (e.size() != c.size()) {
    return ::testing::AssertionFailure()
           << "etcd printed " << e.size() << " lines, capstan " << c.size() << "\netcd:\n"
           << absl::StrJoin(e, "\n") << "\ncapstan:\n" << absl::StrJoin(c, "\n");
  }
  for (size_t i = 0; i < e.size(); ++i) {
    google::protobuf::Value ev, cv;
    if (!ParseJson(e[i], &ev) || !ParseJson(c[i], &cv)) {
      if (e[i] != c[i]) {
        return ::testing::AssertionFailure() << "line " << i << " differs:\n  etcd:    " << e[i]
                                             << "\n  capstan: " << c[i];
      }
      continue;
    }
    StripIds(&ev);
    StripIds(&cv);
    google::protobuf::util::MessageDifferencer d;
    std::string diff;
    d.ReportDifferencesToString(&diff);
    if (!d.Compare(ev, cv)) {
      return ::testing::AssertionFailure() << "line " << i << " differs:\n" << diff
                                           << "  etcd:    " << e[i] << "\n  capstan: " << c[i];
    }
  }
  return ::testing::AssertionSuccess();
}

class DiffWatchEtcdctlTest : public DiffTest {
 protected:
  std::unique_ptr<BackgroundCommand> Watch(const ServerProcess& server,
                                           std::vector<std::string> args) {
    std::vector<std::string> argv = {EtcdctlBinary(), "--endpoints=" + server.endpoint(),
                                     "watch"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("-w");
    argv.push_back("json");
    return std::make_unique<BackgroundCommand>(argv);
  }

  // History since first (with args), printed as one line by both; then each
  // live write, one line each; then etcdctl is stopped and the lines compared.
  void WatchHistoryThenLive(std::vector<std::string> args, int64_t first,
                            const std::vector<std::function<void()>>& live) {
    args.push_back("--rev=" + std::to_string(first));
    auto e = Watch(etcd(), args);
    auto c = Watch(capstan(), args);
    size_t lines = 1;
    EXPECT_EQ(e->Lines(lines).size(), lines) << "etcd: " << e->err();
    EXPECT_EQ(c->Lines(lines).size(), lines) << "capstan: " << c->err();
    for (const auto& write : live) {
      write();
      ++lines;
      EXPECT_EQ(e->Lines(lines).size(), lines) << "etcd: " << e->err();
      EXPECT_EQ(c->Lines(lines).size(), lines) << "capstan: " << c->err();
    }
    auto el = e->Lines(lines, 0s);
    auto cl = c->Lines(lines, 0s);
    e->Stop();
    c->Stop();
    EXPECT_TRUE(SameJsonLines(el, cl));
  }
};

TEST_F(DiffWatchEtcdctlTest, WatchRev) {
  const int64_t first = PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  DeleteBoth(K("a"));
  WatchHistoryThenLive({K("a")}, first,
                       {[&] { PutBoth(K("a"), "3"); }, [&] { DeleteBoth(K("a")); }});
}

TEST_F(DiffWatchEtcdctlTest, WatchRevPrevKv) {
  const int64_t first = PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  DeleteBoth(K("a"));
  PutBoth(K("a"), "3");
  WatchHistoryThenLive({K("a"), "--prev-kv"}, first,
                       {[&] { PutBoth(K("a"), "4"); }, [&] { DeleteBoth(K("a")); }});
}

TEST_F(DiffWatchEtcdctlTest, WatchPrefix) {
  const int64_t first = PutBoth(K("p/1"), "1");
  PutBoth(K("p0"), "outside");
  PutBoth(K("p/2"), "2");
  WatchHistoryThenLive({K("p/"), "--prefix", "--prev-kv"}, first,
                       {[&] { PutBoth(K("p/1"), "again"); },
                        [&] { DeleteBoth(K("p/"), PrefixEnd(K("p/"))); }});
}

TEST_F(DiffWatchEtcdctlTest, WatchRange) {
  const int64_t first = PutBoth(K("a"), "1");
  PutBoth(K("b"), "1");
  PutBoth(K("c"), "1");
  WatchHistoryThenLive({K("a"), K("c")}, first, {[&] { PutBoth(K("b"), "2"); }});
}

TEST_F(DiffWatchEtcdctlTest, WatchCompactedRevision) {
  const int64_t r1 = PutBoth(K("a"), "1");
  const int64_t r2 = PutBoth(K("a"), "2");
  etcdserverpb::CompactionRequest c;
  c.set_revision(r2);
  EXPECT_SAME(Both(c));
  // etcdctl prints the canceled response and exits by itself.
  EtcdctlPair p = Etcdctl({"watch", K("a"), "--rev=" + std::to_string(r1)});
  EXPECT_TRUE(SameEtcdctl(p));
  EXPECT_NE(p.etcd.err.find("required revision has been compacted"), std::string::npos)
      << p.etcd.err;
}

}  // namespace
}  // namespace capstan::testing
