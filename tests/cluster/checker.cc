#include "cluster/checker.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace capstan::testing::cluster {

const char* RuleName(Rule r) {
  switch (r) {
    case Rule::kLostWrite: return "lost-write";
    case Rule::kRealTimeOrder: return "real-time-order";
    case Rule::kStaleRead: return "stale-read";
    case Rule::kWrongRead: return "wrong-read";
    case Rule::kDuplicateWrite: return "duplicate-write";
    case Rule::kPhantomWrite: return "phantom-write";
    case Rule::kFailedWriteApplied: return "failed-write-applied";
    case Rule::kBadLog: return "bad-log";
  }
  return "?";
}

size_t CheckResult::Count(Rule r) const {
  return static_cast<size_t>(std::count_if(violations.begin(), violations.end(),
                                           [r](const Violation& v) { return v.rule == r; }));
}

std::string CheckResult::Report(size_t max_violations) const {
  std::string s = absl::StrFormat(
      "%d operations (%d ok, %d failed, %d unknown of which %d applied), %d events, "
      "%d writes and %d reads checked in %.3f s: %d violations",
      stats.operations, stats.ok, stats.failed, stats.unknown, stats.unknown_applied,
      stats.events, stats.writes_checked, stats.reads_checked, stats.seconds, violations.size());
  for (size_t i = 0; i < violations.size() && i < max_violations; ++i) {
    absl::StrAppend(&s, "\n  [", RuleName(violations[i].rule), "] ", violations[i].message);
  }
  if (violations.size() > max_violations) {
    absl::StrAppend(&s, "\n  ... and ", violations.size() - max_violations, " more");
  }
  return s;
}

namespace {

constexpr int64_t kNever = std::numeric_limits<int64_t>::max();

// A key's state after an event.
struct KeyEvent {
  int64_t revision;
  bool is_delete;
  const std::string* value;  // into the event log
};

struct KeyState {
  bool found = false;
  const std::string* value = nullptr;
  int64_t mod_revision = 0;
};

std::string DescribeState(const KeyState& s) {
  if (!s.found) return "absent";
  return absl::StrCat("=", *s.value, " (mod_rev ", s.mod_revision, ")");
}

// Whether a CAS's compare holds on the key's state `s`.
bool CompareHolds(const Operation& op, const KeyState& s) {
  if (op.compare_mod_revision) return (s.found ? s.mod_revision : 0) == op.expected_mod_revision;
  return op.expect_absent ? !s.found : (s.found && *s.value == op.expected);
}

class Checker {
 public:
  Checker(const std::vector<Operation>& ops, const std::vector<Event>& events)
      : ops_(ops), events_(events) {}

  CheckResult Run() {
    const auto start = std::chrono::steady_clock::now();
    Count();
    IndexLog();
    IndexWriters();
    MatchPutEvents();
    CheckAnswers();
    MatchDeleteEvents();
    CheckRealTime();
    result_.stats.events = static_cast<int64_t>(events_.size());
    result_.stats.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::move(result_);
  }

 private:
  void Add(Rule rule, std::string message, std::vector<int64_t> ids) {
    result_.violations.push_back(Violation{rule, std::move(message), std::move(ids)});
  }
  std::string Op(int64_t i) const { return ops_[i].ToString(); }
  static bool Unsettled(const Operation& op) {
    return op.outcome == Outcome::kUnknown || op.outcome == Outcome::kPending;
  }

  void Count() {
    CheckStats& st = result_.stats;
    st.operations = static_cast<int64_t>(ops_.size());
    for (const Operation& op : ops_) {
      if (op.outcome == Outcome::kOk) ++st.ok;
      else if (op.outcome == Outcome::kFailed) ++st.failed;
      else ++st.unknown;
    }
  }

  // Per key: its events in revision order.
  void IndexLog() {
    int64_t last = 0;
    for (const Event& e : events_) {
      if (e.revision < last) {
        Add(Rule::kBadLog,
            absl::StrCat("event log goes back from revision ", last, " to ", e.revision,
                         " (key ", e.key, ")"),
            {});
      }
      last = std::max(last, e.revision);
      auto& log = by_key_[e.key];
      if (!log.empty() && log.back().revision >= e.revision) {
        Add(Rule::kBadLog,
            absl::StrCat("key ", e.key, " changes twice at revision ", e.revision), {});
        continue;
      }
      log.push_back(KeyEvent{e.revision, e.is_delete, &e.value});
    }
    keys_.reserve(by_key_.size());
    for (const auto& [key, log] : by_key_) keys_.push_back(key);
    std::sort(keys_.begin(), keys_.end());
  }

