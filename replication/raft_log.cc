#include "replication/raft_log.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "spdlog/spdlog.h"
#include "util/check.h"
#include "util/coding.h"
#include "util/crc32c.h"

namespace capstan::replication {
namespace {

using storage::Cf;

// Meta keys start with 0xff, entry keys (indexes below 2^63) with a byte
// below it: every entry key sorts before kMetaPrefix.
constexpr char kMetaPrefix[] = "\xff";
constexpr char kHardStateKey[] = "\xff" "hard_state";
constexpr char kSnapshotKey[] = "\xff" "snapshot";
constexpr size_t kCrcBytes = 4;
// What a cached entry costs besides its data.
constexpr size_t kCacheOverhead = sizeof(RaftEntry);

std::string EntryKey(uint64_t index) {
  std::string key;
  util::AppendBigEndian64(index, &key);
  return key;
}

void AppendCrc(std::string* record) {
  const uint32_t crc = util::Crc32cExtend(0, *record);
  for (int shift = 24; shift >= 0; shift -= 8) record->push_back(static_cast<char>(crc >> shift));
}

// Checks the CRC at the end of record and returns what it covers.
absl::StatusOr<std::string_view> CheckCrc(std::string_view record) {
  if (record.size() < kCrcBytes) {
    return absl::DataLossError(absl::StrCat("record of ", record.size(), " bytes is truncated"));
  }
  const std::string_view body = record.substr(0, record.size() - kCrcBytes);
  const auto* c = reinterpret_cast<const unsigned char*>(record.data() + body.size());
  const uint32_t stored = (uint32_t{c[0]} << 24) | (uint32_t{c[1]} << 16) |
                          (uint32_t{c[2]} << 8) | uint32_t{c[3]};
  if (util::Crc32cExtend(0, body) != stored) return absl::DataLossError("CRC mismatch");
  return body;
}

// Entry record: index, term (big-endian 8 bytes each), type (varint), data,
// CRC-32C of all of them.
std::string EncodeEntry(const RaftEntry& e) {
  std::string out;
  out.reserve(16 + 5 + e.data.size() + kCrcBytes);
  util::AppendBigEndian64(e.index, &out);
  util::AppendBigEndian64(e.term, &out);
  util::AppendVarint(static_cast<uint32_t>(e.type), &out);
  out.append(e.data);
  AppendCrc(&out);
  return out;
}

absl::Status DecodeEntry(std::string_view record, RaftEntry* e) {
  auto body = CheckCrc(record);
  if (!body.ok()) return body.status();
  const char* p = body->data();
  const char* end = p + body->size();
  if (end - p < 16) return absl::DataLossError("entry record too short");
  e->index = util::ReadBigEndian64(p);
  e->term = util::ReadBigEndian64(p + 8);
  p += 16;
  uint64_t type = 0;
  if (!util::ReadVarint(&p, end, &type) || type > static_cast<uint32_t>(EntryType::kConfChangeV2)) {
    return absl::DataLossError("bad entry type");
  }
  e->type = static_cast<EntryType>(type);
  e->data.assign(p, end - p);
  return absl::OkStatus();
}

std::string EncodeHardState(const HardState& hs) {
  std::string out;
  util::AppendBigEndian64(hs.term, &out);
  util::AppendBigEndian64(hs.vote, &out);
  util::AppendBigEndian64(hs.commit, &out);
  AppendCrc(&out);
  return out;
}

absl::Status DecodeHardState(std::string_view record, HardState* hs) {
  auto body = CheckCrc(record);
  if (!body.ok()) return body.status();
  if (body->size() != 24) return absl::DataLossError("hard state record has a bad size");
  hs->term = util::ReadBigEndian64(body->data());
  hs->vote = util::ReadBigEndian64(body->data() + 8);
  hs->commit = util::ReadBigEndian64(body->data() + 16);
  return absl::OkStatus();
}

void AppendIds(const std::vector<uint64_t>& ids, std::string* out) {
  util::AppendVarint(ids.size(), out);
  for (uint64_t id : ids) util::AppendVarint(id, out);
}

bool ReadIds(const char** p, const char* end, std::vector<uint64_t>* ids) {
  uint64_t n = 0;
  if (!util::ReadVarint(p, end, &n) || n > static_cast<uint64_t>(end - *p)) return false;
  ids->resize(n);
  for (auto& id : *ids) {
    if (!util::ReadVarint(p, end, &id)) return false;
  }
  return true;
}

// Snapshot record: index, term, the four member lists (a varint count, then
// varint ids), auto_leave (one byte), CRC-32C.
std::string EncodeSnapshot(const SnapshotMeta& s) {
  std::string out;
  util::AppendBigEndian64(s.index, &out);
  util::AppendBigEndian64(s.term, &out);
  AppendIds(s.conf_state.voters, &out);
  AppendIds(s.conf_state.learners, &out);
  AppendIds(s.conf_state.voters_outgoing, &out);
  AppendIds(s.conf_state.learners_next, &out);
  out.push_back(s.conf_state.auto_leave ? 1 : 0);
  AppendCrc(&out);
  return out;
}

absl::Status DecodeSnapshot(std::string_view record, SnapshotMeta* s) {
  auto body = CheckCrc(record);
  if (!body.ok()) return body.status();
  const char* p = body->data();
  const char* end = p + body->size();
  if (end - p < 16) return absl::DataLossError("snapshot record too short");
  s->index = util::ReadBigEndian64(p);
  s->term = util::ReadBigEndian64(p + 8);
  p += 16;
  ConfState& cs = s->conf_state;
  if (!ReadIds(&p, end, &cs.voters) || !ReadIds(&p, end, &cs.learners) ||
      !ReadIds(&p, end, &cs.voters_outgoing) || !ReadIds(&p, end, &cs.learners_next) ||
      end - p != 1) {
    return absl::DataLossError("malformed snapshot record");
  }
  cs.auto_leave = *p != 0;
  return absl::OkStatus();
}

absl::Status Corrupt(uint64_t index, absl::string_view why) {
  return absl::DataLossError(absl::StrCat("raft log corrupt at index ", index, ": ", why));
}

}  // namespace

uint64_t RaftLog::EntrySize(const RaftEntry& e) {
  // gogoproto's Entry.Size(): Type, Term and Index always, Data when set.
  uint64_t n = 3 + util::VarintSize(static_cast<uint32_t>(e.type)) + util::VarintSize(e.term) +
               util::VarintSize(e.index);
  if (!e.data.empty()) n += 1 + util::VarintSize(e.data.size()) + e.data.size();
  return n;
}

absl::StatusOr<std::unique_ptr<RaftLog>> RaftLog::Open(const RaftLogOptions& options) {
  storage::BackendOptions bo;
  bo.dir = options.dir;
  bo.sync = options.sync;
  bo.write_buffer_bytes = options.write_buffer_bytes;
  bo.block_cache_bytes = options.block_cache_bytes;
  bo.file_system = options.file_system;
  auto backend = storage::Backend::Open(bo);
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat("opening the raft log in ", options.dir, ": ",
                                     backend.status().message()));
  }
  std::unique_ptr<RaftLog> log(new RaftLog(options, std::move(*backend)));
  if (auto s = log->Recover(); !s.ok()) return s;
  // What a previous run compacted may still take its space.
  if (log->snapshot_.index > 0) log->ReclaimBelow(log->snapshot_.index + 1);
  return log;
}

