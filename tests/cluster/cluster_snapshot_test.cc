// A member that missed more than the leader's log still holds catches up by
// a snapshot, on etcd 3.5 and on Capstan (--snapshot-count=200): one member
// is stopped, 5,000 keys are written (and 1,000 of them again, so that the
// leader's log, compacted to 5,000 entries below its applied index, no
// longer reaches back to the stopped member's), the member is restarted,
// and every member's HashKV at the final revision is the same. The leader's
// resident memory (VmRSS) is sampled during the catch-up and its growth
// printed: a snapshot is streamed from a checkpoint's files, never held in
// memory.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cluster/cluster_fixture.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "gtest/gtest.h"
#include "process_fixture.h"
#include "reference.h"

namespace capstan::testing::cluster {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// VmRSS of pid in KiB (0 when unreadable).
int64_t RssKib(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return 0;
}

class SnapshotClusterTest : public ::testing::TestWithParam<ServerFlavor> {
 protected:
  void SetUp() override {
    if (GetParam() == ServerFlavor::kEtcd) CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
  }
};

TEST_P(SnapshotClusterTest, AStoppedMemberCatchesUpAfterTheLogWasCompacted) {
  ClusterOptions o = GetParam() == ServerFlavor::kEtcd ? ClusterOptions::Etcd(3)
                                                        : ClusterOptions::Capstan(3);
  o.snapshot_count = 200;
  auto started = Cluster::Start(o);
  ASSERT_TRUE(started.ok()) << started.status();
  Cluster& cluster = **started;
  auto leader = cluster.WaitForLeader(seconds(10));
  ASSERT_TRUE(leader.ok()) << leader.status();
  const int stopped = (*leader + 1) % cluster.size();
  cluster.Stop(stopped);

  // 5,000 keys, then 1,000 of them again, from 4 writers at the leader.
  constexpr int kKeys = 5000;
  constexpr int kRewrites = 1000;
  constexpr int kWriters = 4;
  std::atomic<int> next{0}, failed{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&] {
      auto stub = etcdserverpb::KV::NewStub(cluster.NewChannel(*leader));
      for (int n = next++; n < kKeys + kRewrites; n = next++) {
        etcdserverpb::PutRequest req;
        req.set_key(absl::StrCat("/snap/k", n % kKeys));
        req.set_value(std::string(100, static_cast<char>('a' + n % 26)));
        etcdserverpb::PutResponse resp;
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
        if (!stub->Put(&ctx, req, &resp).ok()) ++failed;
      }
    });
  }
  for (auto& t : writers) t.join();
  ASSERT_EQ(failed.load(), 0);

  const pid_t leader_pid = cluster.pid(*leader);
  const int64_t rss_before = RssKib(leader_pid);
  std::atomic<bool> sampling{true};
  std::atomic<int64_t> rss_peak{rss_before};
  std::thread sampler([&] {
    while (sampling.load()) {
      rss_peak = std::max(rss_peak.load(), RssKib(leader_pid));
      std::this_thread::sleep_for(milliseconds(20));  // a sampling period, not a synchronization
    }
  });
  const auto restart_at = Clock::now();
  ASSERT_TRUE(cluster.Restart(stopped).ok());
  auto rev = cluster.WaitForConvergence(0, seconds(60));
  const double catch_up = std::chrono::duration<double>(Clock::now() - restart_at).count();
  sampling = false;
  sampler.join();
  ASSERT_TRUE(rev.ok()) << rev.status();
  std::printf("%s: member %s caught up to revision %lld in %.2f s; leader VmRSS %lld KiB before, "
              "peak %lld KiB during the catch-up (growth %lld KiB)\n",
              FlavorName(GetParam()), cluster.name(stopped).c_str(), static_cast<long long>(*rev),
              catch_up, static_cast<long long>(rss_before), static_cast<long long>(rss_peak.load()),
              static_cast<long long>(rss_peak.load() - rss_before));
  if (GetParam() == ServerFlavor::kCapstan) {
    EXPECT_NE(cluster.ReadLog(stopped).find("installed a snapshot"), std::string::npos)
        << "the member did not catch up by a snapshot";
  }
  std::vector<uint32_t> hashes;
  for (int i = 0; i < cluster.size(); ++i) {
    auto h = cluster.HashKV(i, *rev);
    ASSERT_TRUE(h.ok()) << h.status();
    hashes.push_back(h->hash());
  }
  for (size_t i = 1; i < hashes.size(); ++i) {
    EXPECT_EQ(hashes[i], hashes[0]) << "member " << cluster.name(static_cast<int>(i));
  }
  // The caught-up member serves the data.
  auto stub = etcdserverpb::KV::NewStub(cluster.NewChannel(stopped));
  etcdserverpb::RangeRequest range;
  range.set_key("/snap/");
  range.set_range_end("/snap0");
  range.set_count_only(true);
  range.set_serializable(true);
  etcdserverpb::RangeResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  ASSERT_TRUE(stub->Range(&ctx, range, &resp).ok());
  EXPECT_EQ(resp.count(), kKeys);
}

INSTANTIATE_TEST_SUITE_P(Servers, SnapshotClusterTest,
                         ::testing::Values(ServerFlavor::kEtcd, ServerFlavor::kCapstan),
                         FlavorTestName());

}  // namespace
}  // namespace capstan::testing::cluster
