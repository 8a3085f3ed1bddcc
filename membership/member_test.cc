#include "membership/member.h"

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

}  // namespace
}  // namespace capstan::membership
