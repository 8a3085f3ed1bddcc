// The committer's side of KvStore: group commit and the application of
// Put, DeleteRange, Txn and Compact to the live (unpublished) state.

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "mvcc/errors.h"
#include "mvcc/kv_codec.h"
#include "mvcc/kv_range.h"
#include "mvcc/kv_store.h"
#include "mvcc/meta_keys.h"
#include "mvcc/revision_key.h"
#include "mvcc/watch_hub.h"
#include "spdlog/spdlog.h"
#include "util/check.h"

namespace capstan::mvcc {

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
using storage::Cf;

namespace {

// ---- Request validation, as etcd's v3rpc does before proposing. ----

absl::Status ValidatePut(const PutRequest& r) {
  if (r.key().empty()) return MakeError(Error::kEmptyKey);
  if (r.ignore_value() && !r.value().empty()) return MakeError(Error::kValueProvided);
  if (r.ignore_lease() && r.lease() != 0) return MakeError(Error::kLeaseProvided);
  return absl::OkStatus();
}

absl::Status ValidateDelete(const DeleteRangeRequest& r) {
  if (r.key().empty()) return MakeError(Error::kEmptyKey);
  return absl::OkStatus();
}

absl::Status ValidateTxn(const TxnRequest& r, int max_ops);

absl::Status ValidateOp(const RequestOp& op, int max_ops) {
  switch (op.request_case()) {
    case RequestOp::kRequestRange: return ValidateRange(op.request_range());
    case RequestOp::kRequestPut: return ValidatePut(op.request_put());
    case RequestOp::kRequestDeleteRange: return ValidateDelete(op.request_delete_range());
    case RequestOp::kRequestTxn: return ValidateTxn(op.request_txn(), max_ops);
    default: return MakeError(Error::kKeyNotFound);  // an empty op, as etcd answers it
  }
}

absl::Status ValidateTxn(const TxnRequest& r, int max_ops) {
  // etcd's checkTxnRequest: the widest part counts, and nested txns get
  // what it leaves of the budget.
  const int widest = std::max({r.compare_size(), r.success_size(), r.failure_size()});
  if (widest > max_ops) return MakeError(Error::kTooManyOps);
  for (const auto& c : r.compare()) {
    if (c.key().empty()) return MakeError(Error::kEmptyKey);
  }
  for (const auto& op : r.success()) {
    if (auto s = ValidateOp(op, max_ops - widest); !s.ok()) return s;
  }
  for (const auto& op : r.failure()) {
    if (auto s = ValidateOp(op, max_ops - widest); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// Half-open key intervals with etcd's affine ordering: an empty end is
// +infinity. A point k is [k, k + "\0").
struct Interval {
  std::string begin, end;
};

bool AffineLess(const std::string& a, const std::string& b) {
  if (a.empty()) return false;
  if (b.empty()) return true;
  return a < b;
}

bool IntersectsPoint(const std::vector<Interval>& dels, const std::string& k) {
  const std::string k_end = k + std::string(1, '\0');
  for (const auto& iv : dels) {
    // [b, e) intersects [k, k\0) iff b < k\0 and k < e.
    if (AffineLess(iv.begin, k_end) && AffineLess(k, iv.end)) return true;
  }
  return false;
}

// etcd's checkIntervals: a txn may not put one key twice, nor put a key that
// the same txn deletes (then/else branches of a nested txn excepted).
absl::Status CheckIntervals(const google::protobuf::RepeatedPtrField<RequestOp>& reqs,
                            std::set<std::string>* puts_out, std::vector<Interval>* dels_out) {
  std::vector<Interval> dels;
  for (const auto& req : reqs) {
    if (req.request_case() != RequestOp::kRequestDeleteRange) continue;
    const auto& d = req.request_delete_range();
    if (!d.range_end().empty()) {
      dels.push_back({d.key(), d.range_end()});
    } else {
      dels.push_back({d.key(), d.key() + std::string(1, '\0')});
    }
  }
  std::set<std::string> puts;
  for (const auto& req : reqs) {
    if (req.request_case() != RequestOp::kRequestTxn) continue;
    std::set<std::string> puts_then, puts_else;
    std::vector<Interval> dels_then, dels_else;
    if (auto s = CheckIntervals(req.request_txn().success(), &puts_then, &dels_then); !s.ok()) {
      return s;
    }
    if (auto s = CheckIntervals(req.request_txn().failure(), &puts_else, &dels_else); !s.ok()) {
      return s;
    }
    for (const auto& k : puts_then) {
      if (puts.count(k) || IntersectsPoint(dels, k)) return MakeError(Error::kDuplicateKey);
      puts.insert(k);
    }
    for (const auto& k : puts_else) {
      if (puts.count(k) && !puts_then.count(k)) return MakeError(Error::kDuplicateKey);
      if (IntersectsPoint(dels, k)) return MakeError(Error::kDuplicateKey);
      puts.insert(k);
    }
    dels.insert(dels.end(), dels_then.begin(), dels_then.end());
    dels.insert(dels.end(), dels_else.begin(), dels_else.end());
  }
  for (const auto& req : reqs) {
    if (req.request_case() != RequestOp::kRequestPut) continue;
    const std::string& k = req.request_put().key();
    if (puts.count(k) || IntersectsPoint(dels, k)) return MakeError(Error::kDuplicateKey);
    puts.insert(k);
  }
  if (puts_out) *puts_out = std::move(puts);
  if (dels_out) *dels_out = std::move(dels);
  return absl::OkStatus();
}

absl::Status ValidateWholeTxn(const TxnRequest& r, int max_ops) {
  if (auto s = ValidateTxn(r, max_ops); !s.ok()) return s;
  if (auto s = CheckIntervals(r.success(), nullptr, nullptr); !s.ok()) return s;
  return CheckIntervals(r.failure(), nullptr, nullptr);
}

int CompareInt(int64_t a, int64_t b) { return a < b ? -1 : (a > b ? 1 : 0); }

// etcd's compareKV.
bool CompareKv(const Compare& c, const KeyValueView& kv) {
  int result = 0;
  switch (c.target()) {
    case Compare::VALUE: {
      std::string_view v;
      if (c.target_union_case() == Compare::kValue) v = c.value();
      result = kv.value.compare(v);
      result = result < 0 ? -1 : (result > 0 ? 1 : 0);
      break;
    }
    case Compare::CREATE:
      result = CompareInt(kv.create_revision,
                          c.target_union_case() == Compare::kCreateRevision ? c.create_revision() : 0);
      break;
    case Compare::MOD:
      result = CompareInt(kv.mod_revision,
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

}  // namespace

absl::Status ValidateWrite(const PutRequest& r, int) { return ValidatePut(r); }
absl::Status ValidateWrite(const DeleteRangeRequest& r, int) { return ValidateDelete(r); }
absl::Status ValidateWrite(const TxnRequest& r, int max_txn_ops) {
  return ValidateWholeTxn(r, max_txn_ops);
}
absl::Status ValidateWrite(const etcdserverpb::CompactionRequest&, int) {
  return absl::OkStatus();
}

// Applies one write request to the committer's live state. Every check that
// can refuse a request runs before its first change, so a refused request
// changes nothing.
//
// WrittenEarlier: a watcher's prev_kv is the key as it was before the whole
// request (etcd reads it at the event's mod_revision - 1), while reads inside
// a txn see the txn's own earlier writes (a put followed by a from-key delete
// of the same key). An event on a key this request already wrote therefore
// leaves prev_kv unknown, and the hub looks it up at rev - 1 once the
// revision is published.
class KvStore::Applier {
 public:
  explicit Applier(KvStore* store)
      : s_(store),
        hub_(store->hub_.load(std::memory_order_acquire)),
        main_(store->current_rev_ + 1),
        sub_(0) {}

  // The revision this request's changes get, and whether it made any.
  int64_t main() const { return main_; }
  bool changed() const { return sub_ > 0; }
  // Reads inside a request see its own earlier changes.
  int64_t read_rev() const { return sub_ > 0 ? main_ : s_->current_rev_; }

  absl::Status Put(const PutRequest& r, PutResponse* resp, bool checked) {
    if (!checked) {
      if (auto s = ValidatePut(r); !s.ok()) return s;
      if (r.lease() != 0 && !s_->LeaseExists(r.lease())) return MakeError(Error::kLeaseNotFound);
    }
    std::vector<std::string> prev;
    if (r.ignore_value() || r.ignore_lease() || r.prev_kv()) {
      if (auto s = ReadKvs(r.key(), "", read_rev(), &prev); !s.ok()) return s;
    }
    KeyValueView prev_kv;
    if (!prev.empty()) CHECK(DecodeKeyValue(prev[0], &prev_kv));
    if ((r.ignore_value() || r.ignore_lease()) && prev.empty()) {
      return MakeError(Error::kKeyNotFound);
    }
    std::string_view value = r.ignore_value() ? prev_kv.value : std::string_view(r.value());
    std::string corrupted;
    if (!s_->options_.failpoint_value_suffix.empty()) {
      corrupted = std::string(value) + s_->options_.failpoint_value_suffix;
      value = corrupted;
    }
    const int64_t lease = r.ignore_lease() ? prev_kv.lease : r.lease();
    if (r.prev_kv() && !prev.empty()) resp->mutable_prev_kv()->ParseFromString(prev[0]);

    Revision created, modified;
    int64_t version = 0;
    const Revision rev{main_, sub_};
    if (!s_->index_->Unpublished().Get(r.key(), read_rev(), &modified, &created, &version).ok()) {
      created = rev;
      version = 0;
    }
    KeyValueView kv;
    kv.key = r.key();
    kv.create_revision = created.main;
    kv.mod_revision = main_;
    kv.version = version + 1;
    kv.value = value;
    kv.lease = lease;
    std::string record = EncodeKeyValue(kv);
    if (hub_) {
      WatchEvent ev;
      ev.rev = main_;
      ev.key = r.key();
      ev.kv = record;
      if (version == 0) {
        ev.prev_known = true;  // a create has no previous value
      } else if (modified.main == main_) {
        // Written earlier in this request: left to the hub (WrittenEarlier).
      } else if (!prev.empty()) {
        ev.prev_kv = prev[0];
        ev.has_prev = ev.prev_known = true;
      } else if (hub_->WantsPrevKv()) {
        std::vector<std::string> recs;
        if (s_->ReadRecords({modified}, &recs, true).ok()) {
          ev.prev_kv = std::move(recs[0]);
          ev.has_prev = ev.prev_known = true;
        }
      }
      s_->group_events_.push_back(std::move(ev));
    }
    const std::string rev_key = RevisionKey(rev);
    s_->batch_.Put(Cf::kKey, rev_key, record);
    s_->pending_[rev] = std::move(record);
    s_->index_->Put(r.key(), rev, lease);  // a keys_only Range reads the lease there
    s_->lessor_.Attach(r.key(), lease);
    ++sub_;
    resp->mutable_header()->set_revision(main_);
    s_->stat_puts_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  absl::Status DeleteRange(const DeleteRangeRequest& r, DeleteRangeResponse* resp, bool checked) {
    if (!checked) {
      if (auto s = ValidateDelete(r); !s.ok()) return s;
    }
    std::vector<std::pair<std::string, Revision>> keys;
    s_->index_->Unpublished().Range(r.key(), r.range_end(), read_rev(),
                                   [&keys](std::string_view k, const index::RangeHit& hit) {
                                     keys.emplace_back(std::string(k), hit.modified);
                                     return true;
                                   });
    std::vector<std::string> records;
    const bool want_prev = hub_ && hub_->WantsPrevKv();
    if ((r.prev_kv() || want_prev) && !keys.empty()) {
      std::vector<Revision> revs;
      for (const auto& k : keys) revs.push_back(k.second);
      if (auto s = s_->ReadRecords(revs, &records, true); !s.ok()) return s;
      if (r.prev_kv()) {
        for (const auto& rec : records) resp->add_prev_kvs()->ParseFromString(rec);
      }
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::string& key = keys[i].first;
      const Revision rev{main_, sub_};
      KeyValueView tomb;
      tomb.key = key;
      if (hub_) {
        WatchEvent ev;
        ev.is_delete = true;
        ev.rev = main_;
        ev.key = key;
        KeyValueView del;
        del.key = key;
        del.mod_revision = main_;
        ev.kv = EncodeKeyValue(del);
        if (!records.empty() && keys[i].second.main != main_) {
          ev.prev_kv = records[i];
          ev.has_prev = ev.prev_known = true;
        }  // else unread, or written earlier in this request (WrittenEarlier)
        s_->group_events_.push_back(std::move(ev));
      }
      s_->batch_.Put(Cf::kKey, RevisionKey(rev, /*tombstone=*/true), EncodeKeyValue(tomb));
      CHECK(s_->index_->Tombstone(key, rev).ok()) << "tombstone of a live key failed";
      s_->lessor_.Attach(key, 0);
      ++sub_;
    }
    resp->set_deleted(static_cast<int64_t>(keys.size()));
    resp->mutable_header()->set_revision(changed() ? main_ : s_->current_rev_);
    s_->stat_deletes_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  // Deletes every key of the lease in this request's revision, then the
  // lease itself.
  absl::Status LeaseRevoke(const etcdserverpb::LeaseRevokeRequest& r,
                           etcdserverpb::LeaseRevokeResponse* resp) {
    if (!s_->lessor_.Exists(r.id())) return MakeError(Error::kLeaseNotFound);
    const std::vector<std::string> keys = s_->lessor_.Get(r.id(), /*with_keys=*/true)->keys;
    for (const auto& key : keys) {
      DeleteRangeRequest d;
      d.set_key(key);
      DeleteRangeResponse unused;
      if (auto s = DeleteRange(d, &unused, /*checked=*/true); !s.ok()) return s;
    }
    s_->batch_.Delete(Cf::kLease, lease::LeaseKey(r.id()));
    s_->lessor_.Revoke(r.id());
    s_->stat_lease_revokes_.fetch_add(1, std::memory_order_relaxed);
    resp->mutable_header()->set_revision(changed() ? main_ : s_->current_rev_);
    return absl::OkStatus();
  }

  // validated: the caller already ran ValidateWrite on r.
  absl::Status Txn(const TxnRequest& r, TxnResponse* resp, bool validated) {
    if (!validated) {
      if (auto s = ValidateWholeTxn(r, s_->options_.max_txn_ops); !s.ok()) return s;
    }
    // Every compare of the txn and its nested txns sees the state before it.
    std::vector<bool> path;
    if (auto s = CompareToPath(r, &path); !s.ok()) return s;
    for (CheckPass pass : {CheckPass::kPuts, CheckPass::kRanges}) {
      size_t pos = 0;
      std::vector<Interval> deleted;
      if (auto s = CheckPath(r, path, &pos, pass, &deleted); !s.ok()) return s;
    }
    size_t pos = 0;
    if (auto s = ApplyTxn(r, path, &pos, resp); !s.ok()) {
      // Everything that can refuse a txn was checked above; failing once
      // changes are staged would leave half a txn behind.
      CHECK(!changed()) << "txn failed after changing the store: " << s;
      return s;
    }
    resp->mutable_header()->set_revision(changed() ? main_ : s_->current_rev_);
    s_->stat_txns_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }

 private:
  // Reads the records of the keys in [key, end) alive at rev.
  absl::Status ReadKvs(const std::string& key, const std::string& end, int64_t rev,
                       std::vector<std::string>* out) {
    std::vector<Revision> revs;
    s_->index_->Unpublished().Range(key, end, rev, [&revs](std::string_view, const index::RangeHit& h) {
      revs.push_back(h.modified);
      return true;
    });
    return s_->ReadRecords(revs, out, /*include_pending=*/true);
  }

  absl::Status ApplyCompares(const TxnRequest& r, bool* ok) {
    *ok = true;
    for (const auto& c : r.compare()) {
      std::string end = c.range_end();
      std::vector<std::string> records;
      if (auto s = ReadKvs(c.key(), end, s_->current_rev_, &records); !s.ok()) return s;
      if (records.empty()) {
        // A missing key compares as an empty KeyValue, except on VALUE,
        // which always fails: there is no value to compare.
        if (c.target() == Compare::VALUE || !CompareKv(c, KeyValueView())) {
          *ok = false;
          return absl::OkStatus();
        }
        continue;
      }
      for (const auto& rec : records) {
        KeyValueView kv;
        CHECK(DecodeKeyValue(rec, &kv));
        if (!CompareKv(c, kv)) {
          *ok = false;
          return absl::OkStatus();
        }
      }
    }
    return absl::OkStatus();
  }

  // etcd's compareToPath: the branch taken by this txn and each nested txn
  // on the taken branches, depth first.
  absl::Status CompareToPath(const TxnRequest& r, std::vector<bool>* path) {
    bool ok;
    if (auto s = ApplyCompares(r, &ok); !s.ok()) return s;
    path->push_back(ok);
    for (const auto& op : ok ? r.success() : r.failure()) {
      if (op.request_case() != RequestOp::kRequestTxn) continue;
      if (auto s = CompareToPath(op.request_txn(), path); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // etcd's checkRequests over the taken path, twice: every put first
  // (checkRequestPut: a previous value for ignore_value/ignore_lease, then
  // the lease), then every range (checkRequestRange).
  enum class CheckPass { kPuts, kRanges };
  // `deleted` collects, in apply order, the ranges the path deletes: a put
  // that needs the previous value of a key the txn deleted before it would
  // fail half-way (etcd panics there), so it is refused up front.
  absl::Status CheckPath(const TxnRequest& r, const std::vector<bool>& path, size_t* pos,
                         CheckPass pass, std::vector<Interval>* deleted) {
    const bool ok = path[(*pos)++];
    for (const auto& op : ok ? r.success() : r.failure()) {
      if (op.request_case() == RequestOp::kRequestTxn) {
        if (auto s = CheckPath(op.request_txn(), path, pos, pass, deleted); !s.ok()) return s;
      } else if (pass == CheckPass::kPuts && op.request_case() == RequestOp::kRequestDeleteRange) {
        const auto& d = op.request_delete_range();
        if (IsFromKey(d.range_end())) {
          deleted->push_back({d.key(), ""});
        } else if (d.range_end().empty()) {
          deleted->push_back({d.key(), d.key() + std::string(1, '\0')});
        } else {
          deleted->push_back({d.key(), d.range_end()});
        }
      } else if (pass == CheckPass::kPuts && op.request_case() == RequestOp::kRequestPut) {
        const auto& p = op.request_put();
        if (p.ignore_value() || p.ignore_lease()) {
          Revision m, c;
          int64_t v;
          if (!s_->index_->Unpublished().Get(p.key(), s_->current_rev_, &m, &c, &v).ok() ||
              IntersectsPoint(*deleted, p.key())) {
            return MakeError(Error::kKeyNotFound);
          }
        }
        if (p.lease() != 0 && !s_->LeaseExists(p.lease())) return MakeError(Error::kLeaseNotFound);
      } else if (pass == CheckPass::kRanges && op.request_case() == RequestOp::kRequestRange) {
        const int64_t rev = op.request_range().revision();
        if (rev == 0) continue;
        if (rev > s_->current_rev_) return MakeError(Error::kFutureRev);
        if (rev < s_->compact_rev_) return MakeError(Error::kCompacted);
      }
    }
    return absl::OkStatus();
  }

  absl::Status ApplyTxn(const TxnRequest& r, const std::vector<bool>& path, size_t* pos,
                        TxnResponse* resp) {
    const bool ok = path[(*pos)++];
    resp->set_succeeded(ok);
    for (const auto& op : ok ? r.success() : r.failure()) {
      ResponseOp* out = resp->add_responses();
      switch (op.request_case()) {
        case RequestOp::kRequestRange: {
          const auto& rr = op.request_range();
          int64_t rev;
          const int64_t current = read_rev();
          if (auto s = ResolveReadRevision(rr.revision(), current, s_->compact_rev_, &rev); !s.ok()) {
            return s;
          }
          RangeResult result;
          auto s = RangeAt(
              s_->index_->Unpublished(), rr, rev, current,
              [this](const std::vector<Revision>& revs, std::vector<std::string>* recs) {
                return s_->ReadRecords(revs, recs, /*include_pending=*/true);
              },
              &result);
          if (!s.ok()) return s;
          RangeResponse* rresp = out->mutable_response_range();
          rresp->ParseFromString(result.kvs_wire);
          rresp->mutable_header()->set_revision(result.rev);
          rresp->set_more(result.more);
          rresp->set_count(result.count);
          break;
        }
        case RequestOp::kRequestPut:
          if (auto s = Put(op.request_put(), out->mutable_response_put(), true); !s.ok()) return s;
          break;
        case RequestOp::kRequestDeleteRange:
          if (auto s = DeleteRange(op.request_delete_range(), out->mutable_response_delete_range(),
                                   true);
              !s.ok()) {
            return s;
          }
          break;
        case RequestOp::kRequestTxn: {
          TxnResponse* nested = out->mutable_response_txn();
          nested->mutable_header();
          if (auto s = ApplyTxn(op.request_txn(), path, pos, nested); !s.ok()) return s;
          break;
        }
        default:
          break;
      }
    }
    return absl::OkStatus();
  }

  KvStore* s_;
  WatchHub* const hub_;
  const int64_t main_;
  int64_t sub_;
};

absl::Status KvStore::ApplyLeaseGrant(const etcdserverpb::LeaseGrantRequest& req,
                                      etcdserverpb::LeaseGrantResponse* resp) {
  if (req.ttl() > lease::Lessor::kMaxTtlSeconds) return MakeError(Error::kLeaseTtlTooLarge);
  int64_t id = req.id();
  if (id == 0) {
    // Pick an unused positive id: the configured prefix in the high bits,
    // a counter seeded from the clock below.
    if (next_lease_id_ == 0) {
      next_lease_id_ = (static_cast<int64_t>(options_.lease_id_prefix & 0x7fff) << 48) |
                       ((absl::ToUnixMillis(absl::Now()) & 0xffffffffffLL) << 8);
    }
    do {
      id = next_lease_id_++ & 0x7fffffffffffffffLL;
    } while (id == 0 || lessor_.Exists(id));
  } else if (lessor_.Exists(id)) {
    return MakeError(Error::kLeaseExists);
  }
  const int64_t ttl = std::max(req.ttl(), options_.min_lease_ttl_seconds);
  batch_.Put(Cf::kLease, lease::LeaseKey(id), lease::EncodeLeaseRecord(id, ttl));
  lessor_.Grant(id, ttl);
  stat_lease_grants_.fetch_add(1, std::memory_order_relaxed);
  lease_ttls_.Record(static_cast<double>(ttl));
  resp->set_id(id);
  resp->set_ttl(ttl);
  resp->mutable_header()->set_revision(current_rev_);
  return absl::OkStatus();
}

namespace {

// etcd's isTxnReadonly: every op of both branches is a Range (a nested txn
// counts as a write).
bool IsTxnReadOnly(const TxnRequest& txn) {
  for (const auto* ops : {&txn.success(), &txn.failure()}) {
    for (const auto& op : *ops) {
      if (!op.has_request_range()) return false;
    }
  }
  return true;
}

}  // namespace

// While a CORRUPT alarm is active etcd's corrupt applier refuses what goes
// through consensus: writes, compactions, lease grants and revocations.
// Ranges and read-only txns are served as usual.
bool KvStore::RefusedWhileCorrupt(const WriteOp& op) {
  if (const auto* txn = std::get_if<TxnOp>(&op)) return !IsTxnReadOnly(*txn->request);
  return std::holds_alternative<PutOp>(op) || std::holds_alternative<DeleteRangeOp>(op) ||
         std::holds_alternative<CompactOp>(op) || std::holds_alternative<LeaseGrantOp>(op) ||
         std::holds_alternative<LeaseRevokeOp>(op);
}

// The state of one group commit as it moves through its phases.
struct KvStore::Group {
  explicit Group(std::vector<WriteRequest>* w)
      : writes(w), results(w->size()), deferred(w->size(), false) {}
  std::vector<WriteRequest>* const writes;
  std::vector<absl::Status> results;
  // Physical compactions, answered once their compaction is done.
  std::vector<bool> deferred;
  // Something changed that readers must see: publish a new view.
  bool changed = false;
};

void KvStore::CommitGroup(std::vector<WriteRequest>* writes, std::vector<Answer>* answers) {
  Group group(writes);
  if (options_.quota_bytes > 0 && absl::Now() - backend_size_at_ > absl::Milliseconds(100)) {
    // Measuring the backend lists its files: do it at most every 100 ms.
    backend_size_.store(static_cast<int64_t>(backend_->SizeOnDisk()), std::memory_order_relaxed);
    backend_size_at_ = absl::Now();
  }
  int64_t group_cost = 0;
  for (size_t i = 0; i < writes->size(); ++i) {
    WriteRequest& w = (*writes)[i];
    const auto apply_start = std::chrono::steady_clock::now();
    group.results[i] =
        Admit(w, backend_size_.load(std::memory_order_relaxed), &group_cost, &group);
    if (group.results[i].ok() && w.caller) {
      if (WriteGuard* guard = guard_.load(std::memory_order_acquire)) {
        group.results[i] = guard->CheckApply(w);
      }
    }
    applying_index_ = w.raft_index;
    if (group.results[i].ok()) group.results[i] = Apply(w, i, &group);
    TimeApply(w, group.results[i], std::chrono::steady_clock::now() - apply_start);
  }
  CommitBatch(&group);
  PublishGroup(&group);
  AnswerGroup(&group, answers);
}

void KvStore::TimeApply(const WriteRequest& w, const absl::Status& result,
                        std::chrono::steady_clock::duration took) {
  const int op = ApplyTimings::OpOf(w);
  if (op < 0) return;
  apply_timings_.Record(op, result, std::chrono::duration<double>(took).count());
  const absl::Duration d = absl::FromChrono(took);
  if (d <= options_.warning_apply_duration) return;
  apply_timings_.CountSlow();
  SPDLOG_WARN("apply request took too long (took {}, expected-duration {}, request {}, error {})",
              absl::FormatDuration(d), absl::FormatDuration(options_.warning_apply_duration),
              ApplyTimings::Describe(w), result.ok() ? "none" : result.ToString());
}

absl::Status KvStore::Admit(const WriteRequest& w, int64_t backend_size, int64_t* group_cost,
                            Group* group) {
  // After a storage failure only reads pass: the store's own internal
  // steps (their waiters must not hang) and listing alarms.
  if (failed_) {
    const auto* alarm = std::get_if<AlarmOp>(&w.op);
    const bool read = std::holds_alternative<InternalOp>(w.op) ||
                      (alarm && alarm->request->action() == etcdserverpb::AlarmRequest::GET);
    if (!read) return FailedWriteError();
  }
  if (Corrupt() && RefusedWhileCorrupt(w.op)) return MakeError(Error::kCorrupt);
  if (auto s = CheckQuota(w, backend_size, group_cost); !s.ok()) {
    group->changed = true;  // the alarm may have been raised
    return s;
  }
  // Compactions, alarms and Capstan's own steps are not size-checked.
  const bool sized = !std::holds_alternative<CompactOp>(w.op) &&
                     !std::holds_alternative<AlarmOp>(w.op);
  if (sized && RequestBytes(w.op) > static_cast<size_t>(options_.max_request_bytes)) {
    return MakeError(Error::kRequestTooLarge);
  }
  return absl::OkStatus();
}

absl::Status KvStore::Apply(WriteRequest& w, size_t i, Group* group) {
  // Writes that take a revision go through one Applier each.
  auto revision = [this, group](Applier& applier, absl::Status s) {
    if (s.ok() && applier.changed()) {
      current_rev_ = applier.main();
      group->changed = true;
    }
    return s;
  };
  return std::visit(
      [&](auto& op) -> absl::Status {
        using T = std::decay_t<decltype(op)>;
        if constexpr (std::is_same_v<T, CustomOp>) {
          return op.apply_batch(&batch_);
        } else if constexpr (std::is_same_v<T, InternalOp>) {
          op.apply();
          group->changed = true;
          return absl::OkStatus();
        } else if constexpr (std::is_same_v<T, AlarmOp>) {
          group->changed = true;
          return ApplyAlarm(*op.request, op.response);
        } else if constexpr (std::is_same_v<T, CompactOp>) {
          absl::Status s = ApplyCompact(*op.request, op.response);
          if (s.ok()) {
            group->changed = true;
            group->deferred[i] = op.request->physical();
          }
          return s;
        } else if constexpr (std::is_same_v<T, LeaseGrantOp>) {
          return ApplyLeaseGrant(*op.request, op.response);
        } else {
          Applier applier(this);
          if constexpr (std::is_same_v<T, PutOp>) {
            return revision(applier, applier.Put(*op.request, op.response, false));
          } else if constexpr (std::is_same_v<T, DeleteRangeOp>) {
            return revision(applier, applier.DeleteRange(*op.request, op.response, false));
          } else if constexpr (std::is_same_v<T, TxnOp>) {
            return revision(applier, applier.Txn(*op.request, op.response, w.validated));
          } else {
            static_assert(std::is_same_v<T, LeaseRevokeOp>, "every write kind is applied");
            return revision(applier, applier.LeaseRevoke(*op.request, op.response));
          }
        }
      },
      w.op);
}

void KvStore::CommitBatch(Group* group) {
  // The applied index is written with the data it covers, in the same
  // batch. Writes from a Raft log carry their entry's index; a single
  // member's index counts its client writes (not the store's own steps).
  uint64_t applied = applied_index_.load(std::memory_order_relaxed);
  uint64_t applied_term = applied_term_.load(std::memory_order_relaxed);
  bool from_log = false;
  for (const auto& w : *group->writes) {
    if (w.raft_index > 0) {
      from_log = true;
      if (w.raft_index >= applied) {
        applied = w.raft_index;
        applied_term = std::max(applied_term, w.raft_term);
      }
    } else if (!std::holds_alternative<InternalOp>(w.op)) {
      ++applied;
    }
  }
  if (batch_.Count() > 0 || (from_log && applied != applied_index_.load(std::memory_order_relaxed))) {
    std::string index_bytes;
    util::AppendBigEndian64(applied, &index_bytes);
    batch_.Put(Cf::kMeta, kConsistentIndexKey, index_bytes);
    if (from_log && applied_term != 0) {
      std::string term_bytes;
      util::AppendBigEndian64(applied_term, &term_bytes);
      batch_.Put(Cf::kMeta, kConsistentTermKey, term_bytes);
    }
    // A store that applies only what a write log holds needs no WAL of its
    // own: after a crash it reopens at its last flush, whose applied index
    // says where the log's replay starts (docs/REPLICATION.md). One that
    // makes its writes durable itself (SelfDurable) syncs each group.
    batch_.set_wal(SelfDurable());
    const absl::Time write_start = absl::Now();
    absl::Status s = backend_->Write(&batch_);
    commit_latency_.Record(absl::ToDoubleSeconds(absl::Now() - write_start));
    batch_.Clear();
    pending_.clear();
    if (!s.ok()) {
      // Fail-stop: the group's changes are in the live index but not durable.
      // They are never published, and no later write is accepted.
      FailStop(s, "a group commit failed");
      for (auto& r : group->results) {
        if (r.ok()) r = FailedWriteError();
      }
      group->changed = false;
      group_events_.clear();
    }
  }
  if (!failed_) {
    applied_term_.store(applied_term, std::memory_order_release);
    applied_index_.store(applied, std::memory_order_release);
  }
  stat_groups_.fetch_add(1, std::memory_order_relaxed);
  stat_group_writes_.fetch_add(group->writes->size(), std::memory_order_relaxed);
}

void KvStore::PublishGroup(Group* group) {
  // A failed store never publishes again: its live index holds the failed
  // group's changes, which are not durable.
  if (group->changed && !failed_) Publish();
  if (WriteLog* log = write_log_.load(std::memory_order_acquire); log != nullptr && !failed_) {
    log->Applied(applied_index_.load(std::memory_order_relaxed));
  }
  if (!group_events_.empty()) {
    if (WatchHub* hub = hub_.load(std::memory_order_acquire)) {
      hub->Notify(current_rev_, std::move(group_events_));
    }
    group_events_.clear();
  }
  if (compaction_barrier_) {
    if (!failed_) {
      util::MutexLock l(&compact_mu_);
      compact_requested_ = compact_rev_;
      compact_epoch_ = compaction_barrier_;
    }
    compaction_barrier_.reset();
  }
}

void KvStore::AnswerGroup(Group* group, std::vector<Answer>* answers_out) {
  std::vector<Answer> answers;
  answers.reserve(group->writes->size());
  for (size_t i = 0; i < group->writes->size(); ++i) {
    WriteRequest& w = (*group->writes)[i];
    if (std::holds_alternative<InternalOp>(w.op) || w.unawaited) continue;
    if (group->deferred[i] && group->results[i].ok()) {
      const int64_t rev = std::get<CompactOp>(w.op).request->revision();
      util::MutexLock l(&compact_mu_);
      if (compact_finished_ < rev) {
        compact_waiters_.emplace_back(rev, std::move(w.done));
        continue;
      }
    }
    answers.push_back({std::move(w.done), std::move(group->results[i])});
  }
  if (answers_out != nullptr) {
    *answers_out = std::move(answers);
    return;
  }
  DeliverAnswers(&answers);
}

}  // namespace capstan::mvcc
