// A KvStore on a real RocksDB backend in a fresh temporary directory, for
// the store's tests: opened before each test, reopened on demand (a restart
// with the same data), removed after.

#ifndef CAPSTAN_MVCC_KV_STORE_TEST_FIXTURE_H_
#define CAPSTAN_MVCC_KV_STORE_TEST_FIXTURE_H_

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "mvcc/kv_store.h"
#include "mvcc/revision_key.h"
#include "storage/backend.h"

namespace capstan::mvcc {

class KvStoreInTempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/capstan-kv-XXXXXX";
    dir_ = mkdtemp(tmpl);
    Reopen();
  }
  void TearDown() override {
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  // Closes the store (if open) and opens it again on the same data.
  void Reopen(KvStoreOptions options = {}) {
    store_.reset();
    storage::BackendOptions bo;
    bo.dir = dir_ + "/db";
    auto backend = storage::Backend::Open(bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto store = KvStore::Open(options, std::move(*backend));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  // The revision of the write, or -1 (and a test failure).
  int64_t Put(const std::string& k, const std::string& v = "v") {
    etcdserverpb::PutRequest req;
    req.set_key(k);
    req.set_value(v);
    auto resp = store_->Put(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->header().revision() : -1;
  }
  int64_t Delete(const std::string& k) {
    etcdserverpb::DeleteRangeRequest req;
    req.set_key(k);
    auto resp = store_->DeleteRange(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->header().revision() : -1;
  }

  // The revisions in the key family, "t" marking a tombstone.
  std::vector<std::string> StoredRevisions() const {
    std::vector<std::string> out;
    auto it = store_->backend()->NewIterator(storage::Cf::kKey);
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      Revision r;
      bool tombstone;
      if (!ParseRevisionKey(it->key(), &r, &tombstone)) continue;
      out.push_back(std::to_string(r.main) + (tombstone ? "t" : ""));
    }
    return out;
  }

  std::string dir_;
  std::unique_ptr<KvStore> store_;
};

}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_KV_STORE_TEST_FIXTURE_H_