RaftLog::RaftLog(const RaftLogOptions& options, std::unique_ptr<storage::Backend> backend)
    : options_(options), backend_(std::move(backend)) {}

RaftLog::~RaftLog() = default;

absl::Status RaftLog::Recover() {
  std::string value;
  if (auto s = backend_->Get(Cf::kRaft, kSnapshotKey, &value); s.ok()) {
    if (auto d = DecodeSnapshot(value, &snapshot_); !d.ok()) {
      return absl::DataLossError(absl::StrCat("raft log corrupt: snapshot metadata: ", d.message()));
    }
  } else if (!absl::IsNotFound(s)) {
    return s;
  }
  HardState hs;
  if (auto s = backend_->Get(Cf::kRaft, kHardStateKey, &value); s.ok()) {
    if (auto d = DecodeHardState(value, &hs); !d.ok()) {
      return absl::DataLossError(absl::StrCat("raft log corrupt: hard state: ", d.message()));
    }
    has_hard_state_ = true;
  } else if (!absl::IsNotFound(s)) {
    return s;
  }
  {
    util::MutexLock l(&hard_state_mu_);
    hard_state_ = hs;
  }

  cache_first_ = snapshot_.index + 1;
  uint64_t expect = snapshot_.index + 1;
  uint64_t prev_term = snapshot_.term;
  uint64_t stale = 0;            // records at or below the snapshot index
  std::optional<uint64_t> bad;   // the first bad position
  std::string why;
  std::optional<uint64_t> intact_after;  // an intact record after it
  auto it = backend_->NewIterator(Cf::kRaft);
  RaftEntry e;
  for (it->SeekToFirst(); it->Valid() && it->key() < std::string_view(kMetaPrefix, 1); it->Next()) {
    const std::string_view key = it->key();
    if (key.size() != 8) {
      if (!bad) {
        bad = expect;
        why = absl::StrCat("a key of ", key.size(), " bytes among the entries");
      }
      continue;
    }
    const uint64_t index = util::ReadBigEndian64(key.data());
    if (!bad && index <= snapshot_.index) {
      ++stale;
      continue;
    }
    const absl::Status decoded = DecodeEntry(it->value(), &e);
    if (bad) {
      if (decoded.ok() && e.index == index) {
        intact_after = index;
        break;
      }
      continue;
    }
    if (index != expect) {
      bad = expect;
      why = absl::StrCat("entry missing (the next stored entry is ", index, ")");
      if (decoded.ok() && e.index == index) {
        intact_after = index;
        break;
      }
      continue;
    }
    if (!decoded.ok()) {
      bad = index;
      why = std::string(decoded.message());
    } else if (e.index != index) {
      bad = index;
      why = absl::StrCat("the record holds entry ", e.index);
    } else if (e.term < prev_term) {
      bad = index;
      why = absl::StrCat("term ", e.term, " is below the term ", prev_term, " before it");
    } else {
      AppendMemory(e);
      prev_term = e.term;
      ++expect;
    }
  }
  if (auto s = it->status(); !s.ok()) return s;
  it.reset();

  const uint64_t last = expect - 1;
  last_index_.store(last, std::memory_order_release);
  if (bad) {
    if (*bad <= hs.commit) {
      return Corrupt(*bad, absl::StrCat(why, " (at or below the commit index ", hs.commit, ")"));
    }
    if (intact_after) {
      return Corrupt(*bad, absl::StrCat(why, " (entry ", *intact_after, " after it is intact)"));
    }
  }
  if (bad || stale > 0) {
    storage::WriteBatch repair;
    if (stale > 0) {
      SPDLOG_WARN("raft log in {}: dropping {} stale entries at or below the snapshot index {}",
                  options_.dir, stale, snapshot_.index);
      repair.DeleteRange(Cf::kRaft, EntryKey(0), EntryKey(snapshot_.index + 1));
    }
    if (bad) {
      SPDLOG_WARN(
          "raft log in {}: dropping a torn tail from index {} ({}); the log ends at {}, the "
          "commit index is {}",
          options_.dir, *bad, why, last, hs.commit);
      repair.DeleteRange(Cf::kRaft, EntryKey(*bad), kMetaPrefix);
    }
    if (auto s = backend_->Write(&repair); !s.ok()) return s;
  }
  if (has_hard_state_ && hs.commit > last) {
    return absl::DataLossError(absl::StrCat("raft log corrupt: the commit index ", hs.commit,
                                            " is past the last entry ", last));
  }
  return absl::OkStatus();
}

