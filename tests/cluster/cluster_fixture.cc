#include "cluster/cluster_fixture.h"

#include <signal.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "http_client.h"

namespace capstan::testing::cluster {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kPollInterval = std::chrono::milliseconds(20);

bool KeepDirs() {
  const char* v = std::getenv("CAPSTAN_KEEP_TEST_DIRS");
  return v != nullptr && *v != '\0';
}

std::string ReadTail(const std::string& path, size_t max_tail) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  if (max_tail != 0 && s.size() > max_tail) s = "...\n" + s.substr(s.size() - max_tail);
  return s;
}

bool IsPortInUseFailure(const std::string& log) {
  return log.find("address already in use") != std::string::npos ||
         log.find("Address already in use") != std::string::npos ||
         log.find("Failed to add :") != std::string::npos;
}

std::string GrpcError(const grpc::Status& st) {
  return absl::StrCat("code ", st.error_code(), ": ", st.error_message());
}

}  // namespace

Cluster::Cluster(ClusterOptions options) : options_(std::move(options)) {
  if (options_.binary.empty()) {
    options_.binary = options_.flavor == ServerFlavor::kEtcd ? EtcdBinary() : CapstanBinary();
  }
}

Cluster::~Cluster() {
  for (int i = 0; i < size(); ++i) {
    if (members_[i].pid > 0) {
      if (members_[i].paused) kill(members_[i].pid, SIGCONT);
      SignalAndWait(i, SIGKILL, std::chrono::seconds(30));
    }
  }
  if (dir_.empty()) return;
  if (KeepDirs()) {
    std::fprintf(stderr, "capstan-test: keeping cluster dir %s\n", dir_.c_str());
  } else {
    RemoveTree(dir_);
  }
}

std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    if (static_cast<unsigned char>(end.back()) < 0xff) {
      end.back() = static_cast<char>(static_cast<unsigned char>(end.back()) + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');
}

int64_t Cluster::Metric(int i, absl::string_view prefix, absl::string_view label,
                        int64_t missing) const {
  const std::string ep = endpoint(i);
  int port = 0;
  if (!absl::SimpleAtoi(ep.substr(ep.rfind(':') + 1), &port)) return -1;
  HttpClient http(port);
  HttpAnswer answer = http.Request("GET", "/metrics", "", {}, std::chrono::seconds(5));
  if (answer.status != 200) return -1;
  for (absl::string_view line : absl::StrSplit(answer.body, '\n')) {
    if (!absl::StartsWith(line, prefix) || !absl::StrContains(line, label)) continue;
    double n = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &n)) return static_cast<int64_t>(n);
  }
  return missing;
}

absl::Status Cluster::SameHashKV(const std::vector<int>& members, int64_t revision) const {
  std::vector<std::string> hashes;
  bool differ = false;
  uint32_t first = 0;
  for (size_t k = 0; k < members.size(); ++k) {
    auto h = HashKV(members[k], revision);
    if (!h.ok()) {
      return absl::Status(h.status().code(),
                          absl::StrCat(name(members[k]), ": ", h.status().message()));
    }
    if (k == 0) first = h->hash();
    differ = differ || h->hash() != first;
    hashes.push_back(absl::StrCat(name(members[k]), " ", h->hash()));
  }
  if (!differ) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("HashKV at revision ", revision, " differs: ",
                                          absl::StrJoin(hashes, ", ")));
}

absl::StatusOr<MemberAdded> ParseMemberAdd(const std::string& out) {
  MemberAdded added;
  bool have_id = false;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipWhitespace())) {
    if (absl::StartsWith(line, "Member ")) {
      std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (words.size() < 2 || !absl::SimpleHexAtoi(words[1], &added.id)) {
        return absl::InvalidArgumentError(absl::StrCat("no member ID in \"", line, "\""));
      }
      have_id = true;
      continue;
    }
    if (!absl::StartsWith(line, "ETCD_")) continue;
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("no '=' in \"", line, "\""));
    }
    absl::string_view key = line.substr(0, eq);
    absl::string_view value = line.substr(eq + 1);
    if (!absl::ConsumePrefix(&value, "\"") || !absl::ConsumeSuffix(&value, "\"") ||
        absl::StrContains(value, "\\")) {
      return absl::InvalidArgumentError(absl::StrCat("not a plain quoted value: \"", line, "\""));
    }
    added.env.push_back(absl::StrCat(key, "=", value));
    added.vars[std::string(key)] = std::string(value);
  }
  if (!have_id) return absl::InvalidArgumentError("no \"Member <id> added\" line");
  return added;
}

