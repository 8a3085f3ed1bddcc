// Shared by the differential Watch tests (diff_watch_test.cc,
// diff_watch_etcdctl_test.cc, diff_watch_race_test.cc): requests, a Watch
// stream read by its own thread, the same stream on both servers, and the
// comparisons.

#ifndef CAPSTAN_TESTS_DIFF_WATCH_H_
#define CAPSTAN_TESTS_DIFF_WATCH_H_


#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "diff_fixture.h"
#include "google/protobuf/util/message_differencer.h"

namespace capstan::testing {

using etcdserverpb::WatchCreateRequest;
using etcdserverpb::WatchRequest;
using etcdserverpb::WatchResponse;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Bounds a wait for a response that must come (only a failing case waits
// this long).
inline constexpr auto kEventWait = 10s;
// How long a case looks for responses that must not come.
inline constexpr auto kQuiet = 300ms;

// ---------------------------------------------------------------------------
// Requests

inline WatchRequest CreateReq(const std::string& key, const std::string& end = "", int64_t start = 0) {
  WatchRequest r;
  WatchCreateRequest* c = r.mutable_create_request();
  c->set_key(key);
  c->set_range_end(end);
  c->set_start_revision(start);
  return r;
}

inline WatchRequest CancelReq(int64_t id) {
  WatchRequest r;
  r.mutable_cancel_request()->set_watch_id(id);
  return r;
}

inline WatchRequest ProgressReq() {
  WatchRequest r;
  r.mutable_progress_request();
  return r;
}

inline bool IsProgress(const WatchResponse& r) {
  return !r.created() && !r.canceled() && r.events_size() == 0 && r.compact_revision() == 0;
}

// ---------------------------------------------------------------------------
// One Watch stream to one server, read by its own thread.

class WatchClient {
 public:
  // token: sent as the stream's auth token, if not empty.
  explicit WatchClient(etcdserverpb::Watch::Stub* stub, const std::string& token = "") {
    if (!token.empty()) ctx_.AddMetadata("token", token);
    stream_ = stub->Watch(&ctx_);
    reader_ = std::thread([this] {
      WatchResponse r;
      while (stream_->Read(&r)) {
        std::lock_guard<std::mutex> l(mu_);
        queue_.push_back(std::move(r));
        r = WatchResponse();
        cv_.notify_all();
      }
      std::lock_guard<std::mutex> l(mu_);
      ended_ = true;
      cv_.notify_all();
    });
  }
  ~WatchClient() {
    ctx_.TryCancel();
    reader_.join();
    (void)stream_->Finish();
  }
  WatchClient(const WatchClient&) = delete;
  WatchClient& operator=(const WatchClient&) = delete;

  // REQUIRES: called by one thread at a time.
  bool Send(const WatchRequest& r) { return stream_->Write(r); }

  // The next response, or nothing after timeout (or when the stream ended).
  std::optional<WatchResponse> Next(Clock::duration timeout) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, timeout, [this] { return !queue_.empty() || ended_; });
    if (queue_.empty()) return std::nullopt;
    WatchResponse r = std::move(queue_.front());
    queue_.pop_front();
    return r;
  }

 private:
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<WatchRequest, WatchResponse>> stream_;
  std::thread reader_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<WatchResponse> queue_;  // guarded by mu_
  bool ended_ = false;               // guarded by mu_
};

// The same stream on both servers.
struct WatchPair {
  WatchPair(ServerStubs& e, ServerStubs& c) : etcd(e.watch.get()), capstan(c.watch.get()) {}
  void Send(const WatchRequest& r) {
    EXPECT_TRUE(etcd.Send(r)) << "etcd stream broke";
    EXPECT_TRUE(capstan.Send(r)) << "capstan stream broke";
  }
  WatchClient etcd;
  WatchClient capstan;
};

// Responses grouped by watch id, each group in arrival order.
using ByWatcher = std::map<int64_t, std::vector<WatchResponse>>;

