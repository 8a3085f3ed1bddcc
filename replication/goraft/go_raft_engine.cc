#include "replication/goraft/go_raft_engine.h"

#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "replication/goraft/shim/capstan_raft.h"
#include "spdlog/spdlog.h"
#include "util/check.h"

namespace capstan::replication {
namespace {

// LogError's values are the shim's storage codes.
static_assert(static_cast<int>(LogError::kOk) == CAPSTAN_RAFT_STORAGE_OK);
static_assert(static_cast<int>(LogError::kCompacted) == CAPSTAN_RAFT_ERR_COMPACTED);
static_assert(static_cast<int>(LogError::kUnavailable) == CAPSTAN_RAFT_ERR_UNAVAILABLE);
static_assert(static_cast<int>(LogError::kSnapshotTemporarilyUnavailable) ==
              CAPSTAN_RAFT_ERR_SNAPSHOT_TEMPORARILY_UNAVAILABLE);
static_assert(static_cast<int>(LogError::kFailed) == CAPSTAN_RAFT_ERR_FAILED);

// True on a thread while it runs a RunLoop's loop.
thread_local bool tls_in_run_loop = false;

void RunLoopOnGoThread(void* arg) {
  auto* loop = static_cast<absl::AnyInvocable<void()>*>(arg);
  tls_in_run_loop = true;
  try {
    (*loop)();
  } catch (const std::exception& e) {
    // Unwinding into Go's frames is undefined behaviour.
    CHECK(false) << "the raft loop threw: " << e.what();
  } catch (...) {
    CHECK(false) << "the raft loop threw";
  }
  tls_in_run_loop = false;
}

int RunStepOnGoThread(void* arg) {
  auto* step = static_cast<absl::AnyInvocable<bool()>*>(arg);
  tls_in_run_loop = true;
  bool again = false;
  try {
    again = (*step)();
  } catch (const std::exception& e) {
    CHECK(false) << "the raft loop threw: " << e.what();
  } catch (...) {
    CHECK(false) << "the raft loop threw";
  }
  tls_in_run_loop = false;
  return again ? 1 : 0;
}

// The global logger: raft's package logger and that of engines without
// RaftConfig::log.
void LogToSpdlog(void* /*ctx*/, int level, const char* line, size_t len) {
  spdlog::level::level_enum spd = spdlog::level::err;
  switch (level) {
    case CAPSTAN_RAFT_LOG_DEBUG: spd = spdlog::level::debug; break;
    case CAPSTAN_RAFT_LOG_INFO: spd = spdlog::level::info; break;
    case CAPSTAN_RAFT_LOG_WARNING: spd = spdlog::level::warn; break;
    default: break;
  }
  try {
    spdlog::log(spd, "raft: {}", std::string_view(line, len));
  } catch (...) {
    // A log line that cannot be written is dropped; nothing may unwind into Go.
  }
}

// Views of a ConfState's vectors; valid while the vectors are unchanged.
void ToC(const ConfState& cs, capstan_raft_conf_state* out) {
  *out = capstan_raft_conf_state{};
  out->voters = cs.voters.data();
  out->n_voters = cs.voters.size();
  out->learners = cs.learners.data();
  out->n_learners = cs.learners.size();
  out->voters_outgoing = cs.voters_outgoing.data();
  out->n_voters_outgoing = cs.voters_outgoing.size();
  out->learners_next = cs.learners_next.data();
  out->n_learners_next = cs.learners_next.size();
  out->auto_leave = cs.auto_leave ? 1 : 0;
}

std::vector<uint64_t> Ids(const uint64_t* p, size_t n) { return std::vector<uint64_t>(p, p + n); }

ConfState FromC(const capstan_raft_conf_state& c) {
  ConfState cs;
  cs.voters = Ids(c.voters, c.n_voters);
  cs.learners = Ids(c.learners, c.n_learners);
  cs.voters_outgoing = Ids(c.voters_outgoing, c.n_voters_outgoing);
  cs.learners_next = Ids(c.learners_next, c.n_learners_next);
  cs.auto_leave = c.auto_leave != 0;
  return cs;
}

HardState FromC(const capstan_raft_hard_state& h) {
  return HardState{.term = h.term, .vote = h.vote, .commit = h.commit};
}

std::string Bytes(const uint8_t* p, size_t n) {
  return n == 0 ? std::string() : std::string(reinterpret_cast<const char*>(p), n);
}

std::vector<RaftEntry> FromC(const capstan_raft_entry* es, size_t n) {
  std::vector<RaftEntry> out(n);
  for (size_t i = 0; i < n; ++i) {
    out[i].index = es[i].index;
    out[i].term = es[i].term;
    out[i].type = static_cast<EntryType>(es[i].type);
    out[i].data = Bytes(es[i].data, es[i].data_len);
  }
  return out;
}

const uint8_t* Data(std::string_view s) { return reinterpret_cast<const uint8_t*>(s.data()); }

// The shim's result codes as Status; raft's texts.
absl::Status ToStatus(int code) {
  switch (code) {
    case CAPSTAN_RAFT_OK: return absl::OkStatus();
    case CAPSTAN_RAFT_ERR_PROPOSAL_DROPPED: return absl::UnavailableError("raft proposal dropped");
    case CAPSTAN_RAFT_ERR_INVALID_ARGUMENT:
      return absl::InvalidArgumentError("raft: undecodable message or empty proposal");
    case CAPSTAN_RAFT_ERR_STEP_LOCAL_MSG:
      return absl::FailedPreconditionError("raft: cannot step raft local message");
    case CAPSTAN_RAFT_ERR_STEP_PEER_NOT_FOUND:
      return absl::FailedPreconditionError("raft: cannot step as peer not found");
    default: return absl::FailedPreconditionError(absl::StrCat("raft: error code ", code));
  }
}

class GoRaftEngine final : public RaftEngine {
 public:
  explicit GoRaftEngine(const RaftConfig& config)
      : storage_(config.storage), log_(config.log) {
    c_storage_.ctx = this;
    c_storage_.initial_state = &InitialStateCallback;
    c_storage_.entries = &EntriesCallback;
    c_storage_.term = &TermCallback;
    c_storage_.first_index = &FirstIndexCallback;
    c_storage_.last_index = &LastIndexCallback;
    c_storage_.snapshot = &SnapshotCallback;
  }