bool RaftLog::IsNew() const {
  return !has_hard_state_ && snapshot_.index == 0 &&
         last_index_.load(std::memory_order_relaxed) == 0;
}

HardState RaftLog::hard_state() const {
  util::MutexLock l(&hard_state_mu_);
  return hard_state_;
}

uint64_t RaftLog::TermOf(uint64_t i) const {
  if (i == snapshot_.index) return snapshot_.term;
  // Most lookups are near the end of the log.
  if (!runs_.empty() && i >= runs_.back().first) return runs_.back().term;
  auto next = std::upper_bound(runs_.begin(), runs_.end(), i,
                               [](uint64_t v, const TermRun& r) { return v < r.first; });
  CHECK(next != runs_.begin()) << "no term for index " << i;
  return std::prev(next)->term;
}

void RaftLog::TruncateMemory(uint64_t index) {
  while (!runs_.empty() && runs_.back().first >= index) runs_.pop_back();
  if (index <= cache_first_) {
    cache_.clear();
    cache_bytes_ = 0;
    cache_first_ = index;
  } else {
    while (!cache_.empty() && cache_.back().index >= index) {
      cache_bytes_ -= cache_.back().data.size() + kCacheOverhead;
      cache_.pop_back();
    }
  }
}

void RaftLog::AppendMemory(const RaftEntry& entry) {
  if (runs_.empty() || runs_.back().term != entry.term) runs_.push_back({entry.index, entry.term});
  if (cache_.empty()) cache_first_ = entry.index;
  cache_.push_back(entry);
  cache_bytes_ += entry.data.size() + kCacheOverhead;
  TrimCache();
}

