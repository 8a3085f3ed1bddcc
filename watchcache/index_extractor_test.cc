#include "watchcache/index_extractor.h"

#include "gtest/gtest.h"
#include "watchcache/cached_object.h"
#include "watchcache/k8s_test_objects.h"

namespace capstan::watchcache {
namespace {

using testing::PodFields;

PodFields SamplePod() {
  PodFields p;
  p.name = "web-1";
  p.ns = "prod";
  p.node = "node-7";
  p.phase = "Running";
  p.labels = {{"app", "web"}, {"tier", "frontend"}, {"pod-template-hash", "abc"}};
  p.padding = 3000;
  return p;
}

void ExpectPod(const IndexExtractor& ex, const Extracted& e) {
  ASSERT_TRUE(e.decoded);
  EXPECT_EQ(*e.fields[ex.FieldIndex("metadata.name")], "web-1");
  EXPECT_EQ(*e.fields[ex.FieldIndex("metadata.namespace")], "prod");
  EXPECT_EQ(*e.fields[ex.FieldIndex("spec.nodeName")], "node-7");
  EXPECT_EQ(*e.fields[ex.FieldIndex("status.phase")], "Running");
  ASSERT_EQ(e.labels.size(), 3u);
  EXPECT_EQ(e.labels[0].first, "app");  // sorted by key
  EXPECT_EQ(e.labels[0].second, "web");
  EXPECT_EQ(e.labels[1].first, "pod-template-hash");
  EXPECT_EQ(e.labels[2].first, "tier");
  EXPECT_EQ(e.labels[2].second, "frontend");
}

TEST(IndexExtractor, KubernetesProtobuf) {
  IndexExtractor ex(PodResource());
  const std::string v = testing::PodProtobuf(SamplePod());
  ASSERT_EQ(v.substr(0, 4), std::string("k8s\0", 4));
  Extracted e;
  EXPECT_TRUE(ex.Extract(v, &e));
  ExpectPod(ex, e);
  // Views point into the value: nothing copied.
  auto nn = *e.fields[ex.FieldIndex("spec.nodeName")];
  EXPECT_TRUE(nn.data() >= v.data() && nn.data() < v.data() + v.size());
}

TEST(IndexExtractor, Json) {
  IndexExtractor ex(PodResource());
  // The views in e point into the value: it must outlive them.
  const std::string v = testing::PodJson(SamplePod());
  Extracted e;
  EXPECT_TRUE(ex.Extract(v, &e));
  ExpectPod(ex, e);
}

TEST(IndexExtractor, JsonEscapesAndOrderIndependence) {
  IndexExtractor ex(PodResource());
  Extracted e;
  const std::string v =
      R"( {"status":{"phase":"Pend\u0069ng"},"spec":{"nodeName":"n\"1","x":[1,2,{"a":null}]},)"
      R"("metadata":{"labels":{"k":"v\\w","z":"1"},"namespace":"ns","name":"p"}} )";
  ASSERT_TRUE(ex.Extract(v, &e));
  EXPECT_EQ(*e.fields[ex.FieldIndex("status.phase")], "Pending");
  EXPECT_EQ(*e.fields[ex.FieldIndex("spec.nodeName")], "n\"1");
  ASSERT_EQ(e.labels.size(), 2u);
  EXPECT_EQ(e.labels[0].second, "v\\w");
}

TEST(IndexExtractor, AbsentFieldsAreUnset) {
  IndexExtractor ex(PodResource());
  PodFields p = SamplePod();
  p.node.clear();
  p.labels.clear();
  Extracted e;
  ASSERT_TRUE(ex.Extract(testing::PodProtobuf(p), &e));
  EXPECT_FALSE(e.fields[ex.FieldIndex("spec.nodeName")].has_value());
  EXPECT_TRUE(e.labels.empty());
}

TEST(IndexExtractor, UndecodableValues) {
  IndexExtractor ex(PodResource());
  Extracted e;
  EXPECT_FALSE(ex.Extract("k8s:enc:aescbc:v1:key1:\x01\x02\x03", &e));
  EXPECT_FALSE(ex.Extract("plain text", &e));
  EXPECT_FALSE(ex.Extract("{\"metadata\":{\"name\":", &e));  // truncated JSON
  std::string bad = testing::PodProtobuf(SamplePod());
  bad.resize(bad.size() / 2);  // truncated protobuf
  EXPECT_FALSE(ex.Extract(bad, &e));
  // A compressed raw (contentEncoding set) is not decoded.
  std::string env(std::string_view("k8s\0", 4));
  util::AppendBytesField(2, "raw", &env);
  util::AppendBytesField(3, "gzip", &env);
  EXPECT_FALSE(ex.Extract(env, &e));
  EXPECT_FALSE(e.decoded);
}

TEST(IndexExtractor, CachedObjectKeepsExtractedValues) {
  IndexExtractor ex(PodResource());
  auto alloc = NewSlabAllocator();
  for (bool json : {false, true}) {
    const std::string v = json ? testing::PodJson(SamplePod()) : testing::PodProtobuf(SamplePod());
    const std::string rec = testing::KvRecord("/registry/pods/prod/web-1", v, 42, 40, 3);
    Extracted e;
    ASSERT_TRUE(ex.Extract(v, &e));
    // Extract from the record's copy of the value, as the cache does.
    mvcc::KeyValueView kv;
    ASSERT_TRUE(mvcc::DecodeKeyValue(rec, &kv));
    ASSERT_TRUE(ex.Extract(kv.value, &e));
    ObjectRef o = CachedObject::Create(alloc.get(), rec, e);
    ASSERT_TRUE(o);
    EXPECT_EQ(o->key(), "/registry/pods/prod/web-1");
    EXPECT_EQ(o->value(), v);
    EXPECT_EQ(o->kv(), rec);
    EXPECT_EQ(o->mod_revision(), 42);
    EXPECT_EQ(o->create_revision(), 40);
    EXPECT_EQ(o->version(), 3);
    EXPECT_TRUE(o->decoded());
    EXPECT_EQ(o->field(ex.FieldIndex("spec.nodeName")), "node-7");
    EXPECT_EQ(o->FindLabel("tier").value_or("?"), "frontend");
    EXPECT_FALSE(o->FindLabel("nope").has_value());
    EXPECT_LT(o->block_size(), rec.size() + 200);
  }
  EXPECT_EQ(alloc->GetStats().live_blocks, 0u);
}

}  // namespace
}  // namespace capstan::watchcache
