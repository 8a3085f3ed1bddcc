// Helpers for the peer transport's tests: members on 127.0.0.1 whose
// handlers record what they receive, raftpb.Message bytes made and read
// without the raftpb protobufs, and polling with a deadline. Test-only
// (linked by the tests of server/peer alone).
//
// Thread safety: Recorder and ErrorLog are thread-safe (the transports'
// threads call them); the rest is for the test's thread.

#ifndef CAPSTAN_SERVER_PEER_PEER_TESTING_H_
#define CAPSTAN_SERVER_PEER_PEER_TESTING_H_

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "membership/member.h"
#include "server/peer/peer_transport.h"
#include "util/coding.h"
#include "util/mutex.h"

namespace capstan::server::peer_testing {

using replication::RaftMessage;

inline constexpr uint64_t kCluster = 0x1c2d3e4f;

inline constexpr uint32_t kMsgApp = 3;  // raftpb.MsgApp

// A marshaled raftpb.Message (type 1, to 2, from 3, term 4, index 6,
// entries 7) from -> to whose index is `seq`, with one entry of `payload`
// bytes when payload > 0.
inline RaftMessage Message(uint64_t from, uint64_t to, uint64_t seq, size_t payload = 0) {
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
inline bool MessageIndex(const std::string& bytes, uint64_t* index) {
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
      auto open = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !held_; };
      mu_.Await(absl::Condition(&open));
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
  // While held, the handler waits before it records a message: the member's
  // stream receivers stop reading, as a slow peer's do.
  void Hold(bool held) {
    util::MutexLock l(&mu_);
    held_ = held;
  }

 private:
  util::Mutex mu_;
  std::map<uint64_t, std::vector<uint64_t>> received_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, int> unreachable_ ABSL_GUARDED_BY(mu_);
  int unparsed_ ABSL_GUARDED_BY(mu_) = 0;
  bool held_ ABSL_GUARDED_BY(mu_) = false;
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

// A listening TCP socket on a free port of 127.0.0.1 that nobody accepts
// on (the kernel completes connections to it): its fd, the port in *port;
// -1 when it cannot be made.
inline int ListenOnLoopback(int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(fd, 4) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

struct Member {
  uint64_t id;
  Recorder recorder;
  ErrorLog errors;
  std::unique_ptr<PeerTransport> transport;
  std::string url;  // where peers reach it
};

// Starts member `id` on 127.0.0.1:port (0: any).
inline std::unique_ptr<Member> StartMember(uint64_t id, uint64_t cluster = kCluster, int port = 0,
                                    std::optional<PeerTls> tls = std::nullopt,
                                    size_t queue_capacity = 4096,
                                    peer::PeerProberOptions probe = {}) {
  auto m = std::make_unique<Member>();
  m->id = id;
  PeerTransportOptions o;
  o.member_id = id;
  o.cluster_id = cluster;
  const std::string scheme = tls ? "https" : "http";
  o.listen_peer_urls = {{scheme, absl::StrCat("127.0.0.1:", port)}};
  o.tls = std::move(tls);
  o.queue_capacity = queue_capacity;
  o.probe = probe;
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

inline void Connect(Member& from, const Member& to) { from.transport->AddPeer(to.id, {to.url}); }

// Starts members 1 (of kCluster) and 2 (of cluster_b), with the given peer
// TLS or none, and connects 1 to 2.
inline void StartConnectedPair(std::unique_ptr<Member>* a, std::unique_ptr<Member>* b,
                               std::optional<PeerTls> tls_a = std::nullopt,
                               std::optional<PeerTls> tls_b = std::nullopt,
                               uint64_t cluster_b = kCluster) {
  *a = StartMember(1, kCluster, 0, std::move(tls_a));
  *b = StartMember(2, cluster_b, 0, std::move(tls_b));
  ASSERT_NE(*a, nullptr);
  ASSERT_NE(*b, nullptr);
  Connect(**a, **b);
}

// Sends `sends` batches of two messages of `payload` bytes (under the
// sender's batch limit together) from a to b, once a's stream to b is up,
// while b reads nothing: more than the connection takes, so that the direct
// writes of a's sender (peer_sender.h) leave bytes to its thread and later
// batches queue behind them. Then lets b read, and expects every message
// at b, in order, and no drop.
inline void ExpectABurstInOrder(Member& a, Member& b, int sends = 64,
                                size_t payload = 255 << 10) {
  ASSERT_TRUE(WaitFor([&] {
    a.transport->Send({Message(a.id, b.id, 0)});
    return b.recorder.CountFrom(a.id) > 0;
  }));
  const size_t base = b.recorder.CountFrom(a.id);
  const int unreachable = a.recorder.Unreachable(b.id);
  auto traffic = [&] {
    for (const auto& t : a.transport->Traffic()) {
      if (t.id == b.id) return t;
    }
    return membership::PeerTraffic();
  };
  const membership::PeerTraffic before = traffic();
  uint64_t seq = 0;
  uint64_t bytes = 0;
  b.recorder.Hold(true);
  for (int i = 0; i < sends; ++i) {
    std::vector<RaftMessage> batch;
    for (int j = 0; j < 2; ++j) {
      batch.push_back(Message(a.id, b.id, ++seq, payload));
      bytes += batch.back().bytes.size();
    }
    a.transport->Send(std::move(batch));
  }
  b.recorder.Hold(false);
  auto numbered = [&] {
    std::vector<uint64_t> got = b.recorder.From(a.id);
    std::vector<uint64_t> out;
    for (size_t i = base; i < got.size(); ++i) {
      if (got[i] != 0) out.push_back(got[i]);  // not a late warm-up message
    }
    return out;
  };
  ASSERT_TRUE(WaitFor([&] { return numbered().size() >= seq; }))
      << numbered().size() << " of " << seq << "; " << a.errors.Describe(b.id);
  std::vector<uint64_t> want;
  for (uint64_t i = 1; i <= seq; ++i) want.push_back(i);
  EXPECT_EQ(numbered(), want);
  EXPECT_EQ(b.recorder.unparsed(), 0);
  EXPECT_EQ(a.recorder.Unreachable(b.id), unreachable) << a.errors.Describe(b.id);
  // Counted as sent once the connection took all of it, whoever wrote it.
  EXPECT_TRUE(WaitFor([&] { return traffic().sent_bytes >= before.sent_bytes + bytes; }))
      << traffic().sent_bytes - before.sent_bytes << " of " << bytes;
  EXPECT_EQ(traffic().sent_failures, before.sent_failures);
}

}  // namespace capstan::server::peer_testing

#endif  // CAPSTAN_SERVER_PEER_PEER_TESTING_H_