void RaftLog::TrimCache() {
  while (cache_bytes_ > options_.tail_cache_bytes && !cache_.empty()) {
    cache_bytes_ -= cache_.front().data.size() + kCacheOverhead;
    cache_.pop_front();
    ++cache_first_;
  }
}

absl::Status RaftLog::Save(const std::optional<HardState>& hard_state,
                           const std::vector<RaftEntry>& entries,
                           const std::optional<SnapshotMeta>& snapshot, bool sync) {
  const bool reset = snapshot && snapshot->index > snapshot_.index;
  const SnapshotMeta& snap = reset ? *snapshot : snapshot_;
  const uint64_t base_last = reset ? snap.index : LastIndex();

  // The entries past the snapshot, validated before anything is written.
  size_t skip = 0;
  while (skip < entries.size() && entries[skip].index <= snap.index) ++skip;
  const size_t n = entries.size() - skip;
  const RaftEntry* first = n > 0 ? &entries[skip] : nullptr;
  if (first != nullptr) {
    if (first->index > base_last + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "missing log entry [last: ", base_last, ", append at: ", first->index, "]"));
    }
    const uint64_t prev_term = first->index - 1 == snap.index ? snap.term : TermOf(first->index - 1);
    if (first->term < prev_term) {
      return absl::InvalidArgumentError(absl::StrCat("entry ", first->index, " has term ",
                                                     first->term, ", below the term ", prev_term,
                                                     " of the entry before it"));
    }
    for (size_t k = skip + 1; k < entries.size(); ++k) {
      if (entries[k].index != entries[k - 1].index + 1 || entries[k].term < entries[k - 1].term) {
        return absl::InvalidArgumentError(absl::StrCat(
            "entries to append are not contiguous with non-decreasing terms at index ",
            entries[k].index));
      }
    }
  }

  storage::WriteBatch batch;
  batch.set_sync(sync);
  const bool write_held = held_unwritten_ && !reset;
  if (write_held) {
    batch.DeleteRange(Cf::kRaft, EntryKey(0), EntryKey(snapshot_.index + 1));
    batch.Put(Cf::kRaft, kSnapshotKey, EncodeSnapshot(snapshot_));
  }
  if (reset) {
    // Every entry goes, including any past the snapshot, as raft's
    // MemoryStorage.ApplySnapshot does.
    if (LastIndex() > snapshot_.index) {
      batch.DeleteRange(Cf::kRaft, EntryKey(0), EntryKey(LastIndex() + 1));
    }
    batch.Put(Cf::kRaft, kSnapshotKey, EncodeSnapshot(snap));
  }
  if (first != nullptr) {
    // A conflicting tail longer than the new entries: the rest goes too.
    const uint64_t new_last = entries.back().index;
    if (base_last > new_last) {
      batch.DeleteRange(Cf::kRaft, EntryKey(new_last + 1), EntryKey(base_last + 1));
    }
    for (size_t k = skip; k < entries.size(); ++k) {
      batch.Put(Cf::kRaft, EntryKey(entries[k].index), EncodeEntry(entries[k]));
    }
  }
  if (hard_state) batch.Put(Cf::kRaft, kHardStateKey, EncodeHardState(*hard_state));
  if (batch.Count() == 0) return absl::OkStatus();
  if (auto s = backend_->Write(&batch); !s.ok()) return s;

  if (write_held) ReclaimBelow(snapshot_.index + 1);
  held_unwritten_ = false;
  if (reset) {
    snapshot_ = *snapshot;
    runs_.clear();
    cache_.clear();
    cache_bytes_ = 0;
    cache_first_ = snapshot_.index + 1;
    // Entries past the snapshot may be written again; those below never are.
    ReclaimBelow(snapshot_.index + 1);
  }
  uint64_t last = base_last;
  if (first != nullptr) {
    if (first->index <= last) TruncateMemory(first->index);
    for (size_t k = skip; k < entries.size(); ++k) AppendMemory(entries[k]);
    last = entries.back().index;
  }
  if (cache_.empty()) cache_first_ = last + 1;
  last_index_.store(last, std::memory_order_release);
  if (hard_state) {
    util::MutexLock l(&hard_state_mu_);
    hard_state_ = *hard_state;
    has_hard_state_ = true;
  }
  return absl::OkStatus();
}

