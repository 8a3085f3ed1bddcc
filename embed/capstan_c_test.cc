// libcapstan's C API (include/capstan/capstan_c.h), used only through the C
// header: handles, error codes and messages, callbacks with user data, and
// who frees what.

#include "capstan/capstan_c.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "process_fixture.h"
#include "watchcache/k8s_test_objects.h"

namespace {

std::string S(const char* p, size_t n) { return std::string(p, n); }

class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    capstan_options o;
    capstan_options_init(&o);
    data_ = dir_.path() + "/data";
    o.data_dir = data_.c_str();
    o.fsync = 0;
    char* error = nullptr;
    ASSERT_EQ(capstan_open(&o, &store_, &error), CAPSTAN_OK) << error;
    EXPECT_EQ(error, nullptr);
  }
  void TearDown() override { capstan_close(store_); }

  void Put(const std::string& k, const std::string& v, int64_t lease = 0) {
    char* error = nullptr;
    ASSERT_EQ(capstan_put(store_, k.data(), k.size(), v.data(), v.size(), lease, nullptr, &error),
              CAPSTAN_OK)
        << error;
  }

  capstan::testing::TempDir dir_{"capstan-c-api"};
  std::string data_;
  capstan_store* store_ = nullptr;
};

TEST_F(CApiTest, PutRangeDeleteAndErrors) {
  int64_t rev = 0;
  ASSERT_EQ(capstan_put(store_, "a", 1, "1", 1, 0, &rev, nullptr), CAPSTAN_OK);
  EXPECT_EQ(rev, 2);
  Put("b", std::string("with\0nul", 8));
  Put("c", "3");

  capstan_range_result r;
  char* error = nullptr;
  ASSERT_EQ(capstan_range(store_, "a", 1, "c", 1, nullptr, &r, &error), CAPSTAN_OK);
  EXPECT_EQ(r.revision, 4);
  EXPECT_EQ(r.count, 2);
  ASSERT_EQ(r.num_kvs, 2u);
  EXPECT_EQ(S(r.kvs[0].key, r.kvs[0].key_len), "a");
  EXPECT_EQ(S(r.kvs[1].value, r.kvs[1].value_len), std::string("with\0nul", 8));
  EXPECT_EQ(r.kvs[1].mod_revision, 3);
  capstan_range_result_free(&r);
  EXPECT_EQ(r.kvs, nullptr);

  capstan_range_options ro = {};
  ro.count_only = 1;
  ASSERT_EQ(capstan_range(store_, "\0", 1, "\0", 1, &ro, &r, nullptr), CAPSTAN_OK);
  EXPECT_EQ(r.count, 3);
  EXPECT_EQ(r.num_kvs, 0u);
  capstan_range_result_free(&r);

  int64_t deleted = 0;
  ASSERT_EQ(capstan_delete_range(store_, "a", 1, "z", 1, &deleted, &rev, nullptr), CAPSTAN_OK);
  EXPECT_EQ(deleted, 3);
  EXPECT_EQ(rev, 5);
  EXPECT_EQ(capstan_revision(store_), 5);

  // Errors: etcd's code and text, freed by the caller.
  EXPECT_EQ(capstan_put(store_, "", 0, "v", 1, 0, nullptr, &error), CAPSTAN_INVALID_ARGUMENT);
  ASSERT_NE(error, nullptr);
  EXPECT_STREQ(error, "etcdserver: key is not provided");
  capstan_free(error);
  ASSERT_EQ(capstan_compact(store_, 4, 1, nullptr), CAPSTAN_OK);
  ro = {};
  ro.revision = 3;
  EXPECT_EQ(capstan_range(store_, "a", 1, nullptr, 0, &ro, &r, &error), CAPSTAN_OUT_OF_RANGE);
  EXPECT_STREQ(error, "etcdserver: mvcc: required revision has been compacted");
  capstan_free(error);
  EXPECT_EQ(capstan_compact_revision(store_), 4);
  // A failed call leaves nothing to free, but freeing is harmless.
  capstan_range_result_free(&r);
}