// Reads from c until every watcher in want_events has at least that many
// events in its group and its last response is not a fragment (a watcher
// wanting 0 events needs one response, its Created), or timeout.
inline ByWatcher CollectByWatcher(WatchClient& c, const std::map<int64_t, int>& want_events,
                           Clock::duration timeout = kEventWait) {
  ByWatcher got;
  std::map<int64_t, int> events;
  const auto deadline = Clock::now() + timeout;
  auto done = [&] {
    for (const auto& [id, want] : want_events) {
      auto it = got.find(id);
      if (it == got.end() || events[id] < want || it->second.back().fragment()) return false;
    }
    return true;
  };
  while (!done()) {
    auto r = c.Next(deadline - Clock::now());
    if (!r) break;
    events[r->watch_id()] += r->events_size();
    got[r->watch_id()].push_back(std::move(*r));
  }
  return got;
}

// ---------------------------------------------------------------------------
// Comparisons shared by the fixtures.

inline ::testing::AssertionResult SameResponse(const WatchResponse& e, const WatchResponse& c,
                                        const ServerProcess& etcd, const ServerProcess& capstan) {
  return SameAnswer(grpc::Status::OK, e, etcd, grpc::Status::OK, c, capstan);
}

// Mixin for a fixture that has etcd(), capstan() and their stubs.
template <typename Base>
class WatchCompare : public Base {
 protected:
  // The next response of each server, which must come and be the same.
  // Returns etcd's (or capstan's, if etcd sent none).
  WatchResponse ExpectNext(WatchPair& w, const std::string& what = "") {
    auto e = w.etcd.Next(kEventWait);
    auto c = w.capstan.Next(kEventWait);
    EXPECT_TRUE(e.has_value()) << what << ": etcd sent no response";
    EXPECT_TRUE(c.has_value()) << what << ": capstan sent no response";
    if (e && c) {
      EXPECT_TRUE(SameResponse(*e, *c, this->etcd(), this->capstan())) << what;
    } else if (e || c) {
      ADD_FAILURE() << what << ": the one response that came:\n" << Describe(e ? *e : *c);
    }
    return e ? *e : (c ? *c : WatchResponse());
  }

  // Neither server sends anything within kQuiet.
  void ExpectQuiet(WatchPair& w, const std::string& what = "") {
    auto e = w.etcd.Next(kQuiet);
    auto c = w.capstan.Next(kQuiet);
    EXPECT_FALSE(e.has_value()) << what << ": etcd sent\n" << Describe(*e);
    EXPECT_FALSE(c.has_value()) << what << ": capstan sent\n" << Describe(*c);
  }

  // Collects per watcher on both servers and compares group by group.
  ByWatcher ExpectSameByWatcher(WatchPair& w, const std::map<int64_t, int>& want_events,
                                const std::string& what = "") {
    ByWatcher e = CollectByWatcher(w.etcd, want_events);
    ByWatcher c = CollectByWatcher(w.capstan, want_events);
    std::set<int64_t> ids;
    for (const auto& [id, rs] : e) ids.insert(id);
    for (const auto& [id, rs] : c) ids.insert(id);
    for (int64_t id : ids) {
      const auto& er = e[id];
      const auto& cr = c[id];
      EXPECT_EQ(er.size(), cr.size()) << what << ": responses for watch id " << id;
      for (size_t i = 0; i < std::min(er.size(), cr.size()); ++i) {
        EXPECT_TRUE(SameResponse(er[i], cr[i], this->etcd(), this->capstan()))
            << what << ": watch id " << id << ", response " << i;
      }
      for (size_t i = cr.size(); i < er.size(); ++i) {
        ADD_FAILURE() << what << ": only etcd sent, watch id " << id << ":\n" << Describe(er[i]);
      }
      for (size_t i = er.size(); i < cr.size(); ++i) {
        ADD_FAILURE() << what << ": only capstan sent, watch id " << id << ":\n"
                      << Describe(cr[i]);
      }
    }
    return e;
  }
};

}  // namespace capstan::testing

#endif  // CAPSTAN_TESTS_DIFF_WATCH_H_