absl::Status RaftLog::Compact(uint64_t index, const ConfState& conf_state) {
  if (index <= snapshot_.index) {
    return absl::FailedPreconditionError(absl::StrCat(
        "requested index ", index, " is unavailable due to compaction (snapshot index ",
        snapshot_.index, ")"));
  }
  const uint64_t last = LastIndex();
  const uint64_t commit = hard_state().commit;
  if (index > last || index > commit) {
    return absl::OutOfRangeError(absl::StrCat("compact index ", index,
                                              " is past the last entry ", last,
                                              " or the commit index ", commit));
  }
  SnapshotMeta meta{index, TermOf(index), conf_state};
  storage::WriteBatch batch;
  batch.DeleteRange(Cf::kRaft, EntryKey(0), EntryKey(index + 1));
  batch.Put(Cf::kRaft, kSnapshotKey, EncodeSnapshot(meta));
  if (auto s = backend_->Write(&batch); !s.ok()) return s;

  snapshot_ = std::move(meta);
  while (runs_.size() >= 2 && runs_[1].first <= index + 1) runs_.pop_front();
  if (index == last) {
    runs_.clear();
  } else if (!runs_.empty()) {
    runs_.front().first = std::max(runs_.front().first, index + 1);
  }
  while (!cache_.empty() && cache_.front().index <= index) {
    cache_bytes_ -= cache_.front().data.size() + kCacheOverhead;
    cache_.pop_front();
  }
  cache_first_ = std::max(cache_first_, index + 1);
  ReclaimBelow(index + 1);
  return absl::OkStatus();
}

void RaftLog::HoldInStore(uint64_t index, uint64_t term, const ConfState& conf_state) {
  if (index <= snapshot_.index) return;
  CHECK(index >= LastIndex()) << "entries up to " << index << " held by the store, but the log "
                              << "holds entries up to " << LastIndex();
  snapshot_ = SnapshotMeta{index, term, conf_state};
  held_unwritten_ = true;
  runs_.clear();
  cache_.clear();
  cache_bytes_ = 0;
  cache_first_ = index + 1;
  last_index_.store(index, std::memory_order_release);
}

uint64_t RaftLog::ReclaimedBelow() const {
  util::MutexLock l(&reclaim_mu_);
  return reclaimed_;
}

