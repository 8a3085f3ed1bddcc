#include "watchcache/selector.h"

#include "gtest/gtest.h"
#include "watchcache/errors.h"
#include "watchcache/k8s_test_objects.h"

namespace capstan::watchcache {
namespace {

class SelectorTest : public ::testing::Test {
 protected:
  ObjectRef Pod(const std::string& node, const std::string& phase,
                std::map<std::string, std::string> labels) {
    testing::PodFields p{"p", "ns", node, phase, std::move(labels), 0};
    const std::string rec = testing::KvRecord("/registry/pods/ns/p", testing::PodProtobuf(p), 5);
    mvcc::KeyValueView kv;
    mvcc::DecodeKeyValue(rec, &kv);
    Extracted e;
    ex_.Extract(kv.value, &e);
    return CachedObject::Create(alloc_.get(), rec, e);
  }
  bool Match(const std::string& labels, const std::string& fields, const ObjectRef& o) {
    auto s = Selector::Parse(labels, fields, ex_);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() && s->Matches(*o);
  }
  IndexExtractor ex_{PodResource()};
  std::unique_ptr<ObjectAllocator> alloc_ = NewSlabAllocator();
};

TEST_F(SelectorTest, Labels) {
  ObjectRef o = Pod("n1", "Running", {{"app", "web"}, {"env", "prod"}});
  EXPECT_TRUE(Match("", "", o));
  EXPECT_TRUE(Match("app=web", "", o));
  EXPECT_TRUE(Match("app==web,env=prod", "", o));
  EXPECT_FALSE(Match("app=db", "", o));
  EXPECT_TRUE(Match("app!=db", "", o));
  EXPECT_TRUE(Match("missing!=x", "", o));
  EXPECT_TRUE(Match("app in (db, web)", "", o));
  EXPECT_FALSE(Match("app notin (db,web)", "", o));
  EXPECT_TRUE(Match("missing notin (a)", "", o));
  EXPECT_TRUE(Match("app", "", o));
  EXPECT_FALSE(Match("!app", "", o));
  EXPECT_TRUE(Match(" !missing , env ", "", o));
  EXPECT_FALSE(Match("env=", "", o));
}

TEST_F(SelectorTest, Fields) {
  ObjectRef o = Pod("n1", "Running", {});
  EXPECT_TRUE(Match("", "spec.nodeName=n1", o));
  EXPECT_TRUE(Match("", "spec.nodeName==n1,status.phase!=Failed", o));
  EXPECT_FALSE(Match("", "status.phase=Pending", o));
  EXPECT_TRUE(Match("", "metadata.namespace=ns,metadata.name=p", o));
  ObjectRef unscheduled = Pod("", "Pending", {});
  EXPECT_TRUE(Match("", "spec.nodeName=", unscheduled));  // unset reads as ""
  EXPECT_FALSE(Match("", "spec.nodeName=", o));
}

TEST_F(SelectorTest, Errors) {
  auto s = Selector::Parse("", "spec.hostname=x", ex_);
  EXPECT_TRUE(Is(s.status(), CacheError::kInvalidRequest));
  EXPECT_EQ(s.status().message(), "field label not supported: spec.hostname");
  EXPECT_FALSE(Selector::Parse("app in (", "", ex_).ok());
  EXPECT_FALSE(Selector::Parse("a b", "", ex_).ok());
  EXPECT_FALSE(Selector::Parse("", "nooperator", ex_).ok());
  EXPECT_FALSE(Selector::Parse("x>1", "", ex_).ok());
}

TEST_F(SelectorTest, UndecodedObjectsMatchOnlyEverything) {
  Extracted none;
  ObjectRef o = CachedObject::Create(alloc_.get(), testing::KvRecord("/registry/pods/a/b", "garbage", 3), none);
  EXPECT_TRUE(Match("", "", o));
  EXPECT_FALSE(Match("!app", "", o));
  EXPECT_FALSE(Match("", "spec.nodeName=", o));
}

}  // namespace
}  // namespace capstan::watchcache
