#include "cluster/watch_checker.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <unordered_map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace capstan::testing::cluster {

std::string WatchRecord::ToString() const {
  std::string s;
  switch (kind) {
    case kEvent:
      s = is_delete ? absl::StrCat("delete ", key) : absl::StrCat("put ", key, "=", value);
      absl::StrAppend(&s, " rev ", revision,
                      has_prev ? absl::StrCat(" prev=", prev_value) : std::string(" no prev"));
      break;
    case kProgress:
      s = absl::StrCat("progress rev ", revision);
      break;
    case kReconnect:
      s = absl::StrCat("reconnect from rev ", revision);
      break;
    case kError:
      s = absl::StrCat("error (compact rev ", revision, ")");
      break;
  }
  if (!endpoint.empty()) absl::StrAppend(&s, " @", endpoint);
  if (!detail.empty()) absl::StrAppend(&s, " (", detail, ")");
  return s;
}

const char* WatchRuleName(WatchRule r) {
  switch (r) {
    case WatchRule::kMissedEvent: return "missed-event";
    case WatchRule::kDuplicateEvent: return "duplicate-event";
    case WatchRule::kOutOfOrder: return "out-of-order";
    case WatchRule::kWrongEvent: return "wrong-event";
    case WatchRule::kWrongPrevKv: return "wrong-prev-kv";
    case WatchRule::kProgressOvertook: return "progress-overtook";
    case WatchRule::kEventBeforeStart: return "event-before-start";
    case WatchRule::kWatchError: return "watch-error";
    case WatchRule::kBadLog: return "bad-log";
  }
  return "?";
}

size_t WatchCheckResult::Count(WatchRule r) const {
  return static_cast<size_t>(std::count_if(violations.begin(), violations.end(),
                                           [r](const WatchViolation& v) { return v.rule == r; }));
}

std::string WatchCheckResult::Report(size_t max_violations) const {
  std::string s = absl::StrFormat(
      "%d events, %d progress notifications, %d reconnects, last revision %d; "
      "%d of %d logged changes checked in %.3f s: %d violations",
      stats.events, stats.progress, stats.reconnects, stats.last_revision, stats.events_checked,
      stats.log_events, stats.seconds, violations.size());
  for (size_t i = 0; i < violations.size() && i < max_violations; ++i) {
    absl::StrAppend(&s, "\n  [", WatchRuleName(violations[i].rule), "] ", violations[i].message);
  }
  if (violations.size() > max_violations) {
    absl::StrAppend(&s, "\n  ... and ", violations.size() - max_violations, " more");
  }
  return s;
}

namespace {

constexpr size_t kNone = std::numeric_limits<size_t>::max();

// A key's state just before a change.
struct PrevState {
  bool found = false;
  const std::string* value = nullptr;  // into the event log
};

std::string DescribeChange(const Event& e) {
  return e.is_delete ? absl::StrCat("delete ", e.key, " at rev ", e.revision)
                     : absl::StrCat("put ", e.key, "=", e.value, " at rev ", e.revision);
}

std::string DescribePrev(const PrevState& p) {
  return p.found ? absl::StrCat("=", *p.value) : std::string("absent");
}

class WatchChecker {
 public:
  WatchChecker(const std::vector<WatchRecord>& records, int64_t start_revision,
               const std::string& prefix, const std::vector<Event>& log)
      : records_(records), start_(start_revision), prefix_(prefix), full_log_(log) {}

  WatchCheckResult Run() {
    const auto start = std::chrono::steady_clock::now();
    IndexLog();
    Scan();
    CheckUndelivered();
    result_.stats.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::move(result_);
  }

 private:
  void Add(WatchRule rule, std::string message, std::vector<size_t> records) {
    result_.violations.push_back(WatchViolation{rule, std::move(message), std::move(records)});
  }
  std::string Rec(size_t r) const { return absl::StrCat("#", r, " ", records_[r].ToString()); }

  // The changes under the prefix, each with the key's state before it, and
  // per key its changes by revision.
  void IndexLog() {
    std::unordered_map<std::string, PrevState> state;
    int64_t last = 0;
    for (const Event& e : full_log_) {
      if (!absl::StartsWith(e.key, prefix_)) continue;
      if (e.revision < last) {
        Add(WatchRule::kBadLog,
            absl::StrCat("event log goes back from revision ", last, " to ", e.revision,
                         " (key ", e.key, ")"),
            {});
      }
      last = std::max(last, e.revision);
      auto& changes = by_key_[e.key];
      if (!changes.empty() && changes.back().first >= e.revision) {
        Add(WatchRule::kBadLog,
            absl::StrCat("key ", e.key, " changes at revision ", e.revision,
                         " after a change at revision ", changes.back().first),
            {});
        continue;
      }
      changes.emplace_back(e.revision, log_.size());
      PrevState& s = state[e.key];
      prev_.push_back(s);
      s = e.is_delete ? PrevState{} : PrevState{true, &e.value};
      log_.push_back(&e);
    }
    delivered_at_.assign(log_.size(), kNone);
    result_.stats.log_events = static_cast<int64_t>(log_.size());
  }

  // The position in log_ of the change of `key` at `revision`, or kNone.
  size_t Find(const std::string& key, int64_t revision) const {
    auto it = by_key_.find(key);
    if (it == by_key_.end()) return kNone;
    const auto& changes = it->second;
    auto pos = std::lower_bound(
        changes.begin(), changes.end(), revision,
        [](const std::pair<int64_t, size_t>& c, int64_t r) { return c.first < r; });
    if (pos == changes.end() || pos->first != revision) return kNone;
    return pos->second;
  }

