// Maintenance RPCs end to end: HashKV's hashes and compact_revision
// compared against etcd's across compactions, Defragment while puts and linearizable
// ranges go on, the Alarm RPC (ACTIVATE / GET / DEACTIVATE) against etcd,
// and /health with active alarms as kubeadm's liveness probe asks it.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "diff_fixture.h"
#include "etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "process_fixture.h"

namespace capstan::testing {
namespace {

using etcdserverpb::AlarmRequest;
using etcdserverpb::AlarmResponse;
using etcdserverpb::AlarmType;
using Clock = std::chrono::steady_clock;

constexpr char kNoSpace[] = "etcdserver: mvcc: database space exceeded";

std::unique_ptr<grpc::ClientContext> Deadline(
    std::chrono::seconds timeout = std::chrono::seconds(kRpcDeadline)) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + timeout);
  return ctx;
}

grpc::Status Put(ServerStubs& s, const std::string& key, const std::string& value,
                 int64_t* rev = nullptr) {
  etcdserverpb::PutRequest req;
  req.set_key(key);
  req.set_value(value);
  etcdserverpb::PutResponse resp;
  grpc::Status st = s.kv->Put(Deadline().get(), req, &resp);
  if (rev) *rev = resp.header().revision();
  return st;
}

grpc::Status HashKV(ServerStubs& s, int64_t rev, etcdserverpb::HashKVResponse* resp) {
  etcdserverpb::HashKVRequest req;
  req.set_revision(rev);
  return s.maintenance->HashKV(Deadline().get(), req, resp);
}

// ---------------------------------------------------------------------------
// HashKV: hash and compact_revision as etcd 3.5.16's at every revision, and
// no hash_revision (3.6 adds it).

