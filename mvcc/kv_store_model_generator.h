// Random requests for capstan_mvcc_model_test: keys from a small key space
// (with a NUL byte and 0xff bytes in some) so that keys are reused, deleted
// and recreated all the time; ranges of every shape; txns with compares and
// nested txns; compactions. Test code only. A Generator is used by one
// thread at a time.

#ifndef CAPSTAN_MVCC_KV_STORE_MODEL_GENERATOR_H_
#define CAPSTAN_MVCC_KV_STORE_MODEL_GENERATOR_H_

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "mvcc/kv_store_model.h"

namespace capstan::mvcc::model_test {

inline const std::vector<std::string>& KeySpace() {
  static const auto* keys = new std::vector<std::string>{
      "a",   "a/0", "a/1", "a/2", "a/3",          std::string("a\0", 2), "a\xff",
      "b",   "b/0", "b/1", "ba",  "c",            "c/0",                 "c/1",
      "z\xff\xff"};
  return *keys;
}

// etcd's prefix end (clientv3 GetPrefixRangeEnd).
inline std::string PrefixEnd(const std::string& prefix) {
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
inline void Sanitize(TxnRequest* t, Generator* gen) {
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

}  // namespace capstan::mvcc::model_test

#endif  // CAPSTAN_MVCC_KV_STORE_MODEL_GENERATOR_H_
