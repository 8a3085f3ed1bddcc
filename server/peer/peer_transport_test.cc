// The peer transport between real gRPC servers on 127.0.0.1: ordered
// delivery between three members, rafthttp's refusals (another cluster, a
// removed member), a peer that is down and then starts, a full queue, and
// lease calls forwarded to the leader.

#include "server/peer/peer_transport.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "grpcpp/create_channel.h"
#include "server/peer/peer_prober.h"
#include "server/peer/peer_protocol.h"
#include "server/peer/peer_sender.h"
#include "server/peer/peer_testing.h"
#include "util/mutex.h"

namespace capstan::server {
namespace {

using namespace peer_testing;  // NOLINT: the helpers of these tests

// A keep-alive forwarded through `t` to `leader`, its answer waited for.
absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse> RenewThrough(
    PeerTransport& t, uint64_t leader, const etcdserverpb::LeaseKeepAliveRequest& request,
    int64_t deadline_ms) {
  std::promise<absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse>> answered;
  auto future = answered.get_future();
  t.LeaseRenew(leader, request, deadline_ms,
               [&answered](absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse> r) {
                 answered.set_value(std::move(r));
               });
  return future.get();
}

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
  // Reports after the warm-up: a first connection that failed on a slow
  // machine is retried and is no drop of the numbered messages.
  std::map<std::pair<uint64_t, uint64_t>, int> unreachable;
  for (auto& a : members) {
    for (auto& b : members) {
      if (a != b) {
        base[{a->id, b->id}] = b->recorder.CountFrom(a->id);
        unreachable[{a->id, b->id}] = a->recorder.Unreachable(b->id);
      }
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
      if (a != b) {
        EXPECT_EQ(a->recorder.Unreachable(b->id), (unreachable[{a->id, b->id}]))
            << a->errors.Describe(b->id);
      }
    }
  }
}

TEST(PeerTransportTest, ABurstLargerThanTheConnectionTakesArrivesInOrder) {
  std::unique_ptr<Member> a, b;
  ASSERT_NO_FATAL_FAILURE(StartConnectedPair(&a, &b));
  ExpectABurstInOrder(*a, *b);
}

TEST(PeerTransportTest, AnotherClusterIsRefusedWithEtcdsText) {
  std::unique_ptr<Member> a, b;
  ASSERT_NO_FATAL_FAILURE(
      StartConnectedPair(&a, &b, std::nullopt, std::nullopt, kCluster + 1));
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
  absl::Status s = RenewThrough(*a->transport, 2, {}, 5000).status();
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

// A channel to a member's peer URL, as its peers' senders make it.
std::shared_ptr<grpc::Channel> PeerChannel(const std::string& url) {
  return grpc::CreateCustomChannel(peer::Target(url).first, grpc::InsecureChannelCredentials(),
                                   peer::PeerChannelArguments());
}

// Probe timing short enough for a test (etcd's: 4 s, 5 s, 30 s).
peer::PeerProberOptions FastProbes(absl::Duration timeout = absl::Seconds(2)) {
  peer::PeerProberOptions o;
  o.probe_interval = absl::Milliseconds(10);
  o.probe_timeout = timeout;
  o.report_first = absl::Milliseconds(30);
  o.report_interval = absl::Milliseconds(30);
  o.report_unhealthy_interval = absl::Milliseconds(30);
  return o;
}

TEST(PeerProberTest, AnswersSmoothTheRoundTripAndFailuresMarkThePeerUnhealthy) {
  auto b = StartMember(2);
  ASSERT_NE(b, nullptr);
  auto channel = PeerChannel(b->url);
  peer::PeerProber prober(FastProbes());
  prober.AddPeer(2, [channel] { return channel; });
  prober.Start();
  ASSERT_TRUE(WaitFor([&] {
    auto s = prober.StatusOf(2);
    return s.healthy && s.probes >= 5;
  }));
  const auto healthy = prober.StatusOf(2);
  EXPECT_GT(healthy.srtt, absl::ZeroDuration());
  EXPECT_LT(healthy.srtt, absl::Seconds(1));
  // The same clock on both ends: the difference is about nothing.
  EXPECT_LT(absl::AbsDuration(healthy.clock_difference), absl::Milliseconds(500));
  // The SRTT is observed into etcd's buckets: 0.1 ms doubling to 3.2768 s.
  std::shared_ptr<const util::LatencyHistogram> round_trips = prober.RoundTrips(2);
  ASSERT_NE(round_trips, nullptr);
  ASSERT_TRUE(WaitFor([&] { return round_trips->Count() >= 2; }));
  EXPECT_EQ(round_trips->buckets(), 16);
  EXPECT_DOUBLE_EQ(round_trips->UpperBound(0), 0.0001);
  EXPECT_DOUBLE_EQ(round_trips->UpperBound(15), 3.2768);
  EXPECT_GT(round_trips->Sum(), 0);

  // The peer goes away: its probes fail, it is unhealthy, and the last SRTT
  // is still observed (as etcd's prober does).
  b->transport->Stop();
  ASSERT_TRUE(WaitFor([&] { return !prober.StatusOf(2).healthy; }));
  const uint64_t observed = round_trips->Count();
  ASSERT_TRUE(WaitFor([&] { return round_trips->Count() >= observed + 2; }));

  prober.RemovePeer(2);
  EXPECT_EQ(prober.RoundTrips(2), nullptr);
  EXPECT_EQ(prober.StatusOf(2).probes, 0u);
  prober.Stop();
}

TEST(PeerProberTest, APeerAddedAfterStartIsProbedWithinAProbeInterval) {
  auto b = StartMember(2);
  ASSERT_NE(b, nullptr);
  auto channel = PeerChannel(b->url);
  // Observations a minute apart: with no peer, the schedule has nothing to
  // do for a minute, and the peer added now must not wait for it.
  peer::PeerProberOptions o = FastProbes();
  o.report_interval = absl::Minutes(1);
  peer::PeerProber prober(o);
  prober.Start();
  prober.AddPeer(2, [channel] { return channel; });
  ASSERT_TRUE(WaitFor([&] { return prober.StatusOf(2).healthy; }, absl::Seconds(10)));
  ASSERT_TRUE(WaitFor([&] { return prober.RoundTrips(2)->Count() >= 1; }, absl::Seconds(10)));
  prober.Stop();
}

TEST(PeerProberTest, AProberWithNoPeerHasNoThread) {
  peer::PeerProber prober(FastProbes());
  prober.Start();
  // A single member's prober: nothing to probe, and no thread polling the
  // process's connections for it.
  EXPECT_FALSE(prober.HasThread());
  auto b = StartMember(2);
  ASSERT_NE(b, nullptr);
  auto channel = PeerChannel(b->url);
  prober.AddPeer(2, [channel] { return channel; });
  EXPECT_TRUE(prober.HasThread());
  ASSERT_TRUE(WaitFor([&] { return prober.StatusOf(2).healthy; }, absl::Seconds(10)));
  prober.Stop();
  EXPECT_FALSE(prober.HasThread());
}

TEST(PeerProberTest, StopCancelsAProbeThePeerNeverAnswers) {
  // A socket that accepts connections (the kernel's backlog) and never
  // speaks: a probe waits for its deadline, a minute away.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 16), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", ntohs(addr.sin_port)),
                                           grpc::InsecureChannelCredentials(),
                                           peer::PeerChannelArguments());
  peer::PeerProber prober(FastProbes(absl::Minutes(1)));
  prober.AddPeer(2, [channel] { return channel; });
  prober.Start();
  ASSERT_TRUE(WaitFor([&] { return prober.RoundTrips(2)->Count() >= 1; }));
  EXPECT_EQ(prober.StatusOf(2).probes, 0u);  // none answered or failed yet
  const absl::Time start = absl::Now();
  prober.Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));
  close(fd);
}

