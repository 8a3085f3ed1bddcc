#include "bench/loadgen/flags.h"

#include <gtest/gtest.h>

namespace capstan::bench {
namespace {

TEST(FlagSetTest, ParsesEtcdBenchmarkStyleArguments) {
  FlagSet f;
  int clients = 1;
  int64_t total = 10000;
  bool seq = false;
  double rate = 0;
  std::string consistency = "l";
  std::vector<std::string> endpoints{"127.0.0.1:2379"};
  absl::Duration d = absl::ZeroDuration();
  f.Int("clients", &clients, "");
  f.Int64("total", &total, "");
  f.Bool("sequential-keys", &seq, "");
  f.Double("rate", &rate, "");
  f.String("consistency", &consistency, "");
  f.StringList("endpoints", &endpoints, "");
  f.Duration("duration", &d, "");
  std::vector<std::string> pos;
  ASSERT_TRUE(f.Parse({"--clients=100", "--total", "500", "--sequential-keys", "key", "-rate=7.5",
                       "--consistency", "s", "--endpoints=a:1,b:2", "--duration=1m30s", "end"},
                      &pos)
                  .ok());
  EXPECT_EQ(clients, 100);
  EXPECT_EQ(total, 500);
  EXPECT_TRUE(seq);
  EXPECT_EQ(rate, 7.5);
  EXPECT_EQ(consistency, "s");
  EXPECT_EQ(endpoints, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_EQ(d, absl::Seconds(90));
  EXPECT_EQ(pos, (std::vector<std::string>{"key", "end"}));
  EXPECT_TRUE(f.WasSet("clients"));
}

TEST(FlagSetTest, RejectsUnknownFlagsAndBadValues) {
  FlagSet f;
  int n = 0;
  f.Int("n", &n, "");
  std::vector<std::string> pos;
  EXPECT_FALSE(f.Parse({"--nope=1"}, &pos).ok());
  EXPECT_FALSE(f.Parse({"--n=abc"}, &pos).ok());
  EXPECT_FALSE(f.Parse({"--n"}, &pos).ok());
}

TEST(FlagSetTest, DoubleDashEndsFlags) {
  FlagSet f;
  bool b = false;
  f.Bool("b", &b, "");
  std::vector<std::string> pos;
  ASSERT_TRUE(f.Parse({"--", "--b"}, &pos).ok());
  EXPECT_FALSE(b);
  EXPECT_EQ(pos, (std::vector<std::string>{"--b"}));
}

}  // namespace
}  // namespace capstan::bench