TEST(HashKVTest, HashRevisionAndHashesAsEtcd) {
  auto capstan = ServerProcess::Start(ServerOptions::Capstan());
  ASSERT_TRUE(capstan.ok()) << capstan.status();
  auto etcd = ServerProcess::Start(ServerOptions::Etcd());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  ServerStubs c((*capstan)->NewChannel());
  ServerStubs e((*etcd)->NewChannel());

  // Overwrites and a delete: revisions 2..7 on both.
  int64_t current = 0;
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"/h/a", "1"}, {"/h/b", "1"}, {"/h/a", "2"}, {"/h/c", "1"}, {"/h/a", "3"}}) {
    int64_t crev = 0, erev = 0;
    ASSERT_TRUE(Put(c, key, value, &crev).ok());
    ASSERT_TRUE(Put(e, key, value, &erev).ok());
    ASSERT_EQ(crev, erev);
    current = crev;
  }
  etcdserverpb::DeleteRangeRequest del;
  del.set_key("/h/b");
  etcdserverpb::DeleteRangeResponse cdel, edel;
  ASSERT_TRUE(c.kv->DeleteRange(Deadline().get(), del, &cdel).ok());
  ASSERT_TRUE(e.kv->DeleteRange(Deadline().get(), del, &edel).ok());
  current = cdel.header().revision();
  ASSERT_EQ(current, 7);

  auto check_all = [&](int64_t from, int64_t want_compact) {
    for (int64_t rev : std::vector<int64_t>{0, from, from + 1, current - 1, current}) {
      etcdserverpb::HashKVResponse cr, er;
      ASSERT_TRUE(HashKV(c, rev, &cr).ok()) << "rev " << rev;
      ASSERT_TRUE(HashKV(e, rev, &er).ok()) << "rev " << rev;
      EXPECT_EQ(cr.hash_revision(), 0) << "rev " << rev;
      EXPECT_EQ(cr.header().revision(), current);
      EXPECT_EQ(cr.hash(), er.hash()) << "rev " << rev;
      EXPECT_EQ(cr.compact_revision(), want_compact) << "rev " << rev;
      EXPECT_EQ(er.compact_revision(), want_compact) << "rev " << rev;
    }
  };
  // Rev 1 is the empty store.
  check_all(1, -1);
  // The hashes of different revisions differ (the test can tell them apart).
  etcdserverpb::HashKVResponse at3, at7;
  ASSERT_TRUE(HashKV(c, 3, &at3).ok());
  ASSERT_TRUE(HashKV(c, 7, &at7).ok());
  EXPECT_NE(at3.hash(), at7.hash());

  // After a compaction to 4: hashes above 4, compact_revision 4 on both.
  etcdserverpb::CompactionRequest compact;
  compact.set_revision(4);
  compact.set_physical(true);
  etcdserverpb::CompactionResponse unused;
  ASSERT_TRUE(c.kv->Compact(Deadline().get(), compact, &unused).ok());
  ASSERT_TRUE(e.kv->Compact(Deadline().get(), compact, &unused).ok());
  check_all(5, 4);
  // At the compaction revision itself: the hash the compaction stored
  // (etcd 3.5.16's hashStorage), whose compact_revision is the compaction
  // before it (none: -1). 3.4 answered ErrCompacted.
  auto same_hash = [&](int64_t rev, int64_t want_compact) {
    etcdserverpb::HashKVResponse cr, er;
    grpc::Status cst = HashKV(c, rev, &cr);
    grpc::Status est = HashKV(e, rev, &er);
    ASSERT_TRUE(est.ok()) << "rev " << rev << ": " << est.error_message();
    ASSERT_TRUE(cst.ok()) << "rev " << rev << ": " << cst.error_message();
    EXPECT_EQ(cr.hash(), er.hash()) << "rev " << rev;
    EXPECT_EQ(er.compact_revision(), want_compact) << "rev " << rev;
    EXPECT_EQ(cr.compact_revision(), want_compact) << "rev " << rev;
    EXPECT_EQ(cr.header().revision(), er.header().revision()) << "rev " << rev;
  };
  same_hash(4, -1);

  // Below the compaction and in the future: the same errors, no hash.
  auto same_error = [&](int64_t rev) {
    etcdserverpb::HashKVResponse cr, er;
    grpc::Status cst = HashKV(c, rev, &cr);
    grpc::Status est = HashKV(e, rev, &er);
    EXPECT_FALSE(est.ok()) << "rev " << rev;
    EXPECT_EQ(cst.error_code(), est.error_code()) << "rev " << rev;
    EXPECT_EQ(cst.error_message(), est.error_message()) << "rev " << rev;
  };
  same_error(3);
  same_error(current + 1);

  // A second compaction, at the delete of revision 7: 3.5.16 keeps that
  // tombstone until the next compaction, and leaves it out of the hashes.
  // Revision 4 still answers its stored hash though now compacted, 7 the
  // hash of its compaction (from 4 on), 5 and 6 are compacted.
  compact.set_revision(7);
  ASSERT_TRUE(c.kv->Compact(Deadline().get(), compact, &unused).ok());
  ASSERT_TRUE(e.kv->Compact(Deadline().get(), compact, &unused).ok());
  same_hash(4, -1);
  same_hash(7, 4);
  same_hash(0, 7);
  same_error(5);
  same_error(6);

  // After more writes and a compaction past the tombstone, which removes it.
  int64_t crev = 0, erev = 0;
  ASSERT_TRUE(Put(c, "/h/d", "1", &crev).ok());
  ASSERT_TRUE(Put(e, "/h/d", "1", &erev).ok());
  ASSERT_EQ(crev, erev);
  compact.set_revision(crev);
  ASSERT_TRUE(c.kv->Compact(Deadline().get(), compact, &unused).ok());
  ASSERT_TRUE(e.kv->Compact(Deadline().get(), compact, &unused).ok());
  same_hash(crev, 7);
  same_hash(7, 4);
  same_hash(0, crev);
}

