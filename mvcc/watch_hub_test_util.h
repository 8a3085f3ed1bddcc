// Test support for the WatchHub tests (watch_hub_test.cc,
// watch_hub_slow_test.cc): a client-side reader of a hub stream that drives
// it as the gRPC reactor does, and a fixture with a store and a hub.

#ifndef CAPSTAN_MVCC_WATCH_HUB_TEST_UTIL_H_
#define CAPSTAN_MVCC_WATCH_HUB_TEST_UTIL_H_

#include "mvcc/watch_hub.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "mvcc/errors.h"
#include "mvcc/kv_store.h"

namespace capstan::mvcc {
namespace watch_hub_test {

using etcdserverpb::WatchCreateRequest;
using etcdserverpb::WatchResponse;
using mvccpb::Event;

inline constexpr std::chrono::milliseconds kWait{10000};
inline constexpr std::chrono::milliseconds kQuiet{300};

// The client side of one Watch stream, driven like server/api/watch_service.cc's
// reactor drives it: the hub hands a message to the deliver function when
// the writer is idle (the write is then "in flight"); when that write
// completes (OnWriteDone) the reader calls Pop, and a popped message is the
// next write in flight. At most one message is ever in flight; a second
// delivery while one is in flight is a protocol violation and is counted.
//
// A stalled reader never completes its write, so everything after the first
// message stays queued in the stream until Resume().
//
// Thread safety: one thread reads (Next/DrainBurst/Resume); the hub may
// deliver from any thread.
class TestReader {
 public:
  TestReader(std::shared_ptr<WatchStream> stream, bool stalled)
      : stream_(std::move(stream)), stalled_(stalled) {
    stream_->SetDeliver([this](std::string m) { OnDeliver(std::move(m)); });
  }
  // Close() guarantees the deliver function is never called again.
  ~TestReader() { stream_->Close(); }

  WatchStream* stream() const { return stream_.get(); }

  // The next response the client receives, waiting up to `timeout`.
  std::optional<WatchResponse> Next(std::chrono::milliseconds timeout = kWait) {
    EXPECT_FALSE(stalled_) << "a stalled reader does not read";
    if (!HasReceived()) {
      {
        std::unique_lock<std::mutex> l(mu_);
        if (!cv_.wait_for(l, timeout, [this] { return inflight_.has_value(); })) {
          return std::nullopt;
        }
      }
      CompleteWrite();
    }
    std::string bytes;
    {
      std::lock_guard<std::mutex> l(mu_);
      bytes = std::move(received_.front());
      received_.pop_front();
    }
    WatchResponse resp;
    EXPECT_TRUE(resp.ParseFromString(bytes)) << "undecodable WatchResponse";
    return resp;
  }

  // A stalled reader starts reading.
  void Resume() { stalled_ = false; }

  // Completes writes back to back until the stream has nothing queued;
  // returns how many messages were queued behind the one in flight.
  size_t DrainBurst() {
    size_t popped = 0;
    while (CompleteWrite()) ++popped;
    return popped;
  }

  int violations() const {
    std::lock_guard<std::mutex> l(mu_);
    return violations_;
  }
  // Messages handed to the deliver function (not popped).
  int deliveries() const {
    std::lock_guard<std::mutex> l(mu_);
    return deliveries_;
  }

 private:
  bool HasReceived() const {
    std::lock_guard<std::mutex> l(mu_);
    return !received_.empty();
  }

  void OnDeliver(std::string m) {
    std::lock_guard<std::mutex> l(mu_);
    if (inflight_) ++violations_;
    inflight_ = std::move(m);
    ++deliveries_;
    cv_.notify_all();
  }

  // The write in flight completes: the client has it. Then, as OnWriteDone
  // does, Pop the next message. Returns true if one was popped.
  bool CompleteWrite() {
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!inflight_) return false;
      received_.push_back(std::move(*inflight_));
      inflight_.reset();
    }
    std::string next;
    if (!stream_->Pop(&next)) return false;  // the next message will be delivered
    std::lock_guard<std::mutex> l(mu_);
    if (inflight_) ++violations_;
    inflight_ = std::move(next);
    return true;
  }

  const std::shared_ptr<WatchStream> stream_;
  std::atomic<bool> stalled_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<std::string> inflight_;
  std::deque<std::string> received_;
  int violations_ = 0;
  int deliveries_ = 0;
};

inline WatchCreateRequest CreateReq(const std::string& key, const std::string& end = "",
                             int64_t start = 0) {
  WatchCreateRequest req;
  req.set_key(key);
  req.set_range_end(end);
  req.set_start_revision(start);
  return req;
}

inline std::vector<int64_t> Revs(const std::vector<Event>& evs) {
  std::vector<int64_t> out;
  for (const auto& e : evs) out.push_back(e.kv().mod_revision());
  return out;
}

inline std::vector<std::string> Keys(const std::vector<Event>& evs) {
  std::vector<std::string> out;
  for (const auto& e : evs) out.push_back(e.kv().key());
  return out;
}