  KeyState StateAt(const std::string& key, int64_t revision) const {
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return {};
    const auto& log = it->second;
    auto pos = std::upper_bound(log.begin(), log.end(), revision,
                                [](int64_t r, const KeyEvent& e) { return r < e.revision; });
    if (pos == log.begin()) return {};
    --pos;
    if (pos->is_delete) return {};
    return KeyState{true, pos->value, pos->revision};
  }

  const KeyEvent* EventAt(const std::string& key, int64_t revision) const {
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return nullptr;
    const auto& log = it->second;
    auto pos = std::lower_bound(log.begin(), log.end(), revision,
                                [](const KeyEvent& e, int64_t r) { return e.revision < r; });
    if (pos == log.end() || pos->revision != revision) return nullptr;
    return &*pos;
  }

  // value -> the put/cas that wrote it.
  void IndexWriters() {
    writer_.reserve(ops_.size());
    for (size_t i = 0; i < ops_.size(); ++i) {
      const Operation& op = ops_[i];
      if (op.kind != OpKind::kPut && op.kind != OpKind::kCas) continue;
      auto [it, inserted] = writer_.emplace(op.value, static_cast<int64_t>(i));
      if (!inserted) {
        Add(Rule::kDuplicateWrite,
            absl::StrCat("value ", op.value, " is written by two operations (the history must ",
                         "write unique values): ", Op(it->second), " | ", Op(i)),
            {it->second, static_cast<int64_t>(i)});
      }
    }
  }

  // Every put event must come from exactly one invoked write of that key and
  // value; records the revision each write took effect at.
  void MatchPutEvents() {
    applied_rev_.assign(ops_.size(), 0);
    for (const Event& e : events_) {
      if (e.is_delete) continue;
      auto it = writer_.find(e.value);
      if (it == writer_.end() || ops_[it->second].key != e.key) {
        Add(Rule::kPhantomWrite,
            absl::StrCat("revision ", e.revision, " puts ", e.key, "=", e.value,
                         " but no recorded operation wrote that"),
            {});
        continue;
      }
      const int64_t i = it->second;
      const Operation& op = ops_[i];
      if (applied_rev_[i] != 0) {
        Add(Rule::kDuplicateWrite,
            absl::StrCat("the write of ", e.key, "=", e.value, " appears at revisions ",
                         applied_rev_[i], " and ", e.revision, ": ", Op(i)),
            {i});
        continue;
      }
      applied_rev_[i] = e.revision;
      if (op.outcome == Outcome::kFailed ||
          (op.outcome == Outcome::kOk && op.kind == OpKind::kCas && !op.response.succeeded)) {
        Add(Rule::kFailedWriteApplied,
            absl::StrCat("revision ", e.revision, " holds the write of an operation answered ",
                         "as not done: ", Op(i)),
            {i});
      }
      if (Unsettled(op)) ++result_.stats.unknown_applied;
      if (op.kind == OpKind::kCas) {
        // The compare must have held just before.
        const KeyState before = StateAt(op.key, e.revision - 1);
        if (!CompareHolds(op, before)) {
          Add(Rule::kLostWrite,
              absl::StrCat("CAS applied at revision ", e.revision, " but its compare did not ",
                           "hold: the key was ", DescribeState(before), ": ", Op(i)),
              {i});
        }
      }
    }
  }

  // The answer of each ok operation against the log.
  void CheckAnswers() {
    for (size_t n = 0; n < ops_.size(); ++n) {
      const Operation& op = ops_[n];
      const int64_t i = static_cast<int64_t>(n);
      if (op.outcome != Outcome::kOk) continue;
      const Response& r = op.response;
      switch (op.kind) {
        case OpKind::kPut:
          CheckAckedPut(i, r.has_prev, r.prev_value);
          break;
        case OpKind::kCas:
          if (r.succeeded) {
            CheckAckedPut(i, false, "");
          } else {
            const KeyState at = StateAt(op.key, r.revision);
            if (CompareHolds(op, at)) {
              Add(Rule::kWrongRead,
                  absl::StrCat("CAS answered compare-failed but at its revision the key was ",
                               DescribeState(at), ": ", Op(i)),
                  {i});
            }
            CheckRead(i);
          }
          break;
        case OpKind::kGet:
          CheckRead(i);
          break;
        case OpKind::kList:
          CheckList(i);
          break;
        case OpKind::kDelete:
          if (r.deleted > 0) {
            ++result_.stats.writes_checked;
            const KeyEvent* e = EventAt(op.key, r.revision);
            if (e == nullptr || !e->is_delete) {
              Add(Rule::kLostWrite,
                  absl::StrCat("acknowledged delete has no delete of ", op.key,
                               " at its revision: ", Op(i)),
                  {i});
            } else {
              claimed_deletes_.emplace_back(op.key, r.revision);
            }
            const KeyState before = StateAt(op.key, r.revision - 1);
            if (!before.found || (op.prev_kv && (!r.has_prev || r.prev_value != *before.value))) {
              Add(Rule::kLostWrite,
                  absl::StrCat("delete's answer disagrees with the log: before it the key was ",
                               DescribeState(before), ": ", Op(i)),
                  {i});
            }
          } else {
            ++result_.stats.reads_checked;
            const KeyState at = StateAt(op.key, r.revision);
            if (at.found) {
              Add(Rule::kWrongRead,
                  absl::StrCat("delete deleted nothing but at its revision the key was ",
                               DescribeState(at), ": ", Op(i)),
                  {i});
            }
          }
          break;
      }
    }
  }

