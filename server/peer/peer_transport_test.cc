// The peer transport between real gRPC servers on 127.0.0.1: ordered
// delivery between three members, rafthttp's refusals (another cluster, a
// removed member), a peer that is down and then starts, a full queue, lease
// calls forwarded to the leader, and mutual TLS with etcd's peer flags
// (certificates made by the openssl command).

#include "server/peer/peer_transport.h"

#include <sys/socket.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/peer/peer_protocol.h"
#include "tests/reference.h"
#include "util/coding.h"
#include "util/mutex.h"

namespace capstan::server {
namespace {

using replication::RaftMessage;

constexpr uint64_t kCluster = 0x1c2d3e4f;

constexpr uint32_t kMsgApp = 3;  // raftpb.MsgApp

// A marshaled raftpb.Message (type 1, to 2, from 3, term 4, index 6,
// entries 7) from -> to whose index is `seq`, with one entry of `payload`
// bytes when payload > 0.
RaftMessage Message(uint64_t from, uint64_t to, uint64_t seq, size_t payload = 0) {
  std::string bytes;
  util::AppendVarintField(1, kMsgApp, &bytes);
  util::AppendVarintField(2, to, &bytes);
  util::AppendVarintField(3, from, &bytes);
  util::AppendVarintField(4, 1, &bytes);
  util::AppendVarintField(6, seq, &bytes);
  if (payload > 0) {
    std::string entry;
    util::AppendVarintField(2, 1, &entry);
    util::AppendVarintField(3, seq, &entry);
    util::AppendBytesField(4, std::string(payload, 'x'), &entry);
    util::AppendBytesField(7, entry, &bytes);
  }
  RaftMessage out;
  out.to = to;
  out.type = kMsgApp;
  out.bytes = std::move(bytes);
  return out;
}

// The index (field 6) of a marshaled raftpb.Message; false when the bytes
// do not parse.
bool MessageIndex(const std::string& bytes, uint64_t* index) {
  *index = 0;
  const char* p = bytes.data();
  const char* end = p + bytes.size();
  while (p < end) {
    uint64_t tag = 0, value = 0;
    if (!util::ReadVarint(&p, end, &tag)) return false;
    if ((tag & 7) == 0) {
      if (!util::ReadVarint(&p, end, &value)) return false;
      if ((tag >> 3) == 6) *index = value;
    } else if ((tag & 7) == 2) {
      if (!util::ReadVarint(&p, end, &value) || value > static_cast<uint64_t>(end - p)) return false;
      p += value;
    } else {
      return false;
    }
  }
  return true;
}

// What one member's handler saw.
class Recorder {
 public:
  replication::TransportHandler Handler() {
    replication::TransportHandler h;
    h.on_message = [this](uint64_t from, std::string bytes) {
      uint64_t index = 0;
      const bool parsed = MessageIndex(bytes, &index);
      util::MutexLock l(&mu_);
      if (!parsed) ++unparsed_;
      received_[from].push_back(index);
    };
    h.on_unreachable = [this](uint64_t to) {
      util::MutexLock l(&mu_);
      ++unreachable_[to];
    };
    return h;
  }
  std::vector<uint64_t> From(uint64_t id) {
    util::MutexLock l(&mu_);
    return received_[id];
  }
  size_t CountFrom(uint64_t id) {
    util::MutexLock l(&mu_);
    return received_[id].size();
  }
  int Unreachable(uint64_t id) {
    util::MutexLock l(&mu_);
    return unreachable_[id];
  }
  int unparsed() {
    util::MutexLock l(&mu_);
    return unparsed_;
  }

