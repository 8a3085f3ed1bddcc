// KvStore::Restore: a store replaced by a checkpoint of another, by the
// backend's directory swap and by the record copy a backend that cannot swap
// falls back to.

#include <filesystem>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "mvcc/kv_store.h"
#include "mvcc/test_backend.h"

namespace capstan::mvcc {
namespace {

class KvStoreRestoreTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/capstan-restore-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A store on a TestBackend in dir_/name.
  std::unique_ptr<KvStore> OpenStore(const std::string& name, TestBackend** backend = nullptr) {
    storage::BackendOptions bo;
    bo.dir = dir_ + "/" + name;
    auto base = storage::Backend::Open(bo);
    EXPECT_TRUE(base.ok()) << base.status();
    auto test = std::make_unique<TestBackend>(std::move(*base));
    if (backend != nullptr) *backend = test.get();
    auto store = KvStore::Open(KvStoreOptions{}, std::move(test));
    EXPECT_TRUE(store.ok()) << store.status();
    return std::move(*store);
  }

  static int64_t Put(KvStore* s, const std::string& k, const std::string& v, int64_t lease = 0) {
    etcdserverpb::PutRequest req;
    req.set_key(k);
    req.set_value(v);
    req.set_lease(lease);
    auto resp = s->Put(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->header().revision() : -1;
  }

  static std::string Range(KvStore* s, int64_t rev = 0, absl::Status* status = nullptr) {
    etcdserverpb::RangeRequest req;
    req.set_key("a");
    req.set_range_end("z");
    req.set_revision(rev);
    RangeResult result;
    absl::Status st = s->Range(req, &result);
    if (status != nullptr) *status = st;
    return result.kvs_wire;
  }

  std::string dir_;
};

// The restored store answers as the checkpoint's store did: keys at every
// revision kept, revisions, compaction, leases, hashes; and it goes on
// writing from there, also after a reopen.
TEST_P(KvStoreRestoreTest, TheRestoredStoreIsTheCheckpointsStore) {
  const bool swap = GetParam();
  auto leader = OpenStore("leader");
  etcdserverpb::LeaseGrantRequest grant;
  grant.set_id(77);
  grant.set_ttl(600);
  ASSERT_TRUE(leader->LeaseGrant(grant).ok());
  for (int i = 0; i < 300; ++i) {
    Put(leader.get(), "k" + std::to_string(i % 50), std::string(i % 200, 'v'), i % 7 == 0 ? 77 : 0);
  }
  etcdserverpb::CompactionRequest compact;
  compact.set_revision(100);
  compact.set_physical(true);
  ASSERT_TRUE(leader->Compact(compact).ok());
  const int64_t rev = leader->Rev();
  ASSERT_TRUE(leader->backend()->Checkpoint(dir_ + "/snap").ok());

  TestBackend* backend = nullptr;
  auto follower = OpenStore("follower", &backend);
  backend->refuse_replace = !swap;
  for (int i = 0; i < 20; ++i) Put(follower.get(), "other" + std::to_string(i), "x");
  // A reader in the middle of the old data when the store is replaced.
  auto reader = follower->backend()->NewIterator(storage::Cf::kKey);
  reader->SeekToFirst();
  ASSERT_TRUE(reader->Valid());

  storage::BackendOptions so;
  so.dir = dir_ + "/snap";
  so.read_only = true;
  auto source = storage::Backend::Open(so);
  ASSERT_TRUE(source.ok()) << source.status();
  bool after_ran = false;
  ASSERT_TRUE(follower->Restore(std::move(*source), [&] {
                        after_ran = true;
                        return absl::OkStatus();
                      }).ok());
  EXPECT_TRUE(after_ran);

  int old_records = 0;
  for (; reader->Valid(); reader->Next()) ++old_records;
  EXPECT_TRUE(reader->status().ok());
  // With the swap the reader finishes on the data it began on.
  if (swap) {
    EXPECT_EQ(old_records, 20);
  }
  reader.reset();

  EXPECT_EQ(follower->Rev(), rev);
  EXPECT_EQ(follower->CompactRev(), 100);
  EXPECT_TRUE(follower->lessor()->Exists(77));
  for (int64_t at : {int64_t{0}, int64_t{100}, int64_t{150}, rev}) {
    EXPECT_EQ(Range(follower.get(), at), Range(leader.get(), at)) << "at revision " << at;
  }
  absl::Status below;
  Range(follower.get(), 99, &below);
  EXPECT_FALSE(below.ok());
  uint32_t want = 0, got = 0;
  int64_t c1 = 0, c2 = 0, h1 = 0, h2 = 0;
  ASSERT_TRUE(leader->HashKV(rev, &want, &c1, &h1).ok());
  ASSERT_TRUE(follower->HashKV(rev, &got, &c2, &h2).ok());
  EXPECT_EQ(got, want);
  EXPECT_EQ(follower->AppliedIndex(), leader->AppliedIndex());

  // The swap leaves the replaced files in the checkpoint's directory.
  if (swap) {
    storage::BackendOptions old;
    old.dir = dir_ + "/snap";
    old.read_only = true;
    auto replaced = storage::Backend::Open(old);
    ASSERT_TRUE(replaced.ok()) << replaced.status();
    int records = 0;
    auto it = (*replaced)->NewIterator(storage::Cf::kKey);
    for (it->SeekToFirst(); it->Valid(); it->Next()) ++records;
    EXPECT_EQ(records, 20);
  }

  EXPECT_EQ(Put(follower.get(), "k1", "after"), rev + 1);
  EXPECT_EQ(Put(leader.get(), "k1", "after"), rev + 1);
  follower.reset();
  follower = OpenStore("follower");
  EXPECT_EQ(follower->Rev(), rev + 1);
  EXPECT_EQ(Range(follower.get()), Range(leader.get()));
  EXPECT_TRUE(follower->lessor()->Exists(77));
}

INSTANTIATE_TEST_SUITE_P(SwapOrCopy, KvStoreRestoreTest, ::testing::Values(true, false),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? std::string("Swap") : std::string("Copy");
                         });

}  // namespace
}  // namespace capstan::mvcc
