// The watch checker on synthetic logs and record streams: a correct stream
// passes, reconnections and transactions included; each rule catches the
// fault it names; a long random stream checks in well under seconds.

#include "cluster/watch_checker.h"

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace capstan::testing::cluster {
namespace {

// Builds an event log by hand, and the records a correct watcher of it
// would make: Deliver(i) is the record of the log's change i, with the
// prev_kv the log implies.
class Builder {
 public:
  explicit Builder(std::string prefix = "w/") : prefix(std::move(prefix)) {}

  // Returns the change's position in the log.
  size_t Put(int64_t rev, const std::string& key, const std::string& value) {
    return Change(Event{rev, key, false, value});
  }
  size_t Delete(int64_t rev, const std::string& key) { return Change(Event{rev, key, true, ""}); }

  WatchRecord Deliver(size_t i) const {
    const Event& e = log[i];
    WatchRecord r;
    r.kind = WatchRecord::kEvent;
    r.revision = e.revision;
    r.key = e.key;
    r.is_delete = e.is_delete;
    r.value = e.value;
    auto it = prev_.find(i);
    if (it != prev_.end()) {
      r.has_prev = true;
      r.prev_value = it->second;
    }
    return r;
  }
  static WatchRecord Progress(int64_t rev) {
    WatchRecord r;
    r.kind = WatchRecord::kProgress;
    r.revision = rev;
    return r;
  }
  static WatchRecord Reconnect(int64_t from) {
    WatchRecord r;
    r.kind = WatchRecord::kReconnect;
    r.revision = from;
    r.detail = "stream ended";
    return r;
  }

  WatchCheckResult Check(const std::vector<WatchRecord>& records, int64_t start) const {
    return CheckWatch(records, start, prefix, log);
  }

  std::string prefix;
  std::vector<Event> log;

 private:
  size_t Change(Event e) {
    const size_t i = log.size();
    auto it = state_.find(e.key);
    if (it != state_.end()) prev_[i] = it->second;
    if (e.is_delete) {
      state_.erase(e.key);
    } else {
      state_[e.key] = e.value;
    }
    log.push_back(std::move(e));
    return i;
  }

  std::map<std::string, std::string> state_;  // the keys after the last change
  std::map<size_t, std::string> prev_;         // change -> the key's value before it
};

// rev 2 put w/a=a1; rev 3 put w/b=b1; rev 4 a transaction: put w/a=a2,
// delete w/b; rev 5 put w/b=b2; rev 6 delete w/a; rev 7 put w/c=c1.
struct Scenario {
  Builder b;
  size_t a1, b1, a2, del_b, b2, del_a, c1;
  Scenario() {
    a1 = b.Put(2, "w/a", "a1");
    b1 = b.Put(3, "w/b", "b1");
    a2 = b.Put(4, "w/a", "a2");
    del_b = b.Delete(4, "w/b");
    b2 = b.Put(5, "w/b", "b2");
    del_a = b.Delete(6, "w/a");
    c1 = b.Put(7, "w/c", "c1");
  }
  // A watcher from revision 3: an event, a notification, the transaction,
  // the stream ends and the watch resumes from 5, the rest with a
  // notification between them and one at the end.
  std::vector<WatchRecord> Correct() const {
    return {b.Deliver(b1),     Builder::Progress(3), b.Deliver(a2),     b.Deliver(del_b),
            Builder::Reconnect(5), b.Deliver(b2),    Builder::Progress(5), b.Deliver(del_a),
            b.Deliver(c1),     Builder::Progress(7)};
  }
};

TEST(WatchCheckerTest, CorrectStreamWithReconnectPasses) {
  Scenario s;
  WatchCheckResult r = s.b.Check(s.Correct(), 3);
  EXPECT_TRUE(r.ok()) << r.Report();
  EXPECT_EQ(r.stats.events, 6);
  EXPECT_EQ(r.stats.progress, 3);
  EXPECT_EQ(r.stats.reconnects, 1);
  EXPECT_EQ(r.stats.last_revision, 7);
  EXPECT_EQ(r.stats.events_checked, 6);
  EXPECT_EQ(r.stats.log_events, 7);
}

TEST(WatchCheckerTest, ResumingFromAProgressNotificationPasses) {
  // The notification at 3 carries the watcher past revision 2 (nothing under
  // the prefix changed there for it); the log also holds a key outside the
  // prefix, which the checker ignores.
  Builder b;
  b.Put(2, "other", "x");
  const size_t a = b.Put(3, "w/a", "a1");
  WatchCheckResult r =
      b.Check({Builder::Progress(2), Builder::Reconnect(3), b.Deliver(a), Builder::Progress(3)}, 1);
  EXPECT_TRUE(r.ok()) << r.Report();
  EXPECT_EQ(r.stats.events_checked, 1);
}

TEST(WatchCheckerTest, ChangesAboveTheLastRevisionAreNotRequired) {
  Scenario s;
  std::vector<WatchRecord> records = s.Correct();
  records.resize(4);  // up to the transaction at revision 4
  WatchCheckResult r = s.b.Check(records, 3);
  EXPECT_TRUE(r.ok()) << r.Report();
  EXPECT_EQ(r.stats.events_checked, 3);
}

TEST(WatchCheckerTest, CatchesADroppedEvent) {
  Scenario s;
  // Without a notification after it: only the change is missing.
  std::vector<WatchRecord> records = {s.b.Deliver(s.b1), s.b.Deliver(s.a2), s.b.Deliver(s.del_b),
                                      s.b.Deliver(s.del_a), s.b.Deliver(s.c1)};
  WatchCheckResult r = s.b.Check(records, 3);
  ASSERT_EQ(r.violations.size(), 1u) << r.Report();
  EXPECT_EQ(r.Count(WatchRule::kMissedEvent), 1u) << r.Report();
  EXPECT_NE(r.violations[0].message.find("w/b=b2 at rev 5"), std::string::npos) << r.Report();

  // Dropped after a reconnect, with a notification vouching for it.
  records = s.Correct();
  records.erase(records.begin() + 5);  // b2
  r = s.b.Check(records, 3);
  EXPECT_EQ(r.Count(WatchRule::kMissedEvent), 1u) << r.Report();
  EXPECT_EQ(r.Count(WatchRule::kProgressOvertook), 1u) << r.Report();
  EXPECT_EQ(r.violations.size(), 2u) << r.Report();
}

TEST(WatchCheckerTest, CatchesADuplicateAfterReconnect) {
  Scenario s;
  std::vector<WatchRecord> records = s.Correct();
  // The watch resumed from 4 instead of 5: the transaction comes again.
  records[4] = Builder::Reconnect(4);
  records.insert(records.begin() + 5, {s.b.Deliver(s.a2), s.b.Deliver(s.del_b)});
  WatchCheckResult r = s.b.Check(records, 3);
  EXPECT_EQ(r.Count(WatchRule::kDuplicateEvent), 2u) << r.Report();
  EXPECT_EQ(r.violations.size(), 2u) << r.Report();
  EXPECT_EQ(r.violations[0].records, (std::vector<size_t>{2, 5})) << r.Report();
}

TEST(WatchCheckerTest, CatchesAWrongPrevKv) {
  Scenario s;
  std::vector<WatchRecord> records = s.Correct();
  records[2].prev_value = "a0";  // put w/a=a2: before it w/a was a1
  records[8].has_prev = true;     // put w/c=c1: w/c never existed
  records[8].prev_value = "c0";
  records[3].has_prev = false;    // delete w/b: w/b was b1
  records[3].prev_value.clear();
  WatchCheckResult r = s.b.Check(records, 3);
  EXPECT_EQ(r.Count(WatchRule::kWrongPrevKv), 3u) << r.Report();
  EXPECT_EQ(r.violations.size(), 3u) << r.Report();

  // A key deleted and put again has no prev_kv.
  Builder b;
  const size_t put1 = b.Put(2, "w/a", "a1");
  const size_t del = b.Delete(3, "w/a");
  const size_t put2 = b.Put(4, "w/a", "a2");
  std::vector<WatchRecord> again = {b.Deliver(put1), b.Deliver(del), b.Deliver(put2)};
  EXPECT_FALSE(again[2].has_prev);
  EXPECT_TRUE(b.Check(again, 1).ok()) << b.Check(again, 1).Report();
  again[2].has_prev = true;
  again[2].prev_value = "a1";
  EXPECT_EQ(b.Check(again, 1).Count(WatchRule::kWrongPrevKv), 1u);
}

TEST(WatchCheckerTest, CatchesAProgressNotifyThatOvertakesAnEvent) {
  Scenario s;
  std::vector<WatchRecord> records = s.Correct();
  // A notification at 4 before the transaction at revision 4 arrives.
  records[1] = Builder::Progress(4);
  WatchCheckResult r = s.b.Check(records, 3);
  EXPECT_EQ(r.Count(WatchRule::kProgressOvertook), 2u) << r.Report();
  EXPECT_EQ(r.violations.size(), 2u) << r.Report();
  EXPECT_EQ(r.violations[0].records, (std::vector<size_t>{1, 2})) << r.Report();

  // The watcher trusted it and resumed above it: the transaction is lost.
  records = {s.b.Deliver(s.b1), Builder::Progress(4), Builder::Reconnect(5),
             s.b.Deliver(s.b2), s.b.Deliver(s.del_a), s.b.Deliver(s.c1)};
  r = s.b.Check(records, 3);
  EXPECT_EQ(r.Count(WatchRule::kMissedEvent), 2u) << r.Report();
  EXPECT_EQ(r.Count(WatchRule::kProgressOvertook), 2u) << r.Report();
  EXPECT_EQ(r.violations.size(), 4u) << r.Report();
}

TEST(WatchCheckerTest, CatchesOutOfOrderEvents) {
  Scenario s;
  std::vector<WatchRecord> records = s.Correct();
  // Within a transaction: the delete of w/b before the put of w/a.
  std::swap(records[2], records[3]);
  WatchCheckResult r = s.b.Check(records, 3);
  EXPECT_EQ(r.Count(WatchRule::kOutOfOrder), 1u) << r.Report();
  EXPECT_EQ(r.violations.size(), 1u) << r.Report();

  // Across revisions and a reconnect: 6 before 5.
  records = s.Correct();
  std::swap(records[5], records[7]);
  records[6] = Builder::Progress(4);
  r = s.b.Check(records, 3);
  EXPECT_EQ(r.Count(WatchRule::kOutOfOrder), 1u) << r.Report();
  EXPECT_EQ(r.violations.size(), 1u) << r.Report();
}

TEST(WatchCheckerTest, CatchesAnEventNotInTheLog) {
  Scenario s;
  std::vector<WatchRecord> records = s.Correct();
  WatchRecord phantom = s.b.Deliver(s.b2);
  phantom.key = "w/z";
  phantom.has_prev = false;
  records.insert(records.begin() + 6, phantom);
  WatchCheckResult r = s.b.Check(records, 3);
  EXPECT_EQ(r.Count(WatchRule::kWrongEvent), 1u) << r.Report();
  EXPECT_EQ(r.violations.size(), 1u) << r.Report();

  // Another value, a put for a delete, a key outside the prefix.
  records = s.Correct();
  records[5].value = "b3";
  records[7].is_delete = false;
  records[7].value = "a3";
  WatchRecord outside = s.b.Deliver(s.c1);
  outside.key = "x/c";
  outside.has_prev = false;
  records.push_back(outside);
  r = s.b.Check(records, 3);
  EXPECT_EQ(r.Count(WatchRule::kWrongEvent), 3u) << r.Report();
  EXPECT_EQ(r.violations.size(), 3u) << r.Report();
}

TEST(WatchCheckerTest, CatchesAnEventBeforeTheStart) {
  Scenario s;
  std::vector<WatchRecord> records = s.Correct();
  records.insert(records.begin(), s.b.Deliver(s.a1));
  WatchCheckResult r = s.b.Check(records, 3);
  EXPECT_EQ(r.Count(WatchRule::kEventBeforeStart), 1u) << r.Report();
  EXPECT_EQ(r.violations.size(), 1u) << r.Report();
}

TEST(WatchCheckerTest, ReportsWatchErrorsAndABadLog) {
  Scenario s;
  std::vector<WatchRecord> records = s.Correct();
  WatchRecord error;
  error.kind = WatchRecord::kError;
  error.revision = 6;
  error.detail = "watch compacted at revision 6";
  records.push_back(error);
  WatchCheckResult r = s.b.Check(records, 3);
  EXPECT_EQ(r.Count(WatchRule::kWatchError), 1u) << r.Report();
  EXPECT_NE(r.Report().find("compacted"), std::string::npos) << r.Report();

  Builder b;
  b.Put(3, "w/a", "a1");
  b.Put(2, "w/b", "b1");
  b.Put(3, "w/a", "a2");
  r = b.Check({}, 1);
  EXPECT_EQ(r.Count(WatchRule::kBadLog), 2u) << r.Report();
}

TEST(WatchCheckerTest, LongRandomStreamChecksFast) {
  // 100k changes over 1000 keys, transactions of up to 3 keys; the watcher
  // reconnects now and then (resuming above its last revision) and receives
  // notifications between revisions.
  std::mt19937_64 rng(7);
  Builder b;
  std::vector<WatchRecord> records;
  std::map<std::string, bool> live;
  int64_t rev = 1;
  while (b.log.size() < 100000) {
    ++rev;
    const int keys = 1 + static_cast<int>(rng() % 3);
    std::map<std::string, bool> touched;
    for (int k = 0; k < keys; ++k) {
      std::string key = absl::StrCat("w/", rng() % 1000);
      if (!touched.emplace(key, true).second) continue;
      size_t i;
      if (live[key] && rng() % 4 == 0) {
        i = b.Delete(rev, key);
        live[key] = false;
      } else {
        i = b.Put(rev, key, absl::StrCat("v", b.log.size()));
        live[key] = true;
      }
      records.push_back(b.Deliver(i));
    }
    if (rng() % 10 == 0) records.push_back(Builder::Progress(rev));
    if (rng() % 100 == 0) records.push_back(Builder::Reconnect(rev + 1));
  }
  WatchCheckResult r = b.Check(records, 1);
  EXPECT_TRUE(r.ok()) << r.Report();
  EXPECT_EQ(r.stats.events_checked, static_cast<int64_t>(b.log.size()));
  EXPECT_LT(r.stats.seconds, 2.0) << r.Report();
  std::printf("watch checker: %s\n", r.Report(0).c_str());

  // One change dropped in the middle is found.
  size_t mid = records.size() / 2;
  while (records[mid].kind != WatchRecord::kEvent) ++mid;
  records.erase(records.begin() + static_cast<std::ptrdiff_t>(mid));
  r = b.Check(records, 1);
  EXPECT_EQ(r.Count(WatchRule::kMissedEvent), 1u) << r.Report(3);
}

}  // namespace
}  // namespace capstan::testing::cluster