TEST(PeerTransportTest, TrafficHasTheProbedRoundTripsOfEachPeer) {
  auto a = StartMember(1, kCluster, 0, std::nullopt, 4096, FastProbes());
  auto b = StartMember(2, kCluster, 0, std::nullopt, 4096, FastProbes());
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(*a, *b);
  auto observed = [&] {
    for (const auto& p : a->transport->Traffic()) {
      if (p.id == 2 && p.round_trips != nullptr && p.round_trips->Count() > 0) return true;
    }
    return false;
  };
  ASSERT_TRUE(WaitFor(observed));
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
  // Keeping the newest few and dropping the rest is quick; a generous bound
  // that only a blocking Send would miss.
  EXPECT_LT(took, absl::Seconds(5)) << took;
  // The sender's failed attempts report the peer.
  EXPECT_TRUE(WaitFor([&] { return a->recorder.Unreachable(2) > before; }));
}

TEST(PeerTransportTest, WhatWasSentToADownPeerArrivesOnlyInPart) {
  auto a = StartMember(1);
  ASSERT_NE(a, nullptr);
  const int port = FreePort();
  a->transport->AddPeer(2, {absl::StrCat("http://127.0.0.1:", port)});
  // Heartbeats and appends for a peer that is down: stale when it is back.
  std::vector<RaftMessage> batch;
  for (uint64_t s = 1000; s < 2000; ++s) batch.push_back(Message(1, 2, s));
  a->transport->Send(std::move(batch));
  auto b = StartMember(2, kCluster, port);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(WaitFor([&] {
    a->transport->Send({Message(1, 2, 7)});
    return b->recorder.CountFrom(1) > 0;
  }));
  // At most the newest few of them reach it (a burst of stale heartbeats
  // would have the leader answer every response with an append).
  std::vector<uint64_t> stale;
  for (uint64_t s : b->recorder.From(1)) {
    if (s >= 1000) stale.push_back(s);
  }
  EXPECT_LE(stale.size(), 8u);
  for (uint64_t s : stale) EXPECT_GE(s, 1992u);
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

// Member 2, the leader of the lease calls, with the lease handlers `handle`
// sets on its recorder's handler.
std::unique_ptr<Member> StartLeaseLeader(
    const std::function<void(replication::TransportHandler&)>& handle) {
  auto leader = std::make_unique<Member>();
  leader->id = 2;
  PeerTransportOptions o;
  o.member_id = 2;
  o.cluster_id = kCluster;
  o.listen_peer_urls = {{"http", "127.0.0.1:0"}};
  leader->transport = std::make_unique<PeerTransport>(o);
  replication::TransportHandler h = leader->recorder.Handler();
  handle(h);
  if (!leader->transport->Start(std::move(h)).ok()) return nullptr;
  leader->url = absl::StrCat("http://127.0.0.1:", leader->transport->BoundPorts()[0]);
  return leader;
}

TEST(PeerTransportTest, LeaseCallsReachTheLeader) {
  auto leader = StartLeaseLeader([](replication::TransportHandler& h) {
    h.on_lease_renew = [](const etcdserverpb::LeaseKeepAliveRequest& request,
                          etcdserverpb::LeaseKeepAliveResponse* response,
                          absl::AnyInvocable<void(absl::Status)> done) {
      if (request.id() == 404) {
        done(absl::NotFoundError("etcdserver: requested lease not found"));
        return;
      }
      response->set_id(request.id());
      response->set_ttl(42);
      done(absl::OkStatus());
    };
    h.on_lease_time_to_live = [](const etcdserverpb::LeaseTimeToLiveRequest& request,
                                 etcdserverpb::LeaseTimeToLiveResponse* response) {
      response->set_id(request.id());
      response->set_ttl(30);
      response->set_grantedttl(60);
      if (request.keys()) response->add_keys("foo");
      return absl::OkStatus();
    };
  });
  ASSERT_NE(leader, nullptr);

  auto follower = StartMember(1);
  ASSERT_NE(follower, nullptr);
  Connect(*follower, *leader);

  etcdserverpb::LeaseKeepAliveRequest renew;
  renew.set_id(7);
  auto renewed = RenewThrough(*follower->transport, 2, renew, 10000);
  ASSERT_TRUE(renewed.ok()) << renewed.status();
  EXPECT_EQ(renewed->id(), 7);
  EXPECT_EQ(renewed->ttl(), 42);

  renew.set_id(404);
  absl::Status s = RenewThrough(*follower->transport, 2, renew, 10000).status();
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
  s = RenewThrough(*follower->transport, 3, renew, 1000).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  follower->transport->AddPeer(4, {absl::StrCat("http://127.0.0.1:", FreePort())});
  const absl::Time start = absl::Now();
  s = RenewThrough(*follower->transport, 4, renew, 300).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// A leader whose keep-alive answers wait until `hold` renewals are waiting
// (or it is released), then answers them all.
struct HeldRenewals {
  util::Mutex mu;
  size_t hold = 0;
  bool released ABSL_GUARDED_BY(mu) = false;
  std::vector<absl::AnyInvocable<void()>> waiting ABSL_GUARDED_BY(mu);

  void Add(absl::AnyInvocable<void()> answer) {
    std::vector<absl::AnyInvocable<void()>> now;
    {
      util::MutexLock l(&mu);
      if (!released) {
        waiting.push_back(std::move(answer));
        if (waiting.size() < hold) return;
        released = true;
        now.swap(waiting);
      } else {
        now.push_back(std::move(answer));
      }
    }
    for (auto& a : now) a();
  }
  // Answers every renewal waiting, and from now on each at once.
  void Release() {
    std::vector<absl::AnyInvocable<void()>> now;
    {
      util::MutexLock l(&mu);
      released = true;
      now.swap(waiting);
    }
    for (auto& a : now) a();
  }
  size_t Waiting() {
    util::MutexLock l(&mu);
    return waiting.size();
  }
};

std::unique_ptr<Member> StartLeaseLeader(std::shared_ptr<HeldRenewals> held) {
  return StartLeaseLeader([held](replication::TransportHandler& h) {
    h.on_lease_renew = [held](const etcdserverpb::LeaseKeepAliveRequest& request,
                              etcdserverpb::LeaseKeepAliveResponse* response,
                              absl::AnyInvocable<void(absl::Status)> done) {
      held->Add([id = request.id(), response, done = std::move(done)]() mutable {
        response->set_id(id);
        response->set_ttl(42);
        done(absl::OkStatus());
      });
    };
  });
}

// etcd's follower forwards each keep-alive on its own: a leader slow to
// answer one holds up no other. Here none is answered until 64 are waiting
// at the leader at once.
TEST(PeerTransportTest, ForwardedKeepAlivesWaitForTheLeaderTogether) {
  constexpr int kRenewals = 64;
  auto held = std::make_shared<HeldRenewals>();
  held->hold = kRenewals;
  auto leader = StartLeaseLeader(held);
  ASSERT_NE(leader, nullptr);
  auto follower = StartMember(1);
  ASSERT_NE(follower, nullptr);
  Connect(*follower, *leader);

  util::Mutex mu;
  std::vector<int64_t> answered;
  int failed = 0;
  for (int i = 0; i < kRenewals; ++i) {
    etcdserverpb::LeaseKeepAliveRequest renew;
    renew.set_id(100 + i);
    follower->transport->LeaseRenew(
        2, renew, 30000,
        [&mu, &answered, &failed](absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse> r) {
          util::MutexLock l(&mu);
          if (r.ok()) {
            answered.push_back(r->id());
          } else {
            ++failed;
          }
        });
  }
  util::MutexLock l(&mu);
  auto all = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu) {
    return answered.size() + failed == static_cast<size_t>(kRenewals);
  };
  ASSERT_TRUE(mu.AwaitWithTimeout(absl::Condition(&all), absl::Seconds(30)))
      << answered.size() << " answered, " << failed << " failed, " << held->Waiting()
      << " waiting at the leader";
  EXPECT_EQ(failed, 0);
  std::sort(answered.begin(), answered.end());
  for (int i = 0; i < kRenewals; ++i) EXPECT_EQ(answered[i], 100 + i);
}

// A follower that stops answers the keep-alives it forwarded and is still
// waiting for: Unavailable, at once rather than at their deadline.
TEST(PeerTransportTest, StopAnswersForwardedKeepAlivesStillWaiting) {
  auto held = std::make_shared<HeldRenewals>();
  held->hold = 1000;  // never reached: the leader answers none
  auto leader = StartLeaseLeader(held);
  ASSERT_NE(leader, nullptr);
  auto follower = StartMember(1);
  ASSERT_NE(follower, nullptr);
  Connect(*follower, *leader);

  std::promise<absl::Status> answered;
  etcdserverpb::LeaseKeepAliveRequest renew;
  renew.set_id(7);
  follower->transport->LeaseRenew(
      2, renew, 600000, [&answered](absl::StatusOr<etcdserverpb::LeaseKeepAliveResponse> r) {
        answered.set_value(r.status());
      });
  ASSERT_TRUE(WaitFor([&] { return held->Waiting() == 1; }, absl::Seconds(10)));
  const absl::Time start = absl::Now();
  follower->transport->Stop();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  absl::Status s = answered.get_future().get();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  // A keep-alive forwarded after the stop fails at once.
  s = RenewThrough(*follower->transport, 2, renew, 600000).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  // The leader's answer, released now, finds nobody waiting for it.
  held->Release();
}
}  // namespace
}  // namespace capstan::server