void RaftLog::ReclaimBelow(uint64_t end) {
  {
    util::MutexLock l(&reclaim_mu_);
    reclaim_asked_ = std::max(reclaim_asked_, end);
    // One pass at a time; a pass takes the newest end when it starts, so
    // compactions asked for meanwhile coalesce.
    if (reclaim_queued_) return;
    reclaim_queued_ = true;
  }
  reclaimer_.RunOrCancel([this](bool run) {
    if (run) Reclaim();
  });
}

void RaftLog::Reclaim() {
  uint64_t end = 0;
  {
    util::MutexLock l(&reclaim_mu_);
    reclaim_queued_ = false;
    end = reclaim_asked_;
  }
  const absl::Status s = backend_->ReclaimRange(Cf::kRaft, EntryKey(0), EntryKey(end));
  if (!s.ok()) {
    // Only disk space is at stake: RocksDB's own compactions get it later.
    SPDLOG_WARN("raft log in {}: giving back the space of the entries below {} failed: {}",
                options_.dir, end, s.ToString());
    return;
  }
  util::MutexLock l(&reclaim_mu_);
  reclaimed_ = std::max(reclaimed_, end);
}

LogError RaftLog::InitialState(HardState* hard_state, ConfState* conf_state) {
  *hard_state = this->hard_state();
  *conf_state = snapshot_.conf_state;
  return LogError::kOk;
}

LogError RaftLog::Term(uint64_t i, uint64_t* term) {
  *term = 0;
  if (i < snapshot_.index) return LogError::kCompacted;
  if (i > LastIndex()) return LogError::kUnavailable;
  *term = TermOf(i);
  return LogError::kOk;
}

LogError RaftLog::Snapshot(SnapshotMeta* meta) {
  *meta = snapshot_;
  return LogError::kOk;
}

LogError RaftLog::Entries(uint64_t lo, uint64_t hi, uint64_t max_bytes,
                          std::vector<RaftEntry>* out) {
  out->clear();
  if (lo <= snapshot_.index) return LogError::kCompacted;
  const uint64_t last = LastIndex();
  if (hi > last + 1 || lo > hi) return LogError::kUnavailable;
  if (last == snapshot_.index) return LogError::kUnavailable;  // no entries at all
  uint64_t bytes = 0;
  if (lo < cache_first_) {
    const uint64_t end = std::min(hi, cache_first_);
    if (LogError err = ReadStored(lo, end, max_bytes, &bytes, out); err != LogError::kOk) {
      out->clear();
      return err;
    }
    if (out->size() < end - lo) return LogError::kOk;  // the size limit stopped it
    lo = end;
  }
  for (uint64_t i = lo; i < hi; ++i) {
    const RaftEntry& e = cache_[i - cache_first_];
    const uint64_t size = EntrySize(e);
    if (!out->empty() && bytes + size > max_bytes) break;
    bytes += size;
    out->push_back(e);
  }
  return LogError::kOk;
}

LogError RaftLog::ReadStored(uint64_t lo, uint64_t hi, uint64_t max_bytes, uint64_t* bytes,
                             std::vector<RaftEntry>* out) {
  auto it = backend_->NewIterator(Cf::kRaft);
  it->Seek(EntryKey(lo));
  for (uint64_t i = lo; i < hi; ++i, it->Next()) {
    if (!it->Valid() || it->key() != EntryKey(i)) {
      SPDLOG_ERROR("raft log in {}: entry {} cannot be read: {}", options_.dir, i,
                   it->status().ok() ? std::string("missing") : it->status().ToString());
      return LogError::kFailed;
    }
    RaftEntry e;
    if (auto s = DecodeEntry(it->value(), &e); !s.ok() || e.index != i) {
      const absl::Status corrupt =
          Corrupt(i, s.ok() ? absl::string_view("the record holds another entry") : s.message());
      SPDLOG_ERROR("raft log in {}: {}", options_.dir, std::string(corrupt.message()));
      return LogError::kFailed;
    }
    const uint64_t size = EntrySize(e);
    if (!out->empty() && *bytes + size > max_bytes) break;
    *bytes += size;
    out->push_back(std::move(e));
  }
  return LogError::kOk;
}

}  // namespace capstan::replication
