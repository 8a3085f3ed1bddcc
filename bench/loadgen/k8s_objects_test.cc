#include "bench/loadgen/k8s_objects.h"

#include <gtest/gtest.h>

namespace capstan::bench::k8s {
namespace {

TEST(K8sObjectsTest, PodRoundTripsTheIndexedFields) {
  PodSpec p;
  p.name = "web-5d9c7b8f6-x2x9q";
  p.ns = "team-a";
  p.node = "node-000042";
  p.phase = "Pending";
  p.app = "web";
  p.seed = 7;
  const std::string stored = EncodePod(p);
  ASSERT_EQ(stored.substr(0, 4), std::string("k8s\0", 4));
  PodFields f;
  ASSERT_TRUE(DecodePod(stored, &f));
  EXPECT_EQ(f.api_version, "v1");
  EXPECT_EQ(f.kind, "Pod");
  EXPECT_EQ(f.name, p.name);
  EXPECT_EQ(f.ns, p.ns);
  EXPECT_EQ(f.node, p.node);
  EXPECT_EQ(f.phase, "Pending");
  EXPECT_EQ(f.labels.at("app"), "web");
  EXPECT_EQ(f.labels.count("pod-template-hash"), 1u);
}

TEST(K8sObjectsTest, UnscheduledPodHasNoNodeName) {
  PodSpec p;
  p.name = "unscheduled-pod";
  p.ns = "default";
  p.app = "web";
  PodFields f;
  ASSERT_TRUE(DecodePod(EncodePod(p), &f));
  EXPECT_EQ(f.node, "");
}

TEST(K8sObjectsTest, PodSizeFollowsTheTarget) {
  for (size_t target : {2048u, 4096u, 8192u}) {
    PodSpec p;
    p.name = "web-5d9c7b8f6-x2x9q";
    p.ns = "default";
    p.node = "node-1";
    p.app = "web";
    p.target_size = target;
    p.seed = target;
    const size_t size = EncodePod(p).size();
    EXPECT_NEAR(static_cast<double>(size), static_cast<double>(target), target * 0.05) << target;
  }
}

TEST(K8sObjectsTest, EnvelopeCarriesTypeMetaAndEmptyEncodingFields) {
  const std::string e = Envelope("coordination.k8s.io/v1", "Lease", "RAW");
  std::vector<int> fields;
  std::string api, kind, raw;
  ASSERT_TRUE(ForEachField(std::string_view(e).substr(4),
                           [&](int f, int type, uint64_t, std::string_view b) {
                             fields.push_back(f);
                             EXPECT_EQ(type, 2);
                             if (f == 1) {
                               ForEachField(b, [&](int tf, int, uint64_t, std::string_view tb) {
                                 (tf == 1 ? api : kind) = tb;
                               });
                             }
                             if (f == 2) raw = b;
                           }));
  EXPECT_EQ(fields, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(api, "coordination.k8s.io/v1");
  EXPECT_EQ(kind, "Lease");
  EXPECT_EQ(raw, "RAW");
}

TEST(K8sObjectsTest, OtherObjectsParseAndHaveRealisticSizes) {
  NodeSpec n;
  n.name = "node-000001";
  const std::string node = EncodeNode(n);
  const std::string lease = EncodeNodeLease("node-000001", 1700000000, 123000, 1);
  EventSpec e;
  e.name = "web-1.17a2b3c4d5e6f708";
  e.ns = "default";
  e.pod = "web-1";
  e.node = "node-000001";
  const std::string event = EncodeEvent(e);
  for (const std::string* s : {&node, &lease, &event}) {
    ASSERT_EQ(s->substr(0, 4), std::string("k8s\0", 4));
    EXPECT_TRUE(ForEachField(std::string_view(*s).substr(4),
                             [](int, int, uint64_t, std::string_view) {}));
  }
  EXPECT_GT(node.size(), 2000u);
  EXPECT_LT(node.size(), 12000u);
  EXPECT_GT(lease.size(), 200u);
  EXPECT_LT(lease.size(), 1000u);
  EXPECT_GT(event.size(), 200u);
  EXPECT_LT(event.size(), 1200u);
}

}  // namespace
}  // namespace capstan::bench::k8s