TEST_F(CApiTest, OpenFailsWithAMessage) {
  capstan_options o;
  capstan_options_init(&o);
  capstan_store* other = nullptr;
  char* error = nullptr;
  EXPECT_EQ(capstan_open(&o, &other, &error), CAPSTAN_INVALID_ARGUMENT);
  ASSERT_NE(error, nullptr);
  EXPECT_NE(std::string(error).find("data_dir"), std::string::npos);
  capstan_free(error);
  EXPECT_EQ(other, nullptr);
}

TEST_F(CApiTest, TxnBuilder) {
  Put("x", "1");
  capstan_txn* txn = capstan_txn_new();
  capstan_txn_compare(txn, CAPSTAN_COMPARE_VALUE, CAPSTAN_EQUAL, "x", 1, 0, "1", 1);
  capstan_txn_put(txn, CAPSTAN_SUCCESS, "x", 1, "2", 1, 0);
  capstan_txn_range(txn, CAPSTAN_SUCCESS, "x", 1, nullptr, 0);
  capstan_txn_delete(txn, CAPSTAN_FAILURE, "x", 1, nullptr, 0);
  capstan_txn_result r;
  ASSERT_EQ(capstan_txn_commit(store_, txn, &r, nullptr), CAPSTAN_OK);
  EXPECT_TRUE(r.succeeded);
  EXPECT_EQ(r.revision, 3);
  ASSERT_EQ(r.num_results, 2u);
  EXPECT_EQ(r.results[0].type, CAPSTAN_OP_PUT);
  EXPECT_EQ(r.results[1].type, CAPSTAN_OP_RANGE);
  ASSERT_EQ(r.results[1].num_kvs, 1u);
  EXPECT_EQ(S(r.results[1].kvs[0].value, r.results[1].kvs[0].value_len), "2");
  capstan_txn_result_free(&r);
  // The same builder again: now the compare fails.
  ASSERT_EQ(capstan_txn_commit(store_, txn, &r, nullptr), CAPSTAN_OK);
  EXPECT_FALSE(r.succeeded);
  ASSERT_EQ(r.num_results, 1u);
  EXPECT_EQ(r.results[0].type, CAPSTAN_OP_DELETE);
  EXPECT_EQ(r.results[0].count, 1);
  capstan_txn_result_free(&r);
  capstan_txn_free(txn);
}

TEST_F(CApiTest, Leases) {
  int64_t id = 0, ttl = 0;
  ASSERT_EQ(capstan_lease_grant(store_, 20, 0, &id, &ttl, nullptr), CAPSTAN_OK);
  EXPECT_NE(id, 0);
  EXPECT_EQ(ttl, 20);
  Put("l", "v", id);
  int64_t granted = 0;
  EXPECT_GT(capstan_lease_ttl(store_, id, &granted), 15);
  EXPECT_EQ(granted, 20);
  ASSERT_EQ(capstan_lease_keepalive(store_, id, &ttl, nullptr), CAPSTAN_OK);
  EXPECT_EQ(ttl, 20);
  ASSERT_EQ(capstan_lease_revoke(store_, id, nullptr), CAPSTAN_OK);
  EXPECT_EQ(capstan_lease_ttl(store_, id, nullptr), -1);
  char* error = nullptr;
  EXPECT_EQ(capstan_lease_keepalive(store_, id, &ttl, &error), CAPSTAN_NOT_FOUND);
  EXPECT_STREQ(error, "etcdserver: requested lease not found");
  capstan_free(error);
  capstan_range_result r;
  ASSERT_EQ(capstan_range(store_, "l", 1, nullptr, 0, nullptr, &r, nullptr), CAPSTAN_OK);
  EXPECT_EQ(r.num_kvs, 0u);
  capstan_range_result_free(&r);
}

