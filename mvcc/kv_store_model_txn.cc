// The model's Txn, as etcd does it (kv_store_model.h).

#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "mvcc/kv_store_model.h"

namespace capstan::mvcc::model_test {
namespace {

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

}  // namespace

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

}  // namespace capstan::mvcc::model_test