  ~GoRaftEngine() override {
    CheckThread();
    if (node_ != 0) capstan_raft_free(node_);
    std::free(ready_);
  }

  // Makes the node; the engine must not move afterwards (the shim holds
  // pointers to c_storage_ and to this).
  absl::Status Start(const RaftConfig& config) {
    capstan_raft_config c{};
    c.id = config.id;
    c.election_tick = config.election_tick;
    c.heartbeat_tick = config.heartbeat_tick;
    c.pre_vote = config.pre_vote ? 1 : 0;
    c.check_quorum = config.check_quorum ? 1 : 0;
    c.applied = config.applied;
    c.max_size_per_msg = config.max_size_per_msg;
    c.max_committed_size_per_ready = config.max_committed_size_per_ready;
    c.max_uncommitted_entries_size = config.max_uncommitted_entries_size;
    c.max_inflight_msgs = config.max_inflight_msgs;
    c.bootstrap_voters = config.bootstrap_voters.data();
    c.n_bootstrap_voters = config.bootstrap_voters.size();
    std::vector<capstan_raft_slice> contexts;
    if (!config.bootstrap_contexts.empty()) {
      CHECK(config.bootstrap_contexts.size() == config.bootstrap_voters.size())
          << "one bootstrap context per voter";
      for (const auto& ctx : config.bootstrap_contexts) {
        contexts.push_back({reinterpret_cast<const uint8_t*>(ctx.data()), ctx.size()});
      }
      c.bootstrap_contexts = contexts.data();
    }
    c.storage = &c_storage_;
    if (log_) {
      c.log = &LogCallback;
      c.log_ctx = this;
    }
    char* error = nullptr;
    node_ = capstan_raft_new(&c, &error);
    if (node_ == 0) {
      std::string message = error != nullptr ? error : "unknown error";
      std::free(error);
      return absl::InvalidArgumentError(absl::StrCat("raft: cannot start member: ", message));
    }
    return absl::OkStatus();
  }