// What the callbacks below collect (the user data).
struct Collected {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::string> items;
  int end_code = 0;

  void Add(std::string s) {
    std::lock_guard<std::mutex> l(mu);
    items.push_back(std::move(s));
    cv.notify_all();
  }
  bool WaitFor(size_t n) {
    std::unique_lock<std::mutex> l(mu);
    return cv.wait_for(l, std::chrono::seconds(10), [&] { return items.size() >= n || end_code; });
  }
};

void OnWatch(void* user, int64_t revision, const capstan_event* events, size_t n, int end_code,
             const char* end_message) {
  auto* c = static_cast<Collected*>(user);
  for (size_t i = 0; i < n; ++i) {
    c->Add((events[i].type == CAPSTAN_EVENT_PUT ? "PUT " : "DELETE ") +
           S(events[i].kv.key, events[i].kv.key_len) + "@" +
           std::to_string(events[i].kv.mod_revision));
  }
  if (end_code != 0) {
    std::lock_guard<std::mutex> l(c->mu);
    c->end_code = end_code;
    c->items.push_back(end_message);
    c->cv.notify_all();
  }
}

TEST_F(CApiTest, WatchCallbackWithUserData) {
  Collected c;
  capstan_watch* w = nullptr;
  ASSERT_EQ(capstan_watch_open(store_, "w/", 2, "w0", 2, nullptr, OnWatch, &c, &w, nullptr),
            CAPSTAN_OK);
  Put("w/1", "a");
  Put("other", "b");
  ASSERT_EQ(capstan_delete_range(store_, "w/1", 3, nullptr, 0, nullptr, nullptr, nullptr),
            CAPSTAN_OK);
  ASSERT_TRUE(c.WaitFor(2));
  capstan_watch_close(w);
  EXPECT_EQ(c.items, (std::vector<std::string>{"PUT w/1@2", "DELETE w/1@4"}));

  // A watch from a compacted revision ends with etcd's error.
  ASSERT_EQ(capstan_compact(store_, 4, 1, nullptr), CAPSTAN_OK);
  Collected ended;
  capstan_watch_options o = {};
  o.start_revision = 2;
  ASSERT_EQ(capstan_watch_open(store_, "w/1", 3, nullptr, 0, &o, OnWatch, &ended, &w, nullptr),
            CAPSTAN_OK);
  ASSERT_TRUE(ended.WaitFor(1));
  capstan_watch_close(w);
  EXPECT_EQ(ended.end_code, CAPSTAN_OUT_OF_RANGE);
  EXPECT_EQ(ended.items.back(), "etcdserver: mvcc: required revision has been compacted");
}

void OnCacheWatch(void* user, const capstan_cache_event* events, size_t n, int end_code,
                  const char* end_message) {
  auto* c = static_cast<Collected*>(user);
  static const char* kNames[] = {"ADDED", "MODIFIED", "DELETED", "BOOKMARK"};
  for (size_t i = 0; i < n; ++i) {
    c->Add(std::string(kNames[events[i].type]) + " " +
           S(events[i].object.key, events[i].object.key_len));
  }
}

