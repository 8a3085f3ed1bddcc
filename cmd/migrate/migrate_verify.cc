// Verification of a migration (`capstan migrate --verify`): the migrated
// store against its source, revision by revision.

#include "cmd/migrate/migrate.h"
#include "cmd/migrate/migrate_source.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "etcdserverpb/rpc.pb.h"
#include "lease/lessor.h"
#include "mvcc/kv_codec.h"
#include "mvcc/kv_store.h"
#include "storage/backend.h"
#include "storage/data_dir.h"
#include "storage/etcdfmt/bbolt_reader.h"
#include "util/crc32c.h"


namespace capstan::server {
namespace migrate_internal {

using index::Revision;
using etcdfmt::BboltReader;
using storage::Cf;

namespace {

constexpr int kMaxMismatchExamples = 20;


void Mismatch(MigrateReport* report, std::string what) {
  ++report->mismatches;
  if (report->mismatch_examples.size() < kMaxMismatchExamples) {
    report->mismatch_examples.push_back(std::move(what));
  }
}

// Describes how a Range answer differs from the model's live keys.
std::string DescribeRangeDiff(int64_t rev, const mvcc::RangeResult& got,
                              const std::map<std::string_view, std::string_view>& live) {
  std::string text = absl::StrCat("revision ", rev, ": full Range differs: capstan count ",
                                  got.count, " (", got.num_kvs, " kvs), etcd count ", live.size());
  etcdserverpb::RangeResponse parsed;
  if (!parsed.ParseFromString(got.kvs_wire)) return text + "; capstan's kvs do not parse";
  auto it = live.begin();
  for (int i = 0; i < parsed.kvs_size(); ++i, ++it) {
    if (it == live.end()) return absl::StrCat(text, "; extra key ", Printable(parsed.kvs(i).key()));
    if (parsed.kvs(i).key() != it->first) {
      return absl::StrCat(text, "; first differing key: capstan ", Printable(parsed.kvs(i).key()),
                          ", etcd ", Printable(it->first));
    }
    if (parsed.kvs(i).SerializeAsString() != it->second) {
      return absl::StrCat(text, "; key ", Printable(it->first), " has different bytes");
    }
  }
  if (it != live.end()) return absl::StrCat(text, "; missing key ", Printable(it->first));
  return text;
}

std::string ExpectedWire(const std::map<std::string_view, std::string_view>& live) {
  std::string wire;
  for (const auto& [k, record] : live) mvcc::AppendRecordField(2, record, false, &wire);
  return wire;
}

// The source as verification models it: every key record in revision
// order, and the revisions that bound what the store must hold.
struct SourceModel {
  std::vector<SourceRecord> records;
  SourceMeta meta;
  int64_t compact = 0;  // the higher of etcd's scheduled and finished compactions
  int64_t current = 0;  // the last revision (at least the compaction's, and 1)
};

absl::StatusOr<SourceModel> LoadSourceModel(const BboltReader& r) {
  SourceModel model;
  std::vector<SourceRecord>& records = model.records;
  if (auto s = ForEachKeyRecord(r, [&records](const SourceRecord& rec) {
        records.push_back(rec);
        return absl::OkStatus();
      });
      !s.ok()) {
    return s;
  }
  auto meta = ReadSourceMeta(r);
  if (!meta.ok()) return meta.status();
  model.meta = *std::move(meta);
  model.compact = std::max(model.meta.scheduled, model.meta.finished);
  model.current =
      std::max<int64_t>({records.empty() ? 0 : records.back().rev.main, model.compact, 1});
  return model;
}

// The store in data_dir, opened as a server would but never serving; lease
// expiry is pushed out of reach so verification writes nothing.
absl::StatusOr<std::unique_ptr<mvcc::KvStore>> OpenForVerification(const std::string& data_dir) {
  storage::BackendOptions bopts;
  bopts.dir = storage::BackendDir(data_dir);
  auto backend = storage::Backend::Open(bopts);
  if (!backend.ok()) return backend.status();
  mvcc::KvStoreOptions sopts;
  sopts.lease_check_interval = absl::Hours(24 * 365);
  auto opened = mvcc::KvStore::Open(sopts, std::move(*backend));
  if (!opened.ok()) return opened.status();
  (*opened)->WaitCompactionDone();  // an interrupted etcd compaction is resumed on open
  return opened;
}

// The current and compact revisions and the consistent index.
void CompareRevisions(const SourceModel& model, mvcc::KvStore& store, MigrateReport* report) {
  if (store.Rev() != model.current) {
    Mismatch(report,
             absl::StrCat("current revision: capstan ", store.Rev(), ", etcd ", model.current));
  }
  if (store.CompactRev() != model.compact) {
    Mismatch(report, absl::StrCat("compact revision: capstan ", store.CompactRev(), ", etcd ",
                                  model.compact));
  }
  if (store.AppliedIndex() != model.meta.consistent_index.value_or(0)) {
    Mismatch(report, absl::StrCat("consistent index: capstan ", store.AppliedIndex(), ", etcd ",
                                  model.meta.consistent_index.value_or(0)));
  }
}

// The source's live keys (key -> stored record), moved forward through its
// records a revision at a time. REQUIRES: records outlives it.
class SourceReplay {
 public:
  explicit SourceReplay(const std::vector<SourceRecord>& records) : records_(records) {}