  void Tick() override {
    CheckThread();
    capstan_raft_tick(node_);
  }

  absl::Status Campaign() override {
    CheckThread();
    return ToStatus(capstan_raft_campaign(node_));
  }

  absl::Status Propose(const std::vector<std::string_view>& entries) override {
    CheckThread();
    if (entries.empty()) return absl::InvalidArgumentError("raft: empty proposal");
    slices_.resize(entries.size());
    for (size_t i = 0; i < entries.size(); ++i) {
      slices_[i] = capstan_raft_slice{Data(entries[i]), entries[i].size()};
    }
    return ToStatus(capstan_raft_propose(node_, slices_.data(), slices_.size()));
  }

  absl::Status ProposeConfChange(bool v2, std::string_view conf_change) override {
    CheckThread();
    return ToStatus(capstan_raft_propose_conf_change(node_, v2 ? 1 : 0, Data(conf_change),
                                                     conf_change.size()));
  }

  ConfState ApplyConfChange(EntryType type, std::string_view data) override {
    CheckThread();
    capstan_raft_conf_state* cs = nullptr;
    int rc = capstan_raft_apply_conf_change(node_, static_cast<uint32_t>(type), Data(data),
                                            data.size(), &cs);
    // A committed configuration entry that does not decode is a corrupt log.
    CHECK(rc == CAPSTAN_RAFT_OK) << "cannot apply the configuration entry: "
                                 << ToStatus(rc).message();
    ConfState out = FromC(*cs);
    std::free(cs);
    return out;
  }

  absl::Status Step(std::string_view message) override {
    CheckThread();
    return ToStatus(capstan_raft_step(node_, Data(message), message.size()));
  }

  void ReadIndex(std::string_view context) override {
    CheckThread();
    capstan_raft_read_index(node_, Data(context), context.size());
  }

  void TransferLeader(uint64_t to) override {
    CheckThread();
    capstan_raft_transfer_leader(node_, to);
  }

  void ReportUnreachable(uint64_t id) override {
    CheckThread();
    capstan_raft_report_unreachable(node_, id);
  }

  void ReportSnapshot(uint64_t id, bool failure) override {
    CheckThread();
    capstan_raft_report_snapshot(node_, id, failure ? 1 : 0);
  }

  bool HasReady() override {
    CheckThread();
    return capstan_raft_has_ready(node_) != 0;
  }

  Ready GetReady() override {
    CheckThread();
    CHECK(ready_ == nullptr) << "GetReady before the previous Ready was advanced";
    ready_ = capstan_raft_ready_get(node_);
    const capstan_raft_ready& r = *ready_;
    Ready out;
    if (r.has_soft_state) {
      out.soft_state = SoftState{.lead = r.lead, .role = static_cast<RaftRole>(r.role)};
    }
    if (r.has_hard_state) out.hard_state = FromC(r.hard_state);
    if (r.has_snapshot) {
      out.snapshot = SnapshotMeta{.index = r.snapshot.index,
                                  .term = r.snapshot.term,
                                  .conf_state = FromC(r.snapshot.conf_state)};
    }
    out.entries = FromC(r.entries, r.n_entries);
    out.committed = FromC(r.committed, r.n_committed);
    out.messages.resize(r.n_messages);
    for (size_t i = 0; i < r.n_messages; ++i) {
      out.messages[i].to = r.messages[i].to;
      out.messages[i].type = r.messages[i].type;
      out.messages[i].bytes = Bytes(r.messages[i].bytes, r.messages[i].len);
    }
    out.read_states.resize(r.n_read_states);
    for (size_t i = 0; i < r.n_read_states; ++i) {
      out.read_states[i].index = r.read_states[i].index;
      out.read_states[i].context = Bytes(r.read_states[i].context, r.read_states[i].context_len);
    }
    out.must_sync = r.must_sync != 0;
    return out;
  }