TEST_F(CApiTest, CacheListAndWatchByNode) {
  ASSERT_EQ(capstan_wait_cache_ready(store_, 10000), 1);
  using capstan::watchcache::testing::PodFields;
  using capstan::watchcache::testing::PodProtobuf;
  auto pod = [](const std::string& name, const std::string& node) {
    PodFields p;
    p.name = name;
    p.ns = "ns";
    p.node = node;
    return PodProtobuf(p);
  };
  Put("/registry/pods/ns/a", pod("a", "n1"));
  Put("/registry/pods/ns/b", pod("b", "n2"));
  Put("/registry/pods/ns/c", pod("c", "n1"));

  capstan_list_options lo = {};
  lo.prefix = "/registry/pods/";
  lo.field_selector = "spec.nodeName=n1";
  capstan_list_result lr;
  ASSERT_EQ(capstan_list(store_, &lo, &lr, nullptr), CAPSTAN_OK);
  EXPECT_EQ(lr.revision, 4);
  ASSERT_EQ(lr.num_objects, 2u);
  EXPECT_EQ(S(lr.objects[0].key, lr.objects[0].key_len), "/registry/pods/ns/a");
  EXPECT_EQ(S(lr.objects[1].key, lr.objects[1].key_len), "/registry/pods/ns/c");
  EXPECT_STREQ(lr.continue_token, "");
  capstan_list_result_free(&lr);

  lo.field_selector = "bogus";
  char* error = nullptr;
  EXPECT_EQ(capstan_list(store_, &lo, &lr, &error), CAPSTAN_INVALID_ARGUMENT);
  EXPECT_NE(error, nullptr);
  capstan_free(error);

  Collected c;
  capstan_cache_watch_options wo = {};
  wo.prefix = "/registry/pods/";
  wo.field_selector = "spec.nodeName=n1";
  capstan_cache_watch* w = nullptr;
  ASSERT_EQ(capstan_cache_watch_open(store_, &wo, OnCacheWatch, &c, &w, nullptr), CAPSTAN_OK);
  ASSERT_TRUE(c.WaitFor(2));  // the initial ADDED events
  Put("/registry/pods/ns/a", pod("a", "n2"));
  ASSERT_TRUE(c.WaitFor(3));
  capstan_cache_watch_close(w);
  EXPECT_EQ(c.items, (std::vector<std::string>{"ADDED /registry/pods/ns/a",
                                               "ADDED /registry/pods/ns/c",
                                               "DELETED /registry/pods/ns/a"}));
}

TEST_F(CApiTest, ServesEtcdOnAPickedPort) {
  capstan_close(store_);
  store_ = nullptr;
  capstan_options o;
  capstan_options_init(&o);
  o.data_dir = data_.c_str();
  o.fsync = 0;
  o.listen_client_urls = "http://127.0.0.1:0";
  o.watch_cache_prefixes = "";
  ASSERT_EQ(capstan_open(&o, &store_, nullptr), CAPSTAN_OK);
  int port = 0;
  ASSERT_EQ(capstan_client_ports(store_, &port, 1), 1u);
  ASSERT_GT(port, 0);
  // etcdctl on that port reads what the C API wrote, and the C API reads
  // what etcdctl wrote.
  if (capstan::testing::IsExecutable(capstan::testing::EtcdctlBinary())) {
    ASSERT_EQ(capstan_put(store_, "from-c", 6, "1", 1, 0, nullptr, nullptr), CAPSTAN_OK);
    const std::string endpoint = "--endpoints=127.0.0.1:" + std::to_string(port);
    auto get = capstan::testing::RunCommand(
        {capstan::testing::EtcdctlBinary(), endpoint, "get", "from-c", "--print-value-only"});
    EXPECT_EQ(get.out, "1\n") << get.err;
    auto put = capstan::testing::RunCommand(
        {capstan::testing::EtcdctlBinary(), endpoint, "put", "from-etcdctl", "2"});
    EXPECT_EQ(put.out, "OK\n") << put.err;
    capstan_range_result r;
    ASSERT_EQ(capstan_range(store_, "from-etcdctl", 12, nullptr, 0, nullptr, &r, nullptr),
              CAPSTAN_OK);
    ASSERT_EQ(r.num_kvs, 1u);
    EXPECT_EQ(S(r.kvs[0].value, r.kvs[0].value_len), "2");
    capstan_range_result_free(&r);
  }
  // No watch cache configured: List answers NOT_FOUND.
  capstan_list_options lo = {};
  lo.prefix = "/registry/pods/";
  capstan_list_result lr;
  EXPECT_EQ(capstan_list(store_, &lo, &lr, nullptr), CAPSTAN_NOT_FOUND);
  EXPECT_STREQ(capstan_version(), "0.1.0");
}

}  // namespace