  // Applies the records up to revision rev; adds each to *changed unless
  // changed is null.
  void ApplyThrough(int64_t rev, std::vector<const SourceRecord*>* changed) {
    for (; next_ < records_.size() && records_[next_].rev.main <= rev; ++next_) {
      const SourceRecord& rec = records_[next_];
      if (rec.tombstone) {
        live_.erase(rec.key);
      } else {
        live_[rec.key] = rec.record;
      }
      if (changed != nullptr) changed->push_back(&rec);
    }
  }

  const std::map<std::string_view, std::string_view>& live() const { return live_; }

 private:
  const std::vector<SourceRecord>& records_;
  size_t next_ = 0;
  std::map<std::string_view, std::string_view> live_;
};

// A Range over every key at rev against the source's live keys.
void CompareFullRange(mvcc::KvStore& store, int64_t rev,
                      const std::map<std::string_view, std::string_view>& live,
                      MigrateReport* report) {
  ++report->full_ranges_checked;
  etcdserverpb::RangeRequest req;
  req.set_key(std::string(1, '\0'));
  req.set_range_end(std::string(1, '\0'));
  req.set_revision(rev);
  mvcc::RangeResult got;
  if (auto s = store.Range(req, &got); !s.ok()) {
    Mismatch(report, absl::StrCat("revision ", rev, ": Range failed: ", s.message()));
    return;
  }
  if (got.count != static_cast<int64_t>(live.size()) ||
      got.num_kvs != static_cast<int>(live.size()) || got.kvs_wire != ExpectedWire(live)) {
    Mismatch(report, DescribeRangeDiff(rev, got, live));
  }
}

// A Range of each key changed at rev against the source's live keys.
void CompareChangedKeys(mvcc::KvStore& store, int64_t rev,
                        const std::vector<const SourceRecord*>& changed,
                        const std::map<std::string_view, std::string_view>& live,
                        MigrateReport* report) {
  for (const SourceRecord* rec : changed) {
    etcdserverpb::RangeRequest req;
    req.set_key(std::string(rec->key));
    req.set_revision(rev);
    mvcc::RangeResult got;
    auto s = store.Range(req, &got);
    auto it = live.find(rec->key);
    std::string want;
    if (it != live.end()) mvcc::AppendRecordField(2, it->second, false, &want);
    if (!s.ok() || got.kvs_wire != want) {
      Mismatch(report, absl::StrCat("revision ", rev, ": key ", Printable(rec->key), " differs"));
    }
  }
}

// Ranges at every retained revision: every key at the first, the last and
// every stride-th revision, else the keys that revision changed.
void CompareRanges(const SourceModel& model, int64_t stride, mvcc::KvStore& store,
                   MigrateReport* report) {
  SourceReplay replay(model.records);
  const int64_t first = std::max<int64_t>(model.compact, 1);
  replay.ApplyThrough(first - 1, nullptr);
  report->first_revision_checked = first;
  for (int64_t rev = first; rev <= model.current; ++rev) {
    std::vector<const SourceRecord*> changed;
    replay.ApplyThrough(rev, &changed);
    ++report->revisions_checked;
    const bool full =
        stride == 1 || rev == first || rev == model.current || (rev - first) % stride == 0;
    if (full) {
      CompareFullRange(store, rev, replay.live(), report);
    } else {
      CompareChangedKeys(store, rev, changed, replay.live(), report);
    }
  }
  report->live_keys = static_cast<int64_t>(replay.live().size());
}

// HashKV with etcd's algorithm over the source (etcd's store.hashByRev,
// the same in 3.4 and 3.5): CRC-32C of "key" and of every record up to
// the hash revision, leaving out records at or below the compaction
// revision that are not in treeIndex.Keep(hash revision), i.e. not the
// latest record of a key live at the hash revision. (Keep is taken at the
// hash revision, not at the compaction revision: a record kept by the
// compaction but superseded since is left out.)
uint32_t SourceHash(const SourceModel& model) {
  absl::flat_hash_map<std::string_view, const SourceRecord*> latest;
  for (const SourceRecord& rec : model.records) {
    if (rec.rev.main > model.current) break;
    latest[rec.key] = &rec;
  }
  absl::flat_hash_set<Revision> keep;
  for (const auto& [k, rec] : latest) {
    if (!rec->tombstone) keep.insert(rec->rev);
  }
  uint32_t h = util::Crc32cExtend(0, kKeyBucket);
  for (const SourceRecord& rec : model.records) {
    if (rec.rev.main > model.current) break;
    if (rec.rev.main <= model.compact && !keep.empty() && !keep.contains(rec.rev)) continue;
    h = util::Crc32cExtend(h, rec.key_bytes);
    h = util::Crc32cExtend(h, rec.record);
  }
  return h;
}

void CompareHashes(const SourceModel& model, mvcc::KvStore& store, MigrateReport* report) {
  const uint32_t h = SourceHash(model);
  report->source_hash = h;
  uint32_t capstan_hash = 0;
  int64_t hash_compact = 0, hash_rev = 0;
  if (auto s = store.HashKV(0, &capstan_hash, &hash_compact, &hash_rev); !s.ok()) {
    Mismatch(report, absl::StrCat("HashKV failed: ", s.message()));
    return;
  }
  report->capstan_hash = capstan_hash;
  if (capstan_hash != h || hash_rev != model.current) {
    Mismatch(report, absl::StrFormat("HashKV: capstan %u at revision %d, etcd %u at revision %d",
                                     capstan_hash, hash_rev, h, model.current));
  }
}

// The keys attached to each lease, sorted: each live key's latest record
// names its lease, as etcd's restore reads it.
std::map<int64_t, std::vector<std::string>> LeaseKeys(const std::vector<SourceRecord>& records) {
  std::map<int64_t, std::vector<std::string>> lease_keys;
  absl::flat_hash_map<std::string_view, int64_t> key_lease;
  for (const SourceRecord& rec : records) {
    if (rec.tombstone || rec.lease == 0) {
      key_lease.erase(rec.key);
    } else {
      key_lease[rec.key] = rec.lease;
    }
  }
  for (const auto& [k, id] : key_lease) lease_keys[id].emplace_back(k);
  for (auto& [id, keys] : lease_keys) std::sort(keys.begin(), keys.end());
  return lease_keys;
}

// Leases, with their TTLs and the keys attached to them.
absl::Status CompareLeases(const BboltReader& r, const SourceModel& model, mvcc::KvStore& store,
                           MigrateReport* report) {
  std::map<int64_t, std::vector<std::string>> lease_keys = LeaseKeys(model.records);
  uint64_t source_leases = 0;
  auto has_lease = r.HasBucket({kLeaseBucket});
  if (!has_lease.ok()) return has_lease.status();
  if (*has_lease) {
    auto s = r.ForEach({kLeaseBucket}, [&](std::string_view, std::string_view v, bool) {
      int64_t id, ttl;
      if (!lease::DecodeLeaseRecord(v, &id, &ttl)) return absl::DataLossError("corrupt lease");
      ++source_leases;
      auto info = store.lessor()->Get(id, /*with_keys=*/true);
      if (!info.has_value()) {
        Mismatch(report, absl::StrFormat("lease %x is missing", id));
        return absl::OkStatus();
      }
      if (info->granted_ttl != ttl) {
        Mismatch(report, absl::StrFormat("lease %x: TTL capstan %d, etcd %d", id,
                                         info->granted_ttl, ttl));
      }
      if (info->keys != lease_keys[id]) {
        Mismatch(report, absl::StrFormat("lease %x: capstan holds %d keys, etcd %d", id,
                                         info->keys.size(), lease_keys[id].size()));
      }
      ++report->leases_checked;
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
  }
  if (store.lessor()->size() != source_leases) {
    Mismatch(report, absl::StrCat("leases: capstan ", store.lessor()->size(), ", etcd ",
                                  source_leases));
  }
  return absl::OkStatus();
}

// Auth records, byte for byte, and their number.
absl::Status CompareAuth(const BboltReader& r, mvcc::KvStore& store, MigrateReport* report) {
  uint64_t auth = 0;
  for (const char* bucket : kAuthBuckets) {
    auto has = r.HasBucket({bucket});
    if (!has.ok()) return has.status();
    if (!*has) continue;
    auto s = r.ForEach({bucket}, [&](std::string_view k, std::string_view v, bool) {
      ++auth;
      std::string got;
      const std::string key = absl::StrCat(bucket, "/", Sv(k));
      if (!store.backend()->Get(Cf::kAuth, key, &got).ok() || got != v) {
        Mismatch(report, absl::StrCat("auth record ", Printable(key), " differs"));
      }
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
  }
  uint64_t capstan_auth = 0;
  {
    auto it = store.backend()->NewIterator(Cf::kAuth);
    for (it->SeekToFirst(); it->Valid(); it->Next()) ++capstan_auth;
  }
  if (capstan_auth != auth) {
    Mismatch(report, absl::StrCat("auth records: capstan ", capstan_auth, ", etcd ", auth));
  }
  return absl::OkStatus();
}

// The number of alarms.
absl::Status CompareAlarms(const BboltReader& r, mvcc::KvStore& store, MigrateReport* report) {
  uint64_t alarms = 0;
  auto has_alarm = r.HasBucket({kAlarmBucket});
  if (!has_alarm.ok()) return has_alarm.status();
  if (*has_alarm) {
    auto s = r.ForEach({kAlarmBucket}, [&alarms](std::string_view, std::string_view, bool) {
      ++alarms;
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
  }
  if (store.Alarms().size() != alarms) {
    Mismatch(report, absl::StrCat("alarms: capstan ", store.Alarms().size(), ", etcd ", alarms));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status VerifyAgainstSource(const BboltReader& r, const std::string& data_dir,
                                 int64_t stride, MigrateReport* report) {
  if (stride < 1) stride = 1;
  auto model = LoadSourceModel(r);
  if (!model.ok()) return model.status();
  auto opened = OpenForVerification(data_dir);
  if (!opened.ok()) return opened.status();
  mvcc::KvStore& store = **opened;

  CompareRevisions(*model, store, report);
  CompareRanges(*model, stride, store, report);
  CompareHashes(*model, store, report);
  if (auto s = CompareLeases(r, *model, store, report); !s.ok()) return s;
  if (auto s = CompareAuth(r, store, report); !s.ok()) return s;
  if (auto s = CompareAlarms(r, store, report); !s.ok()) return s;
  report->verified = true;
  return absl::OkStatus();
}

}  // namespace migrate_internal

absl::Status VerifyMigration(const std::string& from, const std::string& data_dir,
                             int64_t verify_stride, MigrateReport* report) {
  auto source = migrate_internal::OpenSource(from);
  if (!source.ok()) return source.status();
  report->source_file = (*source)->file;
  report->snapshot = (*source)->snapshot;
  return migrate_internal::VerifyAgainstSource(*(*source)->reader, data_dir, verify_stride, report);
}

}  // namespace capstan::server
