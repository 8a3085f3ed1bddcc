#include "membership/member.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace capstan::membership {
namespace {

TEST(MemberTest, DefaultFlagsGiveEtcdsDefaultIds) {
  // Every etcd started with default flags logs "starting member
  // 8e9e05c52164694d in cluster cdf818194e3a8c32".
  const uint64_t member = EtcdMemberId({"http://localhost:2380"}, "etcd-cluster");
  EXPECT_EQ(member, 0x8e9e05c52164694dULL);
  EXPECT_EQ(EtcdClusterId({member}), 0xcdf818194e3a8c32ULL);
}

TEST(MemberTest, IdsDependOnUrlsAndTokenNotTheirOrder) {
  EXPECT_EQ(EtcdMemberId({"http://b:2380", "http://a:2380"}, "t"),
            EtcdMemberId({"http://a:2380", "http://b:2380"}, "t"));
  EXPECT_NE(EtcdMemberId({"http://a:2380"}, "t"), EtcdMemberId({"http://a:2380"}, "u"));
  EXPECT_NE(EtcdMemberId({"http://a:2380"}, "t"), EtcdMemberId({"http://a:2381"}, "t"));
  EXPECT_EQ(EtcdClusterId({1, 2}), EtcdClusterId({2, 1}));
  EXPECT_NE(EtcdClusterId({1}), EtcdClusterId({2}));
}

TEST(MemberTest, AThreeMemberClusterGetsEtcdsIds) {
  // etcd 3.5.16 started as m0, m1, m2 with --initial-cluster
  // m0=http://127.0.0.1:24800,m1=http://127.0.0.1:24801,m2=http://127.0.0.1:24802
  // and --initial-cluster-token tok lists these members (etcdctl member
  // list) and this cluster id (endpoint status).
  const std::vector<InitialMember> initial = {{"m0", {"http://127.0.0.1:24800"}},
                                              {"m1", {"http://127.0.0.1:24801"}},
                                              {"m2", {"http://127.0.0.1:24802"}}};
  std::vector<uint64_t> ids;
  for (const auto& m : initial) ids.push_back(EtcdMemberId(m.peer_urls, "tok"));
  EXPECT_EQ(ids[0], 0x926ecc1f78366a58ULL);
  EXPECT_EQ(ids[1], 0xa6b899a614adff8fULL);
  EXPECT_EQ(ids[2], 0x98d24e1898a4bdcfULL);
  EXPECT_EQ(EtcdClusterId(ids), 17130201788098635667ULL);
}

}  // namespace
}  // namespace capstan::membership