absl::StatusOr<std::unique_ptr<Cluster>> Cluster::Start(ClusterOptions options) {
  if (options.members < 1) return absl::InvalidArgumentError("a cluster needs a member");
  std::unique_ptr<Cluster> c(new Cluster(std::move(options)));
  if (!IsExecutable(c->options_.binary)) {
    return absl::NotFoundError(absl::StrCat(FlavorName(c->options_.flavor),
                                            " binary not found or not executable: '",
                                            c->options_.binary, "'"));
  }
  c->dir_ = TempDir(absl::StrCat("capstan-cluster-", FlavorName(c->options_.flavor))).Release();
  c->members_.resize(c->options_.members);
  absl::Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    for (int i = 0; i < c->size(); ++i) {
      Member& m = c->members_[i];
      m.name = absl::StrCat("m", i);
      m.dir = absl::StrCat(c->dir_, "/", m.name);
      RemoveTree(m.dir);
      if (mkdir(m.dir.c_str(), 0755) != 0) {
        return absl::InternalError(absl::StrCat("mkdir ", m.dir, ": ", std::strerror(errno)));
      }
    }
    last = absl::OkStatus();
    for (int i = 0; i < c->size() && last.ok(); ++i) last = c->PickPorts(i);
    for (int i = 0; i < c->size() && last.ok(); ++i) {
      if (c->options_.prepare) last = c->options_.prepare(*c, i);
    }
    for (int i = 0; i < c->size() && last.ok(); ++i) last = c->Spawn(i);
    absl::StatusOr<int> leader = absl::UnknownError("not started");
    if (last.ok()) {
      leader = c->WaitForLeader(c->options_.start_timeout);
      last = leader.status();
    }
    if (last.ok()) {
      // Member IDs, by name, from the leader's member list.
      auto stub = etcdserverpb::Cluster::NewStub(c->NewChannel(*leader));
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      ctx.set_wait_for_ready(true);  // a new channel's first connection may fail
      etcdserverpb::MemberListRequest req;
      etcdserverpb::MemberListResponse resp;
      grpc::Status st = stub->MemberList(&ctx, req, &resp);
      if (!st.ok()) {
        last = absl::UnavailableError(absl::StrCat("MemberList: ", GrpcError(st)));
      } else {
        c->member_ids_.assign(c->size(), 0);
        for (const auto& m : resp.members()) {
          for (int i = 0; i < c->size(); ++i) {
            if (m.name() == c->name(i)) c->member_ids_[i] = m.id();
          }
        }
        return c;
      }
    }
    bool port_taken = false;
    for (int i = 0; i < c->size(); ++i) {
      if (c->members_[i].pid > 0) c->Kill(i);
      port_taken = port_taken || IsPortInUseFailure(c->ReadLog(i));
    }
    if (!port_taken) break;
  }
  return absl::Status(last.code(),
                      absl::StrCat(last.message(), "\n", c->LogTails(3000)));
}

std::string Cluster::initial_cluster() const {
  std::vector<std::string> peers;
  for (int j = 0; j < size(); ++j) {
    if (!members_[j].joined) peers.push_back(absl::StrCat(name(j), "=", peer_url(j)));
  }
  return absl::StrJoin(peers, ",");
}

std::vector<std::string> Cluster::BuildArgv(int i) const {
  const Member& m = members_[i];
  if (m.joined) {
    // The rest comes from the environment `etcdctl member add` printed.
    std::vector<std::string> a = {
        options_.binary,
        "--data-dir", data_dir(i),
        "--listen-client-urls", client_url(i),
        "--advertise-client-urls", client_url(i),
        "--listen-peer-urls", listen_peer_url(i),
        "--heartbeat-interval", absl::StrCat(options_.heartbeat_interval_ms),
        "--election-timeout", absl::StrCat(options_.election_timeout_ms),
        "--snapshot-count", absl::StrCat(options_.snapshot_count),
    };
    a.insert(a.end(), options_.extra_args.begin(), options_.extra_args.end());
    return a;
  }
  std::vector<std::string> a = {
      options_.binary,
      "--name", m.name,
      "--data-dir", data_dir(i),
      "--listen-client-urls", client_url(i),
      "--advertise-client-urls", client_url(i),
      "--listen-peer-urls", listen_peer_url(i),
      "--initial-advertise-peer-urls", peer_url(i),
      "--initial-cluster", initial_cluster(),
      "--initial-cluster-token", options_.cluster_token,
      "--initial-cluster-state", "new",
      "--heartbeat-interval", absl::StrCat(options_.heartbeat_interval_ms),
      "--election-timeout", absl::StrCat(options_.election_timeout_ms),
      "--snapshot-count", absl::StrCat(options_.snapshot_count),
  };
  a.insert(a.end(), options_.extra_args.begin(), options_.extra_args.end());
  return a;
}