inline std::vector<int64_t> Range(int64_t from, int64_t to) {
  std::vector<int64_t> out;
  for (int64_t r = from; r <= to; ++r) out.push_back(r);
  return out;
}

class WatchHubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/capstan-watch-XXXXXX";
    dir_ = mkdtemp(tmpl);
    header_.set_cluster_id(11);
    header_.set_member_id(22);
    header_.set_raft_term(33);
  }
  void TearDown() override {
    // Detach, stop the syncer (it reads the store), then the store (joins
    // the committer), then the streams (they need the hub), then the hub.
    if (store_) store_->SetWatchHub(nullptr);
    if (hub_) hub_->Stop();
    store_.reset();
    for (const auto& r : readers_) EXPECT_EQ(r->violations(), 0) << "two messages in flight";
    readers_.clear();
    hub_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Start(WatchHubOptions ho = {}, KvStoreOptions so = {}) {
    storage::BackendOptions bo;
    bo.dir = dir_ + "/db";
    bo.sync = false;  // durability is not under test here
    bo.block_cache_bytes = 8 << 20;
    bo.write_buffer_bytes = 8 << 20;
    auto backend = storage::Backend::Open(bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto store = KvStore::Open(so, std::move(*backend));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    hub_ = std::make_unique<WatchHub>(store_.get(), ho);
    store_->SetWatchHub(hub_.get());
  }

  TestReader* NewReader(bool stalled = false) {
    readers_.push_back(std::make_unique<TestReader>(hub_->OpenStream(header_), stalled));
    return readers_.back().get();
  }

  int64_t Put(const std::string& k, const std::string& v, int64_t lease = 0) {
    etcdserverpb::PutRequest req;
    req.set_key(k);
    req.set_value(v);
    req.set_lease(lease);
    auto resp = store_->Put(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->header().revision() : -1;
  }

  int64_t Delete(const std::string& k, const std::string& end = "") {
    etcdserverpb::DeleteRangeRequest req;
    req.set_key(k);
    req.set_range_end(end);
    auto resp = store_->DeleteRange(req);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->header().revision() : -1;
  }

  // Submits the puts with up to `window` of them queued at once, so they
  // are group-committed together; returns each put's revision, in order.
  std::vector<int64_t> PutMany(const std::vector<std::pair<std::string, std::string>>& kvs,
                               size_t window) {
    std::vector<int64_t> revs;
    for (size_t i = 0; i < kvs.size(); i += window) {
      const size_t n = std::min(window, kvs.size() - i);
      std::vector<etcdserverpb::PutRequest> reqs(n);
      std::vector<etcdserverpb::PutResponse> resps(n);
      std::mutex mu;
      std::condition_variable cv;
      size_t left = n;
      bool ok = true;
      for (size_t j = 0; j < n; ++j) {
        reqs[j].set_key(kvs[i + j].first);
        reqs[j].set_value(kvs[i + j].second);
        store_->Submit({PutOp{&reqs[j], &resps[j]}, [&](absl::Status s) {
                          std::lock_guard<std::mutex> l(mu);
                          if (!s.ok()) ok = false;
                          if (--left == 0) cv.notify_all();
                        }});
      }
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return left == 0; });
      EXPECT_TRUE(ok);
      for (const auto& r : resps) revs.push_back(r.header().revision());
    }
    return revs;
  }

  // Expects the next response to be the Created response of watch_id.
  void ExpectCreated(TestReader* r, int64_t watch_id) {
    auto resp = r->Next();
    ASSERT_TRUE(resp.has_value()) << "no Created response";
    EXPECT_TRUE(resp->created());
    EXPECT_FALSE(resp->canceled()) << resp->cancel_reason();
    EXPECT_EQ(resp->watch_id(), watch_id);
    EXPECT_EQ(resp->events_size(), 0);
  }

  // Reads responses until `want` events of watch_id arrived (all responses
  // read are appended to *all). Fails if they do not arrive in time.
  std::vector<Event> ReadEvents(TestReader* r, int64_t watch_id, size_t want,
                                std::vector<WatchResponse>* all = nullptr) {
    std::vector<Event> out;
    while (out.size() < want) {
      auto resp = r->Next();
      if (!resp) {
        ADD_FAILURE() << "watch " << watch_id << ": got " << out.size() << " of " << want
                      << " events";
        break;
      }
      if (resp->watch_id() == watch_id) {
        for (const auto& e : resp->events()) out.push_back(e);
      }
      if (all) all->push_back(*resp);
    }
    return out;
  }

  // Expects nothing more on the stream for a while.
  void ExpectQuiet(TestReader* r) {
    auto resp = r->Next(kQuiet);
    EXPECT_FALSE(resp.has_value()) << "unexpected response: " << resp->ShortDebugString();
  }

  std::string dir_;
  etcdserverpb::ResponseHeader header_;
  std::unique_ptr<KvStore> store_;
  std::unique_ptr<WatchHub> hub_;
  std::vector<std::unique_ptr<TestReader>> readers_;
};

}  // namespace watch_hub_test
}  // namespace capstan::mvcc

#endif  // CAPSTAN_MVCC_WATCH_HUB_TEST_UTIL_H_
