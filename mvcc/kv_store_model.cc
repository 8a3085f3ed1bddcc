// The model's Range, Put, DeleteRange and Compact (kv_store_model.h).

#include "mvcc/kv_store_model.h"

#include <algorithm>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace capstan::mvcc::model_test {

bool AvoidKnownBugs() {
  static const bool avoid = std::getenv("CAPSTAN_MODEL_ALL") == nullptr;
  return avoid;
}

std::string Hex(std::string_view s) { return absl::CHexEscape(absl::string_view(s.data(), s.size())); }

namespace {

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

}  // namespace

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
  if (c.revision() < m->compact_rev() || (c.revision() == m->compact_rev() && m->compacted())) {
    e.error = Error::kCompacted;
  } else if (c.revision() > m->rev()) {
    e.error = Error::kFutureRev;
  } else {
    m->SetCompactRev(c.revision());
    e.header_rev = m->rev();
  }
  return e;
}

}  // namespace capstan::mvcc::model_test
