#include "watchcache/object_tree.h"

#include <map>
#include <random>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "watchcache/k8s_test_objects.h"

namespace capstan::watchcache {
namespace {

class ObjectTreeTest : public ::testing::Test {
 protected:
  ObjectRef Obj(const std::string& key, int64_t rev) {
    Extracted e;
    return CachedObject::Create(alloc_.get(), testing::KvRecord(key, "v", rev), e);
  }
  std::unique_ptr<ObjectAllocator> alloc_ = NewSlabAllocator();
};

void ExpectEqual(const TreeSnapshot& s, const std::map<std::string, int64_t>& model) {
  ASSERT_EQ(s.size(), model.size());
  auto it = model.begin();
  s.Scan("", "", [&](const ObjectRef& o) {
    EXPECT_EQ(o->key(), it->first);
    EXPECT_EQ(o->mod_revision(), it->second);
    ++it;
    return true;
  });
  EXPECT_TRUE(it == model.end());
}

TEST_F(ObjectTreeTest, RandomAgainstModelWithSnapshots) {
  std::mt19937 rng(7);
  ObjectTree tree;
  std::map<std::string, int64_t> model;
  std::vector<std::pair<TreeSnapshot, std::map<std::string, int64_t>>> snaps;
  for (int64_t rev = 1; rev <= 20000; ++rev) {
    const std::string key = absl::StrFormat("/k/%05d", static_cast<int>(rng() % 3000));
    if (rng() % 3 == 0) {
      ObjectRef old = tree.Erase(key);
      EXPECT_EQ(static_cast<bool>(old), model.count(key) == 1);
      model.erase(key);
    } else {
      ObjectRef old = tree.Put(Obj(key, rev));
      EXPECT_EQ(static_cast<bool>(old), model.count(key) == 1);
      model[key] = rev;
    }
    if (rev % 500 == 0) {
      ASSERT_TRUE(tree.TEST_Validate()) << rev;
      snaps.emplace_back(tree.Snapshot(), model);
    }
    if (rev % 3000 == 0 && snaps.size() > 3) snaps.erase(snaps.begin() + 1);  // drop some
  }
  ExpectEqual(tree.Snapshot(), model);
  for (const auto& [s, m] : snaps) ExpectEqual(s, m);  // unchanged by later writes
  // Find, Rank and Count agree with the model.
  TreeSnapshot s = tree.Snapshot();
  for (int i = 0; i < 3000; i += 37) {
    const std::string key = absl::StrFormat("/k/%05d", i);
    const CachedObject* o = s.Find(key);
    EXPECT_EQ(o != nullptr, model.count(key) == 1);
    size_t rank = std::distance(model.begin(), model.lower_bound(key));
    EXPECT_EQ(s.Rank(key), rank);
    const std::string end = absl::StrFormat("/k/%05d", i + 500);
    EXPECT_EQ(s.Count(key, end),
              static_cast<size_t>(std::distance(model.lower_bound(key), model.lower_bound(end))));
  }
  // Erase everything: the tree shrinks back to empty and frees its objects
  // once the snapshots are gone.
  for (const auto& [k, v] : std::map<std::string, int64_t>(model)) tree.Erase(k);
  EXPECT_EQ(tree.size(), 0u);
  snaps.clear();
  s = TreeSnapshot();
  EXPECT_EQ(alloc_->GetStats().live_blocks, 0u);
}

TEST_F(ObjectTreeTest, SnapshotIsIsolatedFromInPlaceWrites) {
  ObjectTree tree;
  for (int i = 0; i < 1000; ++i) tree.Put(Obj(absl::StrFormat("/k/%04d", i), 1));
  TreeSnapshot before = tree.Snapshot();
  tree.Put(Obj("/k/0500", 2));
  tree.Erase("/k/0001");
  EXPECT_EQ(before.Find("/k/0500")->mod_revision(), 1);
  EXPECT_NE(before.Find("/k/0001"), nullptr);
  EXPECT_EQ(tree.Find("/k/0500")->mod_revision(), 2);
  EXPECT_EQ(tree.Find("/k/0001"), nullptr);
  EXPECT_EQ(before.size(), 1000u);
  EXPECT_EQ(tree.size(), 999u);
  // Scan with bounds.
  std::vector<std::string> keys;
  before.Scan("/k/0010", "/k/0013", [&](const ObjectRef& o) {
    keys.emplace_back(o->key());
    return true;
  });
  EXPECT_EQ(keys, (std::vector<std::string>{"/k/0010", "/k/0011", "/k/0012"}));
}

}  // namespace
}  // namespace capstan::watchcache