// etcd's compaction revision is -1 until the first compaction, so a store
// never compacted takes a compaction at 0 (etcd's benchmark sends one from
// put --compact-interval early in a run), and refuses it from then on, after
// a restart too. HashKV's compact_revision and the hash a later compaction
// stores are compared with etcd's at every step.
TEST(HashKVTest, AStoreNeverCompactedTakesOneCompactionAtZero) {
  auto capstan = ServerProcess::Start(ServerOptions::Capstan());
  ASSERT_TRUE(capstan.ok()) << capstan.status();
  auto etcd = ServerProcess::Start(ServerOptions::Etcd());
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  auto compact = [](ServerProcess& server, int64_t rev) {
    ServerStubs s(server.NewChannel());
    etcdserverpb::CompactionRequest req;
    req.set_revision(rev);
    req.set_physical(true);
    etcdserverpb::CompactionResponse resp;
    grpc::Status st = s.kv->Compact(Deadline().get(), req, &resp);
    return st.ok() ? std::string("ok") : absl::StrCat(st.error_code(), " ", st.error_message());
  };
  auto hash_at = [](ServerProcess& server, int64_t rev) {
    ServerStubs s(server.NewChannel());
    etcdserverpb::HashKVResponse resp;
    grpc::Status st = HashKV(s, rev, &resp);
    return st.ok() ? absl::StrCat("hash ", resp.hash(), " compact_revision ",
                                  resp.compact_revision())
                   : absl::StrCat(st.error_code(), " ", st.error_message());
  };
  // Each server's answers, step by step.
  auto steps = [&](ServerProcess& server) {
    std::vector<std::string> out;
    out.push_back(hash_at(server, 0));
    out.push_back(compact(server, 0));
    out.push_back(hash_at(server, 0));
    out.push_back(compact(server, 0));
    server.Stop();
    absl::Status restarted = server.Restart();
    EXPECT_TRUE(restarted.ok()) << restarted;
    if (!restarted.ok()) return out;
    out.push_back(compact(server, 0));
    out.push_back(hash_at(server, 0));
    ServerStubs s(server.NewChannel());
    int64_t rev = 0;
    EXPECT_TRUE(Put(s, "/z/a", "1", &rev).ok());
    EXPECT_TRUE(Put(s, "/z/a", "2", &rev).ok());
    out.push_back(compact(server, rev));
    // The hash that compaction stored names the one before it.
    out.push_back(hash_at(server, rev));
    out.push_back(hash_at(server, 0));
    return out;
  };
  const std::vector<std::string> want = steps(**etcd);
  const std::vector<std::string> got = steps(**capstan);
  ASSERT_EQ(want.size(), 9u);
  EXPECT_EQ(want[1], "ok");
  EXPECT_EQ(want[3], "11 etcdserver: mvcc: required revision has been compacted");
  EXPECT_EQ(want[4], want[3]);
  EXPECT_EQ(got, want);
}

// ---------------------------------------------------------------------------
// Defragment is online: puts and linearizable ranges on other threads
// complete while it runs, and nothing they did is lost.

struct TimedOp {
  Clock::time_point start, end;
  grpc::Status status;
  int64_t rev = 0;          // put: its revision; range: the header revision
  int64_t count = 0;        // range: keys seen
  int64_t want_rev = 0;     // range: the last put acknowledged before it started
  int64_t want_count = 0;   // range: puts acknowledged before it started
  std::string key;          // put
};

// Incompressible bytes, so that the backend's compaction has real work.
std::string RandomBytes(std::mt19937_64& rng, size_t n) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng();
    for (size_t j = 0; j < 8 && i + j < n; ++j) s[i + j] = static_cast<char>(r >> (8 * j));
  }
  return s;
}

