// TestStore: a KvStore and its WatchHub on a fresh directory, for tests of
// what is fed from them (the watch cache, Range from the cache). Close and
// Open again restart both on the same data.
//
// Not thread-safe; one test at a time.

#ifndef CAPSTAN_WATCHCACHE_TEST_STORE_H_
#define CAPSTAN_WATCHCACHE_TEST_STORE_H_

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "mvcc/kv_store.h"
#include "mvcc/watch_hub.h"

namespace capstan::watchcache::testing {

class TestStore {
 public:
  TestStore() {
    char tmpl[] = "/tmp/capstan-wc-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  ~TestStore() {
    Close();
    std::filesystem::remove_all(dir_);
  }

  // Opens the store (empty the first time) and a hub on it. Check with
  // ASSERT_NO_FATAL_FAILURE.
  void Open(mvcc::WatchHubOptions hub_options = {}) {
    storage::BackendOptions bo;
    bo.dir = dir_ + "/db";
    bo.sync = false;
    auto backend = storage::Backend::Open(bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto store = mvcc::KvStore::Open(mvcc::KvStoreOptions{}, std::move(*backend));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    hub_ = std::make_unique<mvcc::WatchHub>(store_.get(), hub_options);
    store_->SetWatchHub(hub_.get());
  }
  // Stops the hub, then the store. REQUIRES: what was fed from them is gone.
  void Close() {
    if (hub_) hub_->Stop();
    store_.reset();
    hub_.reset();
  }

  mvcc::KvStore* store() const { return store_.get(); }
  mvcc::WatchHub* hub() const { return hub_.get(); }

 private:
  std::string dir_;
  std::unique_ptr<mvcc::KvStore> store_;
  std::unique_ptr<mvcc::WatchHub> hub_;
};

}  // namespace capstan::watchcache::testing

#endif  // CAPSTAN_WATCHCACHE_TEST_STORE_H_