  // The records in arrival order: each event against the log, the order and
  // the progress notifications seen before it.
  void Scan() {
    WatchCheckStats& st = result_.stats;
    int64_t progress_max = 0;  // the highest notification so far
    size_t last_pos = kNone;   // the furthest change in log order received so far
    for (size_t r = 0; r < records_.size(); ++r) {
      const WatchRecord& w = records_[r];
      switch (w.kind) {
        case WatchRecord::kReconnect:
          ++st.reconnects;
          continue;
        case WatchRecord::kError:
          Add(WatchRule::kWatchError, absl::StrCat("the watch failed: ", Rec(r)), {r});
          continue;
        case WatchRecord::kProgress:
          ++st.progress;
          st.last_revision = std::max(st.last_revision, w.revision);
          if (w.revision > progress_max) {
            progress_max = w.revision;
            progress_steps_.emplace_back(w.revision, r);
          }
          continue;
        case WatchRecord::kEvent:
          break;
      }
      ++st.events;
      st.last_revision = std::max(st.last_revision, w.revision);
      if (!absl::StartsWith(w.key, prefix_)) {
        Add(WatchRule::kWrongEvent,
            absl::StrCat("event outside the prefix \"", prefix_, "\": ", Rec(r)), {r});
        continue;
      }
      if (w.revision < start_) {
        Add(WatchRule::kEventBeforeStart,
            absl::StrCat("event below the start revision ", start_, ": ", Rec(r)), {r});
        continue;
      }
      const size_t pos = Find(w.key, w.revision);
      if (pos == kNone) {
        Add(WatchRule::kWrongEvent,
            absl::StrCat("the log has no change of ", w.key, " at revision ", w.revision, ": ",
                         Rec(r)),
            {r});
        continue;
      }
      const Event& e = *log_[pos];
      if (delivered_at_[pos] != kNone) {
        Add(WatchRule::kDuplicateEvent,
            absl::StrCat("received twice: ", Rec(delivered_at_[pos]), " | again ", Rec(r)),
            {delivered_at_[pos], r});
        continue;
      }
      delivered_at_[pos] = r;
      if (last_pos != kNone && pos < last_pos) {
        Add(WatchRule::kOutOfOrder,
            absl::StrCat("received after a later change: ", Rec(delivered_at_[last_pos]),
                         " | then ", Rec(r)),
            {delivered_at_[last_pos], r});
      } else {
        last_pos = pos;
      }
      if (e.is_delete != w.is_delete || (!e.is_delete && e.value != w.value)) {
        Add(WatchRule::kWrongEvent,
            absl::StrCat("the log has ", DescribeChange(e), ": ", Rec(r)), {r});
      }
      const PrevState& before = prev_[pos];
      if (before.found != w.has_prev || (w.has_prev && *before.value != w.prev_value)) {
        Add(WatchRule::kWrongPrevKv,
            absl::StrCat("before revision ", e.revision, " the log has the key ",
                         DescribePrev(before), ": ", Rec(r)),
            {r});
      }
      if (w.revision <= progress_max) {
        const size_t p = FirstProgressCovering(w.revision);
        Add(WatchRule::kProgressOvertook,
            absl::StrCat("first received after a progress notification covering it: ",
                         Rec(p), " | then ", Rec(r)),
            {p, r});
      }
    }
  }

  // The first progress record whose revision is at least `revision`.
  // REQUIRES: some notification recorded so far reached `revision`.
  size_t FirstProgressCovering(int64_t revision) const {
    auto it = std::lower_bound(
        progress_steps_.begin(), progress_steps_.end(), revision,
        [](const std::pair<int64_t, size_t>& s, int64_t r) { return s.first < r; });
    return it->second;
  }

  // Changes the watcher should have received and never did.
  void CheckUndelivered() {
    WatchCheckStats& st = result_.stats;
    const int64_t progress_max = progress_steps_.empty() ? 0 : progress_steps_.back().first;
    for (size_t pos = 0; pos < log_.size(); ++pos) {
      const Event& e = *log_[pos];
      if (e.revision < start_ || e.revision > st.last_revision) continue;
      ++st.events_checked;
      if (delivered_at_[pos] != kNone) continue;
      Add(WatchRule::kMissedEvent,
          absl::StrCat("never received ", DescribeChange(e), " (the watcher reached revision ",
                       st.last_revision, ")"),
          {});
      if (e.revision <= progress_max) {
        const size_t p = FirstProgressCovering(e.revision);
        Add(WatchRule::kProgressOvertook,
            absl::StrCat("never received ", DescribeChange(e),
                         " though a progress notification covered it: ", Rec(p)),
            {p});
      }
    }
  }

  const std::vector<WatchRecord>& records_;
  const int64_t start_;
  const std::string& prefix_;
  const std::vector<Event>& full_log_;
  std::vector<const Event*> log_;  // the changes under the prefix, in log order
  std::vector<PrevState> prev_;    // by position in log_
  std::vector<size_t> delivered_at_;  // by position in log_: the record, or kNone
  // key -> (revision, position in log_), by revision.
  std::unordered_map<std::string, std::vector<std::pair<int64_t, size_t>>> by_key_;
  // (revision, record) of each progress notification above all before it.
  std::vector<std::pair<int64_t, size_t>> progress_steps_;
  WatchCheckResult result_;
};

}  // namespace

WatchCheckResult CheckWatch(const std::vector<WatchRecord>& records, int64_t start_revision,
                            const std::string& prefix, const std::vector<Event>& log) {
  return WatchChecker(records, start_revision, prefix, log).Run();
}

}  // namespace capstan::testing::cluster