absl::Status Cluster::Spawn(int i, const std::vector<std::string>& flags) {
  Member& m = members_[i];
  m.argv = BuildArgv(i);
  m.argv.insert(m.argv.end(), flags.begin(), flags.end());
  std::vector<std::string> env = m.env;
  if (options_.member_env) {
    std::vector<std::string> more = options_.member_env(*this, i);
    env.insert(env.end(), more.begin(), more.end());
  }
  absl::StatusOr<pid_t> pid = SpawnChild(m.argv, log_path(i), env);
  if (!pid.ok()) return pid.status();
  m.pid = *pid;
  m.paused = false;
  m.exit = ExitInfo{};
  return absl::OkStatus();
}

bool Cluster::Reap(int i, bool block) {
  Member& m = members_[i];
  if (m.pid <= 0) return true;
  if (!ReapChild(m.pid, block, &m.exit)) return false;
  m.pid = -1;
  m.paused = false;
  return true;
}

ExitInfo Cluster::SignalAndWait(int i, int sig, std::chrono::milliseconds timeout) {
  Member& m = members_[i];
  if (m.pid <= 0) return m.exit;
  kill(m.pid, sig);
  // A paused member handles SIGTERM only once it runs again.
  if (m.paused && sig != SIGKILL) kill(m.pid, SIGCONT);
  const auto deadline = Clock::now() + timeout;
  while (!Reap(i, false)) {
    if (Clock::now() >= deadline) {
      kill(m.pid, SIGKILL);
      Reap(i, true);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return m.exit;
}

std::string Cluster::endpoint(int i) const {
  return absl::StrCat("127.0.0.1:", members_[i].client_port);
}
std::vector<std::string> Cluster::endpoints() const {
  std::vector<std::string> out;
  for (int i = 0; i < size(); ++i) out.push_back(endpoint(i));
  return out;
}
std::string Cluster::client_url(int i) const {
  return absl::StrCat("http://127.0.0.1:", members_[i].client_port);
}
std::string Cluster::peer_url(int i) const {
  return absl::StrCat(options_.peer_scheme, "://127.0.0.1:", members_[i].advertised_peer_port);
}
std::string Cluster::listen_peer_url(int i) const {
  return absl::StrCat(options_.peer_scheme, "://127.0.0.1:", members_[i].peer_port);
}
std::string Cluster::name(int i) const { return members_[i].name; }
std::string Cluster::data_dir(int i) const { return members_[i].dir + "/data"; }
std::string Cluster::log_path(int i) const { return members_[i].dir + "/server.log"; }
std::string Cluster::ReadLog(int i, size_t max_bytes) const {
  return ReadTail(log_path(i), max_bytes);
}
const std::vector<std::string>& Cluster::argv(int i) const { return members_[i].argv; }

std::string Cluster::LogTails(size_t bytes_each) const {
  std::string s;
  for (int i = 0; i < size(); ++i) {
    absl::StrAppend(&s, "--- ", name(i), " log tail (", log_path(i), "):\n",
                    ReadLog(i, bytes_each), "\n");
  }
  return s;
}

std::shared_ptr<grpc::Channel> NewMemberChannel(const std::string& endpoint) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 250);
  return grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), args);
}

std::shared_ptr<grpc::Channel> Cluster::NewChannel(int i) const {
  return NewMemberChannel(endpoint(i));
}

bool Cluster::running(int i) { return members_[i].pid > 0 && !Reap(i, false); }
bool Cluster::paused(int i) const { return members_[i].paused; }
pid_t Cluster::pid(int i) const { return members_[i].pid; }

ExitInfo Cluster::Kill(int i) { return SignalAndWait(i, SIGKILL, std::chrono::seconds(30)); }
ExitInfo Cluster::Stop(int i) { return SignalAndWait(i, SIGTERM, options_.stop_timeout); }

absl::Status Cluster::Pause(int i) {
  Member& m = members_[i];
  if (m.pid <= 0) return absl::FailedPreconditionError(absl::StrCat(m.name, " is not running"));
  if (kill(m.pid, SIGSTOP) != 0) {
    return absl::InternalError(absl::StrCat("SIGSTOP ", m.name, ": ", std::strerror(errno)));
  }
  m.paused = true;
  return absl::OkStatus();
}