  void CheckAckedPut(int64_t i, bool has_prev, const std::string& prev) {
    const Operation& op = ops_[i];
    ++result_.stats.writes_checked;
    const int64_t at = applied_rev_[i];
    if (at == 0) {
      Add(Rule::kLostWrite,
          absl::StrCat("acknowledged write is not in the log: ", Op(i)), {i});
      return;
    }
    if (at != op.response.revision) {
      Add(Rule::kLostWrite,
          absl::StrCat("acknowledged at revision ", op.response.revision, " but the log has it ",
                       "at revision ", at, ": ", Op(i)),
          {i});
      return;
    }
    if (op.kind == OpKind::kPut && op.prev_kv) {
      const KeyState before = StateAt(op.key, at - 1);
      if (before.found != has_prev || (has_prev && prev != *before.value)) {
        Add(Rule::kLostWrite,
            absl::StrCat("put's prev_kv disagrees with the log: before it the key was ",
                         DescribeState(before), ": ", Op(i)),
            {i});
      }
    }
  }

  void CheckRead(int64_t i) {
    const Operation& op = ops_[i];
    const Response& r = op.response;
    ++result_.stats.reads_checked;
    const KeyState at = StateAt(op.key, r.revision);
    const bool same = at.found == r.found &&
                      (!at.found || (*at.value == r.value && at.mod_revision == r.mod_revision));
    if (!same) {
      Add(Rule::kWrongRead,
          absl::StrCat("read answered ", r.found ? absl::StrCat("=", r.value, " (mod_rev ",
                                                                  r.mod_revision, ")")
                                                 : std::string("absent"),
                       " but at revision ", r.revision, " the log has the key ",
                       DescribeState(at), ": ", Op(i)),
          {i});
    }
  }

  // A page of a list: the keys of its range that exist at the revision it
  // read, in key order, the first `limit` of them, and `more` when others
  // follow.
  void CheckList(int64_t i) {
    const Operation& op = ops_[i];
    const Response& r = op.response;
    ++result_.stats.reads_checked;
    const int64_t at = op.list_revision != 0 ? op.list_revision : r.revision;
    if (r.revision < at) {
      Add(Rule::kWrongRead,
          absl::StrCat("list at revision ", at, " answered with header revision ", r.revision,
                       " (a future revision must be refused): ", Op(i)),
          {i});
      return;
    }
    std::vector<Response::Kv> want;
    bool more = false;
    for (auto it = std::lower_bound(keys_.begin(), keys_.end(), op.key);
         it != keys_.end() && *it < op.range_end; ++it) {
      const KeyState s = StateAt(*it, at);
      if (!s.found) continue;
      if (op.limit > 0 && static_cast<int64_t>(want.size()) == op.limit) {
        more = true;
        break;
      }
      want.push_back(Response::Kv{*it, *s.value, s.mod_revision});
    }
    bool same = want.size() == r.kvs.size() && more == r.more;
    for (size_t k = 0; same && k < want.size(); ++k) {
      same = want[k].key == r.kvs[k].key && want[k].value == r.kvs[k].value &&
             want[k].mod_revision == r.kvs[k].mod_revision;
    }
    if (!same) {
      std::string expected;
      for (const Response::Kv& kv : want) {
        absl::StrAppend(&expected, expected.empty() ? "" : " ", kv.key, "=", kv.value, "@",
                        kv.mod_revision);
      }
      Add(Rule::kWrongRead,
          absl::StrCat("at revision ", at, " the log has [", expected, "]", more ? " more" : "",
                       ": ", Op(i)),
          {i});
    }
  }