 private:
  util::Mutex mu_;
  std::map<uint64_t, std::vector<uint64_t>> received_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, int> unreachable_ ABSL_GUARDED_BY(mu_);
  int unparsed_ ABSL_GUARDED_BY(mu_) = 0;
};

// The errors a member's senders reported, per peer.
class ErrorLog {
 public:
  std::function<void(uint64_t, const absl::Status&)> Callback() {
    return [this](uint64_t peer, const absl::Status& s) {
      util::MutexLock l(&mu_);
      errors_[peer].push_back(s);
    };
  }
  // Whether an error with this code and text was reported for peer.
  bool Saw(uint64_t peer, absl::StatusCode code, const std::string& text) {
    util::MutexLock l(&mu_);
    for (const auto& s : errors_[peer]) {
      if (s.code() == code && s.message() == text) return true;
    }
    return false;
  }
  size_t Count(uint64_t peer) {
    util::MutexLock l(&mu_);
    return errors_[peer].size();
  }
  std::string Describe(uint64_t peer) {
    util::MutexLock l(&mu_);
    std::string out;
    for (const auto& s : errors_[peer]) absl::StrAppend(&out, s.ToString(), "; ");
    return out;
  }

 private:
  util::Mutex mu_;
  std::map<uint64_t, std::vector<absl::Status>> errors_ ABSL_GUARDED_BY(mu_);
};

// Polls cond until it holds or the deadline passes.
template <typename Cond>
bool WaitFor(Cond cond, absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (cond()) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return cond();
}

struct Member {
  uint64_t id;
  Recorder recorder;
  ErrorLog errors;
  std::unique_ptr<PeerTransport> transport;
  std::string url;  // where peers reach it
};

// Starts member `id` on 127.0.0.1:port (0: any).
std::unique_ptr<Member> StartMember(uint64_t id, uint64_t cluster = kCluster, int port = 0,
                                    std::optional<PeerTls> tls = std::nullopt,
                                    size_t queue_capacity = 4096) {
  auto m = std::make_unique<Member>();
  m->id = id;
  PeerTransportOptions o;
  o.member_id = id;
  o.cluster_id = cluster;
  const std::string scheme = tls ? "https" : "http";
  o.listen_peer_urls = {{scheme, absl::StrCat("127.0.0.1:", port)}};
  o.tls = std::move(tls);
  o.queue_capacity = queue_capacity;
  o.initial_backoff = absl::Milliseconds(20);
  o.max_backoff = absl::Milliseconds(200);
  o.on_peer_error = m->errors.Callback();
  m->transport = std::make_unique<PeerTransport>(std::move(o));
  absl::Status s = m->transport->Start(m->recorder.Handler());
  EXPECT_TRUE(s.ok()) << s;
  if (!s.ok()) return nullptr;
  m->url = absl::StrCat(scheme, "://127.0.0.1:", m->transport->BoundPorts()[0]);
  return m;
}

void Connect(Member& from, const Member& to) { from.transport->AddPeer(to.id, {to.url}); }

TEST(PeerProtocolTest, IdsAreEtcdsHex) {
  EXPECT_EQ(peer::IdText(0x8e9e05c52164694d), "8e9e05c52164694d");
  EXPECT_EQ(peer::ParseIdText("8e9e05c52164694d"), 0x8e9e05c52164694dull);
  EXPECT_EQ(peer::ParseIdText("1"), 1u);
  EXPECT_FALSE(peer::ParseIdText(""));
  EXPECT_FALSE(peer::ParseIdText("12345678901234567"));
  EXPECT_FALSE(peer::ParseIdText("xyz"));
  uint64_t to = 0, from = 0;
  ASSERT_TRUE(peer::ReadMessageAddresses(Message(7, 9, 3).bytes, &to, &from));
  EXPECT_EQ(to, 9u);
  EXPECT_EQ(from, 7u);
}

TEST(PeerTransportTest, ThreeMembersExchangeMessagesInOrder) {
  std::vector<std::unique_ptr<Member>> members;
  for (uint64_t id : {1, 2, 3}) members.push_back(StartMember(id));
  for (auto& a : members) ASSERT_NE(a, nullptr);
  for (auto& a : members) {
    for (auto& b : members) {
      if (a != b) Connect(*a, *b);
    }
  }
  // The streams are up before the messages go (a message queued while a
  // stream is still being refused or retried may be dropped by design).
  for (auto& a : members) {
    for (auto& b : members) {
      if (a == b) continue;
      ASSERT_TRUE(WaitFor([&] {
        a->transport->Send({Message(a->id, b->id, 0)});
        return b->recorder.CountFrom(a->id) > 0;
      }));
    }
  }
  constexpr uint64_t kCount = 2000;
  std::map<std::pair<uint64_t, uint64_t>, size_t> base;
  for (auto& a : members) {
    for (auto& b : members) {
      if (a != b) base[{a->id, b->id}] = b->recorder.CountFrom(a->id);
    }
  }
  for (uint64_t seq = 1; seq <= kCount; seq += 100) {
    for (auto& a : members) {
      std::vector<RaftMessage> batch;
      for (uint64_t s = seq; s < seq + 100; ++s) {
        for (auto& b : members) {
          if (a != b) batch.push_back(Message(a->id, b->id, s, 16));
        }
      }
      a->transport->Send(std::move(batch));
    }
  }
  for (auto& a : members) {
    for (auto& b : members) {
      if (a == b) continue;
      // The numbered messages, leaving out the warm-up's (index 0), some of
      // which may arrive after `base` was taken.
      auto numbered = [&] {
        std::vector<uint64_t> got = b->recorder.From(a->id);
        std::vector<uint64_t> out;
        for (size_t i = base[{a->id, b->id}]; i < got.size(); ++i) {
          if (got[i] != 0) out.push_back(got[i]);
        }
        return out;
      };
      ASSERT_TRUE(WaitFor([&] { return numbered().size() >= kCount; }))
          << a->id << " -> " << b->id << ": " << numbered().size() << " of " << kCount;
      std::vector<uint64_t> tail = numbered();
      ASSERT_EQ(tail.size(), kCount);
      for (uint64_t i = 0; i < kCount; ++i) ASSERT_EQ(tail[i], i + 1) << a->id << " -> " << b->id;
    }
  }
  for (auto& a : members) {
    EXPECT_EQ(a->recorder.unparsed(), 0);
    for (auto& b : members) {
      if (a != b) EXPECT_EQ(a->recorder.Unreachable(b->id), 0);
    }
  }
}

TEST(PeerTransportTest, AnotherClusterIsRefusedWithEtcdsText) {
  auto a = StartMember(1, kCluster);
  auto b = StartMember(2, kCluster + 1);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(*a, *b);
  // The sender learns why; the receiver's handler never hears of it.
  ASSERT_TRUE(WaitFor([&] {
    a->transport->Send({Message(1, 2, 1)});
    return a->errors.Count(2) >= 3;
  })) << a->errors.Describe(2);
  EXPECT_TRUE(a->errors.Saw(2, absl::StatusCode::kFailedPrecondition, "cluster ID mismatch"))
      << a->errors.Describe(2);
  EXPECT_GE(a->recorder.Unreachable(2), 3);
  EXPECT_EQ(b->recorder.CountFrom(1), 0u);
  // Lease calls are refused alike.
  etcdserverpb::LeaseKeepAliveResponse response;
  absl::Status s = a->transport->LeaseRenew(2, {}, &response, 5000);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "cluster ID mismatch");
}

TEST(PeerTransportTest, RemovedMemberIsRefused) {
  auto a = StartMember(1);
  auto b = StartMember(2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(*a, *b);
  Connect(*b, *a);
  ASSERT_TRUE(WaitFor([&] {
    a->transport->Send({Message(1, 2, 1)});
    return b->recorder.CountFrom(1) > 0;
  }));
  b->transport->RemovePeer(1);
  // Messages sent after the removal: the open stream is cut at its next
  // batch, new streams are refused.
  ASSERT_TRUE(WaitFor([&] {
    a->transport->Send({Message(1, 2, 1000)});
    return a->errors.Saw(2, absl::StatusCode::kPermissionDenied,
                         "the member has been permanently removed from the cluster");
  })) << a->errors.Describe(2);
  for (int i = 0; i < 20; ++i) a->transport->Send({Message(1, 2, 1000)});
  ASSERT_TRUE(WaitFor([&] { return a->errors.Count(2) >= 3; }));
  // Nothing sent after the removal (index 1000) reached b's handler.
  for (uint64_t index : b->recorder.From(1)) EXPECT_NE(index, 1000u);
  etcdserverpb::LeaseTimeToLiveResponse response;
  absl::Status s = a->transport->LeaseTimeToLive(2, {}, &response, 5000);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(s.message(), "the member has been permanently removed from the cluster");
  // Sending to a removed peer goes nowhere and does not block.
  b->transport->Send({Message(2, 1, 1)});
}

// A port nothing listens on (bound, then released).
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(PeerTransportTest, PeerDownIsUnreachableThenMessagesFlowOnceItStarts) {
  auto a = StartMember(1);
  ASSERT_NE(a, nullptr);
  const int port = FreePort();
  a->transport->AddPeer(2, {absl::StrCat("http://127.0.0.1:", port)});
  a->transport->Send({Message(1, 2, 1)});
  ASSERT_TRUE(WaitFor([&] { return a->recorder.Unreachable(2) >= 2; }));
  EXPECT_EQ(a->errors.Count(2) > 0, true);

  auto b = StartMember(2, kCluster, port);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(WaitFor([&] {
    a->transport->Send({Message(1, 2, 7)});
    return b->recorder.CountFrom(1) > 0;
  }));
  // Once the stream is up, everything sent arrives, in order.
  const size_t base = b->recorder.CountFrom(1);
  std::vector<RaftMessage> batch;
  for (uint64_t s = 100; s < 600; ++s) batch.push_back(Message(1, 2, s));
  a->transport->Send(std::move(batch));
  // (Leaving out the probes, index 7, some of which may still arrive.)
  auto numbered = [&] {
    std::vector<uint64_t> got = b->recorder.From(1);
    std::vector<uint64_t> out;
    for (size_t i = base; i < got.size(); ++i) {
      if (got[i] != 7) out.push_back(got[i]);
    }
    return out;
  };
  ASSERT_TRUE(WaitFor([&] { return numbered().size() >= 500; }));
  std::vector<uint64_t> got = numbered();
  ASSERT_EQ(got.size(), 500u);
  for (size_t i = 0; i < 500; ++i) EXPECT_EQ(got[i], 100 + i);
}

TEST(PeerTransportTest, FullQueueDropsWithoutBlocking) {
  auto a = StartMember(1, kCluster, 0, std::nullopt, /*queue_capacity=*/16);
  ASSERT_NE(a, nullptr);
  // A peer that never answers: nothing listens there.
  a->transport->AddPeer(2, {absl::StrCat("http://127.0.0.1:", FreePort())});
  std::vector<RaftMessage> batch;
  for (uint64_t s = 0; s < 100000; ++s) batch.push_back(Message(1, 2, s, 64));
  const int before = a->recorder.Unreachable(2);
  const absl::Time start = absl::Now();
  a->transport->Send(std::move(batch));
  const absl::Duration took = absl::Now() - start;
  // Reported at once, from Send itself: at least one more report.
  EXPECT_GT(a->recorder.Unreachable(2), before);
  // Queueing 16 and dropping the rest is quick; a generous bound that only
  // a blocking Send would miss.
  EXPECT_LT(took, absl::Seconds(5)) << took;
}

TEST(PeerTransportTest, FullQueueOfALivePeerDropsAndReports) {
  auto b = StartMember(2);
  ASSERT_NE(b, nullptr);
  auto a = StartMember(1, kCluster, 0, std::nullopt, /*queue_capacity=*/4);
  ASSERT_NE(a, nullptr);
  Connect(*a, *b);
  ASSERT_TRUE(WaitFor([&] {
    a->transport->Send({Message(1, 2, 0)});
    return b->recorder.CountFrom(1) > 0;
  }));
  // Far more than the queue holds in one call: some are dropped, the peer
  // is reported, and what arrives is in order.
  std::vector<RaftMessage> batch;
  for (uint64_t s = 1; s <= 5000; ++s) batch.push_back(Message(1, 2, s, 1024));
  const size_t base = b->recorder.CountFrom(1);
  a->transport->Send(std::move(batch));
  EXPECT_GE(a->recorder.Unreachable(2), 1);
  ASSERT_TRUE(WaitFor([&] {
    a->transport->Send({Message(1, 2, 100000)});
    std::vector<uint64_t> got = b->recorder.From(1);
    return !got.empty() && got.back() == 100000;
  }));
  std::vector<uint64_t> got = b->recorder.From(1);
  std::vector<uint64_t> tail(got.begin() + base, got.end());
  EXPECT_LT(tail.size(), 5000u);
  for (size_t i = 1; i < tail.size(); ++i) EXPECT_LE(tail[i - 1], tail[i]);
}

TEST(PeerTransportTest, LeaseCallsReachTheLeader) {
  auto leader = std::make_unique<Member>();
  leader->id = 2;
  PeerTransportOptions o;
  o.member_id = 2;
  o.cluster_id = kCluster;
  o.listen_peer_urls = {{"http", "127.0.0.1:0"}};
  leader->transport = std::make_unique<PeerTransport>(o);
  replication::TransportHandler h = leader->recorder.Handler();
  h.on_lease_renew = [](const etcdserverpb::LeaseKeepAliveRequest& request,
                        etcdserverpb::LeaseKeepAliveResponse* response) {
    if (request.id() == 404) return absl::NotFoundError("etcdserver: requested lease not found");
    response->set_id(request.id());
    response->set_ttl(42);
    return absl::OkStatus();
  };
  h.on_lease_time_to_live = [](const etcdserverpb::LeaseTimeToLiveRequest& request,
                               etcdserverpb::LeaseTimeToLiveResponse* response) {
    response->set_id(request.id());
    response->set_ttl(30);
    response->set_grantedttl(60);
    if (request.keys()) response->add_keys("foo");
    return absl::OkStatus();
  };
  ASSERT_TRUE(leader->transport->Start(std::move(h)).ok());
  leader->url = absl::StrCat("http://127.0.0.1:", leader->transport->BoundPorts()[0]);

  auto follower = StartMember(1);
  ASSERT_NE(follower, nullptr);
  Connect(*follower, *leader);

  etcdserverpb::LeaseKeepAliveRequest renew;
  renew.set_id(7);
  etcdserverpb::LeaseKeepAliveResponse renewed;
  absl::Status s = follower->transport->LeaseRenew(2, renew, &renewed, 10000);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(renewed.id(), 7);
  EXPECT_EQ(renewed.ttl(), 42);

  renew.set_id(404);
  s = follower->transport->LeaseRenew(2, renew, &renewed, 10000);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "etcdserver: requested lease not found");

  etcdserverpb::LeaseTimeToLiveRequest ttl;
  ttl.set_id(9);
  ttl.set_keys(true);
  etcdserverpb::LeaseTimeToLiveResponse ttl_response;
  s = follower->transport->LeaseTimeToLive(2, ttl, &ttl_response, 10000);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(ttl_response.id(), 9);
  EXPECT_EQ(ttl_response.grantedttl(), 60);
  ASSERT_EQ(ttl_response.keys_size(), 1);

  // Not a peer, or a peer that is down: Unavailable within the deadline.
  s = follower->transport->LeaseRenew(3, renew, &renewed, 1000);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  follower->transport->AddPeer(4, {absl::StrCat("http://127.0.0.1:", FreePort())});
  const absl::Time start = absl::Now();
  s = follower->transport->LeaseRenew(4, renew, &renewed, 300);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

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
  // farip calls from 127.0.0.1 with a certificate for 10.1.2.3 only.
  auto x = StartMember(3, kCluster, 0, Tls("farip"));
  ASSERT_NE(x, nullptr);
  Connect(*x, *b);
  ASSERT_TRUE(WaitFor([&] {
    x->transport->Send({Message(3, 2, 1)});
    return x->errors.Saw(2, absl::StatusCode::kUnauthenticated,
                         "x509: certificate is valid for 10.1.2.3, not 127.0.0.1");
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
  EXPECT_FALSE(options.ok());
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
