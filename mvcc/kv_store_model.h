// The model that capstan_mvcc_model_test checks KvStore against: every
// change of every key by revision, and etcd 3.5's answers to Range, Put,
// DeleteRange, Txn and Compact computed from it (server/etcdserver/apply.go,
// api/v3rpc/key.go, server/mvcc/kvstore_txn.go), quirks included: a Range
// with a sort target other than KEY, no sort order and a limit sorts only
// the first limit+1 keys; the txn put checks run before the range checks.
//
// Test code only (kv_store_model_test.cc, kv_store_txn_compat_test.cc);
// not part of capstan_mvcc. Used by one thread at a time.

#ifndef CAPSTAN_MVCC_KV_STORE_MODEL_H_
#define CAPSTAN_MVCC_KV_STORE_MODEL_H_

#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "etcdserverpb/rpc.pb.h"
#include "mvcc/errors.h"
#include "mvcc/revision_key.h"
#include "mvcc/test_backend.h"
#include "storage/backend.h"

namespace capstan::mvcc::model_test {

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

inline const std::string kFromKey(1, '\0');  // range_end: every key >= key

// Steers the random test around the bugs that KvStoreTxnCompatTest shows, so
// that it goes on finding new ones; CAPSTAN_MODEL_ALL=1 turns this off.
// Remove each workaround with its fix:
//  - compare values stay within std::string's inline capacity (15 bytes):
//    TxnCompareLongValue;
//  - no ignore_value/ignore_lease put in a txn with a from-key delete:
//    RefusedTxnChangesNothing (etcd panics on such txns; see Sanitize).
bool AvoidKnownBugs();

// `s` with its bytes C-escaped, for failure messages.
std::string Hex(std::string_view s);

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
  // A compaction was ever made (at 0 included): etcd takes a compaction at 0
  // only on a store never compacted.
  bool compacted() const { return compacted_; }
  void SetCompactRev(int64_t rev) {
    compact_rev_ = rev;
    compacted_ = true;
  }

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
  // of the older ones only each key's last change, if it is a put or a
  // tombstone at exactly the compaction revision (etcd 3.5.16's
  // keyIndex.compact).
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
      } else if (last_compacted != nullptr && last_compacted->rev.main == compact_rev_) {
        out[RevisionKey(last_compacted->rev, true)] = std::nullopt;
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
  bool compacted_ = false;
  std::map<std::string, std::vector<ModelChange>> history_;
};

// ---------------------------------------------------------------------------
// Expected responses.

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

// etcd's Range (apply.go executeRange + kvstore_txn.go rangeKeys) at the
// store revision `current`.
RangeExpectation ExpectRange(const Model& m, const RangeRequest& req, int64_t current);
// EXPECTs that `got` is `want` (its value empty with keys_only).
void ExpectKv(const ModelKv& want, const mvccpb::KeyValue& got, bool keys_only,
              const std::string& ctx);
// EXPECTs that `s` is OK, or the error `want`.
void ExpectStatus(const absl::Status& s, const std::optional<Error>& want, const std::string& ctx);
void CheckRange(const RangeExpectation& e, const RangeResponse& got, const std::string& ctx);

// etcd's Put outside a txn (v3rpc checkPutRequest, then apply.go Put).
PutExpectation ModelPut(Model* m, const PutRequest& p);
DeleteExpectation ModelDelete(Model* m, const DeleteRangeRequest& d);
CompactExpectation ModelCompact(Model* m, const CompactionRequest& c);
// etcd's Txn: checkTxnRequest, checkIntervals, the compares, checkPut and
// checkRange over the taken path, then applyTxn (kv_store_model_txn.cc).
TxnExpectation ModelTxn(Model* m, const TxnRequest& r, int max_ops);
void CheckTxn(const TxnExpectation& e, const TxnResponse& got, bool top, const std::string& ctx);

// ---------------------------------------------------------------------------
// Fixtures shared by the model test and KvStoreTxnCompatTest.

// Every store of the harness writes through TestBackend (mvcc/test_backend.h),
// which keeps TSan runs free of RocksDB's unnamed write-group frames.
inline std::unique_ptr<storage::Backend> ForTest(std::unique_ptr<storage::Backend> backend) {
  return std::make_unique<TestBackend>(std::move(backend));
}

// A fresh directory, removed with everything in it on destruction.
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

}  // namespace capstan::mvcc::model_test

#endif  // CAPSTAN_MVCC_KV_STORE_MODEL_H_
