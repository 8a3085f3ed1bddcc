// Differential tests of the Watch API: the same watch streams and writes
// against real etcd and Capstan, responses compared one by one (header
// cluster/member ids and raft terms aside; watch ids included, since both
// servers number a stream's watchers from 0).
//
// Determinism: a case writes, then waits for the response that write causes
// on both servers before it writes again, so no server has a reason to put
// two revisions in one response. Where etcd's own order is not fixed (the
// responses of different watchers of one revision come in Go map order), the
// responses are compared per watcher. The only waits are generous bounds on
// responses that must come, and a short look for responses that must not.
//
//   DiffWatchTest         gRPC streams: keys, ranges, prefixes, from-key,
//                         start revisions, prev_kv, filters, watch ids,
//                         several watchers, cancel, compaction, progress.
//   DiffWatchFlagsTest    its own etcd and capstan started with
//                         --experimental-watch-progress-notify-interval=1s and
//                         a small --max-request-bytes: periodic progress
//                         notifications and fragments.
//   DiffWatchEtcdctlTest  `etcdctl watch -w json` run in the background.
//   DiffWatchRaceTest     writers racing watch creation, compaction, cancel
//                         and progress requests; each server checked against
//                         the writes it acknowledged.
//
// etcd 3.4 vs 3.5 (Capstan follows 3.5; docs/COMPATIBILITY.md): a progress
// request on a stream without watchers is answered by 3.4 and not by 3.5,
// and 3.4 may answer a progress request before events at or below its
// revision were sent. Those cases check Capstan alone.

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

extern char** environ;