absl::Status Cluster::Resume(int i) {
  Member& m = members_[i];
  if (m.pid <= 0) return absl::FailedPreconditionError(absl::StrCat(m.name, " is not running"));
  if (kill(m.pid, SIGCONT) != 0) {
    return absl::InternalError(absl::StrCat("SIGCONT ", m.name, ": ", std::strerror(errno)));
  }
  m.paused = false;
  return absl::OkStatus();
}

absl::Status Cluster::Restart(int i) { return Restart(i, {}); }

absl::Status Cluster::Restart(int i, const std::vector<std::string>& flags) {
  if (running(i)) {
    return absl::FailedPreconditionError(absl::StrCat("Restart: ", name(i), " still running"));
  }
  absl::Status s = Spawn(i, flags);
  if (s.ok()) s = WaitMemberReady(i, options_.start_timeout);
  if (!s.ok() && running(i)) Kill(i);
  return s;
}

absl::StatusOr<ExitInfo> Cluster::WaitForExit(int i, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (running(i)) {
    if (Clock::now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(name(i), " still running after ",
                                                      timeout.count(), " ms\nlog tail:\n",
                                                      ReadLog(i, 4000)));
    }
    std::this_thread::sleep_for(kPollInterval);
  }
  return members_[i].exit;
}

const ExitInfo& Cluster::exit_info(int i) const { return members_[i].exit; }

absl::StatusOr<int> Cluster::ReserveMember() {
  const int i = size();
  Member m;
  m.name = absl::StrCat("m", i);
  m.dir = absl::StrCat(dir_, "/", m.name);
  RemoveTree(m.dir);
  if (mkdir(m.dir.c_str(), 0755) != 0) {
    return absl::InternalError(absl::StrCat("mkdir ", m.dir, ": ", std::strerror(errno)));
  }
  members_.push_back(std::move(m));
  member_ids_.resize(members_.size(), 0);
  absl::Status ports = PickPorts(i);
  if (!ports.ok()) return ports;
  return i;
}

absl::Status Cluster::PickPorts(int i) {
  Member& m = members_[i];
  m.client_port = PickFreePort();
  m.peer_port = PickFreePort();
  m.advertised_peer_port = m.peer_port;
  if (options_.peer_front) {
    absl::StatusOr<int> front = options_.peer_front(*this, i, m.peer_port);
    if (!front.ok()) return front.status();
    m.advertised_peer_port = *front;
  }
  return absl::OkStatus();
}

absl::Status Cluster::StartJoining(int i, std::vector<std::string> env) {
  Member& m = members_[i];
  if (m.pid > 0 || !m.argv.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("StartJoining: ", m.name,
                                                      " has been started before"));
  }
  m.joined = true;
  m.env = std::move(env);
  absl::Status s = Spawn(i);
  if (s.ok()) s = WaitMemberReady(i, options_.start_timeout);
  if (s.ok()) {
    auto st = Status(i, std::chrono::seconds(5));
    if (st.ok()) {
      member_ids_[i] = st->header().member_id();
    } else {
      s = st.status();
    }
  }
  if (!s.ok() && running(i)) Kill(i);
  return s;
}

