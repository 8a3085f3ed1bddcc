// The history checker on synthetic histories: histories that are
// linearizable pass; each rule catches the fault it names; a 100k-operation
// history checks in well under seconds.

#include "cluster/checker.h"

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace capstan::testing::cluster {
namespace {

constexpr int64_t kMs = 1000000;

// Builds a history by hand: each op with its times (ms) and answer, and the
// event log beside it.
class Builder {
 public:
  Operation& Put(std::string key, std::string value, int64_t t0, int64_t t1, int64_t rev) {
    Operation op = Operation::Put(0, std::move(key), std::move(value));
    return Done(std::move(op), t0, t1, rev);
  }
  Operation& Get(std::string key, int64_t t0, int64_t t1, int64_t rev, bool found,
                 std::string value = "", int64_t mod_rev = 0) {
    Operation op = Operation::Get(0, std::move(key));
    Operation& o = Done(std::move(op), t0, t1, rev);
    o.response.found = found;
    o.response.value = std::move(value);
    o.response.mod_revision = mod_rev;
    return o;
  }
  Operation& Unknown(Operation op, int64_t t0, int64_t t1) {
    op.invoke_ns = t0 * kMs;
    op.complete_ns = t1 * kMs;
    op.outcome = Outcome::kUnknown;
    op.error = "deadline exceeded";
    return Push(std::move(op));
  }
  Operation& Done(Operation op, int64_t t0, int64_t t1, int64_t rev) {
    op.invoke_ns = t0 * kMs;
    op.complete_ns = t1 * kMs;
    op.outcome = Outcome::kOk;
    op.response.revision = rev;
    if (op.kind == OpKind::kCas) op.response.succeeded = true;
    if (op.kind == OpKind::kDelete) op.response.deleted = 1;
    return Push(std::move(op));
  }
  void PutEvent(int64_t rev, std::string key, std::string value) {
    events.push_back(Event{rev, std::move(key), false, std::move(value)});
  }
  void DeleteEvent(int64_t rev, std::string key) {
    events.push_back(Event{rev, std::move(key), true, ""});
  }
  CheckResult Check() const { return CheckHistory(ops, events); }

  std::vector<Operation> ops;
  std::vector<Event> events;

 private:
  Operation& Push(Operation op) {
    op.id = static_cast<int64_t>(ops.size());
    ops.push_back(std::move(op));
    return ops.back();
  }
};

// put a=1 (rev 2), put b=1 (rev 3), cas a 1->2 (rev 4), delete b (rev 5),
// with reads between them.
Builder Sequential() {
  Builder b;
  b.Put("a", "a1", 0, 1, 2);
  b.PutEvent(2, "a", "a1");
  b.Get("a", 2, 3, 2, true, "a1", 2);
  b.Put("b", "b1", 4, 5, 3);
  b.PutEvent(3, "b", "b1");
  b.Done(Operation::Cas(0, "a", "a1", false, "a2"), 6, 7, 4);
  b.PutEvent(4, "a", "a2");
  b.Get("a", 8, 9, 4, true, "a2", 4);
  b.Done(Operation::Delete(0, "b"), 10, 11, 5);
  b.DeleteEvent(5, "b");
  b.Get("b", 12, 13, 5, false);
  // A CAS whose compare fails is a read (its else-branch Range).
  Operation& cas = b.Done(Operation::Cas(0, "a", "a1", false, "a3"), 14, 15, 5);
  cas.response.succeeded = false;
  cas.response.found = true;
  cas.response.value = "a2";
  cas.response.mod_revision = 4;
  return b;
}

TEST(CheckerTest, SequentialHistoryPasses) {
  CheckResult r = Sequential().Check();
  EXPECT_TRUE(r.ok()) << r.Report();
  EXPECT_EQ(r.stats.writes_checked, 4);
  EXPECT_EQ(r.stats.reads_checked, 4);
}

TEST(CheckerTest, ConcurrentOperationsMayTakeEffectInEitherOrder) {
  Builder b;
  // Two overlapping puts; the one invoked later takes the lower revision.
  b.Put("a", "x", 0, 10, 3);
  b.Put("a", "y", 1, 10, 2);
  b.PutEvent(2, "a", "y");
  b.PutEvent(3, "a", "x");
  // A read overlapping the second write may see the first.
  b.Get("a", 2, 5, 2, true, "y", 2);
  CheckResult r = b.Check();
  EXPECT_TRUE(r.ok()) << r.Report();
}

TEST(CheckerTest, UnknownWritesMayOrMayNotHappen) {
  Builder b;
  b.Unknown(Operation::Put(1, "a", "lost"), 0, 5);
  b.Unknown(Operation::Put(1, "a", "late"), 6, 7);
  b.Unknown(Operation::Delete(1, "a"), 8, 9);
  // "late" happened after its client gave up on it.
  b.Put("a", "z", 10, 11, 2);
  b.PutEvent(2, "a", "z");
  b.PutEvent(3, "a", "late");
  b.DeleteEvent(4, "a");
  b.Get("a", 20, 21, 4, false);
  CheckResult r = b.Check();
  EXPECT_TRUE(r.ok()) << r.Report();
  EXPECT_EQ(r.stats.unknown_applied, 2);
}

TEST(CheckerTest, CatchesALostAcknowledgedWrite) {
  Builder b = Sequential();
  b.Put("c", "c1", 20, 21, 6);  // acknowledged, never in the log
  CheckResult r = b.Check();
  ASSERT_EQ(r.Count(Rule::kLostWrite), 1u) << r.Report();
  EXPECT_EQ(r.violations[0].op_ids, std::vector<int64_t>{b.ops.back().id});
  EXPECT_NE(r.violations[0].message.find("c=c1"), std::string::npos) << r.Report();
}

TEST(CheckerTest, CatchesAWriteAcknowledgedAtAnotherRevision) {
  Builder b;
  b.Put("a", "a1", 0, 1, 3);
  b.PutEvent(2, "a", "a1");
  CheckResult r = b.Check();
  EXPECT_EQ(r.Count(Rule::kLostWrite), 1u) << r.Report();
}

TEST(CheckerTest, CatchesAStaleRead) {
  Builder b;
  b.Put("a", "a1", 0, 1, 2);
  b.Put("a", "a2", 2, 3, 3);
  b.PutEvent(2, "a", "a1");
  b.PutEvent(3, "a", "a2");
  // Invoked after a2 was acknowledged, answers from revision 2: consistent
  // with the log at its revision, but stale.
  b.Get("a", 4, 5, 2, true, "a1", 2);
  CheckResult r = b.Check();
  ASSERT_EQ(r.Count(Rule::kStaleRead), 1u) << r.Report();
  EXPECT_EQ(r.violations.size(), 1u) << r.Report();
  EXPECT_EQ(r.violations[0].op_ids, (std::vector<int64_t>{1, 2}));
}

TEST(CheckerTest, CatchesAReadThatDisagreesWithTheLog) {
  Builder b = Sequential();
  b.Get("a", 20, 21, 5, true, "a1", 2);  // a is a2 since revision 4
  CheckResult r = b.Check();
  EXPECT_EQ(r.Count(Rule::kWrongRead), 1u) << r.Report();
  // And a read of a deleted key that finds it.
  Builder c = Sequential();
  c.Get("b", 20, 21, 5, true, "b1", 3);
  EXPECT_EQ(c.Check().Count(Rule::kWrongRead), 1u);
}

TEST(CheckerTest, CatchesARevisionGoingBackInRealTime) {
  Builder b;
  b.Put("a", "a1", 0, 1, 3);
  b.Put("b", "b1", 2, 3, 2);  // invoked after a1 completed, yet an older revision
  b.PutEvent(2, "b", "b1");
  b.PutEvent(3, "a", "a1");
  CheckResult r = b.Check();
  ASSERT_EQ(r.Count(Rule::kRealTimeOrder), 1u) << r.Report();
  EXPECT_EQ(r.violations.size(), 1u) << r.Report();
}

TEST(CheckerTest, CatchesAnUnknownWriteAppliedTwice) {
  Builder b;
  b.Unknown(Operation::Put(1, "a", "once"), 0, 5);
  b.PutEvent(2, "a", "once");
  b.PutEvent(3, "a", "once");  // a retried proposal applied again
  CheckResult r = b.Check();
  EXPECT_EQ(r.Count(Rule::kDuplicateWrite), 1u) << r.Report();
}

TEST(CheckerTest, CatchesWritesNobodyMade) {
  Builder b;
  b.PutEvent(2, "a", "ghost");
  b.DeleteEvent(3, "a");
  CheckResult r = b.Check();
  EXPECT_EQ(r.Count(Rule::kPhantomWrite), 2u) << r.Report();
}

TEST(CheckerTest, CatchesAFailedWriteThatHappened) {
  Builder b;
  Operation op = Operation::Put(0, "a", "no");
  op.invoke_ns = 0;
  op.complete_ns = kMs;
  op.outcome = Outcome::kFailed;
  op.error = "refused";
  b.ops.push_back(op);
  b.PutEvent(2, "a", "no");
  CheckResult r = b.Check();
  EXPECT_EQ(r.Count(Rule::kFailedWriteApplied), 1u) << r.Report();
}

TEST(CheckerTest, CatchesACasAppliedAgainstItsCompare) {
  Builder b;
  b.Put("a", "a1", 0, 1, 2);
  b.PutEvent(2, "a", "a1");
  b.Done(Operation::Cas(0, "a", "zzz", false, "a2"), 2, 3, 3);
  b.PutEvent(3, "a", "a2");
  CheckResult r = b.Check();
  EXPECT_EQ(r.Count(Rule::kLostWrite), 1u) << r.Report();
}

TEST(CheckerTest, CatchesAWrongPrevKv) {
  Builder b;
  b.Put("a", "a1", 0, 1, 2);
  b.PutEvent(2, "a", "a1");
  Operation& p = b.Put("a", "a2", 2, 3, 3);
  p.prev_kv = true;
  p.response.has_prev = true;
  p.response.prev_value = "a0";
  b.PutEvent(3, "a", "a2");
  EXPECT_EQ(b.Check().Count(Rule::kLostWrite), 1u);
}

// A random linearizable history: each operation takes effect at a point
// inside [invoke, complete], in the order of those points, on a model store.
struct Generated {
  std::vector<Operation> ops;
  std::vector<Event> events;
};

Generated GenerateLinearizable(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  Generated g;
  std::map<std::string, std::pair<std::string, int64_t>> store;  // key -> value, mod_rev
  int64_t rev = 1;
  for (int i = 0; i < n; ++i) {
    const int64_t point = static_cast<int64_t>(i) * 1000;
    const std::string key = absl::StrCat("k", rng() % 16);
    const std::string value = absl::StrCat("v", i);
    const int client = static_cast<int>(rng() % 8);
    Operation op;
    switch (rng() % 10) {
      case 0: case 1: case 2: case 3: op = Operation::Get(client, key); break;
      case 4: case 5: case 6: op = Operation::Put(client, key, value, rng() % 2 == 0); break;
      case 7: op = Operation::Delete(client, key); break;
      default: {
        auto it = store.find(key);
        const bool absent = it == store.end() || rng() % 4 == 0;
        op = Operation::Cas(client, key, absent ? "" : it->second.first, absent, value);
      }
    }
    op.id = i;
    op.invoke_ns = point - static_cast<int64_t>(rng() % 20000);
    op.complete_ns = point + static_cast<int64_t>(rng() % 20000);
    const bool unknown = rng() % 50 == 0;
    const bool applied = !unknown || rng() % 2 == 0;
    op.outcome = unknown ? Outcome::kUnknown : Outcome::kOk;
    Response& r = op.response;
    auto it = store.find(key);
    const bool found = it != store.end();
    switch (op.kind) {
      case OpKind::kGet:
        if (unknown) break;
        r.found = found;
        if (found) {
          r.value = it->second.first;
          r.mod_revision = it->second.second;
        }
        break;
      case OpKind::kPut:
        if (!applied) break;
        r.has_prev = op.prev_kv && found;
        if (r.has_prev) r.prev_value = it->second.first;
        store[key] = {value, ++rev};
        g.events.push_back(Event{rev, key, false, value});
        break;
      case OpKind::kDelete:
        if (!applied || !found) break;
        r.deleted = 1;
        store.erase(it);
        g.events.push_back(Event{++rev, key, true, ""});
        break;
      case OpKind::kCas: {
        const bool held = op.expect_absent ? !found : (found && it->second.first == op.expected);
        r.succeeded = held;
        if (!applied) break;
        if (held) {
          store[key] = {value, ++rev};
          g.events.push_back(Event{rev, key, false, value});
        } else {
          r.found = found;
          if (found) {
            r.value = it->second.first;
            r.mod_revision = it->second.second;
          }
        }
        break;
      }
    }
    r.revision = rev;
    if (unknown) op.response = Response{};
    g.ops.push_back(std::move(op));
  }
  return g;
}

// A page of a list over [a, z) answered with `keys` ("key=value@mod_rev").
Operation& ListPage(Builder* b, std::string start, int64_t limit, int64_t list_rev, int64_t t0,
                    int64_t t1, int64_t header_rev, std::vector<Response::Kv> kvs, bool more) {
  Operation& op = b->Done(Operation::List(0, std::move(start), "z", limit, list_rev), t0, t1,
                          header_rev);
  op.response.kvs = std::move(kvs);
  op.response.more = more;
  return op;
}

TEST(CheckerTest, ListPagesAtARevisionPass) {
  Builder b = Sequential();  // at revision 5: a=a2 (mod 4); b deleted
  b.Put("c", "c1", 20, 21, 6);
  b.PutEvent(6, "c", "c1");
  // The first page at the current revision, the next at the first's.
  ListPage(&b, "a", 1, 0, 22, 23, 6, {{"a", "a2", 4}}, true);
  b.Put("a", "a9", 24, 25, 7);
  b.PutEvent(7, "a", "a9");
  ListPage(&b, std::string("a\0", 2), 1, 6, 26, 27, 7, {{"c", "c1", 6}}, false);
  // An old revision still shows b.
  ListPage(&b, "a", 0, 3, 28, 29, 7, {{"a", "a1", 2}, {"b", "b1", 3}}, false);
  CheckResult r = b.Check();
  EXPECT_TRUE(r.ok()) << r.Report();
  EXPECT_EQ(r.stats.reads_checked, 7);
}

TEST(CheckerTest, CatchesAListThatDisagreesWithTheLog) {
  // A key missing from the page.
  Builder b = Sequential();
  ListPage(&b, "a", 0, 3, 20, 21, 5, {{"a", "a1", 2}}, false);
  EXPECT_EQ(b.Check().Count(Rule::kWrongRead), 1u) << b.Check().Report();
  // A deleted key still listed at the current revision.
  Builder c = Sequential();
  ListPage(&c, "a", 0, 0, 20, 21, 5, {{"a", "a2", 4}, {"b", "b1", 3}}, false);
  EXPECT_EQ(c.Check().Count(Rule::kWrongRead), 1u);
  // `more` when nothing follows, and a page longer than its limit.
  Builder d = Sequential();
  ListPage(&d, "a", 1, 0, 20, 21, 5, {{"a", "a2", 4}}, true);
  ListPage(&d, "a", 1, 3, 22, 23, 5, {{"a", "a1", 2}, {"b", "b1", 3}}, false);
  EXPECT_EQ(d.Check().Count(Rule::kWrongRead), 2u);
  // A first page answered from a revision older than a completed write.
  Builder e = Sequential();
  ListPage(&e, "a", 0, 0, 20, 21, 3, {{"a", "a1", 2}, {"b", "b1", 3}}, false);
  CheckResult r = e.Check();
  EXPECT_EQ(r.Count(Rule::kStaleRead), 1u) << r.Report();
  EXPECT_EQ(r.Count(Rule::kWrongRead), 0u) << r.Report();
}

TEST(CheckerTest, ModRevisionCompares) {
  Builder b = Sequential();  // a=a2 at mod_revision 4, b absent
  b.Done(Operation::CasModRevision(0, "a", 4, "a9"), 20, 21, 6);
  b.PutEvent(6, "a", "a9");
  b.Done(Operation::CasModRevision(0, "b", 0, "b2"), 22, 23, 7);  // a create
  b.PutEvent(7, "b", "b2");
  Operation& conflict = b.Done(Operation::CasModRevision(0, "a", 4, "a10"), 24, 25, 7);
  conflict.response.succeeded = false;
  conflict.response.found = true;
  conflict.response.value = "a9";
  conflict.response.mod_revision = 6;
  CheckResult r = b.Check();
  EXPECT_TRUE(r.ok()) << r.Report();
  // Applied although a's mod_revision was no longer 4.
  b.Done(Operation::CasModRevision(0, "a", 4, "a11"), 26, 27, 8);
  b.PutEvent(8, "a", "a11");
  EXPECT_EQ(b.Check().Count(Rule::kLostWrite), 1u) << b.Check().Report();
  // Answered compare-failed although the compare held.
  Builder c = Sequential();
  Operation& wrong = c.Done(Operation::CasModRevision(0, "a", 4, "a9"), 20, 21, 5);
  wrong.response.succeeded = false;
  wrong.response.found = true;
  wrong.response.value = "a2";
  wrong.response.mod_revision = 4;
  EXPECT_EQ(c.Check().Count(Rule::kWrongRead), 1u) << c.Check().Report();
}

TEST(CheckerTest, LargeRandomLinearizableHistoryPassesQuickly) {
  Generated g = GenerateLinearizable(100000, 7);
  CheckResult r = CheckHistory(g.ops, g.events);
  EXPECT_TRUE(r.ok()) << r.Report();
  EXPECT_EQ(r.stats.operations, 100000);
  EXPECT_LT(r.stats.seconds, 5.0);
  std::printf("checker: %s\n", r.Report(0).c_str());
}

TEST(CheckerTest, LargeRandomHistoryWithOneStaleReadFails) {
  Generated g = GenerateLinearizable(100000, 11);
  // Turn a late read into one answered from long ago: the key's state at an
  // early revision, which completed writes have since passed.
  int64_t target = -1;
  for (int64_t i = 90000; i < 100000; ++i) {
    if (g.ops[i].kind == OpKind::kGet && g.ops[i].outcome == Outcome::kOk) {
      target = i;
      break;
    }
  }
  ASSERT_GE(target, 0);
  Operation& op = g.ops[target];
  op.response.revision = 1;
  op.response.found = false;
  op.response.value.clear();
  op.response.mod_revision = 0;
  CheckResult r = CheckHistory(g.ops, g.events);
  EXPECT_EQ(r.Count(Rule::kStaleRead), 1u) << r.Report();
  EXPECT_EQ(r.violations.size(), 1u) << r.Report();
}

}  // namespace
}  // namespace capstan::testing::cluster
