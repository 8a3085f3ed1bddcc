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
// One binary: DiffWatchTest and DiffWatchFlagsTest here, DiffWatchEtcdctlTest
// in diff_watch_etcdctl_test.cc, DiffWatchRaceTest in diff_watch_race_test.cc,
// the shared streams and comparisons in diff_watch.h.

#include "diff_watch.h"

namespace capstan::testing {
namespace {

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
  // etcd 3.5 answers only through a watcher of the stream: none, no answer
  // (3.4 answered anyway).
  WatchClient e(etcd_stubs().watch.get());
  WatchClient c(capstan_stubs().watch.get());
  ASSERT_TRUE(e.Send(ProgressReq()));
  ASSERT_TRUE(c.Send(ProgressReq()));
  for (WatchClient* w : {&e, &c}) {
    auto r = w->Next(kQuiet);
    EXPECT_FALSE(r.has_value()) << (w == &e ? "etcd: " : "capstan: ") << Describe(*r);
  }
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
    CAPSTAN_REQUIRE_REFERENCE("etcd", EtcdBinary());
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

}  // namespace
}  // namespace capstan::testing