TEST(DefragTest, PutsAndLinearizableRangesContinue) {
  auto server = ServerProcess::Start(ServerOptions::Capstan());
  ASSERT_TRUE(server.ok()) << server.status();
  ServerStubs s((*server)->NewChannel());

  // 48 MB written in 1 MB txns over 256 keys of 128 KB: 32 MB live, 16 MB
  // overwritten, all of it rewritten by a full backend compaction.
  std::mt19937_64 rng(42);
  constexpr int kKeys = 256, kValueBytes = 128 << 10, kPerTxn = 8, kTxns = 48;
  for (int t = 0; t < kTxns; ++t) {
    etcdserverpb::TxnRequest txn;
    for (int i = 0; i < kPerTxn; ++i) {
      auto* put = txn.add_success()->mutable_request_put();
      put->set_key(absl::StrFormat("/bulk/%04d", (t * kPerTxn + i) % kKeys));
      put->set_value(RandomBytes(rng, kValueBytes));
    }
    etcdserverpb::TxnResponse resp;
    ASSERT_TRUE(s.kv->Txn(Deadline().get(), txn, &resp).ok()) << "txn " << t;
  }
  etcdserverpb::HashKVResponse bulk_hash;
  ASSERT_TRUE(HashKV(s, 0, &bulk_hash).ok());
  const int64_t bulk_rev = bulk_hash.header().revision();  // nothing else writes yet

  std::mutex mu;
  std::vector<TimedOp> puts, ranges;  // guarded by mu
  std::atomic<bool> stop{false};
  std::atomic<int64_t> acked_rev{0}, acked{0};

  std::thread writer([&] {
    ServerStubs w((*server)->NewChannel());
    for (int i = 0; !stop.load(); ++i) {
      TimedOp op;
      op.key = absl::StrFormat("/online/%06d", i);
      op.start = Clock::now();
      op.status = Put(w, op.key, absl::StrCat("v", i), &op.rev);
      op.end = Clock::now();
      const bool ok = op.status.ok();
      {
        std::lock_guard<std::mutex> l(mu);
        puts.push_back(op);
      }
      if (!ok) return;
      acked_rev.store(op.rev);
      acked.store(i + 1);
    }
  });
  std::thread reader([&] {
    ServerStubs r((*server)->NewChannel());
    while (!stop.load()) {
      TimedOp op;
      op.want_rev = acked_rev.load();
      op.want_count = acked.load();
      etcdserverpb::RangeRequest req;  // linearizable (serializable unset)
      req.set_key("/online/");
      req.set_range_end("/online0");
      req.set_count_only(true);
      etcdserverpb::RangeResponse resp;
      op.start = Clock::now();
      op.status = r.kv->Range(Deadline().get(), req, &resp);
      op.end = Clock::now();
      op.rev = resp.header().revision();
      op.count = resp.count();
      const bool ok = op.status.ok();
      {
        std::lock_guard<std::mutex> l(mu);
        ranges.push_back(op);
      }
      if (!ok) return;
    }
  });
  auto done_inside = [&](const std::vector<TimedOp>& ops, Clock::time_point t0,
                         Clock::time_point t1) {
    return std::count_if(ops.begin(), ops.end(), [&](const TimedOp& op) {
      return op.status.ok() && op.start >= t0 && op.end <= t1;
    });
  };

  // Both workers under way before the first defragmentation.
  const auto warm_deadline = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    {
      std::lock_guard<std::mutex> l(mu);
      if ((puts.size() >= 3 && ranges.size() >= 3) || Clock::now() > warm_deadline) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  // Defragment until, within one run, at least 3 puts and 3 ranges both
  // started and finished (a server that stops writes for the whole
  // defragmentation, as etcd does, never gets there); at most 5 runs.
  int rounds = 0;
  int64_t best_puts = 0, best_ranges = 0;
  std::vector<double> defrag_seconds;
  while (rounds < 5 && (best_puts < 3 || best_ranges < 3)) {
    const auto t0 = Clock::now();
    etcdserverpb::DefragmentResponse resp;
    grpc::Status st =
        s.maintenance->Defragment(Deadline(std::chrono::seconds(60)).get(), {}, &resp);
    const auto t1 = Clock::now();
    ++rounds;
    ASSERT_TRUE(st.ok()) << st.error_message();
    defrag_seconds.push_back(std::chrono::duration<double>(t1 - t0).count());
    std::lock_guard<std::mutex> l(mu);
    const int64_t p = done_inside(puts, t0, t1), r = done_inside(ranges, t0, t1);
    if (std::min(p, r) > std::min(best_puts, best_ranges)) {
      best_puts = p;
      best_ranges = r;
    }
  }
  stop.store(true);
  writer.join();
  reader.join();

  std::string timings;
  for (double d : defrag_seconds) timings += absl::StrFormat(" %.2fs", d);
  EXPECT_GE(best_puts, 3) << "defragmentations:" << timings;
  EXPECT_GE(best_ranges, 3) << "defragmentations:" << timings;
  std::cout << "defragmentations:" << timings << "; within one: " << best_puts << " puts, "
            << best_ranges << " ranges; in all " << puts.size() << " puts, " << ranges.size()
            << " ranges\n";

  // Every put and every range succeeded; each range saw every put
  // acknowledged before it started (linearizable).
  for (const TimedOp& op : puts) {
    EXPECT_TRUE(op.status.ok()) << op.key << ": " << op.status.error_message();
  }
  for (const TimedOp& op : ranges) {
    ASSERT_TRUE(op.status.ok()) << op.status.error_message();
    EXPECT_GE(op.rev, op.want_rev);
    EXPECT_GE(op.count, op.want_count);
  }

  // Afterwards every put is there at the revision it was given.
  etcdserverpb::RangeRequest all;
  all.set_key("/online/");
  all.set_range_end("/online0");
  etcdserverpb::RangeResponse got;
  ASSERT_TRUE(s.kv->Range(Deadline().get(), all, &got).ok());
  std::map<std::string, int64_t> mod_rev;
  for (const auto& kv : got.kvs()) mod_rev[kv.key()] = kv.mod_revision();
  ASSERT_EQ(got.kvs_size(), static_cast<int>(puts.size()));
  for (const TimedOp& op : puts) EXPECT_EQ(mod_rev[op.key], op.rev) << op.key;
  // And the bulk data is unchanged.
  etcdserverpb::HashKVResponse after;
  ASSERT_TRUE(HashKV(s, bulk_rev, &after).ok());
  EXPECT_EQ(after.hash(), bulk_hash.hash());
}

// ---------------------------------------------------------------------------
// The Alarm RPC and /health, the same steps on etcd and Capstan.

struct HttpAnswer {
  int status = 0;
  std::string body, content_type, nosniff, allow;
};

// An HTTP call to a server's metrics URL, or with client_url to its client
// URL.
HttpAnswer HttpCall(const ServerProcess& server, const std::string& method,
                    const std::string& path, bool client_url = false) {
  httplib::Client client("127.0.0.1", client_url ? server.client_port() : server.metrics_port());
  httplib::Result res = method == "GET" ? client.Get(path) : client.Post(path);
  HttpAnswer a;
  if (!res) return a;
  a.status = res->status;
  a.body = res->body;
  a.content_type = res->get_header_value("Content-Type");
  a.nosniff = res->get_header_value("X-Content-Type-Options");
  a.allow = res->get_header_value("Allow");
  return a;
}

class AlarmHealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = ServerProcess::Start(ServerOptions::Etcd());
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    auto capstan = ServerProcess::Start(ServerOptions::Capstan());
    ASSERT_TRUE(capstan.ok()) << capstan.status();
    etcd_ = std::move(*etcd);
    capstan_ = std::move(*capstan);
    e_ = std::make_unique<ServerStubs>(etcd_->NewChannel());
    c_ = std::make_unique<ServerStubs>(capstan_->NewChannel());
    for (auto [stubs, id] : {std::pair{e_.get(), &etcd_id_}, std::pair{c_.get(), &capstan_id_}}) {
      etcdserverpb::StatusResponse st;
      ASSERT_TRUE(stubs->maintenance->Status(Deadline().get(), {}, &st).ok());
      *id = st.header().member_id();
    }
    ASSERT_NE(etcd_id_, kOtherMember);
    ASSERT_NE(capstan_id_, kOtherMember);
  }

  // An alarm for the server's own member (self) or for kOtherMember.
  static constexpr uint64_t kOtherMember = 7;

  // Sends the request to both servers (memberID: each its own if `self`)
  // and expects the same answer: status, header revision, and the alarms
  // as a set (etcd lists them in Go map order) with each server's own id
  // read as "self".
  void ExpectSameAlarm(AlarmRequest::AlarmAction action, bool self, AlarmType alarm,
                       std::vector<std::string> want) {
    std::vector<std::string> answers[2];
    bool has_header[2];
    int64_t revs[2];
    grpc::Status sts[2];
    int i = 0;
    for (auto [stubs, id] : {std::pair{e_.get(), etcd_id_}, std::pair{c_.get(), capstan_id_}}) {
      AlarmRequest req;
      req.set_action(action);
      req.set_memberid(self ? id : kOtherMember);
      req.set_alarm(alarm);
      AlarmResponse resp;
      sts[i] = stubs->maintenance->Alarm(Deadline().get(), req, &resp);
      has_header[i] = resp.has_header();
      revs[i] = resp.header().revision();
      for (const auto& a : resp.alarms()) {
        answers[i].push_back(absl::StrCat(a.memberid() == id ? "self" : absl::StrCat(a.memberid()),
                                          ":", etcdserverpb::AlarmType_Name(a.alarm())));
      }
      std::sort(answers[i].begin(), answers[i].end());
      ++i;
    }
    const std::string what = absl::StrCat(AlarmRequest::AlarmAction_Name(action), " ",
                                          self ? "self" : "other", " ",
                                          etcdserverpb::AlarmType_Name(alarm));
    ASSERT_TRUE(sts[0].ok()) << what << ": etcd: " << sts[0].error_message();
    ASSERT_TRUE(sts[1].ok()) << what << ": capstan: " << sts[1].error_message();
    // etcd 3.5 fills the header (maintenanceServer.Alarm); 3.4 sends none.
    EXPECT_TRUE(has_header[1]) << what;
    if (has_header[0]) {
      EXPECT_EQ(revs[0], revs[1]) << what;
    } else {
      etcdserverpb::StatusResponse st;
      ASSERT_TRUE(c_->maintenance->Status(Deadline().get(), {}, &st).ok());
      EXPECT_EQ(revs[1], st.header().revision()) << what;
    }
    EXPECT_EQ(answers[0], answers[1]) << what;
    std::sort(want.begin(), want.end());
    EXPECT_EQ(answers[1], want) << what;
  }

  // A put on both: refused with NOSPACE on both, or accepted by both.
  void ExpectPut(bool refused) {
    for (ServerStubs* s : {e_.get(), c_.get()}) {
      grpc::Status st = Put(*s, "/alarm/k", "v");
      if (refused) {
        EXPECT_EQ(st.error_code(), grpc::RESOURCE_EXHAUSTED) << (s == e_.get() ? "etcd" : "capstan");
        EXPECT_EQ(st.error_message(), kNoSpace);
      } else {
        EXPECT_TRUE(st.ok()) << st.error_message();
      }
    }
  }

  // GET /health with each query on both servers, on the metrics and the
  // client URL: Capstan answers as etcd, whose body says why it is
  // unhealthy ("reason", etcd 3.5).
  void ExpectHealth(const std::map<std::string, std::string>& unhealthy_reason_by_query) {
    for (const auto& [query, reason] : unhealthy_reason_by_query) {
      for (const bool client_url : {false, true}) {
        const std::string where = absl::StrCat(client_url ? "client " : "metrics ", query);
        const HttpAnswer e = HttpCall(*etcd_, "GET", "/health" + query, client_url);
        const HttpAnswer c = HttpCall(*capstan_, "GET", "/health" + query, client_url);
        const bool healthy = reason.empty();
        EXPECT_EQ(e.status, healthy ? 200 : 503) << where << ": etcd " << e.body;
        EXPECT_EQ(c.status, e.status) << where << ": " << c.body;
        EXPECT_EQ(c.content_type, e.content_type) << where;
        EXPECT_EQ(c.nosniff, e.nosniff) << where;
        EXPECT_EQ(c.body, e.body) << where;
        EXPECT_EQ(e.body, healthy ? "{\"health\":\"true\",\"reason\":\"\"}"
                                  : "{\"health\":\"false\",\"reason\":\"" + reason + "\"}\n")
            << where;
      }
    }
  }

  std::unique_ptr<ServerProcess> etcd_, capstan_;
  std::unique_ptr<ServerStubs> e_, c_;
  uint64_t etcd_id_ = 0, capstan_id_ = 0;
};