absl::Status Cluster::WaitMemberReady(int i, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::string last = "no attempt";
  while (true) {
    if (!running(i)) {
      return absl::UnavailableError(absl::StrCat(name(i), " exited during start-up (",
                                                 members_[i].exit.ToString(), ")\nlog tail:\n",
                                                 ReadLog(i, 4000)));
    }
    auto st = Status(i, std::chrono::milliseconds(500));
    if (st.ok() && st->leader() != 0) return absl::OkStatus();
    last = st.ok() ? "Status answered without a leader" : st.status().ToString();
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  return absl::DeadlineExceededError(absl::StrCat(name(i), " not ready within ", timeout.count(),
                                                  " ms (last: ", last, ")\nlog tail:\n",
                                                  ReadLog(i, 4000)));
}

absl::StatusOr<etcdserverpb::StatusResponse> Cluster::Status(
    int i, std::chrono::milliseconds timeout) const {
  auto stub = etcdserverpb::Maintenance::NewStub(NewChannel(i));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  ctx.set_wait_for_ready(true);
  etcdserverpb::StatusRequest req;
  etcdserverpb::StatusResponse resp;
  grpc::Status st = stub->Status(&ctx, req, &resp);
  if (!st.ok()) {
    return absl::UnavailableError(absl::StrCat(name(i), " Status: ", GrpcError(st)));
  }
  return resp;
}

absl::StatusOr<etcdserverpb::RangeResponse> Cluster::LocalGet(
    int i, const std::string& key, std::chrono::milliseconds timeout) const {
  auto stub = etcdserverpb::KV::NewStub(NewChannel(i));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  etcdserverpb::RangeRequest req;
  req.set_key(key);
  req.set_serializable(true);
  etcdserverpb::RangeResponse resp;
  grpc::Status st = stub->Range(&ctx, req, &resp);
  if (!st.ok()) {
    return absl::UnavailableError(absl::StrCat(name(i), " Range: ", GrpcError(st)));
  }
  return resp;
}

grpc::Status Cluster::KeepAliveOnce(int i, int64_t id, bool require_leader, bool* answered,
                                    std::chrono::milliseconds timeout) const {
  auto stub = etcdserverpb::Lease::NewStub(NewChannel(i));
  grpc::ClientContext ctx;
  if (require_leader) ctx.AddMetadata("hasleader", "true");
  ctx.set_deadline(std::chrono::system_clock::now() + timeout);
  auto stream = stub->LeaseKeepAlive(&ctx);
  etcdserverpb::LeaseKeepAliveRequest req;
  req.set_id(id);
  stream->Write(req);
  etcdserverpb::LeaseKeepAliveResponse resp;
  *answered = stream->Read(&resp);
  if (*answered) stream->WritesDone();
  return stream->Finish();
}

absl::StatusOr<etcdserverpb::HashKVResponse> Cluster::HashKV(
    int i, int64_t revision, std::chrono::milliseconds timeout) const {
  auto stub = etcdserverpb::Maintenance::NewStub(NewChannel(i));
  const auto deadline = Clock::now() + timeout;
  std::string last;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    ctx.set_wait_for_ready(true);
    etcdserverpb::HashKVRequest req;
    req.set_revision(revision);
    etcdserverpb::HashKVResponse resp;
    grpc::Status st = stub->HashKV(&ctx, req, &resp);
    if (st.ok()) return resp;
    last = GrpcError(st);
    // "mvcc: required revision is a future revision": not applied there yet.
    const bool future = st.error_message().find("future revision") != std::string::npos;
    if (!future || Clock::now() >= deadline) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  return absl::UnavailableError(absl::StrCat(name(i), " HashKV at ", revision, ": ", last));
}

int Cluster::IndexOfMemberId(uint64_t id) const {
  for (int i = 0; i < static_cast<int>(member_ids_.size()); ++i) {
    if (member_ids_[i] == id) return i;
  }
  return -1;
}

absl::StatusOr<int> Cluster::WaitForLeader(std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  std::string last = "no attempt";
  while (true) {
    uint64_t leader = 0;
    int leader_index = -1;
    bool agreed = true;
    for (int i = 0; i < size() && agreed; ++i) {
      if (members_[i].pid <= 0 || members_[i].paused) continue;
      auto st = Status(i, std::chrono::milliseconds(500));
      if (!st.ok()) {
        last = st.status().ToString();
        agreed = false;
      } else if (st->leader() == 0) {
        last = absl::StrCat(name(i), " has no leader");
        agreed = false;
      } else if (leader != 0 && st->leader() != leader) {
        last = absl::StrCat(name(i), " names leader ", st->leader(), ", another names ", leader);
        agreed = false;
      } else {
        leader = st->leader();
        if (st->header().member_id() == leader) leader_index = i;
      }
    }
    if (agreed && leader != 0 && leader_index >= 0) return leader_index;
    if (agreed) last = absl::StrCat("leader ", leader, " is not among the running members");
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no leader agreed within ", timeout.count(), " ms (last: ", last, ")"));
}

absl::StatusOr<int64_t> Cluster::WaitForConvergence(int64_t revision,
                                                    std::chrono::milliseconds timeout) const {
  const auto deadline = Clock::now() + timeout;
  std::string last = "no attempt";
  while (true) {
    int64_t seen = -1;
    bool same = true;
    for (int i = 0; i < size() && same; ++i) {
      if (members_[i].pid <= 0 || members_[i].paused) continue;
      auto st = Status(i, std::chrono::milliseconds(500));
      if (!st.ok()) {
        last = st.status().ToString();
        same = false;
        continue;
      }
      const int64_t rev = st->header().revision();
      if (rev < revision || (seen >= 0 && rev != seen)) {
        last = absl::StrCat(name(i), " at revision ", rev, " (want ", revision,
                            seen >= 0 ? absl::StrCat(", another at ", seen) : "", ")");
        same = false;
      }
      seen = rev;
    }
    if (same && seen >= 0) return seen;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(kPollInterval);
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "members did not converge within ", timeout.count(), " ms (last: ", last, ")"));
}

}  // namespace capstan::testing::cluster
