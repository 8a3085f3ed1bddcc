// Randomized model-based test of KvStore (STYLE.md; RocksDB's db_map_fuzzer):
// random Put / DeleteRange (single key, range, prefix, from-key) / Txn
// (compares, nested txns, reads) / Compact (physical or not) / reopen,
// submitted one at a time or in bursts that the committer groups, against a
// small in-memory model of etcd's semantics. Every response is compared with
// the model's, and after each step Ranges at the current revision and at
// retained past revisions, the header revision, ErrCompacted/ErrFutureRev and
// (after compactions) the exact set of records left in the backend.
//
// The model follows etcd 3.5 (server/etcdserver/apply.go, api/v3rpc/key.go,
// server/mvcc/kvstore_txn.go), including its quirks: a Range with a sort
// target other than KEY, no sort order and a limit sorts only the first
// limit+1 keys; the txn put checks run before the range checks.
//
// Keys come from a small key space (with a NUL byte and 0xff bytes in some)
// so that keys are reused, deleted and recreated all the time.
//
// Reproduce or soak: CAPSTAN_MODEL_SEED=<seed> CAPSTAN_MODEL_STEPS=<n>
//   capstan_mvcc_model_test --gtest_filter='KvStoreModelTest.FromEnvironment'
//
// The KvStoreTxnCompatTest cases at the end pin down single behaviours found
// to differ from etcd or from KvStore's own contract.

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "mvcc/errors.h"
#include "mvcc/kv_codec.h"
#include "mvcc/kv_store.h"
#include "mvcc/revision_key.h"
#include "mvcc/test_backend.h"
#include "storage/backend.h"

#if defined(__SANITIZE_THREAD__)
// Debian's RocksDB is not built with ThreadSanitizer: TSan does not see its
// internal synchronization and reports races between RocksDB's own accesses
// (see kv_store_concurrency_test.cc), and so does Debian's Abseil for the
// reference-counted rep that absl::Status copies share. Races with a
// rocksdb:: frame or from libabsl_status are suppressed.
extern "C" const char* __tsan_default_suppressions() {
  return "race:rocksdb::\ncalled_from_lib:libabsl_status.so\n";
}
#endif

namespace capstan::mvcc {
namespace {

using etcdserverpb::CompactionRequest;
using etcdserverpb::CompactionResponse;
using etcdserverpb::Compare;
using etcdserverpb::DeleteRangeRequest;
using etcdserverpb::DeleteRangeResponse;
using etcdserverpb::PutRequest;
using etcdserverpb::PutResponse;
using etcdserverpb::RangeRequest;
using etcdserverpb::RangeResponse;
using etcdserverpb::RequestOp;
using etcdserverpb::ResponseOp;
using etcdserverpb::TxnRequest;
using etcdserverpb::TxnResponse;
using google::protobuf::RepeatedPtrField;

const std::string kFromKey(1, '\0');  // range_end: every key >= key

// Steers the random test around the bugs that KvStoreTxnCompatTest shows, so
// that it goes on finding new ones; CAPSTAN_MODEL_ALL=1 turns this off.
// Remove each workaround with its fix:
//  - compare values stay within std::string's inline capacity (15 bytes):
//    TxnCompareLongValue;
//  - no ignore_value/ignore_lease put in a txn with a from-key delete:
//    RefusedTxnChangesNothing (etcd panics on such txns; see Sanitize).
bool AvoidKnownBugs() {
  static const bool avoid = std::getenv("CAPSTAN_MODEL_ALL") == nullptr;
  return avoid;
}

std::string Hex(std::string_view s) { return absl::CHexEscape(absl::string_view(s.data(), s.size())); }

// ---------------------------------------------------------------------------
// The model: every change of every key, by revision.

struct ModelKv {
  std::string key;
  std::string value;
  int64_t create = 0;
  int64_t mod = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

struct ModelChange {
  Revision rev;
  std::optional<ModelKv> kv;  // empty: the tombstone that deleted the key
};

class Model {
 public:
  int64_t rev() const { return rev_; }
  int64_t compact_rev() const { return compact_rev_; }
  void SetCompactRev(int64_t rev) { compact_rev_ = rev; }

  // The key at revision `at`, if it exists then.
  std::optional<ModelKv> Get(const std::string& key, int64_t at) const {
    auto it = history_.find(key);
    if (it == history_.end()) return std::nullopt;
    std::optional<ModelKv> found;
    for (const auto& c : it->second) {
      if (c.rev.main > at) break;
      found = c.kv;
    }
    return found;
  }

  // The keys of etcd's range (key, end) alive at `at`, in key order.
  std::vector<ModelKv> Range(const std::string& key, const std::string& end, int64_t at) const {
    std::vector<ModelKv> out;
    if (end.empty()) {
      if (auto kv = Get(key, at)) out.push_back(*kv);
      return out;
    }
    const bool all = end == kFromKey;
    for (auto it = history_.lower_bound(key); it != history_.end(); ++it) {
      if (!all && !(it->first < end)) break;
      if (auto kv = Get(it->first, at)) out.push_back(*kv);
    }
    return out;
  }

  // The records a store compacted at compact_rev() keeps in its `key`
  // family, by revision key: every change above the compaction revision, and
  // of the older ones only each key's last change, if it is a put (etcd's
  // keyIndex.keep).
  std::map<std::string, std::optional<ModelKv>> ExpectedRecords() const {
    std::map<std::string, std::optional<ModelKv>> out;
    for (const auto& [key, changes] : history_) {
      const ModelChange* last_compacted = nullptr;
      for (const auto& c : changes) {
        if (c.rev.main <= compact_rev_) {
          last_compacted = &c;
          continue;
        }
        out[RevisionKey(c.rev, !c.kv.has_value())] = c.kv;
      }
      if (last_compacted != nullptr && last_compacted->kv.has_value()) {
        out[RevisionKey(last_compacted->rev, false)] = last_compacted->kv;
      }
    }
    return out;
  }

  // One write request: its changes share main revision rev() + 1.
  class Write {
   public:
    explicit Write(Model* m) : m_(m), main_(m->rev_ + 1) {}
    int64_t main() const { return main_; }
    bool changed() const { return sub_ > 0; }
    // Reads inside the request see its earlier changes.
    int64_t read_rev() const { return changed() ? main_ : m_->rev_; }
    // The header revision of a request that may not have changed anything.
    int64_t header_rev() const { return changed() ? main_ : m_->rev_; }

    void Put(const std::string& key, const std::string& value, int64_t lease) {
      const auto prev = m_->Get(key, read_rev());
      ModelKv kv{key, value, prev ? prev->create : main_, main_, prev ? prev->version + 1 : 1,
                 lease};
      m_->history_[key].push_back({Revision{main_, sub_++}, kv});
    }
    // Deletes the keys of the range; returns them as they were.
    std::vector<ModelKv> Delete(const std::string& key, const std::string& end) {
      auto kvs = m_->Range(key, end, read_rev());
      for (const auto& kv : kvs) {
        m_->history_[kv.key].push_back({Revision{main_, sub_++}, std::nullopt});
      }
      return kvs;
    }
    void Commit() {
      if (changed()) m_->rev_ = main_;
    }

   private:
    Model* m_;
    const int64_t main_;
    int64_t sub_ = 0;
  };