constexpr char kProbe[] = "?exclude=NOSPACE&serializable=true";  // kubeadm's liveness probe

TEST_F(AlarmHealthTest, ActivateGetDeactivateAndHealthAsEtcd) {
  using A = AlarmRequest;
  ExpectSameAlarm(A::GET, true, etcdserverpb::NONE, {});
  ExpectHealth({{"", ""}, {kProbe, ""}, {"?serializable=true", ""}});
  ExpectPut(false);

  // NOSPACE raised through the RPC: writes refused; /health unhealthy unless
  // NOSPACE is excluded.
  ExpectSameAlarm(A::ACTIVATE, true, etcdserverpb::NOSPACE, {"self:NOSPACE"});
  ExpectSameAlarm(A::ACTIVATE, true, etcdserverpb::NOSPACE, {"self:NOSPACE"});  // again
  ExpectSameAlarm(A::GET, true, etcdserverpb::NONE, {"self:NOSPACE"});
  ExpectPut(true);
  ExpectHealth({{"", "ALARM NOSPACE"},
                {kProbe, ""},
                {"?exclude=NOSPACE", ""},
                {"?serializable=true", "ALARM NOSPACE"},
                {"?exclude=CORRUPT", "ALARM NOSPACE"},
                {"?exclude=nospace", "ALARM NOSPACE"},
                {"?exclude=CORRUPT&exclude=NOSPACE", ""}});

  // A second member's NOSPACE: listed, filtered by type, excluded with ours.
  ExpectSameAlarm(A::ACTIVATE, false, etcdserverpb::NOSPACE, {"7:NOSPACE"});
  ExpectSameAlarm(A::GET, false, etcdserverpb::NONE, {"self:NOSPACE", "7:NOSPACE"});
  ExpectSameAlarm(A::GET, true, etcdserverpb::NOSPACE, {"self:NOSPACE", "7:NOSPACE"});
  ExpectSameAlarm(A::GET, true, etcdserverpb::CORRUPT, {});
  ExpectHealth({{"", "ALARM NOSPACE"}, {kProbe, ""}});

  // Disarming ours leaves the other member's: writes still refused.
  ExpectSameAlarm(A::DEACTIVATE, true, etcdserverpb::NOSPACE, {"self:NOSPACE"});
  ExpectPut(true);
  ExpectHealth({{"", "ALARM NOSPACE"}, {kProbe, ""}});
  ExpectSameAlarm(A::DEACTIVATE, false, etcdserverpb::NOSPACE, {"7:NOSPACE"});
  ExpectSameAlarm(A::GET, true, etcdserverpb::NONE, {});
  ExpectPut(false);
  ExpectHealth({{"", ""}, {kProbe, ""}});

  // CORRUPT: not excluded by the probe. (Raised last: disarming it gives
  // etcd back its normal applier even while NOSPACE alarms remain. Writes
  // under CORRUPT: CorruptAlarmRefusesWritesAsEtcd.)
  ExpectSameAlarm(A::ACTIVATE, true, etcdserverpb::CORRUPT, {"self:CORRUPT"});
  ExpectSameAlarm(A::GET, true, etcdserverpb::CORRUPT, {"self:CORRUPT"});
  ExpectHealth({{kProbe, "ALARM CORRUPT"}, {"?exclude=CORRUPT", ""}, {"", "ALARM CORRUPT"}});
  ExpectSameAlarm(A::DEACTIVATE, true, etcdserverpb::CORRUPT, {"self:CORRUPT"});
  ExpectSameAlarm(A::DEACTIVATE, true, etcdserverpb::CORRUPT, {});  // not active
  ExpectHealth({{kProbe, ""}});

  // An alarm of type NONE is not raised (etcd 3.5; 3.4 stored it and was
  // then unhealthy with "ALARM UNKNOWN"): nothing to list or disarm.
  ExpectSameAlarm(A::ACTIVATE, false, etcdserverpb::NONE, {});
  ExpectSameAlarm(A::GET, true, etcdserverpb::NONE, {});
  ExpectHealth({{kProbe, ""}, {"", ""}});
  ExpectSameAlarm(A::DEACTIVATE, false, etcdserverpb::NONE, {});
  ExpectHealth({{kProbe, ""}});
}