namespace capstan::testing {
namespace {

using etcdserverpb::WatchCreateRequest;
using etcdserverpb::WatchRequest;
using etcdserverpb::WatchResponse;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Bounds a wait for a response that must come (only a failing case waits
// this long).
constexpr auto kEventWait = 10s;
// How long a case looks for responses that must not come.
constexpr auto kQuiet = 300ms;

// ---------------------------------------------------------------------------
// Requests

WatchRequest CreateReq(const std::string& key, const std::string& end = "", int64_t start = 0) {
  WatchRequest r;
  WatchCreateRequest* c = r.mutable_create_request();
  c->set_key(key);
  c->set_range_end(end);
  c->set_start_revision(start);
  return r;
}

WatchRequest CancelReq(int64_t id) {
  WatchRequest r;
  r.mutable_cancel_request()->set_watch_id(id);
  return r;
}

WatchRequest ProgressReq() {
  WatchRequest r;
  r.mutable_progress_request();
  return r;
}

std::string PrefixEnd(std::string p) {
  while (!p.empty() && static_cast<unsigned char>(p.back()) == 0xff) p.pop_back();
  if (p.empty()) return std::string(1, '\0');
  p.back() = static_cast<char>(static_cast<unsigned char>(p.back()) + 1);
  return p;
}

bool IsProgress(const WatchResponse& r) {
  return !r.created() && !r.canceled() && r.events_size() == 0 && r.compact_revision() == 0;
}

// ---------------------------------------------------------------------------
// One Watch stream to one server, read by its own thread.

class WatchClient {
 public:
  explicit WatchClient(etcdserverpb::Watch::Stub* stub) {
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
ByWatcher CollectByWatcher(WatchClient& c, const std::map<int64_t, int>& want_events,
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

::testing::AssertionResult SameResponse(const WatchResponse& e, const WatchResponse& c,
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

// ===========================================================================
// gRPC streams against the suite's etcd and capstan

class DiffWatchTest : public WatchCompare<DiffTest> {
 protected:
  std::unique_ptr<WatchPair> Open() {
    return std::make_unique<WatchPair>(etcd_stubs(), capstan_stubs());
  }
  // Creates a watcher on both and compares the Created responses.
  WatchResponse Create(WatchPair& w, const WatchRequest& req) {
    w.Send(req);
    WatchResponse r = ExpectNext(w, "created " + req.create_request().key());
    EXPECT_TRUE(r.created());
    return r;
  }
  int64_t TxnPutBoth(const std::vector<std::pair<std::string, std::string>>& kvs) {
    etcdserverpb::TxnRequest t;
    for (const auto& [k, v] : kvs) {
      auto* put = t.add_success()->mutable_request_put();
      put->set_key(k);
      put->set_value(v);
    }
    auto p = Both(t);
    EXPECT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
    EXPECT_SAME(p);
    return p.etcd.resp.header().revision();
  }
  void CompactBoth(int64_t rev) {
    etcdserverpb::CompactionRequest c;
    c.set_revision(rev);
    c.set_physical(true);
    auto p = Both(c);
    EXPECT_TRUE(p.etcd.status.ok()) << Describe(p.etcd.status);
    EXPECT_SAME(p);
  }
};

TEST_F(DiffWatchTest, SingleKey) {
  auto w = Open();
  Create(*w, CreateReq(K("a")));
  PutBoth(K("a"), "1");
  EXPECT_EQ(ExpectNext(*w, "put a").events_size(), 1);
  // Neither a longer key nor another key is an event of a single-key watch:
  // the next response must be the next write to a.
  PutBoth(K("ab"), "x");
  PutBoth(K("b"), "x");
  PutBoth(K("a"), "2");
  ExpectNext(*w, "second put a");
  DeleteBoth(K("a"));
  EXPECT_EQ(ExpectNext(*w, "delete a").events(0).type(), mvccpb::Event::DELETE);
  DeleteBoth(K("a"));  // deletes nothing: no revision, no event
  PutBoth(K("a"), "3");
  ExpectNext(*w, "put a after delete");
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, Range) {
  auto w = Open();
  Create(*w, CreateReq(K("b"), K("d")));
  for (const char* k : {"a", "b", "bz", "c", "d", "e"}) {
    PutBoth(K(k), k);
  }
  // b, bz, c: one response each, in order.
  for (const char* k : {"b", "bz", "c"}) {
    EXPECT_EQ(ExpectNext(*w, absl::StrCat("put ", k)).events(0).kv().key(), K(k));
  }
  DeleteBoth(K("a"), K("z"));  // one revision, three events in the range
  EXPECT_EQ(ExpectNext(*w, "delete range").events_size(), 3);
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, Prefix) {
  auto w = Open();
  Create(*w, CreateReq(K("p/"), PrefixEnd(K("p/"))));
  PutBoth(K("p"), "not in");
  PutBoth(K("p0"), "not in");
  PutBoth(K("p/1"), "in");
  EXPECT_EQ(ExpectNext(*w, "put p/1").events(0).kv().key(), K("p/1"));
  PutBoth(K("p/"), "in");
  ExpectNext(*w, "put p/");
  DeleteBoth(K("p/"), PrefixEnd(K("p/")));
  EXPECT_EQ(ExpectNext(*w, "delete prefix").events_size(), 2);
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, FromKey) {
  auto w = Open();
  Create(*w, CreateReq(K("m"), std::string(1, '\0')));
  PutBoth(K("a"), "before");
  PutBoth(K("m"), "at");
  ExpectNext(*w, "put m");
  PutBoth(K("zzz"), "after");
  ExpectNext(*w, "put zzz");
  PutBoth(K("\xff\xff"), "last");
  ExpectNext(*w, "put ff ff");
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, EmptyKeyFromKeyWatchesEverything) {
  // key "" and range_end "\0": every key (etcd normalizes "" to "\0").
  auto w = Open();
  WatchRequest req = CreateReq("", std::string(1, '\0'));
  Create(*w, req);
  PutBoth(K("a"), "1");
  ExpectNext(*w, "put a");
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, StartRevisionInPast) {
  const int64_t r1 = PutBoth(K("a"), "1");
  PutBoth(K("b"), "1");
  PutBoth(K("a"), "2");
  DeleteBoth(K("b"));
  TxnPutBoth({{K("c"), "1"}, {K("a"), "3"}});
  PutBoth(K("zz-outside"), "x");
  auto w = Open();
  // The whole history of the range since r1 + 1, in one response after Created.
  Create(*w, CreateReq(K("a"), K("d"), r1 + 1));
  WatchResponse h = ExpectNext(*w, "history");
  EXPECT_EQ(h.events_size(), 5);
  // Then live.
  PutBoth(K("b"), "live");
  ExpectNext(*w, "live put");
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, StartRevisionOfSingleKeyInPast) {
  const int64_t r1 = PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  PutBoth(K("b"), "1");
  auto w = Open();
  Create(*w, CreateReq(K("a"), "", r1));
  EXPECT_EQ(ExpectNext(*w, "history").events_size(), 2);
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, StartRevisionCurrentPlusOne) {
  const int64_t rev = PutBoth(K("a"), "1");
  auto w = Open();
  Create(*w, CreateReq(K("a"), "", rev + 1));
  ExpectQuiet(*w, "nothing before the next write");
  PutBoth(K("a"), "2");
  EXPECT_EQ(ExpectNext(*w, "put").events(0).kv().mod_revision(), rev + 1);
}

TEST_F(DiffWatchTest, StartRevisionInFutureWaits) {
  const int64_t rev = PutBoth(K("a"), "0");
  auto w = Open();
  Create(*w, CreateReq(K("a"), "", rev + 3));
  PutBoth(K("a"), "1");  // rev + 1: before the start
  PutBoth(K("a"), "2");  // rev + 2
  PutBoth(K("a"), "3");  // rev + 3: the first event
  WatchResponse r = ExpectNext(*w, "first event at the start revision");
  ASSERT_EQ(r.events_size(), 1);
  EXPECT_EQ(r.events(0).kv().mod_revision(), rev + 3);
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, PrevKvLive) {
  PutBoth(K("a"), "old");
  auto w = Open();
  WatchRequest req = CreateReq(K(""), PrefixEnd(K("")));
  req.mutable_create_request()->set_prev_kv(true);
  Create(*w, req);
  PutBoth(K("a"), "new");
  EXPECT_TRUE(ExpectNext(*w, "overwrite").events(0).has_prev_kv());
  DeleteBoth(K("a"));
  EXPECT_TRUE(ExpectNext(*w, "delete").events(0).has_prev_kv());
  PutBoth(K("a"), "again");  // a create: no previous value
  EXPECT_FALSE(ExpectNext(*w, "create").events(0).has_prev_kv());
  TxnPutBoth({{K("a"), "t1"}, {K("b"), "t2"}});
  ExpectNext(*w, "txn");
}

TEST_F(DiffWatchTest, PrevKvHistory) {
  const int64_t r1 = PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  DeleteBoth(K("a"));
  PutBoth(K("a"), "3");
  PutBoth(K("a"), "4");
  auto w = Open();
  WatchRequest req = CreateReq(K("a"), "", r1);
  req.mutable_create_request()->set_prev_kv(true);
  Create(*w, req);
  EXPECT_EQ(ExpectNext(*w, "history with previous values").events_size(), 5);
}

TEST_F(DiffWatchTest, FilterNoPut) {
  auto w = Open();
  WatchRequest req = CreateReq(K(""), PrefixEnd(K("")));
  req.mutable_create_request()->add_filters(WatchCreateRequest::NOPUT);
  Create(*w, req);
  PutBoth(K("a"), "1");
  PutBoth(K("b"), "1");
  DeleteBoth(K("a"));
  EXPECT_EQ(ExpectNext(*w, "delete only").events(0).type(), mvccpb::Event::DELETE);
  // A txn that puts and deletes: only the delete.
  etcdserverpb::TxnRequest t;
  t.add_success()->mutable_request_put()->set_key(K("c"));
  t.add_success()->mutable_request_delete_range()->set_key(K("b"));
  EXPECT_SAME(Both(t));
  EXPECT_EQ(ExpectNext(*w, "txn's delete").events_size(), 1);
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, FilterNoDelete) {
  auto w = Open();
  WatchRequest req = CreateReq(K(""), PrefixEnd(K("")));
  req.mutable_create_request()->add_filters(WatchCreateRequest::NODELETE);
  Create(*w, req);
  PutBoth(K("a"), "1");
  ExpectNext(*w, "put");
  DeleteBoth(K("a"));
  PutBoth(K("b"), "1");
  EXPECT_EQ(ExpectNext(*w, "put after a filtered delete").events(0).kv().key(), K("b"));
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, FilterBothSendsNothing) {
  auto w = Open();
  WatchRequest req = CreateReq(K("a"));
  req.mutable_create_request()->add_filters(WatchCreateRequest::NOPUT);
  req.mutable_create_request()->add_filters(WatchCreateRequest::NODELETE);
  Create(*w, req);
  PutBoth(K("a"), "1");
  DeleteBoth(K("a"));
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, ClientChosenWatchIds) {
  auto w = Open();
  WatchRequest req = CreateReq(K("a"));
  req.mutable_create_request()->set_watch_id(1);
  EXPECT_EQ(Create(*w, req).watch_id(), 1);
  EXPECT_EQ(Create(*w, CreateReq(K("b"))).watch_id(), 0);  // automatic: from 0
  EXPECT_EQ(Create(*w, CreateReq(K("c"))).watch_id(), 2);  // skips the taken 1
  req.mutable_create_request()->set_watch_id(7);
  EXPECT_EQ(Create(*w, req).watch_id(), 7);
  // A taken id: created and canceled at once, watch id -1, with a reason.
  req.mutable_create_request()->set_key(K("d"));
  WatchResponse dup = Create(*w, req);
  EXPECT_TRUE(dup.canceled());
  EXPECT_EQ(dup.watch_id(), -1);
  EXPECT_EQ(dup.cancel_reason(), "mvcc: duplicate watch ID provided on the WatchStream");
  // Events name the chosen ids; d has no watcher. Two watchers on a: their
  // responses come in either order.
  PutBoth(K("d"), "1");
  PutBoth(K("a"), "1");
  ExpectSameByWatcher(*w, {{1, 1}, {7, 1}}, "put a");
  PutBoth(K("c"), "1");
  EXPECT_EQ(ExpectNext(*w, "put c").watch_id(), 2);
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, EmptyRangeRefused) {
  auto w = Open();
  WatchResponse r = Create(*w, CreateReq(K("b"), K("a")));
  EXPECT_TRUE(r.canceled());
  EXPECT_EQ(r.cancel_reason(), "mvcc: watcher range is empty");
  Create(*w, CreateReq(K("b"), K("b")));
  // The refused ones took no id.
  EXPECT_EQ(Create(*w, CreateReq(K("a"))).watch_id(), 0);
  // Taken id and empty range at once: etcd checks the range first.
  WatchRequest both = CreateReq(K("b"), K("a"));
  both.mutable_create_request()->set_watch_id(0);
  Create(*w, both);
  WatchRequest dup_empty = CreateReq(K("z"), K("y"));
  dup_empty.mutable_create_request()->set_watch_id(5);
  Create(*w, CreateReq(K("q"), "", 0));  // id 1
  WatchRequest five = CreateReq(K("q"));
  five.mutable_create_request()->set_watch_id(5);
  Create(*w, five);
  Create(*w, dup_empty);
}

TEST_F(DiffWatchTest, TxnEventsInOneResponsePerWatcher) {
  auto w = Open();
  Create(*w, CreateReq(K("a")));                    // 0: one key of the txn
  Create(*w, CreateReq(K(""), PrefixEnd(K(""))));   // 1: all three
  Create(*w, CreateReq(K("b"), K("d")));            // 2: two of them
  Create(*w, CreateReq(K("x")));                    // 3: none
  TxnPutBoth({{K("a"), "1"}, {K("b"), "2"}, {K("c"), "3"}});
  ByWatcher got = ExpectSameByWatcher(*w, {{0, 1}, {1, 3}, {2, 2}}, "txn");
  EXPECT_EQ(got[1].size(), 1u) << "the revision's events in one response";
  EXPECT_EQ(got[2].size(), 1u);
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, CreatedPrecedesEachWatchersHistory) {
  const int64_t r1 = PutBoth(K("a"), "1");
  PutBoth(K("b"), "1");
  PutBoth(K("a"), "2");
  auto w = Open();
  // Sent together: each watcher's Created comes before its history.
  w->Send(CreateReq(K("a"), "", r1));
  w->Send(CreateReq(K(""), PrefixEnd(K("")), r1));
  w->Send(CreateReq(K("b"), "", r1 + 1));
  ByWatcher got = ExpectSameByWatcher(*w, {{0, 2}, {1, 3}, {2, 1}}, "histories");
  for (auto& [id, rs] : got) {
    ASSERT_FALSE(rs.empty());
    EXPECT_TRUE(rs.front().created()) << "watch id " << id;
  }
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, CancelStopsEvents) {
  auto w = Open();
  Create(*w, CreateReq(K("a")));  // 0
  Create(*w, CreateReq(K("b")));  // 1
  PutBoth(K("a"), "1");
  ExpectNext(*w, "put a");
  w->Send(CancelReq(0));
  WatchResponse c = ExpectNext(*w, "canceled");
  EXPECT_TRUE(c.canceled());
  EXPECT_EQ(c.watch_id(), 0);
  // No events of 0 any more: the next response is b's.
  PutBoth(K("a"), "2");
  PutBoth(K("b"), "1");
  EXPECT_EQ(ExpectNext(*w, "put b").watch_id(), 1);
  // Unknown and already canceled ids: no answer.
  w->Send(CancelReq(0));
  w->Send(CancelReq(42));
  ExpectQuiet(*w, "cancel of unknown ids");
  // Automatic ids go on counting; a canceled one is not reused.
  EXPECT_EQ(Create(*w, CreateReq(K("c"))).watch_id(), 2);
}

TEST_F(DiffWatchTest, CancelWatcherWithHistory) {
  const int64_t r1 = PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  auto w = Open();
  Create(*w, CreateReq(K("a"), "", r1));
  ExpectNext(*w, "history");
  w->Send(CancelReq(0));
  EXPECT_TRUE(ExpectNext(*w, "canceled").canceled());
  PutBoth(K("a"), "3");
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, StartRevisionCompacted) {
  const int64_t r1 = PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  const int64_t r3 = PutBoth(K("a"), "3");
  PutBoth(K("a"), "4");
  CompactBoth(r3);
  auto w = Open();
  // Below the compaction: Created, then canceled with compact_revision (and
  // header revision 0, as etcd sends it).
  Create(*w, CreateReq(K("a"), "", r1));
  WatchResponse c = ExpectNext(*w, "compacted");
  EXPECT_TRUE(c.canceled());
  EXPECT_EQ(c.compact_revision(), r3);
  EXPECT_EQ(c.header().revision(), 0);
  // At the compaction revision: still served.
  Create(*w, CreateReq(K("a"), "", r3));
  EXPECT_EQ(ExpectNext(*w, "from the compaction revision").events_size(), 2);
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, CancelAfterCompactionCancel) {
  const int64_t r1 = PutBoth(K("a"), "1");
  const int64_t r2 = PutBoth(K("a"), "2");
  CompactBoth(r2);
  auto w = Open();
  Create(*w, CreateReq(K("a"), "", r1));
  EXPECT_TRUE(ExpectNext(*w, "compacted").canceled());
  // Clients (clientv3) cancel a watcher the server canceled for compaction:
  // etcd still holds it and answers.
  w->Send(CancelReq(0));
  EXPECT_TRUE(ExpectNext(*w, "cancel after compaction").canceled());
  PutBoth(K("a"), "3");
  Create(*w, CreateReq(K("b")));
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, NegativeStartRevision) {
  PutBoth(K("a"), "1");
  auto w = Open();
  // Below every compaction: canceled with the compaction revision (-1
  // before the first compaction, as etcd reports it).
  Create(*w, CreateReq(K("a"), "", -3));
  EXPECT_TRUE(ExpectNext(*w, "canceled").canceled());
  ExpectQuiet(*w);
  // (-1 is not below etcd's -1: etcd reads no history for it and moves
  // the watcher to the revision after the current one at its next sync,
  // 100 ms later or so; whether a put in between reaches it is a race in
  // etcd, so the case is not compared.)
}

TEST_F(DiffWatchTest, StartRevisionCompactedDeleteAtCompaction) {
  PutBoth(K("a"), "1");
  PutBoth(K("b"), "1");
  DeleteBoth(K("a"));
  const int64_t rd = PutBoth(K("b"), "2") - 1;
  PutBoth(K("c"), "1");
  CompactBoth(rd);
  auto w = Open();
  // The tombstone at the compaction revision is gone; what is left is sent.
  Create(*w, CreateReq(K(""), PrefixEnd(K("")), rd));
  ExpectNext(*w, "history from a compacted delete");
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, ProgressRequestOnSyncedStream) {
  PutBoth(K("a"), "1");
  auto w = Open();
  Create(*w, CreateReq(K("a")));
  Create(*w, CreateReq(K("b"), K("c")));
  PutBoth(K("x"), "no event");
  w->Send(ProgressReq());
  WatchResponse p = ExpectNext(*w, "progress");
  EXPECT_TRUE(IsProgress(p));
  EXPECT_EQ(p.watch_id(), -1);
  EXPECT_EQ(p.header().revision(), Revision());
  PutBoth(K("a"), "2");
  ExpectNext(*w, "event after progress");
  w->Send(ProgressReq());
  ExpectNext(*w, "second progress");
  ExpectQuiet(*w);
}

TEST_F(DiffWatchTest, ProgressRequestAfterHistory) {
  const int64_t r1 = PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  auto w = Open();
  Create(*w, CreateReq(K("a"), "", r1));
  ExpectNext(*w, "history");
  w->Send(ProgressReq());
  EXPECT_TRUE(IsProgress(ExpectNext(*w, "progress once caught up")));
}

TEST_F(DiffWatchTest, ProgressRequestWithoutWatchers) {
  // etcd 3.5 answers only through a watcher of the stream: none, no answer.
  // 3.4 answered anyway; Capstan follows 3.5.
  WatchClient c(capstan_stubs().watch.get());
  ASSERT_TRUE(c.Send(ProgressReq()));
  auto r = c.Next(kQuiet);
  EXPECT_FALSE(r.has_value()) << Describe(*r);
}

// ===========================================================================
// Servers started with a 1 s progress interval and a small request limit

constexpr int kMaxRequestBytes = 4096;

class DiffWatchFlagsServers : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    if (!IsExecutable(EtcdBinary())) return;
    const std::vector<std::string> flags = {
        "--experimental-watch-progress-notify-interval=1s",
        absl::StrCat("--max-request-bytes=", kMaxRequestBytes)};
    ServerOptions eo = ServerOptions::Etcd();
    eo.extra_args = flags;
    ServerOptions co = DiffTest::BothEtcd() ? ServerOptions::Etcd() : ServerOptions::Capstan();
    co.extra_args = flags;
    auto e = ServerProcess::Start(eo);
    auto c = ServerProcess::Start(co);
    if (!e.ok() || !c.ok()) {
      error_ = absl::StrCat("starting servers: etcd ", e.status().ToString(), ", capstan ",
                            c.status().ToString());
      return;
    }
    etcd_ = std::move(*e);
    capstan_ = std::move(*c);
    etcd_stubs_ = std::make_unique<ServerStubs>(etcd_->NewChannel());
    capstan_stubs_ = std::make_unique<ServerStubs>(capstan_->NewChannel());
  }
  static void TearDownTestSuite() {
    etcd_stubs_.reset();
    capstan_stubs_.reset();
    etcd_.reset();
    capstan_.reset();
  }

 protected:
  void SetUp() override {
    if (!IsExecutable(EtcdBinary())) GTEST_SKIP() << "no etcd at " << EtcdBinary();
    ASSERT_TRUE(error_.empty()) << error_;
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    prefix_ = absl::StrFormat("/watch-flags/%02d-%s/", ++sequence_, info->name());
  }
  static ServerProcess& etcd() { return *etcd_; }
  static ServerProcess& capstan() { return *capstan_; }
  std::string K(const std::string& s) const { return prefix_ + s; }
  std::unique_ptr<WatchPair> Open() {
    return std::make_unique<WatchPair>(*etcd_stubs_, *capstan_stubs_);
  }
  // A KV call on both; both must succeed with the same answer.
  template <typename Req, typename Resp>
  int64_t Write(grpc::Status (etcdserverpb::KV::Stub::*method)(grpc::ClientContext*, const Req&,
                                                                Resp*),
                const Req& req) {
    Resp er, cr;
    grpc::ClientContext ec, cc;
    grpc::Status es = (etcd_stubs_->kv.get()->*method)(&ec, req, &er);
    grpc::Status cs = (capstan_stubs_->kv.get()->*method)(&cc, req, &cr);
    EXPECT_TRUE(es.ok()) << Describe(es);
    EXPECT_TRUE(SameAnswer(es, er, etcd(), cs, cr, capstan()));
    return er.header().revision();
  }
  int64_t Put(const std::string& k, const std::string& v) {
    etcdserverpb::PutRequest r;
    r.set_key(k);
    r.set_value(v);
    return Write(&etcdserverpb::KV::Stub::Put, r);
  }

 private:
  static std::unique_ptr<ServerProcess> etcd_, capstan_;
  static std::unique_ptr<ServerStubs> etcd_stubs_, capstan_stubs_;
  static std::string error_;
  static int sequence_;
  std::string prefix_;
};

std::unique_ptr<ServerProcess> DiffWatchFlagsServers::etcd_, DiffWatchFlagsServers::capstan_;
std::unique_ptr<ServerStubs> DiffWatchFlagsServers::etcd_stubs_,
    DiffWatchFlagsServers::capstan_stubs_;
std::string DiffWatchFlagsServers::error_;
int DiffWatchFlagsServers::sequence_ = 0;

class DiffWatchFlagsTest : public WatchCompare<DiffWatchFlagsServers> {};

TEST_F(DiffWatchFlagsTest, ProgressNotifyPeriodic) {
  Put(K("a"), "1");
  auto w = Open();
  WatchRequest req = CreateReq(K("a"));
  req.mutable_create_request()->set_progress_notify(true);
  w->Send(req);
  ExpectNext(*w, "created");
  w->Send(CreateReq(K("b")));  // no progress_notify: no notifications
  ExpectNext(*w, "created b");
  // Within about a second: a notification for watcher 0 at the current revision.
  WatchResponse p = ExpectNext(*w, "periodic progress");
  EXPECT_TRUE(IsProgress(p));
  EXPECT_EQ(p.watch_id(), 0);
  const int64_t rev = Put(K("x"), "elsewhere");
  WatchResponse q = ExpectNext(*w, "periodic progress after a write elsewhere");
  EXPECT_TRUE(IsProgress(q));
  EXPECT_EQ(q.header().revision(), rev);
}

// etcd fragments a response when it reaches --max-request-bytes plus gRPC's
// 512 KiB allowance (v3rpc's watch server limit): a watcher that asked for
// fragments gets pieces under that size, each but the last marked fragment;
// one that did not gets the response whole. Both for a catch-up response and
// for one revision (a delete of every key, with previous values).
constexpr size_t kFragmentLimit = kMaxRequestBytes + 512 * 1024;

TEST_F(DiffWatchFlagsTest, FragmentLargeResponses) {
  constexpr int kKeys = 150;
  int64_t first = 0;
  for (int i = 0; i < kKeys; ++i) {
    // Sizes that vary, so that the pieces end at different events.
    const int64_t rev =
        Put(K(absl::StrFormat("k%03d", i)), std::string(3500 + (i * 37) % 200, 'a' + i % 26));
    if (i == 0) first = rev;
  }
  auto w = Open();
  for (bool fragment : {true, false}) {
    WatchRequest req = CreateReq(K(""), PrefixEnd(K("")), first);
    req.mutable_create_request()->set_fragment(fragment);
    w->Send(req);
  }
  ByWatcher got = ExpectSameByWatcher(*w, {{0, kKeys}, {1, kKeys}}, "history");
  EXPECT_GT(got[0].size(), 2u) << "Created and at least two fragments";
  for (size_t i = 1; i + 1 < got[0].size(); ++i) {
    EXPECT_TRUE(got[0][i].fragment()) << i;
    EXPECT_LT(got[0][i].ByteSizeLong(), kFragmentLimit);
  }
  EXPECT_EQ(got[1].size(), 2u) << "Created and one whole response";

  for (bool fragment : {true, false}) {
    WatchRequest req = CreateReq(K(""), PrefixEnd(K("")));
    req.mutable_create_request()->set_prev_kv(true);
    req.mutable_create_request()->set_fragment(fragment);
    w->Send(req);
  }
  ExpectSameByWatcher(*w, {{2, 0}, {3, 0}}, "created");
  etcdserverpb::DeleteRangeRequest del;
  del.set_key(K(""));
  del.set_range_end(PrefixEnd(K("")));
  Write(&etcdserverpb::KV::Stub::DeleteRange, del);
  got = ExpectSameByWatcher(*w, {{0, kKeys}, {1, kKeys}, {2, kKeys}, {3, kKeys}}, "delete");
  EXPECT_GT(got[2].size(), 1u) << "fragments of one revision";
  EXPECT_EQ(got[3].size(), 1u);
}

// ===========================================================================
// etcdctl watch -w json, in the background

// A command running in the background; stdout is read as lines.
class BackgroundCommand {
 public:
  explicit BackgroundCommand(const std::vector<std::string>& argv) {
    int out[2], err[2];
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      ADD_FAILURE() << "pipe2 failed";
      return;
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::string_view(*e).substr(0, 4) != "ETCD") env.emplace_back(*e);
    }
    std::vector<char*> envp;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int devnull = open("/dev/null", O_RDONLY);
      dup2(devnull, 0);
      dup2(out[1], 1);
      dup2(err[1], 2);
      execve(args[0], args.data(), envp.data());
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    out_reader_ = std::thread([this, fd = out[0]] { Pump(fd, &out_); });
    err_reader_ = std::thread([this, fd = err[0]] { Pump(fd, &err_); });
  }
  ~BackgroundCommand() { Stop(); }

  // Waits until stdout holds at least n complete lines, stdout closed, or
  // timeout. Returns the complete lines.
  std::vector<std::string> Lines(size_t n, Clock::duration timeout = kEventWait) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait_for(l, timeout, [&] { return LinesLocked().size() >= n || closed_ == 2; });
    return LinesLocked();
  }
  // Ends the command (SIGTERM if it still runs) and returns how it ended.
  ExitInfo Stop() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGTERM);
      Reap();
    }
    if (out_reader_.joinable()) out_reader_.join();
    if (err_reader_.joinable()) err_reader_.join();
    return exit_;
  }
  // Waits for the command to end by itself.
  ExitInfo Wait() {
    if (pid_ > 0 && !reaped_) Reap();
    return Stop();
  }
  std::string err() {
    std::lock_guard<std::mutex> l(mu_);
    return err_;
  }

 private:
  void Pump(int fd, std::string* into) {
    char buf[4096];
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) break;
      std::lock_guard<std::mutex> l(mu_);
      into->append(buf, static_cast<size_t>(n));
      cv_.notify_all();
    }
    close(fd);
    std::lock_guard<std::mutex> l(mu_);
    ++closed_;
    cv_.notify_all();
  }
  void Reap() {
    int status = 0;
    if (waitpid(pid_, &status, 0) == pid_) {
      exit_.exited = WIFEXITED(status);
      exit_.exit_code = exit_.exited ? WEXITSTATUS(status) : 0;
      exit_.term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    }
    reaped_ = true;
  }
  std::vector<std::string> LinesLocked() const {
    std::vector<std::string> lines;
    size_t start = 0;
    for (size_t nl; (nl = out_.find('\n', start)) != std::string::npos; start = nl + 1) {
      lines.push_back(out_.substr(start, nl - start));
    }
    return lines;
  }

  pid_t pid_ = -1;
  bool reaped_ = false;
  ExitInfo exit_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string out_, err_;  // guarded by mu_
  int closed_ = 0;         // pipes at EOF; guarded by mu_
  std::thread out_reader_, err_reader_;
};

