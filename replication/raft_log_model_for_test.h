// A model of what a RaftLog holds, and a reader of a log into one: shared by
// the log's model-based test and its crash test. Tests only.

#ifndef CAPSTAN_REPLICATION_RAFT_LOG_MODEL_FOR_TEST_H_
#define CAPSTAN_REPLICATION_RAFT_LOG_MODEL_FOR_TEST_H_

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <map>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "replication/raft_log.h"

namespace capstan::replication {

struct Model {
  SnapshotMeta snap;
  std::map<uint64_t, RaftEntry> entries;  // the live log
  HardState hs;

  uint64_t last() const { return entries.empty() ? snap.index : entries.rbegin()->first; }
  uint64_t term(uint64_t i) const { return i == snap.index ? snap.term : entries.at(i).term; }
  bool operator==(const Model& o) const {
    if (snap.index != o.snap.index || snap.term != o.snap.term || !(hs == o.hs) ||
        entries.size() != o.entries.size()) {
      return false;
    }
    for (const auto& [i, e] : entries) {
      auto it = o.entries.find(i);
      if (it == o.entries.end() || it->second.term != e.term || it->second.data != e.data) {
        return false;
      }
    }
    return true;
  }
};

// Reads everything the log answers into a model.
inline Model Observe(RaftLog* log) {
  Model m;
  m.snap = log->snapshot_meta();
  m.hs = log->hard_state();
  std::vector<RaftEntry> all;
  if (log->LastIndex() >= log->FirstIndex()) {
    EXPECT_EQ(log->Entries(log->FirstIndex(), log->LastIndex() + 1, UINT64_MAX, &all),
              LogError::kOk);
  }
  for (auto& e : all) m.entries[e.index] = e;
  return m;
}


// A fixture that owns a RaftLog in a fresh temporary directory: options_
// are the log's (a test may change them before Reopen), Reopen opens the
// log again as a restart does.
class RaftLogFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/capstan-raft-log-XXXXXX";
    dir_ = mkdtemp(tmpl);
    options_.dir = dir_ + "/raft";
  }
  void TearDown() override {
    log_.reset();
    std::filesystem::remove_all(dir_);
  }

  absl::Status Reopen() {
    log_.reset();
    auto log = RaftLog::Open(options_);
    if (!log.ok()) return log.status();
    log_ = std::move(*log);
    return absl::OkStatus();
  }

  std::string dir_;
  RaftLogOptions options_;
  std::unique_ptr<RaftLog> log_;
};

}  // namespace capstan::replication

#endif  // CAPSTAN_REPLICATION_RAFT_LOG_MODEL_FOR_TEST_H_