// While a CORRUPT alarm is active, etcd's corrupt applier refuses what goes
// through consensus (puts, deletes, txns with a write, compactions, lease
// grants and revocations) with DATA_LOSS "etcdserver: corrupt cluster";
// ranges and read-only txns are served. Disarming it lets writes through.
TEST_F(AlarmHealthTest, CorruptAlarmRefusesWritesAsEtcd) {
  using A = AlarmRequest;
  int64_t lease_id[2] = {0, 0};
  for (int i = 0; i < 2; ++i) {
    ServerStubs* s = i == 0 ? e_.get() : c_.get();
    ASSERT_TRUE(Put(*s, "/corrupt/k", "v").ok());
    etcdserverpb::LeaseGrantRequest grant;
    grant.set_ttl(600);
    etcdserverpb::LeaseGrantResponse granted;
    ASSERT_TRUE(s->lease->LeaseGrant(Deadline().get(), grant, &granted).ok());
    lease_id[i] = granted.id();
  }
  ExpectSameAlarm(A::ACTIVATE, true, etcdserverpb::CORRUPT, {"self:CORRUPT"});

  // Each request's answer on both servers, as "CODE message".
  auto answers = [&](const std::string& what, auto call) {
    std::string got[2];
    for (int i = 0; i < 2; ++i) {
      grpc::Status st = call(i == 0 ? *e_ : *c_, lease_id[i]);
      got[i] = st.ok() ? "OK" : absl::StrCat(st.error_code(), " ", st.error_message());
    }
    EXPECT_EQ(got[1], got[0]) << what;
    return got[0];
  };
  const std::string refused = absl::StrCat(grpc::DATA_LOSS, " etcdserver: corrupt cluster");
  EXPECT_EQ(answers("put", [](ServerStubs& s, int64_t) { return Put(s, "/corrupt/k", "w"); }),
            refused);
  EXPECT_EQ(answers("delete", [](ServerStubs& s, int64_t) {
              etcdserverpb::DeleteRangeRequest req;
              req.set_key("/corrupt/k");
              etcdserverpb::DeleteRangeResponse resp;
              return s.kv->DeleteRange(Deadline().get(), req, &resp);
            }),
            refused);
  EXPECT_EQ(answers("txn with a put", [](ServerStubs& s, int64_t) {
              etcdserverpb::TxnRequest req;
              req.add_success()->mutable_request_put()->set_key("/corrupt/t");
              etcdserverpb::TxnResponse resp;
              return s.kv->Txn(Deadline().get(), req, &resp);
            }),
            refused);
  EXPECT_EQ(answers("compaction", [](ServerStubs& s, int64_t) {
              etcdserverpb::CompactionRequest req;
              req.set_revision(1);
              etcdserverpb::CompactionResponse resp;
              return s.kv->Compact(Deadline().get(), req, &resp);
            }),
            refused);
  EXPECT_EQ(answers("lease grant", [](ServerStubs& s, int64_t) {
              etcdserverpb::LeaseGrantRequest req;
              req.set_ttl(60);
              etcdserverpb::LeaseGrantResponse resp;
              return s.lease->LeaseGrant(Deadline().get(), req, &resp);
            }),
            refused);
  EXPECT_EQ(answers("lease revoke", [](ServerStubs& s, int64_t id) {
              etcdserverpb::LeaseRevokeRequest req;
              req.set_id(id);
              etcdserverpb::LeaseRevokeResponse resp;
              return s.lease->LeaseRevoke(Deadline().get(), req, &resp);
            }),
            refused);
  EXPECT_EQ(answers("range", [](ServerStubs& s, int64_t) {
              etcdserverpb::RangeRequest req;
              req.set_key("/corrupt/k");
              etcdserverpb::RangeResponse resp;
              grpc::Status st = s.kv->Range(Deadline().get(), req, &resp);
              if (st.ok() && (resp.kvs_size() != 1 || resp.kvs(0).value() != "v")) {
                return grpc::Status(grpc::UNKNOWN, "unexpected range result");
              }
              return st;
            }),
            "OK");
  EXPECT_EQ(answers("read-only txn", [](ServerStubs& s, int64_t) {
              etcdserverpb::TxnRequest req;
              req.add_success()->mutable_request_range()->set_key("/corrupt/k");
              etcdserverpb::TxnResponse resp;
              return s.kv->Txn(Deadline().get(), req, &resp);
            }),
            "OK");

  ExpectSameAlarm(A::DEACTIVATE, true, etcdserverpb::CORRUPT, {"self:CORRUPT"});
  EXPECT_EQ(answers("put after disarm", [](ServerStubs& s, int64_t) { return Put(s, "/corrupt/k", "x"); }),
            "OK");
}

TEST_F(AlarmHealthTest, HealthRefusesOtherMethodsAsEtcd) {
  const HttpAnswer e = HttpCall(*etcd_, "POST", "/health");
  const HttpAnswer c = HttpCall(*capstan_, "POST", "/health");
  EXPECT_EQ(e.status, 405);
  EXPECT_EQ(c.status, e.status);
  EXPECT_EQ(c.allow, e.allow);
  EXPECT_EQ(c.body, e.body);
  EXPECT_EQ(c.content_type, e.content_type);
  EXPECT_EQ(c.nosniff, e.nosniff);
}

}  // namespace
}  // namespace capstan::testing