// etcdctl's JSON without cluster_id, member_id and raft_term.
void StripIds(google::protobuf::Value* v) {
  if (v->has_struct_value()) {
    auto* fields = v->mutable_struct_value()->mutable_fields();
    for (const char* k : {"cluster_id", "member_id", "raft_term"}) fields->erase(k);
    for (auto& [k, child] : *fields) StripIds(&child);
  } else if (v->has_list_value()) {
    for (auto& child : *v->mutable_list_value()->mutable_values()) StripIds(&child);
  }
}

::testing::AssertionResult SameJsonLines(const std::vector<std::string>& e,
                                         const std::vector<std::string>& c) {
  if (e.size() != c.size()) {
    return ::testing::AssertionFailure()
           << "etcd printed " << e.size() << " lines, capstan " << c.size() << "\netcd:\n"
           << absl::StrJoin(e, "\n") << "\ncapstan:\n" << absl::StrJoin(c, "\n");
  }
  for (size_t i = 0; i < e.size(); ++i) {
    google::protobuf::Value ev, cv;
    if (!ParseJson(e[i], &ev) || !ParseJson(c[i], &cv)) {
      if (e[i] != c[i]) {
        return ::testing::AssertionFailure() << "line " << i << " differs:\n  etcd:    " << e[i]
                                             << "\n  capstan: " << c[i];
      }
      continue;
    }
    StripIds(&ev);
    StripIds(&cv);
    google::protobuf::util::MessageDifferencer d;
    std::string diff;
    d.ReportDifferencesToString(&diff);
    if (!d.Compare(ev, cv)) {
      return ::testing::AssertionFailure() << "line " << i << " differs:\n" << diff
                                           << "  etcd:    " << e[i] << "\n  capstan: " << c[i];
    }
  }
  return ::testing::AssertionSuccess();
}