  void Advance() override {
    CheckThread();
    CHECK(ready_ != nullptr) << "Advance without a Ready";
    capstan_raft_advance(node_);
    std::free(ready_);
    ready_ = nullptr;
  }

  RaftStatus Status() override {
    CheckThread();
    capstan_raft_status* s = capstan_raft_status_get(node_);
    RaftStatus out;
    out.id = s->id;
    out.hard_state = FromC(s->hard_state);
    out.soft_state = SoftState{.lead = s->lead, .role = static_cast<RaftRole>(s->role)};
    out.applied = s->applied;
    out.lead_transferee = s->lead_transferee;
    out.progress.resize(s->n_progress);
    for (size_t i = 0; i < s->n_progress; ++i) {
      const capstan_raft_progress& p = s->progress[i];
      out.progress[i] = PeerProgress{.id = p.id,
                                     .match = p.match,
                                     .next = p.next,
                                     .state = p.state,
                                     .learner = p.learner != 0,
                                     .recent_active = p.recent_active != 0};
    }
    std::free(s);
    return out;
  }

 private:
  void CheckThread() const {
#ifndef NDEBUG
    CHECK(tls_in_run_loop) << "a raft engine is used inside the RunLoop or RunSteps that made it";
#endif
  }

  static GoRaftEngine* Self(void* ctx) { return static_cast<GoRaftEngine*>(ctx); }

  // Storage callbacks: called by Go on the loop thread. Out-pointers refer
  // to the engine's scratch members, which Go copies before its next call.
  void StorageThrew(const char* op) {
    std::string line = absl::StrCat("raft storage ", op, " threw an exception");
    try {
      throw;
    } catch (const std::exception& e) {
      absl::StrAppend(&line, ": ", e.what());
    } catch (...) {
    }
    Log(CAPSTAN_RAFT_LOG_ERROR, line);
  }

  void Log(int level, std::string_view line) {
    if (log_) {
      try {
        log_(level, line);
      } catch (...) {
      }
    } else {
      LogToSpdlog(nullptr, level, line.data(), line.size());
    }
  }

  static void LogCallback(void* ctx, int level, const char* line, size_t len) {
    Self(ctx)->Log(level, std::string_view(line, len));
  }

  static int InitialStateCallback(void* ctx, capstan_raft_hard_state* hs,
                                  capstan_raft_conf_state* cs) {
    GoRaftEngine* e = Self(ctx);
    try {
      HardState h;
      e->scratch_conf_ = ConfState{};
      LogError err = e->storage_->InitialState(&h, &e->scratch_conf_);
      if (err != LogError::kOk) return static_cast<int>(err);
      *hs = capstan_raft_hard_state{h.term, h.vote, h.commit};
      ToC(e->scratch_conf_, cs);
      return CAPSTAN_RAFT_STORAGE_OK;
    } catch (...) {
      e->StorageThrew("InitialState");
      return CAPSTAN_RAFT_ERR_FAILED;
    }
  }

  static int EntriesCallback(void* ctx, uint64_t lo, uint64_t hi, uint64_t max_size,
                             const capstan_raft_entry** out, size_t* n) {
    GoRaftEngine* e = Self(ctx);
    try {
      e->scratch_entries_.clear();
      LogError err = e->storage_->Entries(lo, hi, max_size, &e->scratch_entries_);
      if (err != LogError::kOk) return static_cast<int>(err);
      e->scratch_c_entries_.resize(e->scratch_entries_.size());
      for (size_t i = 0; i < e->scratch_entries_.size(); ++i) {
        const RaftEntry& src = e->scratch_entries_[i];
        e->scratch_c_entries_[i] = capstan_raft_entry{src.index, src.term,
                                                      static_cast<uint32_t>(src.type),
                                                      Data(src.data), src.data.size()};
      }
      *out = e->scratch_c_entries_.data();
      *n = e->scratch_c_entries_.size();
      return CAPSTAN_RAFT_STORAGE_OK;
    } catch (...) {
      e->StorageThrew("Entries");
      return CAPSTAN_RAFT_ERR_FAILED;
    }
  }