  // Deletions in the log not claimed by an acknowledged delete must be
  // covered, key by key, by deletes whose outcome is unknown.
  void MatchDeleteEvents() {
    std::sort(claimed_deletes_.begin(), claimed_deletes_.end());
    std::unordered_map<std::string, int64_t> unsettled;
    for (const Operation& op : ops_) {
      if (op.kind == OpKind::kDelete && Unsettled(op)) ++unsettled[op.key];
    }
    std::unordered_map<std::string, int64_t> unclaimed;
    for (const Event& e : events_) {
      if (!e.is_delete) continue;
      if (std::binary_search(claimed_deletes_.begin(), claimed_deletes_.end(),
                             std::make_pair(e.key, e.revision))) {
        continue;
      }
      if (++unclaimed[e.key] > unsettled[e.key]) {
        Add(Rule::kPhantomWrite,
            absl::StrCat("revision ", e.revision, " deletes ", e.key, " but no acknowledged ",
                         "delete has that revision and the ", unsettled[e.key],
                         " deletes of unknown outcome are used up"),
            {});
      } else {
        ++result_.stats.unknown_applied;
      }
    }
  }

  // (b) and (c): an operation that completed before another was invoked has
  // a revision no greater (strictly smaller when the later one made a
  // revision). One sweep over invocations, completions merged in time order.
  void CheckRealTime() {
    struct Placed {
      int64_t revision;
      int64_t invoke_ns;
      int64_t complete_ns;  // kNever for unknown writes
      bool made_revision;
      int64_t id;
    };
    std::vector<Placed> placed;
    placed.reserve(ops_.size());
    for (size_t n = 0; n < ops_.size(); ++n) {
      const Operation& op = ops_[n];
      const int64_t i = static_cast<int64_t>(n);
      if (op.outcome == Outcome::kOk) {
        placed.push_back({op.response.revision, op.invoke_ns, op.complete_ns,
                          op.MadeRevision(), i});
      } else if (Unsettled(op) && applied_rev_[n] != 0) {
        placed.push_back({applied_rev_[n], op.invoke_ns, kNever, true, i});
      }
    }
    std::vector<const Placed*> by_complete;
    std::vector<const Placed*> by_invoke;
    by_complete.reserve(placed.size());
    by_invoke.reserve(placed.size());
    for (const Placed& p : placed) {
      if (p.complete_ns != kNever) by_complete.push_back(&p);
      by_invoke.push_back(&p);
    }
    std::sort(by_complete.begin(), by_complete.end(),
              [](const Placed* a, const Placed* b) { return a->complete_ns < b->complete_ns; });
    std::sort(by_invoke.begin(), by_invoke.end(),
              [](const Placed* a, const Placed* b) { return a->invoke_ns < b->invoke_ns; });
    size_t next = 0;
    const Placed* max_before = nullptr;  // the highest revision completed so far
    for (const Placed* b : by_invoke) {
      while (next < by_complete.size() && by_complete[next]->complete_ns < b->invoke_ns) {
        const Placed* a = by_complete[next++];
        if (max_before == nullptr || a->revision > max_before->revision) max_before = a;
      }
      if (max_before == nullptr) continue;
      const bool bad = b->made_revision ? b->revision <= max_before->revision
                                        : b->revision < max_before->revision;
      if (!bad) continue;
      const bool write = b->made_revision;
      Add(write ? Rule::kRealTimeOrder : Rule::kStaleRead,
          absl::StrCat(write ? "write" : "read", " at revision ", b->revision,
                       " was invoked after an operation at revision ", max_before->revision,
                       " had completed: ", Op(max_before->id), " | then ", Op(b->id)),
          {max_before->id, b->id});
    }
  }

  const std::vector<Operation>& ops_;
  const std::vector<Event>& events_;
  std::unordered_map<std::string, std::vector<KeyEvent>> by_key_;
  std::vector<std::string> keys_;  // by_key_'s keys, sorted
  std::unordered_map<std::string, int64_t> writer_;
  std::vector<int64_t> applied_rev_;  // by op index; 0: not in the log
  std::vector<std::pair<std::string, int64_t>> claimed_deletes_;
  CheckResult result_;
};

}  // namespace

CheckResult CheckHistory(const std::vector<Operation>& ops, const std::vector<Event>& events) {
  return Checker(ops, events).Run();
}

}  // namespace capstan::testing::cluster