class DiffWatchEtcdctlTest : public DiffTest {
 protected:
  std::unique_ptr<BackgroundCommand> Watch(const ServerProcess& server,
                                           std::vector<std::string> args) {
    std::vector<std::string> argv = {EtcdctlBinary(), "--endpoints=" + server.endpoint(),
                                     "watch"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.push_back("-w");
    argv.push_back("json");
    return std::make_unique<BackgroundCommand>(argv);
  }

  // History since first (with args), printed as one line by both; then each
  // live write, one line each; then etcdctl is stopped and the lines compared.
  void WatchHistoryThenLive(std::vector<std::string> args, int64_t first,
                            const std::vector<std::function<void()>>& live) {
    args.push_back("--rev=" + std::to_string(first));
    auto e = Watch(etcd(), args);
    auto c = Watch(capstan(), args);
    size_t lines = 1;
    EXPECT_EQ(e->Lines(lines).size(), lines) << "etcd: " << e->err();
    EXPECT_EQ(c->Lines(lines).size(), lines) << "capstan: " << c->err();
    for (const auto& write : live) {
      write();
      ++lines;
      EXPECT_EQ(e->Lines(lines).size(), lines) << "etcd: " << e->err();
      EXPECT_EQ(c->Lines(lines).size(), lines) << "capstan: " << c->err();
    }
    auto el = e->Lines(lines, 0s);
    auto cl = c->Lines(lines, 0s);
    e->Stop();
    c->Stop();
    EXPECT_TRUE(SameJsonLines(el, cl));
  }
};

TEST_F(DiffWatchEtcdctlTest, WatchRev) {
  const int64_t first = PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  DeleteBoth(K("a"));
  WatchHistoryThenLive({K("a")}, first,
                       {[&] { PutBoth(K("a"), "3"); }, [&] { DeleteBoth(K("a")); }});
}

TEST_F(DiffWatchEtcdctlTest, WatchRevPrevKv) {
  const int64_t first = PutBoth(K("a"), "1");
  PutBoth(K("a"), "2");
  DeleteBoth(K("a"));
  PutBoth(K("a"), "3");
  WatchHistoryThenLive({K("a"), "--prev-kv"}, first,
                       {[&] { PutBoth(K("a"), "4"); }, [&] { DeleteBoth(K("a")); }});
}

TEST_F(DiffWatchEtcdctlTest, WatchPrefix) {
  const int64_t first = PutBoth(K("p/1"), "1");
  PutBoth(K("p0"), "outside");
  PutBoth(K("p/2"), "2");
  WatchHistoryThenLive({K("p/"), "--prefix", "--prev-kv"}, first,
                       {[&] { PutBoth(K("p/1"), "again"); },
                        [&] { DeleteBoth(K("p/"), PrefixEnd(K("p/"))); }});
}

TEST_F(DiffWatchEtcdctlTest, WatchRange) {
  const int64_t first = PutBoth(K("a"), "1");
  PutBoth(K("b"), "1");
  PutBoth(K("c"), "1");
  WatchHistoryThenLive({K("a"), K("c")}, first, {[&] { PutBoth(K("b"), "2"); }});
}

TEST_F(DiffWatchEtcdctlTest, WatchCompactedRevision) {
  const int64_t r1 = PutBoth(K("a"), "1");
  const int64_t r2 = PutBoth(K("a"), "2");
  etcdserverpb::CompactionRequest c;
  c.set_revision(r2);
  EXPECT_SAME(Both(c));
  // etcdctl prints the canceled response and exits by itself.
  EtcdctlPair p = Etcdctl({"watch", K("a"), "--rev=" + std::to_string(r1)});
  EXPECT_TRUE(SameEtcdctl(p));
  EXPECT_NE(p.etcd.err.find("required revision has been compacted"), std::string::npos)
      << p.etcd.err;
}

// ===========================================================================
// Races: each server on its own, checked against the writes it acknowledged

struct Write {
  int64_t rev;
  std::string key, value;
  bool is_delete;
};

class DiffWatchRaceTest : public WatchCompare<DiffTest> {
 protected:
  // Writes n revisions (puts, every seventh a delete) to keys of prefix() on
  // both servers from its own thread; log is filled as they are answered.
  std::thread Writer(int n, std::vector<Write>* log, std::mutex* mu,
                     std::atomic<bool>* done) {
    return std::thread([this, n, log, mu, done] {
      for (int i = 0; i < n; ++i) {
        const std::string key = K(absl::StrCat("k", i % 5));
        Write w;
        w.key = key;
        w.is_delete = i % 7 == 6;
        if (w.is_delete) {
          // Delete what exists (so that every write is a revision).
          etcdserverpb::TxnRequest t;
          t.add_success()->mutable_request_delete_range()->set_key(key);
          auto* put = t.add_success()->mutable_request_put();
          put->set_key(K("tick"));
          auto p = Both(t);
          EXPECT_SAME(p);
          w.rev = p.etcd.resp.header().revision();
        } else {
          w.value = absl::StrCat("v", i);
          w.rev = PutBoth(key, w.value);
        }
        std::lock_guard<std::mutex> l(*mu);
        log->push_back(std::move(w));
      }
      done->store(true);
    });
  }
  int64_t CurrentRev(ServerStubs& s) {
    etcdserverpb::RangeRequest r;
    r.set_key("x");
    etcdserverpb::RangeResponse resp;
    grpc::ClientContext ctx;
    EXPECT_TRUE(s.kv->Range(&ctx, r, &resp).ok());
    return resp.header().revision();
  }
  // The events of the log a watcher of prefix() on keys k* sees from start.
  static std::vector<std::pair<int64_t, std::string>> Expected(const std::vector<Write>& log,
                                                                int64_t start) {
    std::vector<std::pair<int64_t, std::string>> out;
    for (const Write& w : log) {
      if (w.rev >= start) out.emplace_back(w.rev, w.is_delete ? "DELETE " + w.key : w.key + "=" + w.value);
    }
    return out;
  }
  static std::vector<std::pair<int64_t, std::string>> Seen(const std::vector<WatchResponse>& rs) {
    std::vector<std::pair<int64_t, std::string>> out;
    for (const auto& r : rs) {
      for (const auto& ev : r.events()) {
        out.emplace_back(ev.kv().mod_revision(),
                         ev.type() == mvccpb::Event::DELETE
                             ? "DELETE " + ev.kv().key()
                             : ev.kv().key() + "=" + ev.kv().value());
      }
    }
    return out;
  }
  // Every revision's events in one response (no fragments asked for).
  static void ExpectRevisionsWhole(const std::vector<WatchResponse>& rs, const std::string& what) {
    std::set<int64_t> seen;
    for (const auto& r : rs) {
      std::set<int64_t> mine;
      for (const auto& ev : r.events()) mine.insert(ev.kv().mod_revision());
      for (int64_t rev : mine) {
        EXPECT_TRUE(seen.insert(rev).second) << what << ": revision " << rev << " split";
      }
    }
  }
};

TEST_F(DiffWatchRaceTest, CreationRacesWrites) {
  constexpr int kWrites = 240;
  std::vector<Write> log;
  std::mutex mu;
  std::atomic<bool> done{false};
  WatchClient ec(etcd_stubs().watch.get()), cc(capstan_stubs().watch.get());
  struct Made {
    int64_t id;
    int64_t start;   // requested start revision (0: current)
  };
  std::vector<Made> made;
  std::thread writer = Writer(kWrites, &log, &mu, &done);
  int64_t next_id = 0;
  // Watchers created while the writer runs, alternately at current + 1 (as
  // each server just reported it) and at 0 ("from now").
  while (!done.load() && next_id < 40) {
    for (auto* side : {&ec, &cc}) {
      const int64_t rev = CurrentRev(side == &ec ? etcd_stubs() : capstan_stubs());
      WatchRequest req = CreateReq(K("k"), PrefixEnd(K("k")), next_id % 2 == 0 ? rev + 1 : 0);
      req.mutable_create_request()->set_watch_id(next_id + 1);
      EXPECT_TRUE(side->Send(req));
      made.push_back({next_id + 1, req.create_request().start_revision()});
    }
    ++next_id;
    std::this_thread::sleep_for(5ms);
  }
  writer.join();
  const int64_t last = log.back().rev;
  for (auto* side : {&ec, &cc}) {
    const char* name = side == &ec ? "etcd" : "capstan";
    // Read until every watcher reached the last revision.
    std::map<int64_t, std::vector<WatchResponse>> got;
    std::map<int64_t, int64_t> reached;
    for (int64_t id = 1; id <= next_id; ++id) {
      const int64_t requested = made[(id - 1) * 2 + (side == &ec ? 0 : 1)].start;
      if (requested != 0) reached[id] = requested - 1;
    }
    const auto deadline = Clock::now() + kEventWait;
    auto all_reached = [&] {
      for (int64_t id = 1; id <= next_id; ++id) {
        if (reached[id] < last) return false;
      }
      return true;
    };
    while (!all_reached()) {
      auto r = side->Next(deadline - Clock::now());
      if (!r) break;
      if (r->created()) {
        // A "from now" watcher has seen everything up to its header revision.
        reached[r->watch_id()] = std::max(reached[r->watch_id()], r->header().revision());
      }
      for (const auto& ev : r->events()) {
        reached[r->watch_id()] = std::max(reached[r->watch_id()], ev.kv().mod_revision());
      }
      got[r->watch_id()].push_back(std::move(*r));
    }
    for (int64_t id = 1; id <= next_id; ++id) {
      const auto& rs = got[id];
      ASSERT_FALSE(rs.empty()) << name << " watch " << id << ": no response";
      ASSERT_TRUE(rs.front().created()) << name << " watch " << id;
      const int64_t requested = made[(id - 1) * 2 + (side == &ec ? 0 : 1)].start;
      const int64_t start = requested != 0 ? requested : rs.front().header().revision() + 1;
      std::vector<WatchResponse> events(rs.begin() + 1, rs.end());
      EXPECT_EQ(Seen(events), Expected(log, start))
          << name << " watch " << id << " from " << start
          << (requested == 0 ? " (created at 0)" : "");
      ExpectRevisionsWhole(events, absl::StrCat(name, " watch ", id));
    }
  }
}

TEST_F(DiffWatchRaceTest, WatchDuringCompaction) {
  constexpr int kWrites = 200;
  std::vector<Write> log;
  std::mutex mu;
  std::atomic<bool> done{false};
  const int64_t base = Revision();
  WatchClient ec(etcd_stubs().watch.get()), cc(capstan_stubs().watch.get());
  std::thread writer = Writer(kWrites, &log, &mu, &done);
  // Watchers from the test's first revision, created while the writer runs
  // and a compaction to the middle of the writes happens.
  int64_t made = 0;
  int64_t compacted_at = 0;
  while (!done.load() && made < 30) {
    ++made;
    WatchRequest req = CreateReq(K("k"), PrefixEnd(K("k")), base + 1 + made);
    req.mutable_create_request()->set_watch_id(made);
    EXPECT_TRUE(ec.Send(req));
    EXPECT_TRUE(cc.Send(req));
    if (made == 10) {
      std::lock_guard<std::mutex> l(mu);
      compacted_at = log.empty() ? base + 1 : log[log.size() / 2].rev;
    }
    if (made == 10) {
      etcdserverpb::CompactionRequest c;
      c.set_revision(compacted_at);
      auto p = Both(c);  // header revisions differ: the writer goes on
      EXPECT_TRUE(p.etcd.status.ok() && p.capstan.status.ok())
          << Describe(p.etcd.status) << " / " << Describe(p.capstan.status);
    }
    std::this_thread::sleep_for(8ms);
  }
  writer.join();
  ASSERT_GT(compacted_at, 0) << "the writer finished before the compaction";
  const int64_t last = log.back().rev;
  for (auto* side : {&ec, &cc}) {
    const char* name = side == &ec ? "etcd" : "capstan";
    std::map<int64_t, std::vector<WatchResponse>> got;
    std::map<int64_t, bool> finished;
    auto all = [&] {
      for (int64_t id = 1; id <= made; ++id) {
        if (!finished[id]) return false;
      }
      return true;
    };
    const auto deadline = Clock::now() + kEventWait;
    while (!all()) {
      auto r = side->Next(deadline - Clock::now());
      if (!r) break;
      if (r->canceled() || (r->events_size() > 0 &&
                            r->events(r->events_size() - 1).kv().mod_revision() == last)) {
        finished[r->watch_id()] = true;
      }
      got[r->watch_id()].push_back(std::move(*r));
    }
    int canceled = 0;
    for (int64_t id = 1; id <= made; ++id) {
      const auto& rs = got[id];
      ASSERT_GE(rs.size(), 2u) << name << " watch " << id;
      EXPECT_TRUE(rs.front().created()) << name << " watch " << id;
      const int64_t start = base + 1 + id;
      if (rs.back().canceled()) {
        // Canceled: only for a start below the compaction, with nothing else.
        ++canceled;
        EXPECT_EQ(rs.size(), 2u) << name << " watch " << id << ": events and a cancel";
        EXPECT_LT(start, compacted_at) << name << " watch " << id;
        EXPECT_EQ(rs.back().compact_revision(), compacted_at) << name << " watch " << id;
        continue;
      }
      std::vector<WatchResponse> events(rs.begin() + 1, rs.end());
      // A delete at the compaction revision is compacted away: a watcher
      // starting there that caught up afterwards does not see it.
      auto seen = Seen(events), want = Expected(log, start);
      for (auto* v : {&seen, &want}) {
        std::erase_if(*v, [&](const auto& e) {
          return e.first == compacted_at && e.second.rfind("DELETE ", 0) == 0;
        });
      }
      EXPECT_EQ(seen, want) << name << " watch " << id;
      ExpectRevisionsWhole(events, absl::StrCat(name, " watch ", id));
    }
    std::printf("%s: %d of %lld watchers canceled by the compaction at %lld\n", name, canceled,
                static_cast<long long>(made), static_cast<long long>(compacted_at));
  }
}

TEST_F(DiffWatchRaceTest, CancelDuringDelivery) {
  constexpr int kWrites = 160;
  std::vector<Write> log;
  std::mutex mu;
  std::atomic<bool> done{false};
  const int64_t start = Revision() + 1;
  WatchClient ec(etcd_stubs().watch.get()), cc(capstan_stubs().watch.get());
  for (auto* side : {&ec, &cc}) {
    ASSERT_TRUE(side->Send(CreateReq(K("k"), PrefixEnd(K("k")), start)));     // 0
    ASSERT_TRUE(side->Send(CreateReq(K("marker"))));                          // 1
  }
  std::thread writer = Writer(kWrites, &log, &mu, &done);
  // Cancel watcher 0 once it has some events, while the writer goes on.
  std::map<WatchClient*, std::vector<WatchResponse>> got;
  for (auto* side : {&ec, &cc}) {
    int events = 0;
    const auto deadline = Clock::now() + kEventWait;
    while (events < 40) {
      auto r = side->Next(deadline - Clock::now());
      if (!r) break;
      events += r->events_size();
      got[side].push_back(std::move(*r));
    }
    EXPECT_GE(events, 40);
    EXPECT_TRUE(side->Send(CancelReq(0)));
  }
  writer.join();
  PutBoth(K("marker"), "end");
  for (auto* side : {&ec, &cc}) {
    const char* name = side == &ec ? "etcd" : "capstan";
    auto& rs = got[side];
    const auto deadline = Clock::now() + kEventWait;
    for (;;) {
      auto r = side->Next(deadline - Clock::now());
      ASSERT_TRUE(r.has_value()) << name << ": no marker event";
      const bool marker = r->watch_id() == 1 && r->events_size() > 0;
      rs.push_back(std::move(*r));
      if (marker) break;
    }
    std::vector<WatchResponse> before;
    bool canceled = false;
    for (const auto& r : rs) {
      if (r.watch_id() != 0) continue;
      if (canceled) {
        ADD_FAILURE() << name << ": a response after the canceled one:\n" << Describe(r);
        continue;
      }
      if (r.canceled()) {
        canceled = true;
      } else if (!r.created()) {
        before.push_back(r);
      }
    }
    EXPECT_TRUE(canceled) << name << ": no canceled response";
    // What came before the cancel is the start of the history, in order.
    auto seen = Seen(before);
    auto want = Expected(log, start);
    ASSERT_LE(seen.size(), want.size()) << name;
    want.resize(seen.size());
    EXPECT_EQ(seen, want) << name;
    ExpectRevisionsWhole(before, name);
  }
}

// A progress notification comes after every event at or below its revision
// on its stream. etcd 3.4 answers progress requests at once, ahead of events
// still on their way (fixed in 3.5); checked on Capstan only.
TEST_F(DiffWatchRaceTest, ProgressAfterEvents) {
  constexpr int kWrites = 160;
  std::vector<Write> log;
  std::mutex mu;
  std::atomic<bool> done{false};
  WatchClient cc(capstan_stubs().watch.get());
  ASSERT_TRUE(cc.Send(CreateReq(K("k"), PrefixEnd(K("k")))));
  ASSERT_TRUE(cc.Next(kEventWait).has_value());  // Created
  std::thread writer = Writer(kWrites, &log, &mu, &done);
  int requests = 0;
  while (!done.load()) {
    EXPECT_TRUE(cc.Send(ProgressReq()));
    ++requests;
    std::this_thread::sleep_for(3ms);
  }
  writer.join();
  ASSERT_TRUE(cc.Send(ProgressReq()));
  ++requests;
  const int64_t last = log.back().rev;
  int progress = 0;
  int64_t max_event = 0, max_progress = 0;
  const auto deadline = Clock::now() + kEventWait;
  while (max_event < last || max_progress < last) {
    auto r = cc.Next(deadline - Clock::now());
    if (!r) break;
    if (IsProgress(*r)) {
      ++progress;
      const int64_t rev = r->header().revision();
      EXPECT_GE(rev, max_progress) << "progress went backwards";
      max_progress = std::max(max_progress, rev);
      continue;
    }
    for (const auto& ev : r->events()) {
      EXPECT_GT(ev.kv().mod_revision(), max_progress)
          << "event at " << ev.kv().mod_revision() << " after a progress notification at "
          << max_progress;
      max_event = std::max(max_event, ev.kv().mod_revision());
    }
  }
  EXPECT_EQ(max_event, last);
  EXPECT_EQ(max_progress, last) << "the last progress request is answered at the last revision";
  EXPECT_GT(progress, 0);
  std::printf("%d progress requests, %d answered\n", requests, progress);
}

}  // namespace
}  // namespace capstan::testing