 private:
  int64_t rev_ = 1;  // a new store starts at revision 1
  int64_t compact_rev_ = 0;
  std::map<std::string, std::vector<ModelChange>> history_;
};

// ---------------------------------------------------------------------------
// Expected responses.

std::string TargetOf(const ModelKv& kv, RangeRequest::SortTarget target) {
  switch (target) {
    case RangeRequest::KEY: return kv.key;
    case RangeRequest::VERSION: return absl::StrCat(kv.version);
    case RangeRequest::CREATE: return absl::StrCat(kv.create);
    case RangeRequest::MOD: return absl::StrCat(kv.mod);
    case RangeRequest::VALUE: return kv.value;
    default: return "";
  }
}

bool TargetLess(const ModelKv& a, const ModelKv& b, RangeRequest::SortTarget target) {
  switch (target) {
    case RangeRequest::KEY: return a.key < b.key;
    case RangeRequest::VERSION: return a.version < b.version;
    case RangeRequest::CREATE: return a.create < b.create;
    case RangeRequest::MOD: return a.mod < b.mod;
    case RangeRequest::VALUE: return a.value < b.value;
    default: return false;
  }
}

struct RangeExpectation {
  std::optional<Error> error;
  int64_t header_rev = 0;
  int64_t count = 0;
  bool more = false;
  std::vector<ModelKv> kvs;  // in the expected order; values not stripped
  // Sorted by a target other than the key: etcd's sort is not stable, so
  // equal targets may come in any order (and a limit may cut a run of equal
  // targets anywhere). Then kvs gives the expected target sequence and
  // candidates the keys that may appear.
  bool by_target = false;
  std::map<std::string, ModelKv> candidates;
  RangeRequest::SortTarget target = RangeRequest::KEY;
  bool keys_only = false;
};

// etcd's Range (apply.go executeRange + kvstore_txn.go rangeKeys) at the
// store revision `current`.
RangeExpectation ExpectRange(const Model& m, const RangeRequest& req, int64_t current) {
  RangeExpectation e;
  if (req.key().empty()) {
    e.error = Error::kEmptyKey;
    return e;
  }
  if (!RangeRequest::SortOrder_IsValid(req.sort_order()) ||
      !RangeRequest::SortTarget_IsValid(req.sort_target())) {
    e.error = Error::kInvalidSortOption;
    return e;
  }
  if (req.revision() > current) {
    e.error = Error::kFutureRev;
    return e;
  }
  const int64_t rev = req.revision() <= 0 ? current : req.revision();
  if (rev < m.compact_rev()) {
    e.error = Error::kCompacted;
    return e;
  }
  e.header_rev = current;
  e.keys_only = req.keys_only();
  e.target = req.sort_target();
  std::vector<ModelKv> items = m.Range(req.key(), req.range_end(), rev);
  e.count = static_cast<int64_t>(items.size());
  if (req.count_only()) return e;

  const bool filtered = req.min_mod_revision() != 0 || req.max_mod_revision() != 0 ||
                        req.min_create_revision() != 0 || req.max_create_revision() != 0;
  // etcd's rangeLimit looks at the requested order, before the default below.
  int64_t fetch = (filtered || req.sort_order() != RangeRequest::NONE) ? 0 : req.limit();
  if (fetch > 0 && static_cast<int64_t>(items.size()) > fetch + 1) items.resize(fetch + 1);
  std::vector<ModelKv> kept;
  for (const auto& kv : items) {
    if (req.max_mod_revision() != 0 && kv.mod > req.max_mod_revision()) continue;
    if (req.min_mod_revision() != 0 && kv.mod < req.min_mod_revision()) continue;
    if (req.max_create_revision() != 0 && kv.create > req.max_create_revision()) continue;
    if (req.min_create_revision() != 0 && kv.create < req.min_create_revision()) continue;
    kept.push_back(kv);
  }
  RangeRequest::SortOrder order = req.sort_order();
  if (req.sort_target() != RangeRequest::KEY && order == RangeRequest::NONE) {
    order = RangeRequest::ASCEND;
  }
  const auto target = req.sort_target();
  if (order == RangeRequest::ASCEND) {
    std::stable_sort(kept.begin(), kept.end(),
                     [target](const ModelKv& a, const ModelKv& b) { return TargetLess(a, b, target); });
  } else if (order == RangeRequest::DESCEND) {
    std::stable_sort(kept.begin(), kept.end(),
                     [target](const ModelKv& a, const ModelKv& b) { return TargetLess(b, a, target); });
  }
  e.by_target = order != RangeRequest::NONE && target != RangeRequest::KEY;
  for (const auto& kv : kept) e.candidates[kv.key] = kv;
  if (req.limit() > 0 && static_cast<int64_t>(kept.size()) > req.limit()) {
    kept.resize(req.limit());
    e.more = true;
  }
  e.kvs = std::move(kept);
  return e;
}

void ExpectKv(const ModelKv& want, const mvccpb::KeyValue& got, bool keys_only,
              const std::string& ctx) {
  EXPECT_EQ(Hex(got.key()), Hex(want.key)) << ctx;
  EXPECT_EQ(Hex(got.value()), Hex(keys_only ? std::string() : want.value))
      << ctx << " key " << Hex(want.key);
  EXPECT_EQ(got.create_revision(), want.create) << ctx << " key " << Hex(want.key);
  EXPECT_EQ(got.mod_revision(), want.mod) << ctx << " key " << Hex(want.key);
  EXPECT_EQ(got.version(), want.version) << ctx << " key " << Hex(want.key);
  EXPECT_EQ(got.lease(), want.lease) << ctx << " key " << Hex(want.key);
}

void ExpectStatus(const absl::Status& s, const std::optional<Error>& want, const std::string& ctx) {
  if (want.has_value()) {
    EXPECT_TRUE(Is(s, *want)) << ctx << ": got " << s << ", want " << MakeError(*want);
  } else {
    EXPECT_TRUE(s.ok()) << ctx << ": " << s;
  }
}

void CheckRange(const RangeExpectation& e, const RangeResponse& got, const std::string& ctx) {
  EXPECT_EQ(got.header().revision(), e.header_rev) << ctx;
  EXPECT_EQ(got.count(), e.count) << ctx;
  EXPECT_EQ(got.more(), e.more) << ctx;
  ASSERT_EQ(static_cast<size_t>(got.kvs_size()), e.kvs.size()) << ctx;
  if (!e.by_target) {
    for (size_t i = 0; i < e.kvs.size(); ++i) {
      ExpectKv(e.kvs[i], got.kvs(static_cast<int>(i)), e.keys_only, absl::StrCat(ctx, " kv ", i));
    }
    return;
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < e.kvs.size(); ++i) {
    const auto& kv = got.kvs(static_cast<int>(i));
    auto it = e.candidates.find(kv.key());
    ASSERT_NE(it, e.candidates.end()) << ctx << ": unexpected key " << Hex(kv.key());
    ExpectKv(it->second, kv, e.keys_only, absl::StrCat(ctx, " kv ", i));
    EXPECT_TRUE(seen.insert(kv.key()).second) << ctx << ": key twice " << Hex(kv.key());
    EXPECT_EQ(TargetOf(it->second, e.target), TargetOf(e.kvs[i], e.target))
        << ctx << ": sort order at " << i;
  }
}

struct PutExpectation {
  std::optional<Error> error;
  int64_t header_rev = 0;
  std::optional<ModelKv> prev_kv;
};

struct DeleteExpectation {
  std::optional<Error> error;
  int64_t header_rev = 0;
  int64_t deleted = 0;
  std::vector<ModelKv> prev_kvs;
};

struct TxnExpectation;

struct OpExpectation {
  RequestOp::RequestCase kind = RequestOp::REQUEST_NOT_SET;
  RangeExpectation range;
  PutExpectation put;
  DeleteExpectation del;
  std::unique_ptr<TxnExpectation> txn;
};

struct TxnExpectation {
  std::optional<Error> error;
  bool succeeded = false;
  int64_t header_rev = 0;
  std::vector<OpExpectation> ops;
};

struct CompactExpectation {
  std::optional<Error> error;
  int64_t header_rev = 0;
};

// etcd's Put outside a txn (v3rpc checkPutRequest, then apply.go Put).
PutExpectation ModelPut(Model* m, const PutRequest& p) {
  PutExpectation e;
  if (p.key().empty()) {
    e.error = Error::kEmptyKey;
  } else if (p.ignore_value() && !p.value().empty()) {
    e.error = Error::kValueProvided;
  } else if (p.ignore_lease() && p.lease() != 0) {
    e.error = Error::kLeaseProvided;
  } else if (p.lease() != 0) {
    e.error = Error::kLeaseNotFound;  // the store has no leases
  }
  if (e.error) return e;
  const auto prev = m->Get(p.key(), m->rev());
  if ((p.ignore_value() || p.ignore_lease()) && !prev) {
    e.error = Error::kKeyNotFound;
    return e;
  }
  Model::Write w(m);
  w.Put(p.key(), p.ignore_value() ? prev->value : p.value(),
        p.ignore_lease() ? prev->lease : p.lease());
  e.header_rev = w.main();
  if (p.prev_kv()) e.prev_kv = prev;
  w.Commit();
  return e;
}

DeleteExpectation ModelDelete(Model* m, const DeleteRangeRequest& d) {
  DeleteExpectation e;
  if (d.key().empty()) {
    e.error = Error::kEmptyKey;
    return e;
  }
  Model::Write w(m);
  auto kvs = w.Delete(d.key(), d.range_end());
  e.deleted = static_cast<int64_t>(kvs.size());
  if (d.prev_kv()) e.prev_kvs = std::move(kvs);
  e.header_rev = w.header_rev();
  w.Commit();
  return e;
}

CompactExpectation ModelCompact(Model* m, const CompactionRequest& c) {
  CompactExpectation e;
  if (c.revision() <= m->compact_rev()) {
    e.error = Error::kCompacted;
  } else if (c.revision() > m->rev()) {
    e.error = Error::kFutureRev;
  } else {
    m->SetCompactRev(c.revision());
    e.header_rev = m->rev();
  }
  return e;
}

// ---- Txn, as etcd does it. ----

// v3rpc checkTxnRequest / checkRequestOp.
std::optional<Error> CheckTxnRequest(const TxnRequest& r, int max_ops) {
  const int opc = std::max({r.compare_size(), r.success_size(), r.failure_size()});
  if (opc > max_ops) return Error::kTooManyOps;
  for (const auto& c : r.compare()) {
    if (c.key().empty()) return Error::kEmptyKey;
  }
  for (const auto* ops : {&r.success(), &r.failure()}) {
    for (const auto& op : *ops) {
      switch (op.request_case()) {
        case RequestOp::kRequestRange: {
          const auto& rr = op.request_range();
          if (rr.key().empty()) return Error::kEmptyKey;
          if (!RangeRequest::SortOrder_IsValid(rr.sort_order()) ||
              !RangeRequest::SortTarget_IsValid(rr.sort_target())) {
            return Error::kInvalidSortOption;
          }
          break;
        }
        case RequestOp::kRequestPut: {
          const auto& p = op.request_put();
          if (p.key().empty()) return Error::kEmptyKey;
          if (p.ignore_value() && !p.value().empty()) return Error::kValueProvided;
          if (p.ignore_lease() && p.lease() != 0) return Error::kLeaseProvided;
          break;
        }
        case RequestOp::kRequestDeleteRange:
          if (op.request_delete_range().key().empty()) return Error::kEmptyKey;
          break;
        case RequestOp::kRequestTxn:
          if (auto err = CheckTxnRequest(op.request_txn(), max_ops - opc)) return err;
          break;
        default:
          break;
      }
    }
  }
  return std::nullopt;
}

// Half-open intervals ordered affinely (an empty end is +infinity), as
// etcd's adt.StringAffineInterval.
struct Interval {
  std::string begin, end;
};

bool AffineLess(const std::string& a, const std::string& b) {
  if (a.empty()) return false;
  if (b.empty()) return true;
  return a < b;
}

bool Intersects(const std::vector<Interval>& dels, const std::string& k) {
  const std::string k_end = k + std::string(1, '\0');
  for (const auto& iv : dels) {
    if (AffineLess(iv.begin, k_end) && AffineLess(k, iv.end)) return true;
  }
  return false;
}

// v3rpc checkIntervals.
std::optional<Error> CheckIntervals(const RepeatedPtrField<RequestOp>& reqs,
                                    std::set<std::string>* puts_out,
                                    std::vector<Interval>* dels_out) {
  std::vector<Interval> dels;
  for (const auto& req : reqs) {
    if (req.request_case() != RequestOp::kRequestDeleteRange) continue;
    const auto& d = req.request_delete_range();
    dels.push_back({d.key(), d.range_end().empty() ? d.key() + std::string(1, '\0')
                                                    : d.range_end()});
  }
  std::set<std::string> puts;
  for (const auto& req : reqs) {
    if (req.request_case() != RequestOp::kRequestTxn) continue;
    std::set<std::string> puts_then, puts_else;
    std::vector<Interval> dels_then, dels_else;
    if (auto err = CheckIntervals(req.request_txn().success(), &puts_then, &dels_then)) return err;
    if (auto err = CheckIntervals(req.request_txn().failure(), &puts_else, &dels_else)) return err;
    for (const auto& k : puts_then) {
      if (puts.count(k) || Intersects(dels, k)) return Error::kDuplicateKey;
      puts.insert(k);
    }
    for (const auto& k : puts_else) {
      if (puts.count(k) && !puts_then.count(k)) return Error::kDuplicateKey;
      if (Intersects(dels, k)) return Error::kDuplicateKey;
      puts.insert(k);
    }
    dels.insert(dels.end(), dels_then.begin(), dels_then.end());
    dels.insert(dels.end(), dels_else.begin(), dels_else.end());
  }
  for (const auto& req : reqs) {
    if (req.request_case() != RequestOp::kRequestPut) continue;
    const std::string& k = req.request_put().key();
    if (puts.count(k) || Intersects(dels, k)) return Error::kDuplicateKey;
    puts.insert(k);
  }
  if (puts_out) *puts_out = std::move(puts);
  if (dels_out) *dels_out = std::move(dels);
  return std::nullopt;
}

int CompareInt(int64_t a, int64_t b) { return a < b ? -1 : (a > b ? 1 : 0); }

// etcd's compareKV.
bool CompareKv(const Compare& c, const ModelKv& kv) {
  int result = 0;
  switch (c.target()) {
    case Compare::VALUE: {
      const std::string v = c.target_union_case() == Compare::kValue ? c.value() : "";
      result = kv.value.compare(v);
      result = result < 0 ? -1 : (result > 0 ? 1 : 0);
      break;
    }
    case Compare::CREATE:
      result = CompareInt(kv.create,
                          c.target_union_case() == Compare::kCreateRevision ? c.create_revision() : 0);
      break;
    case Compare::MOD:
      result = CompareInt(kv.mod,
                          c.target_union_case() == Compare::kModRevision ? c.mod_revision() : 0);
      break;
    case Compare::VERSION:
      result = CompareInt(kv.version, c.target_union_case() == Compare::kVersion ? c.version() : 0);
      break;
    case Compare::LEASE:
      result = CompareInt(kv.lease, c.target_union_case() == Compare::kLease ? c.lease() : 0);
      break;
    default:
      break;
  }
  switch (c.result()) {
    case Compare::EQUAL: return result == 0;
    case Compare::NOT_EQUAL: return result != 0;
    case Compare::GREATER: return result > 0;
    case Compare::LESS: return result < 0;
    default: return true;
  }
}

// etcd's applyCompare: every key of the range must pass; an empty range
// compares as an empty KeyValue, except that a VALUE compare fails.
bool ApplyCompare(const Model& m, const Compare& c) {
  const auto kvs = m.Range(c.key(), c.range_end(), m.rev());
  if (kvs.empty()) return c.target() != Compare::VALUE && CompareKv(c, ModelKv());
  for (const auto& kv : kvs) {
    if (!CompareKv(c, kv)) return false;
  }
  return true;
}

// etcd's compareToPath: every compare sees the state before the txn.
void CompareToPath(const Model& m, const TxnRequest& r, std::vector<bool>* path) {
  bool ok = true;
  for (const auto& c : r.compare()) {
    if (!ApplyCompare(m, c)) {
      ok = false;
      break;
    }
  }
  path->push_back(ok);
  for (const auto& op : ok ? r.success() : r.failure()) {
    if (op.request_case() == RequestOp::kRequestTxn) CompareToPath(m, op.request_txn(), path);
  }
}

// etcd's checkRequests over the taken path, with checkPut or checkRange.
template <typename Check>
std::optional<Error> CheckRequests(const TxnRequest& r, const std::vector<bool>& path,
                                   size_t* pos, const Check& check) {
  const bool ok = path[(*pos)++];
  for (const auto& op : ok ? r.success() : r.failure()) {
    if (op.request_case() == RequestOp::kRequestTxn) {
      if (auto err = CheckRequests(op.request_txn(), path, pos, check)) return err;
      continue;
    }
    if (auto err = check(op)) return err;
  }
  return std::nullopt;
}

bool IsTxnReadOnly(const TxnRequest& r) {
  for (const auto* ops : {&r.success(), &r.failure()}) {
    for (const auto& op : *ops) {
      if (op.request_case() != RequestOp::kRequestRange) return false;
    }
  }
  return true;
}

// etcd's applyTxn over the taken path. Returns false on an apply-time
// failure, where etcd panics ("unexpected error during txn").
bool ApplyTxnOps(Model* m, Model::Write* w, const TxnRequest& r, const std::vector<bool>& path,
                 size_t* pos, TxnExpectation* e) {
  const bool ok = path[(*pos)++];
  e->succeeded = ok;
  for (const auto& op : ok ? r.success() : r.failure()) {
    OpExpectation oe;
    oe.kind = op.request_case();
    switch (op.request_case()) {
      case RequestOp::kRequestRange:
        oe.range = ExpectRange(*m, op.request_range(), w->read_rev());
        break;
      case RequestOp::kRequestPut: {
        const auto& p = op.request_put();
        const auto prev = m->Get(p.key(), w->read_rev());
        if ((p.ignore_value() || p.ignore_lease()) && !prev) return false;
        w->Put(p.key(), p.ignore_value() ? prev->value : p.value(),
               p.ignore_lease() ? prev->lease : p.lease());
        oe.put.header_rev = w->main();
        if (p.prev_kv()) oe.put.prev_kv = prev;
        break;
      }
      case RequestOp::kRequestDeleteRange: {
        const auto& d = op.request_delete_range();
        auto kvs = w->Delete(d.key(), d.range_end());
        oe.del.deleted = static_cast<int64_t>(kvs.size());
        if (d.prev_kv()) oe.del.prev_kvs = std::move(kvs);
        oe.del.header_rev = w->header_rev();
        break;
      }
      case RequestOp::kRequestTxn:
        oe.txn = std::make_unique<TxnExpectation>();
        if (!ApplyTxnOps(m, w, op.request_txn(), path, pos, oe.txn.get())) return false;
        break;
      default:
        break;
    }
    e->ops.push_back(std::move(oe));
  }
  return true;
}

TxnExpectation ModelTxn(Model* m, const TxnRequest& r, int max_ops) {
  TxnExpectation e;
  if (auto err = CheckTxnRequest(r, max_ops)) {
    e.error = err;
    return e;
  }
  if (auto err = CheckIntervals(r.success(), nullptr, nullptr)) {
    e.error = err;
    return e;
  }
  if (auto err = CheckIntervals(r.failure(), nullptr, nullptr)) {
    e.error = err;
    return e;
  }
  std::vector<bool> path;
  CompareToPath(*m, r, &path);
  size_t pos = 0;
  if (!IsTxnReadOnly(r)) {
    auto err = CheckRequests(r, path, &pos, [m](const RequestOp& op) -> std::optional<Error> {
      if (op.request_case() != RequestOp::kRequestPut) return std::nullopt;
      const auto& p = op.request_put();
      if ((p.ignore_value() || p.ignore_lease()) && !m->Get(p.key(), m->rev())) {
        return Error::kKeyNotFound;
      }
      if (p.lease() != 0) return Error::kLeaseNotFound;
      return std::nullopt;
    });
    if (err) {
      e.error = err;
      return e;
    }
  }
  pos = 0;
  auto err = CheckRequests(r, path, &pos, [m](const RequestOp& op) -> std::optional<Error> {
    if (op.request_case() != RequestOp::kRequestRange) return std::nullopt;
    const int64_t rev = op.request_range().revision();
    if (rev == 0) return std::nullopt;
    if (rev > m->rev()) return Error::kFutureRev;
    if (rev < m->compact_rev()) return Error::kCompacted;
    return std::nullopt;
  });
  if (err) {
    e.error = err;
    return e;
  }
  Model::Write w(m);
  pos = 0;
  // The generator never builds a txn that fails while applying (etcd would
  // panic); see KvStoreTxnCompatTest for that case.
  EXPECT_TRUE(ApplyTxnOps(m, &w, r, path, &pos, &e)) << "model: txn fails while applying";
  e.header_rev = w.header_rev();
  w.Commit();
  return e;
}

void CheckTxn(const TxnExpectation& e, const TxnResponse& got, bool top, const std::string& ctx) {
  EXPECT_EQ(got.succeeded(), e.succeeded) << ctx;
  if (top) {
    EXPECT_EQ(got.header().revision(), e.header_rev) << ctx;
  }
  ASSERT_EQ(static_cast<size_t>(got.responses_size()), e.ops.size()) << ctx;
  for (size_t i = 0; i < e.ops.size(); ++i) {
    const OpExpectation& oe = e.ops[i];
    const ResponseOp& r = got.responses(static_cast<int>(i));
    const std::string op_ctx = absl::StrCat(ctx, " op ", i);
    switch (oe.kind) {
      case RequestOp::kRequestRange:
        ASSERT_EQ(r.response_case(), ResponseOp::kResponseRange) << op_ctx;
        CheckRange(oe.range, r.response_range(), op_ctx + " range");
        break;
      case RequestOp::kRequestPut:
        ASSERT_EQ(r.response_case(), ResponseOp::kResponsePut) << op_ctx;
        EXPECT_EQ(r.response_put().header().revision(), oe.put.header_rev) << op_ctx;
        EXPECT_EQ(r.response_put().has_prev_kv(), oe.put.prev_kv.has_value()) << op_ctx;
        if (oe.put.prev_kv && r.response_put().has_prev_kv()) {
          ExpectKv(*oe.put.prev_kv, r.response_put().prev_kv(), false, op_ctx + " prev_kv");
        }
        break;
      case RequestOp::kRequestDeleteRange: {
        ASSERT_EQ(r.response_case(), ResponseOp::kResponseDeleteRange) << op_ctx;
        const auto& d = r.response_delete_range();
        EXPECT_EQ(d.header().revision(), oe.del.header_rev) << op_ctx;
        EXPECT_EQ(d.deleted(), oe.del.deleted) << op_ctx;
        ASSERT_EQ(static_cast<size_t>(d.prev_kvs_size()), oe.del.prev_kvs.size()) << op_ctx;
        for (size_t j = 0; j < oe.del.prev_kvs.size(); ++j) {
          ExpectKv(oe.del.prev_kvs[j], d.prev_kvs(static_cast<int>(j)), false, op_ctx + " prev_kvs");
        }
        break;
      }
      case RequestOp::kRequestTxn:
        ASSERT_EQ(r.response_case(), ResponseOp::kResponseTxn) << op_ctx;
        CheckTxn(*oe.txn, r.response_txn(), false, op_ctx + " txn");
        break;
      default:
        break;
    }
  }
}

// ---------------------------------------------------------------------------
// Random requests.

const std::vector<std::string>& KeySpace() {
  static const auto* keys = new std::vector<std::string>{
      "a",   "a/0", "a/1", "a/2", "a/3",          std::string("a\0", 2), "a\xff",
      "b",   "b/0", "b/1", "ba",  "c",            "c/0",                 "c/1",
      "z\xff\xff"};
  return *keys;
}

// etcd's prefix end (clientv3 GetPrefixRangeEnd).
std::string PrefixEnd(const std::string& prefix) {
  std::string end = prefix;
  for (int i = static_cast<int>(end.size()) - 1; i >= 0; --i) {
    if (static_cast<unsigned char>(end[i]) < 0xff) {
      end[i] = static_cast<char>(static_cast<unsigned char>(end[i]) + 1);
      end.resize(i + 1);
      return end;
    }
  }
  return kFromKey;
}

class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {}

  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }
  int64_t Uniform64(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  bool OneIn(int n) { return Uniform(0, n - 1) == 0; }
  template <typename T>
  const T& Pick(const std::vector<T>& v) {
    return v[static_cast<size_t>(Uniform(0, static_cast<int>(v.size()) - 1))];
  }

  std::string Key() {
    if (OneIn(15)) return Pick(std::vector<std::string>{"a/", "aa", "b/00", "d", "\xff"});
    return Pick(KeySpace());
  }

  std::string Value() {
    const int dice = Uniform(0, 99);
    if (dice < 40) return Pick(std::vector<std::string>{"", "x", "y", "zz", "v1"});
    std::string v;
    if (dice < 92) {
      const int n = Uniform(1, 12);
      for (int i = 0; i < n; ++i) v.push_back(static_cast<char>('a' + Uniform(0, 25)));
    } else {
      const int n = Uniform(100, 3000);
      for (int i = 0; i < n; ++i) v.push_back(static_cast<char>(Uniform(0, 255)));
    }
    return v;
  }

  // An etcd key range: single key, [k1, k2), prefix, from-key or all keys.
  void Bounds(std::string* key, std::string* end) {
    const int dice = Uniform(0, 99);
    if (dice < 30) {
      *key = Key();
      end->clear();
    } else if (dice < 50) {
      *key = Pick(std::vector<std::string>{"a", "a/", "b", "b/", "c", "c/", "z\xff", "\xff"});
      *end = PrefixEnd(*key);
    } else if (dice < 75) {
      *key = Key();
      *end = Key();
    } else if (dice < 87) {
      *key = Key();
      *end = kFromKey;
    } else if (dice < 95) {
      *key = kFromKey;
      *end = kFromKey;
    } else {
      *key = Key();
      *end = *key;  // empty range
    }
  }

  // A revision to read at: mostly valid (current or retained); with `bad`,
  // sometimes compacted or in the future.
  // A negative revision reads the current one, except inside a txn, where
  // etcd's checkRange finds it below the compaction revision (ErrCompacted),
  // so there it counts as bad.
  int64_t ReadRev(const Model& m, bool bad, bool in_txn) {
    const int dice = Uniform(0, 99);
    if (bad && dice < 8) return m.rev() + Uniform(1, 3);
    if (bad && dice < 16 && m.compact_rev() > 1) return Uniform64(1, m.compact_rev() - 1);
    if (dice < 50) return 0;
    if (dice < 53 && (bad || !in_txn)) return -Uniform(1, 5);
    return Uniform64(std::max<int64_t>(1, m.compact_rev()), m.rev());
  }

  RangeRequest Range(const Model& m, bool bad, bool in_txn = false) {
    RangeRequest r;
    std::string key, end;
    Bounds(&key, &end);
    r.set_key(key);
    r.set_range_end(end);
    r.set_revision(ReadRev(m, bad, in_txn));
    if (OneIn(3)) r.set_limit(OneIn(15) ? -1 : Uniform(1, 5));
    if (OneIn(3)) {
      r.set_sort_order(static_cast<RangeRequest::SortOrder>(Uniform(0, 2)));
      r.set_sort_target(static_cast<RangeRequest::SortTarget>(Uniform(0, 4)));
    }
    if (bad && OneIn(40)) r.set_sort_order(static_cast<RangeRequest::SortOrder>(9));
    if (OneIn(6)) r.set_keys_only(true);
    if (OneIn(10)) r.set_count_only(true);
    if (OneIn(8)) {
      const int64_t lo = std::max<int64_t>(1, m.compact_rev());
      switch (Uniform(0, 3)) {
        case 0: r.set_min_mod_revision(Uniform64(lo, m.rev())); break;
        case 1: r.set_max_mod_revision(Uniform64(lo, m.rev())); break;
        case 2: r.set_min_create_revision(Uniform64(1, m.rev())); break;
        case 3: r.set_max_create_revision(Uniform64(1, m.rev())); break;
      }
    }
    if (bad && OneIn(60)) r.clear_key();
    return r;
  }

  PutRequest Put(const Model& m, bool bad) {
    PutRequest p;
    p.set_key(Key());
    if (OneIn(8) && m.Get(p.key(), m.rev())) {
      p.set_ignore_value(true);
    } else {
      p.set_value(Value());
    }
    if (OneIn(4)) p.set_prev_kv(true);
    if (OneIn(20) && m.Get(p.key(), m.rev())) p.set_ignore_lease(true);
    if (bad) {
      switch (Uniform(0, 30)) {
        case 0: p.clear_key(); break;
        case 1: p.set_lease(7); break;
        case 2: p.set_ignore_value(true); break;  // maybe with a value, maybe a missing key
        case 3: p.set_ignore_lease(true); break;  // maybe a missing key
        case 4:
          p.set_ignore_lease(true);
          p.set_lease(7);
          break;
        default: break;
      }
    }
    return p;
  }

  DeleteRangeRequest Delete(bool bad) {
    DeleteRangeRequest d;
    std::string key, end;
    Bounds(&key, &end);
    d.set_key(key);
    d.set_range_end(end);
    if (OneIn(3)) d.set_prev_kv(true);
    if (bad && OneIn(40)) d.clear_key();
    return d;
  }

  // A txn up to `depth` levels deep. At most one op of the whole txn may fail
  // a check of the taken path (*risky is the budget for it), so that which
  // check fails first never depends on check order: KvStoreTxnCompatTest
  // covers check order.
  TxnRequest Txn(const Model& m, int depth, bool* risky) {
    TxnRequest t;
    const int ncmp = Uniform(0, 2);
    for (int i = 0; i < ncmp; ++i) {
      Compare* c = t.add_compare();
      std::string key, end;
      if (OneIn(4)) {
        Bounds(&key, &end);
      } else {
        key = Key();
      }
      c->set_key(key);
      c->set_range_end(end);
      c->set_target(static_cast<Compare::CompareTarget>(Uniform(0, 4)));
      c->set_result(static_cast<Compare::CompareResult>(Uniform(0, 3)));
      const auto cur = m.Get(key, m.rev());
      const bool use_cur = cur.has_value() && !OneIn(3);
      if (OneIn(25)) continue;  // no target value: compares with the zero value
      switch (c->target()) {
        case Compare::VALUE: {
          std::string v = use_cur ? cur->value : Value();
          if (AvoidKnownBugs() && v.size() > 15) v.resize(Uniform(0, 15));
          c->set_value(v);
          break;
        }
        case Compare::CREATE:
          c->set_create_revision(use_cur ? cur->create : Uniform64(0, m.rev()));
          break;
        case Compare::MOD: c->set_mod_revision(use_cur ? cur->mod : Uniform64(0, m.rev())); break;
        case Compare::VERSION: c->set_version(use_cur ? cur->version : Uniform(0, 4)); break;
        case Compare::LEASE: c->set_lease(OneIn(4) ? 1 : 0); break;
        default: break;
      }
    }
    Ops(m, depth, risky, t.mutable_success());
    Ops(m, depth, risky, t.mutable_failure());
    return t;
  }

 private:
  void Ops(const Model& m, int depth, bool* risky, RepeatedPtrField<RequestOp>* ops) {
    const int n = Uniform(0, 3);
    for (int i = 0; i < n; ++i) {
      RequestOp* op = ops->Add();
      const int dice = Uniform(0, 99);
      if (dice < 35 || (dice >= 85 && depth >= 2)) {
        const bool bad = *risky && OneIn(6);
        *op->mutable_request_range() = Range(m, bad, /*in_txn=*/true);
        const int64_t rev = op->request_range().revision();
        if (rev != 0 && (rev > m.rev() || rev < m.compact_rev())) *risky = false;
      } else if (dice < 65) {
        // Put() sets ignore_value only on keys that exist before the txn.
        PutRequest p = Put(m, false);
        if (*risky && OneIn(8)) {
          *risky = false;
          if (OneIn(2)) {
            p.set_lease(7);
          } else {
            p.set_ignore_value(true);  // maybe a missing key
            p.clear_value();
          }
        }
        *op->mutable_request_put() = p;
      } else if (dice < 85) {
        *op->mutable_request_delete_range() = Delete(false);
      } else {
        *op->mutable_request_txn() = Txn(m, depth + 1, risky);
      }
    }
  }

  std::mt19937_64 rng_;
};

// Visits every op of a txn, nested ones included.
template <typename Visit>
void ForEachOp(TxnRequest* t, const Visit& visit) {
  for (auto* ops : {t->mutable_success(), t->mutable_failure()}) {
    for (auto& op : *ops) {
      visit(&op);
      if (op.request_case() == RequestOp::kRequestTxn) ForEachOp(op.mutable_request_txn(), visit);
    }
  }
}

// Drops the ignore_value / ignore_lease flags of a txn that also has a
// from-key delete: etcd's checkIntervals lets such a delete and a put of a
// key it covers through, and the put then has no previous value while the
// txn applies (etcd panics; KvStore refuses the txn after changing the store,
// see KvStoreTxnCompatTest.RefusedTxnChangesNothing).
void Sanitize(TxnRequest* t, Generator* gen) {
  if (!AvoidKnownBugs()) return;
  bool from_key_delete = false;
  ForEachOp(t, [&](RequestOp* op) {
    if (op->request_case() == RequestOp::kRequestDeleteRange &&
        op->request_delete_range().range_end() == kFromKey) {
      from_key_delete = true;
    }
  });
  if (!from_key_delete) return;
  ForEachOp(t, [&](RequestOp* op) {
    if (op->request_case() != RequestOp::kRequestPut) return;
    PutRequest* p = op->mutable_request_put();
    if (p->ignore_value()) {
      p->set_ignore_value(false);
      p->set_value(gen->Value());
    }
    p->set_ignore_lease(false);
  });
}

// ---------------------------------------------------------------------------
// The harness: one store, one model, one generator.

// Every store of the harness writes through TestBackend (mvcc/test_backend.h),
// which keeps TSan runs free of RocksDB's unnamed write-group frames.
std::unique_ptr<storage::Backend> ForTest(std::unique_ptr<storage::Backend> backend) {
  return std::make_unique<TestBackend>(std::move(backend));
}

// Completion of asynchronously submitted writes.
class Completions {
 public:
  absl::AnyInvocable<void(absl::Status)> Slot(absl::Status* status) {
    std::lock_guard<std::mutex> l(mu_);
    ++outstanding_;
    return [this, status](absl::Status s) {
      std::lock_guard<std::mutex> l(mu_);
      *status = std::move(s);
      if (--outstanding_ == 0) cv_.notify_all();
    };
  }
  void Wait() {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [this] { return outstanding_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int outstanding_ = 0;
};

// A write, its expected outcome and, once submitted, its actual outcome.
struct PendingWrite {
  WriteRequest::Kind kind = WriteRequest::Kind::kPut;
  std::string description;
  std::unique_ptr<google::protobuf::Message> request;
  std::unique_ptr<google::protobuf::Message> response;
  absl::Status status;
  PutExpectation put;
  DeleteExpectation del;
  TxnExpectation txn;
  CompactExpectation compact;
};

class ModelHarness {
 public:
  ModelHarness(uint64_t seed, std::string dir) : seed_(seed), gen_(seed), dir_(std::move(dir)) {}
  ~ModelHarness() { store_.reset(); }

  // Runs `steps` random steps; stops at the first step that fails.
  void Run(int steps) {
    Open();
    if (::testing::Test::HasFailure()) return;
    for (step_ = 0; step_ < steps; ++step_) {
      SCOPED_TRACE(absl::StrCat("seed ", seed_, " step ", step_));
      Step();
      CheckAfterStep();
      if (::testing::Test::HasFailure()) {
        std::string recent;
        for (const auto& d : recent_) absl::StrAppend(&recent, "\n  ", d);
        ADD_FAILURE() << "seed " << seed_ << " failed at step " << step_ << " (rev " << model_.rev()
                      << ", compacted " << model_.compact_rev() << "); last steps:" << recent;
        return;
      }
    }
    store_->WaitCompactionDone();
    CheckStorage();
    CheckAllRetainedRevisions(1000000);
    stats_.final_rev = model_.rev();
  }

  struct Stats {
    int writes = 0, failed_writes = 0, txns = 0, succeeded_txns = 0, bursts = 0, compactions = 0,
        reopens = 0, ranges = 0, storage_checks = 0;
    int64_t final_rev = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  void Note(std::string what) {
    recent_.push_back(absl::StrCat("[", step_, "] ", std::move(what)));
    if (recent_.size() > 12) recent_.pop_front();
  }

  void Open() {
    KvStoreOptions o;
    o.batch_limit = gen_.Pick(std::vector<int>{1, 2, 10000, 10000});
    o.batch_interval = gen_.OneIn(5) ? absl::Milliseconds(1) : absl::ZeroDuration();
    o.compaction_batch_limit = gen_.Pick(std::vector<int>{1, 2, 3, 7, 1000});
    o.compaction_sleep_interval = gen_.OneIn(2) ? absl::ZeroDuration() : absl::Milliseconds(1);
    storage::BackendOptions bo;
    bo.dir = dir_ + "/db";
    bo.sync = false;  // durability across crashes is not what this test checks
    bo.block_cache_bytes = 8 << 20;
    bo.write_buffer_bytes = 1 << 20;
    auto backend = storage::Backend::Open(bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto store = KvStore::Open(o, ForTest(std::move(*backend)));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    Note(absl::StrCat("open batch_limit=", o.batch_limit,
                      " compaction_batch_limit=", o.compaction_batch_limit));
  }

  void Reopen() {
    ++stats_.reopens;
    store_.reset();  // maybe in the middle of a compaction: Open resumes it
    Open();
  }

  // ---- Steps ----

  void Step() {
    const int dice = gen_.Uniform(0, 99);
    if (dice < 25) {
      RunWrites(1);
    } else if (dice < 35) {
      ++stats_.bursts;
      RunWrites(gen_.Uniform(2, 8));
    } else if (dice < 40) {
      Compact();
    } else if (dice < 42) {
      Note("reopen");
      Reopen();
      if (::testing::Test::HasFailure()) return;
      EXPECT_EQ(store_->Rev(), model_.rev()) << "revision after reopen";
      EXPECT_EQ(store_->CompactRev(), model_.compact_rev()) << "compact revision after reopen";
    } else if (dice < 47) {
      Paginate();
    } else {
      // Several writes of mixed kinds, one after the other.
      RunWrites(1);
      RunWrites(1);
    }
  }

  std::unique_ptr<PendingWrite> NewWrite() {
    auto w = std::make_unique<PendingWrite>();
    const int dice = gen_.Uniform(0, 99);
    const bool bad = gen_.OneIn(10);
    if (dice < 40) {
      auto req = std::make_unique<PutRequest>(gen_.Put(model_, bad));
      w->description = "put " + req->ShortDebugString();
      w->put = ModelPut(&model_, *req);
      w->kind = WriteRequest::Kind::kPut;
      w->request = std::move(req);
      w->response = std::make_unique<PutResponse>();
    } else if (dice < 60) {
      auto req = std::make_unique<DeleteRangeRequest>(gen_.Delete(bad));
      w->description = "delete " + req->ShortDebugString();
      w->del = ModelDelete(&model_, *req);
      w->kind = WriteRequest::Kind::kDeleteRange;
      w->request = std::move(req);
      w->response = std::make_unique<DeleteRangeResponse>();
    } else if (dice < 97) {
      bool risky = gen_.OneIn(3);
      auto req = std::make_unique<TxnRequest>(gen_.Txn(model_, 0, &risky));
      Sanitize(req.get(), &gen_);
      if (bad && gen_.OneIn(4)) {
        // A duplicate put.
        auto* p = req->add_success()->mutable_request_put();
        p->set_key("a");
        req->add_success()->mutable_request_put()->set_key("a");
      }
      w->description = "txn " + req->ShortDebugString();
      w->txn = ModelTxn(&model_, *req, store_->options().max_txn_ops);
      w->kind = WriteRequest::Kind::kTxn;
      w->request = std::move(req);
      w->response = std::make_unique<TxnResponse>();
    } else {
      auto req = std::make_unique<CompactionRequest>(CompactRequest());
      w->description = "compact " + req->ShortDebugString();
      w->compact = ModelCompact(&model_, *req);
      w->kind = WriteRequest::Kind::kCompact;
      w->request = std::move(req);
      w->response = std::make_unique<CompactionResponse>();
    }
    return w;
  }

  CompactionRequest CompactRequest() {
    CompactionRequest c;
    const int dice = gen_.Uniform(0, 99);
    if (dice < 6) {
      c.set_revision(model_.rev() + gen_.Uniform(1, 2));
    } else if (dice < 12) {
      c.set_revision(model_.compact_rev() - gen_.Uniform(0, 1));
    } else if (model_.compact_rev() < model_.rev()) {
      // Mostly close to the head, so that recent history is compacted too.
      const int64_t lo = model_.compact_rev() + 1;
      const int64_t hi = model_.rev();
      c.set_revision(gen_.OneIn(2) ? gen_.Uniform64(std::max(lo, hi - 10), hi)
                                   : gen_.Uniform64(lo, hi));
    } else {
      c.set_revision(model_.rev());
    }
    c.set_physical(gen_.OneIn(2));
    return c;
  }

  // Builds n writes (advancing the model in order), submits them all before
  // waiting, so that the committer may group them, then checks every answer.
  void RunWrites(int n) {
    std::vector<std::unique_ptr<PendingWrite>> writes;
    for (int i = 0; i < n; ++i) writes.push_back(NewWrite());
    Completions done;
    for (auto& w : writes) {
      Note(w->description.substr(0, 600));
      store_->Submit({w->kind, w->request.get(), w->response.get(), done.Slot(&w->status)});
    }
    done.Wait();
    for (size_t i = 0; i < writes.size(); ++i) CheckWrite(*writes[i], absl::StrCat("write ", i));
  }

  void CheckWrite(const PendingWrite& w, const std::string& where) {
    const std::string ctx = absl::StrCat(where, " ", w.description.substr(0, 300));
    ++stats_.writes;
    if (!w.status.ok()) ++stats_.failed_writes;
    switch (w.kind) {
      case WriteRequest::Kind::kPut: {
        ExpectStatus(w.status, w.put.error, ctx);
        if (!w.status.ok() || w.put.error) return;
        const auto& resp = static_cast<const PutResponse&>(*w.response);
        EXPECT_EQ(resp.header().revision(), w.put.header_rev) << ctx;
        EXPECT_EQ(resp.has_prev_kv(), w.put.prev_kv.has_value()) << ctx;
        if (resp.has_prev_kv() && w.put.prev_kv) {
          ExpectKv(*w.put.prev_kv, resp.prev_kv(), false, ctx + " prev_kv");
        }
        break;
      }
      case WriteRequest::Kind::kDeleteRange: {
        ExpectStatus(w.status, w.del.error, ctx);
        if (!w.status.ok() || w.del.error) return;
        const auto& resp = static_cast<const DeleteRangeResponse&>(*w.response);
        EXPECT_EQ(resp.header().revision(), w.del.header_rev) << ctx;
        EXPECT_EQ(resp.deleted(), w.del.deleted) << ctx;
        ASSERT_EQ(static_cast<size_t>(resp.prev_kvs_size()), w.del.prev_kvs.size()) << ctx;
        for (size_t j = 0; j < w.del.prev_kvs.size(); ++j) {
          ExpectKv(w.del.prev_kvs[j], resp.prev_kvs(static_cast<int>(j)), false, ctx);
        }
        break;
      }
      case WriteRequest::Kind::kTxn: {
        ++stats_.txns;
        ExpectStatus(w.status, w.txn.error, ctx);
        if (!w.status.ok() || w.txn.error) return;
        const auto& resp = static_cast<const TxnResponse&>(*w.response);
        if (resp.succeeded()) ++stats_.succeeded_txns;
        CheckTxn(w.txn, resp, true, ctx);
        break;
      }
      case WriteRequest::Kind::kCompact: {
        ExpectStatus(w.status, w.compact.error, ctx);
        if (!w.status.ok() || w.compact.error) return;
        ++stats_.compactions;
        const auto& resp = static_cast<const CompactionResponse&>(*w.response);
        EXPECT_EQ(resp.header().revision(), w.compact.header_rev) << ctx;
        break;
      }
      default:
        break;
    }
  }

  void Compact() {
    CompactionRequest c = CompactRequest();
    Note("compact (blocking) " + c.ShortDebugString());
    const CompactExpectation e = ModelCompact(&model_, c);
    auto resp = store_->Compact(c);
    ExpectStatus(resp.status(), e.error, "compact " + c.ShortDebugString());
    if (!resp.ok() || e.error) return;
    ++stats_.compactions;
    EXPECT_EQ(resp->header().revision(), e.header_rev);
    if (c.physical()) CheckStorage();  // answered once the revisions are gone
  }

  // ---- Reads ----

  absl::Status StoreRange(const RangeRequest& req, RangeResponse* out) {
    ++stats_.ranges;
    RangeResult result;
    absl::Status s = store_->Range(req, &result);
    if (!s.ok()) return s;
    out->Clear();
    EXPECT_TRUE(out->ParseFromString(result.kvs_wire));
    EXPECT_EQ(out->kvs_size(), result.num_kvs);
    out->set_count(result.count);
    out->set_more(result.more);
    out->mutable_header()->set_revision(result.rev);
    return absl::OkStatus();
  }

  void CheckRead(const RangeRequest& req, const std::string& what) {
    const std::string ctx = absl::StrCat(what, " ", req.ShortDebugString());
    const RangeExpectation e = ExpectRange(model_, req, model_.rev());
    RangeResponse got;
    absl::Status s = StoreRange(req, &got);
    ExpectStatus(s, e.error, ctx);
    if (s.ok() && !e.error) CheckRange(e, got, ctx);
  }

  RangeRequest AllKeys(int64_t rev) {
    RangeRequest r;
    r.set_key(kFromKey);
    r.set_range_end(kFromKey);
    r.set_revision(rev);
    return r;
  }

  void CheckAfterStep() {
    if (::testing::Test::HasFailure()) return;
    EXPECT_EQ(store_->Rev(), model_.rev()) << "store revision";
    EXPECT_EQ(store_->CompactRev(), model_.compact_rev()) << "compact revision";
    CheckRead(AllKeys(0), "all keys now");
    for (int i = 0; i < 2; ++i) CheckRead(gen_.Range(model_, /*bad=*/true), "random range");
    if (step_ % 10 == 0) {
      for (int i = 0; i < 3; ++i) {
        CheckRead(AllKeys(gen_.Uniform64(std::max<int64_t>(1, model_.compact_rev()), model_.rev())),
                  "all keys in the past");
      }
    }
    if (step_ % 150 == 149) CheckAllRetainedRevisions(400);
    if (step_ % 40 == 39) CheckStorage();
  }

  // Every retained revision (at most the newest `max`), and the edges.
  void CheckAllRetainedRevisions(int64_t max) {
    const int64_t lo = std::max<int64_t>({1, model_.compact_rev(), model_.rev() - max});
    for (int64_t r = lo; r <= model_.rev(); ++r) {
      CheckRead(AllKeys(r), "history");
      if (::testing::Test::HasFailure()) return;
    }
    if (model_.compact_rev() > 1) CheckRead(AllKeys(model_.compact_rev() - 1), "compacted");
    CheckRead(AllKeys(model_.rev() + 1), "future");
  }

  // Pages through every key at one revision, as Kubernetes lists.
  void Paginate() {
    const int64_t rev = gen_.OneIn(2) ? model_.rev()
                                      : gen_.Uniform64(std::max<int64_t>(1, model_.compact_rev()),
                                                       model_.rev());
    const int64_t limit = gen_.Uniform(1, 4);
    Note(absl::StrCat("paginate rev=", rev, " limit=", limit));
    const auto want = model_.Range(kFromKey, kFromKey, rev);
    std::vector<mvccpb::KeyValue> got;
    std::string from = kFromKey;
    for (int page = 0; page < 100; ++page) {
      RangeRequest r;
      r.set_key(from);
      r.set_range_end(kFromKey);
      r.set_revision(rev);
      r.set_limit(limit);
      RangeResponse resp;
      absl::Status s = StoreRange(r, &resp);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(resp.count(), static_cast<int64_t>(want.size()) - static_cast<int64_t>(got.size()))
          << "page " << page;
      for (const auto& kv : resp.kvs()) got.push_back(kv);
      if (!resp.more()) break;
      ASSERT_GT(resp.kvs_size(), 0);
      from = resp.kvs(resp.kvs_size() - 1).key() + std::string(1, '\0');
    }
    ASSERT_EQ(got.size(), want.size()) << "paginated keys at " << rev;
    for (size_t i = 0; i < want.size(); ++i) ExpectKv(want[i], got[i], false, "paginated");
  }

  // After the compaction is done, the backend holds exactly the records etcd
  // keeps: nothing compacted is left behind, nothing retained is lost.
  void CheckStorage() {
    ++stats_.storage_checks;
    store_->WaitCompactionDone();
    const auto want = model_.ExpectedRecords();
    std::map<std::string, std::string> have;
    auto it = store_->backend()->NewIterator(storage::Cf::kKey);
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      have.emplace(std::string(it->key()), std::string(it->value()));
    }
    ASSERT_TRUE(it->status().ok()) << it->status();
    it.reset();
    auto name = [](const std::string& rev_key) {
      Revision r;
      bool tombstone = false;
      if (!ParseRevisionKey(rev_key, &r, &tombstone)) return "?" + Hex(rev_key);
      return absl::StrCat(r.main, "_", r.sub, tombstone ? "t" : "");
    };
    std::string missing, extra;
    for (const auto& [k, kv] : want) {
      if (!have.count(k)) absl::StrAppend(&missing, " ", name(k));
    }
    for (const auto& [k, v] : have) {
      if (!want.count(k)) absl::StrAppend(&extra, " ", name(k));
    }
    EXPECT_TRUE(missing.empty()) << "records lost (compacted at " << model_.compact_rev()
                                 << "):" << missing;
    EXPECT_TRUE(extra.empty()) << "records left behind by compaction at "
                               << model_.compact_rev() << ":" << extra;
    for (const auto& [k, kv] : want) {
      auto h = have.find(k);
      if (h == have.end()) continue;
      KeyValueView got;
      ASSERT_TRUE(DecodeKeyValue(h->second, &got)) << name(k);
      if (!kv) continue;  // a tombstone: its key comes from the index
      EXPECT_EQ(Hex(got.key), Hex(kv->key)) << name(k);
      EXPECT_EQ(Hex(got.value), Hex(kv->value)) << name(k);
      EXPECT_EQ(got.create_revision, kv->create) << name(k);
      EXPECT_EQ(got.mod_revision, kv->mod) << name(k);
      EXPECT_EQ(got.version, kv->version) << name(k);
    }
  }

  const uint64_t seed_;
  Generator gen_;
  const std::string dir_;
  Model model_;
  std::unique_ptr<KvStore> store_;
  int step_ = 0;
  std::deque<std::string> recent_;
  Stats stats_;
};

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/capstan-model-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void RunSeed(uint64_t seed, int steps) {
  TempDir dir;
  ModelHarness h(seed, dir.path());
  h.Run(steps);
  const auto& s = h.stats();
  std::printf(
      "seed %llu: %d steps, rev %lld, %d writes (%d refused), %d txns (%d succeeded), %d bursts, "
      "%d compactions, %d reopens, %d ranges, %d storage checks\n",
      static_cast<unsigned long long>(seed), steps, static_cast<long long>(s.final_rev), s.writes,
      s.failed_writes, s.txns, s.succeeded_txns, s.bursts, s.compactions, s.reopens, s.ranges,
      s.storage_checks);
}

class KvStoreModelTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(KvStoreModelTest, RandomOperationsMatchTheModel) { RunSeed(GetParam(), 700); }

INSTANTIATE_TEST_SUITE_P(Seeds, KvStoreModelTest, ::testing::Values(1, 2, 3, 4, 5));

// CAPSTAN_MODEL_SEED / CAPSTAN_MODEL_STEPS: reproduce a seed or soak.
TEST(KvStoreModelEnvTest, FromEnvironment) {
  const char* seed = std::getenv("CAPSTAN_MODEL_SEED");
  if (seed == nullptr) GTEST_SKIP() << "set CAPSTAN_MODEL_SEED (and CAPSTAN_MODEL_STEPS)";
  const char* steps = std::getenv("CAPSTAN_MODEL_STEPS");
  RunSeed(std::strtoull(seed, nullptr, 10), steps ? std::atoi(steps) : 3000);
}

// ---------------------------------------------------------------------------
// Single behaviours that differ from etcd or from KvStore's contract.

class KvStoreTxnCompatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    storage::BackendOptions bo;
    bo.dir = dir_.path() + "/db";
    bo.sync = false;
    auto backend = storage::Backend::Open(bo);
    ASSERT_TRUE(backend.ok()) << backend.status();
    auto store = KvStore::Open(KvStoreOptions(), ForTest(std::move(*backend)));
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }
  void TearDown() override { store_.reset(); }

  int64_t Put(const std::string& k, const std::string& v) {
    PutRequest p;
    p.set_key(k);
    p.set_value(v);
    auto resp = store_->Put(p);
    EXPECT_TRUE(resp.ok()) << resp.status();
    return resp.ok() ? resp->header().revision() : -1;
  }
  int Count(const std::string& k, int64_t rev = 0) {
    RangeRequest r;
    r.set_key(k);
    r.set_revision(rev);
    RangeResult result;
    EXPECT_TRUE(store_->Range(r, &result).ok());
    return static_cast<int>(result.count);
  }

  TempDir dir_;
  std::unique_ptr<KvStore> store_;
};

// kv_store_apply.cc, Applier::Txn: "every check that can refuse a request runs
// before its first change". A delete with range_end "\0" (from-key) escapes
// CheckIntervals (its interval [key, "\0") is empty under affine ordering, as
// in etcd's checkIntervals), and CheckPath checks ignore_value against the
// state before the txn. So this txn deletes "k", then its put finds no "k"
// and returns kKeyNotFound from the middle of ApplyTxn: the tombstone is
// already in the live index and in batch_, which is written with the group.
// The next write reuses the revision and publishes the refused delete; a put
// of "k" at that point crashes (KeyIndex::Put: smaller revision).
// etcd 3.5 panics on this txn ("unexpected error during txn").
TEST_F(KvStoreTxnCompatTest, RefusedTxnChangesNothing) {
  ASSERT_EQ(Put("k", "v"), 2);
  TxnRequest t;
  auto* d = t.add_success()->mutable_request_delete_range();
  d->set_key("a");
  d->set_range_end(kFromKey);
  auto* p = t.add_success()->mutable_request_put();
  p->set_key("k");
  p->set_ignore_value(true);
  auto resp = store_->Txn(t);
  EXPECT_FALSE(resp.ok()) << "the put has no previous value to keep";
  EXPECT_EQ(store_->Rev(), 2);
  EXPECT_EQ(Count("k"), 1);
  // Any later write publishes what the refused txn left behind.
  EXPECT_EQ(Put("other", "x"), 3);
  EXPECT_EQ(Count("k"), 1) << "a refused txn deleted k at revision 3";
  EXPECT_EQ(Count("k", 3), 1);
}

// kv_store_apply.cc:153, CompareKv: `std::string_view v = ... ? c.value() :
// "";` binds the view to a temporary std::string (the conditional's type), so
// a VALUE compare longer than the inline capacity reads freed memory.
TEST_F(KvStoreTxnCompatTest, TxnCompareLongValue) {
  const std::string value(64, 'x');
  Put("k", value);
  TxnRequest t;
  auto* c = t.add_compare();
  c->set_key("k");
  c->set_target(Compare::VALUE);
  c->set_result(Compare::EQUAL);
  c->set_value(value);
  auto resp = store_->Txn(t);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_TRUE(resp->succeeded()) << "the value equals the compared one";
  c->set_result(Compare::LESS);
  c->set_value(std::string(64, 'y'));
  resp = store_->Txn(t);
  ASSERT_TRUE(resp.ok()) << resp.status();
  EXPECT_TRUE(resp->succeeded()) << "x... < y...";
}

// kv_store_apply.cc, ValidateTxn: etcd's checkTxnRequest gives each op of a
// txn the budget max_txn_ops - opc, with opc = max(#compare, #success,
// #failure). KvStore gives the success ops max_txn_ops - #success and the
// failure ops max_txn_ops - #failure, so it accepts nested txns that etcd
// refuses with "too many operations in txn request".
TEST_F(KvStoreTxnCompatTest, NestedTxnBudgetCountsTheWidestPart) {
  TxnRequest t;
  for (int i = 0; i < 100; ++i) {
    auto* c = t.add_compare();
    c->set_key("c" + std::to_string(i));
    c->set_target(Compare::VERSION);
    c->set_result(Compare::EQUAL);
    c->set_version(0);
  }
  TxnRequest* nested = t.add_success()->mutable_request_txn();
  for (int i = 0; i < 50; ++i) {
    nested->add_success()->mutable_request_put()->set_key("k" + std::to_string(i));
  }
  // etcd: opc = 100, so the nested txn may hold 128 - 100 = 28 ops.
  EXPECT_TRUE(Is(store_->Txn(t).status(), Error::kTooManyOps));
  EXPECT_EQ(store_->Rev(), 1);
}

// kv_store_apply.cc, Applier::CheckPath: etcd (apply.go Txn) runs checkPut
// over the whole taken path first, then checkRange; KvStore checks op by op,
// so a txn with a bad range before a bad put answers a different error.
TEST_F(KvStoreTxnCompatTest, TxnChecksPutsBeforeRanges) {
  TxnRequest t;
  t.add_success()->mutable_request_range()->set_key("a");
  t.mutable_success(0)->mutable_request_range()->set_revision(100);  // future
  auto* p = t.add_success()->mutable_request_put();
  p->set_key("missing");
  p->set_ignore_value(true);
  auto resp = store_->Txn(t);
  EXPECT_TRUE(Is(resp.status(), Error::kKeyNotFound)) << resp.status();
}

// kv_store_apply.cc, Applier::CheckPath: etcd's checkPut tests
// ignore_value/ignore_lease (key not found) before the lease; KvStore tests
// the lease first.
TEST_F(KvStoreTxnCompatTest, TxnPutChecksKeyBeforeLease) {
  TxnRequest t;
  auto* p = t.add_success()->mutable_request_put();
  p->set_key("missing");
  p->set_ignore_value(true);
  p->set_lease(7);
  auto resp = store_->Txn(t);
  EXPECT_TRUE(Is(resp.status(), Error::kKeyNotFound)) << resp.status();
}

}  // namespace
}  // namespace capstan::mvcc