  static int TermCallback(void* ctx, uint64_t i, uint64_t* term) {
    GoRaftEngine* e = Self(ctx);
    try {
      return static_cast<int>(e->storage_->Term(i, term));
    } catch (...) {
      e->StorageThrew("Term");
      return CAPSTAN_RAFT_ERR_FAILED;
    }
  }

  static int FirstIndexCallback(void* ctx, uint64_t* index) {
    GoRaftEngine* e = Self(ctx);
    try {
      *index = e->storage_->FirstIndex();
      return CAPSTAN_RAFT_STORAGE_OK;
    } catch (...) {
      e->StorageThrew("FirstIndex");
      return CAPSTAN_RAFT_ERR_FAILED;
    }
  }

  static int LastIndexCallback(void* ctx, uint64_t* index) {
    GoRaftEngine* e = Self(ctx);
    try {
      *index = e->storage_->LastIndex();
      return CAPSTAN_RAFT_STORAGE_OK;
    } catch (...) {
      e->StorageThrew("LastIndex");
      return CAPSTAN_RAFT_ERR_FAILED;
    }
  }

  static int SnapshotCallback(void* ctx, capstan_raft_snapshot_meta* meta) {
    GoRaftEngine* e = Self(ctx);
    try {
      SnapshotMeta m;
      LogError err = e->storage_->Snapshot(&m);
      if (err != LogError::kOk) return static_cast<int>(err);
      e->scratch_conf_ = std::move(m.conf_state);
      meta->index = m.index;
      meta->term = m.term;
      ToC(e->scratch_conf_, &meta->conf_state);
      return CAPSTAN_RAFT_STORAGE_OK;
    } catch (...) {
      e->StorageThrew("Snapshot");
      return CAPSTAN_RAFT_ERR_FAILED;
    }
  }

  RaftStorage* const storage_;
  const std::function<void(int, std::string_view)> log_;
  capstan_raft_storage c_storage_{};
  capstan_raft_t node_ = 0;
  capstan_raft_ready* ready_ = nullptr;  // from GetReady until Advance
  // Scratch space: what storage callbacks hand to Go, and propose's slices.
  std::vector<RaftEntry> scratch_entries_;
  std::vector<capstan_raft_entry> scratch_c_entries_;
  ConfState scratch_conf_;
  std::vector<capstan_raft_slice> slices_;
};

}  // namespace

GoRaftEngineFactory::GoRaftEngineFactory() { capstan_raft_set_logger(&LogToSpdlog, nullptr); }

void GoRaftEngineFactory::RunLoop(absl::AnyInvocable<void()> loop) {
  capstan_run_on_go_thread(&RunLoopOnGoThread, &loop);
}

void GoRaftEngineFactory::RunSteps(absl::AnyInvocable<bool()> step) {
  capstan_run_steps(&RunStepOnGoThread, &step);
}

absl::StatusOr<std::unique_ptr<RaftEngine>> GoRaftEngineFactory::NewEngine(
    const RaftConfig& config) {
#ifndef NDEBUG
  CHECK(tls_in_run_loop) << "raft engines are made inside GoRaftEngineFactory::RunLoop";
#endif
  if (config.storage == nullptr) return absl::InvalidArgumentError("raft: no storage");
  auto engine = std::make_unique<GoRaftEngine>(config);
  if (absl::Status s = engine->Start(config); !s.ok()) return s;
  return engine;
}

}  // namespace capstan::replication
