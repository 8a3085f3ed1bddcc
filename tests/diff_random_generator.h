// The seeded differential tests' vocabulary (diff_random_test.cc describes
// them): seeds, steps, the seed's keys, values and leases, what the
// generator knows of the servers, the kinds of steps and their mixes; and
// RequestGenerator, the random requests over one seed's keys and leases.
// Test code only; a RequestGenerator is used by one thread at a time.

#ifndef CAPSTAN_TESTS_DIFF_RANDOM_GENERATOR_H_
#define CAPSTAN_TESTS_DIFF_RANDOM_GENERATOR_H_

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "diff_fixture.h"
#include "etcdserverpb/rpc.pb.h"

namespace capstan::testing::diff_random {

using namespace etcdserverpb;  // NOLINT: the messages are the vocabulary here
using namespace std::string_literals;

// The seeds each suite runs: 1..CAPSTAN_RANDOM_SEEDS.
inline std::vector<uint64_t> Seeds() {
  std::vector<uint64_t> seeds;
  for (int i = 1; i <= EnvCount("CAPSTAN_RANDOM_SEEDS", 6); ++i) seeds.push_back(i);
  return seeds;
}

// Steps per seed: CAPSTAN_RANDOM_STEPS.
inline int Steps() { return EnvCount("CAPSTAN_RANDOM_STEPS", 600); }

// Key suffixes under the seed's prefix: few, so that writes collide; keys
// that start with others, for prefix ranges; 0x00 and 0xff bytes at the edges.
inline const std::vector<std::string> kKeys = {"a", "a/1", "a/2", "ab",     "b", "b\0"s,
                                               "c", "c/1", "d",   "e\xff"s, "f", "\xff"s};
// Few values, so that VALUE compares and sorts meet equal values.
inline const std::vector<std::string> kValues = {"", "v0", "v1", "v2", "w", "\0"s, "\xff"s};

// Lease IDs a seed grants, revokes and names; a few of them, so that grants
// meet taken IDs.
constexpr int kLeasePool = 6;
// Granted TTLs are between this and twice this: long enough to outlive any
// run, since an expiry would come at different revisions on the two servers.
constexpr int64_t kLeaseTtl = 3600;
// etcd's MaxLeaseTTL + 1: "etcdserver: too large lease TTL".
constexpr int64_t kTooLargeLeaseTtl = 9000000001;

// The servers' state as far as the generator needs it, learned from etcd's
// answers.
struct Model {
  int64_t base = 0;       // the seed's first revision
  int64_t rev = 0;        // the current revision
  int64_t compacted = 0;  // the last compaction's revision
  std::set<int64_t> live_leases;
  // Revisions of txns that may have put a key again after deleting a range
  // up to "\0" that held it: a compaction at such a revision makes etcd
  // 3.5.16 lose the key's new value and die on the next read of it
  // (etcd-io/etcd#22376), so no step compacts there.
  std::set<int64_t> no_compaction_at;
};

// What one step does: send a request of one kind, restart both servers (the
// KV tests), or (the watch test) create a watcher, cancel one or ask for
// progress.
enum class StepKind {
  kPut,
  kDelete,
  kRange,
  kTxn,
  kCompact,
  kGrant,
  kRevoke,
  kTimeToLive,
  kLeases,
  kHashKv,
  kRestart,
  kWatch,
  kCancelWatch,
  kProgress,
  kAuthAdmin,
  kAuthenticate
};
using Mix = std::vector<std::pair<StepKind, double>>;  // kinds with their weights

// A restart costs one to two seconds (etcd's election): about one per
// thousand steps.
inline const Mix kKvMix = {
    {StepKind::kPut, 22},     {StepKind::kDelete, 8},     {StepKind::kRange, 25},
    {StepKind::kTxn, 25},     {StepKind::kCompact, 2},    {StepKind::kGrant, 5},
    {StepKind::kRevoke, 4},   {StepKind::kTimeToLive, 5}, {StepKind::kLeases, 2},
    {StepKind::kHashKv, 3},   {StepKind::kRestart, 0.1}};
inline const Mix kWatchMix = {
    {StepKind::kPut, 35},    {StepKind::kDelete, 12},     {StepKind::kTxn, 30},
    {StepKind::kCompact, 2}, {StepKind::kGrant, 6},       {StepKind::kRevoke, 6},
    {StepKind::kWatch, 9},   {StepKind::kCancelWatch, 3}, {StepKind::kProgress, 3}};

// Random requests over one seed's keys and leases.
class RequestGenerator {
 public:
  RequestGenerator(uint64_t seed, std::string prefix, std::vector<int64_t> lease_pool,
                   const Model* model)
      : rng_(seed),
        prefix_(std::move(prefix)),
        lease_pool_(std::move(lease_pool)),
        model_(*model) {}

  struct KeyRange {
    std::string key, end;
  };

  StepKind Kind(const Mix& mix) {
    std::vector<double> weights;
    for (const auto& [kind, weight] : mix) weights.push_back(weight);
    return mix[Weighted(weights)].first;
  }
  bool OneIn(int n) { return Uniform(1, n) == 1; }
  // An element of a non-empty container.
  template <typename Container>
  typename Container::value_type Pick(const Container& c) {
    auto it = c.begin();
    std::advance(it, Uniform(0, static_cast<int64_t>(c.size()) - 1));
    return *it;
  }

  PutRequest Put() {
    PutRequest r;
    r.set_key(OneIn(150) ? "" : Key());
    r.set_value(Pick(kValues));
    r.set_prev_kv(OneIn(3));
    r.set_lease(Lease());
    // Each flag mostly as clients send it, sometimes with what etcd refuses
    // beside it ("value is provided", "lease is provided").
    if (OneIn(12)) {
      r.set_ignore_value(true);
      if (!OneIn(4)) r.clear_value();
    }
    if (OneIn(12)) {
      r.set_ignore_lease(true);
      if (!OneIn(4)) r.set_lease(0);
    }
    return r;
  }

  DeleteRangeRequest Delete() {
    DeleteRangeRequest r;
    const KeyRange s = Span();
    r.set_key(s.key);
    r.set_range_end(s.end);
    r.set_prev_kv(OneIn(2));
    return r;
  }

  RangeRequest Range() {
    RangeRequest r;
    const KeyRange s = Span();
    r.set_key(s.key);
    r.set_range_end(s.end);
    r.set_revision(ReadRevision());
    if (OneIn(3)) r.set_limit(OneIn(10) ? -1 : Uniform(1, 4));
    if (OneIn(3)) {
      r.set_sort_order(static_cast<RangeRequest::SortOrder>(Uniform(0, 2)));
      r.set_sort_target(static_cast<RangeRequest::SortTarget>(Uniform(0, 4)));
    }
    r.set_serializable(OneIn(4));
    r.set_keys_only(OneIn(5));
    r.set_count_only(OneIn(6));
    if (OneIn(8)) r.set_min_mod_revision(NearRevision());
    if (OneIn(8)) r.set_max_mod_revision(NearRevision());
    if (OneIn(8)) r.set_min_create_revision(NearRevision());
    if (OneIn(8)) r.set_max_create_revision(NearRevision());
    return r;
  }

  // Up to three compares and three ops per branch, nested up to two levels
  // below. Keys collide often enough that some txns are refused for
  // duplicate keys.
  // Whether the last Txn() may put a key again that a from-key delete
  // before it deleted (Model::no_compaction_at).
  bool LastTxnPutsAfterFromKeyDelete() const { return txn_puts_after_from_key_delete_; }

  TxnRequest Txn(int depth = 0) {
    if (depth == 0) txn_deleted_from_key_ = txn_puts_after_from_key_delete_ = false;
    TxnRequest t;
    for (int i = Uniform(0, 3); i > 0; --i) *t.add_compare() = Cmp();
    for (int i = Uniform(0, 3); i > 0; --i) *t.add_success() = TxnOp(depth);
    for (int i = Uniform(0, 3); i > 0; --i) *t.add_failure() = TxnOp(depth);
    return t;
  }

  // Mostly a past revision above the last compaction; sometimes at or below
  // the last compaction, or in the future (both refused).
  CompactionRequest Compact() {
    CompactionRequest c;
    switch (Weighted({8, 1, 1})) {
      case 0: {
        int64_t rev = Uniform(std::min(model_.compacted + 1, model_.rev), model_.rev);
        // Below such a revision instead (at or below the last compaction:
        // refused, as case 1).
        while (rev > model_.compacted && model_.no_compaction_at.contains(rev)) --rev;
        c.set_revision(rev);
        break;
      }
      case 1:
        c.set_revision(model_.compacted - Uniform(0, 1));
        break;
      default:
        c.set_revision(model_.rev + 1);
        break;
    }
    c.set_physical(OneIn(2));
    return c;
  }

  // A hash of the whole key history up to a revision, which etcd and
  // Capstan compute alike from the same records (a CRC-32C over etcd's key
  // layout): mostly the current one or one above the last compaction;
  // sometimes a compacted or a future one (both refused). Never exactly the
  // compaction's: etcd 3.4 refuses it, 3.5 and Capstan hash it
  // (docs/COMPATIBILITY.md).
  HashKVRequest HashKv() {
    HashKVRequest r;
    switch (Weighted({50, 35, 10, 5})) {
      case 0:
        break;
      case 1:
        if (model_.compacted < model_.rev) r.set_revision(Uniform(model_.compacted + 1, model_.rev));
        break;
      case 2:
        if (model_.compacted > 1) r.set_revision(Uniform(1, model_.compacted - 1));
        break;
      default:
        r.set_revision(model_.rev + Uniform(1, 3));
        break;
    }
    return r;
  }

  LeaseGrantRequest Grant() {
    LeaseGrantRequest r;
    r.set_id(Pick(lease_pool_));
    r.set_ttl(OneIn(20) ? kTooLargeLeaseTtl : Uniform(kLeaseTtl, 2 * kLeaseTtl));
    return r;
  }

  LeaseRevokeRequest Revoke() {
    LeaseRevokeRequest r;
    r.set_id(LiveOrAnyLease());
    return r;
  }

  LeaseTimeToLiveRequest TimeToLive() {
    LeaseTimeToLiveRequest r;
    r.set_id(LiveOrAnyLease());
    r.set_keys(OneIn(2));
    return r;
  }

  // A watcher of the seed's keys from the current revision (0), a past one,
  // one below the compaction (canceled) or a future one.
  WatchCreateRequest Watch() {
    WatchCreateRequest c;
    const KeyRange s = Span(/*allow_empty_key=*/false);
    c.set_key(s.key);
    c.set_range_end(s.end);
    c.set_prev_kv(OneIn(2));
    if (OneIn(4)) c.add_filters(WatchCreateRequest::NOPUT);
    if (OneIn(4)) c.add_filters(WatchCreateRequest::NODELETE);
    // A watcher that lets no event through gives no sign of having caught
    // up, and etcd cancels one still catching up when a compaction passes
    // it: such a watcher never starts in the past above the compaction.
    const bool silent = c.filters_size() == 2;
    switch (Weighted({40, silent ? 0 : 35, 10, 15})) {
      case 0:
        break;
      case 1:
        c.set_start_revision(Uniform(model_.compacted, model_.rev));
        break;
      case 2:
        c.set_start_revision(Uniform(1, std::max<int64_t>(1, model_.compacted - 1)));
        break;
      default:
        c.set_start_revision(model_.rev + Uniform(1, 3));
        break;
    }
    return c;
  }

  // Requests for a user whom the reference etcd checks otherwise than Capstan
  // does (see docs/COMPATIBILITY.md): etcd 3.5.16 predates the txn permission
  // fixes of April 2026 (etcd-io/etcd#21677, #21689), which Capstan follows,
  // and lets through nested txns and a txn's put with prev_kv or a lease
  // that a plain request is refused; and etcd's answer for a reversed range
  // depends on the shape of its interval tree. So: no nested txn, no prev_kv
  // or lease on a txn's puts, no reversed ranges.
  void set_restricted(bool restricted) { restricted_ = restricted; }
  bool restricted() const { return restricted_; }

  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }
  // An index, with probability weights[i] / sum(weights).
  size_t Weighted(const std::vector<double>& weights) {
    std::discrete_distribution<size_t> d(weights.begin(), weights.end());
    return d(rng_);
  }
  size_t Weighted(std::initializer_list<int> weights) {
    return Weighted(std::vector<double>(weights.begin(), weights.end()));
  }

  // One key, [a, b) (empty if b <= a), a prefix, from a key on, the whole
  // seed, or (rarely) no key at all, which etcd refuses. A from-key range
  // ("\0") sees only this seed's keys: later tests' prefixes sort after it
  // but hold no keys yet.
  KeyRange Span(bool allow_empty_key = true) {
    switch (Weighted({40, 20, 15, 10, 10, allow_empty_key ? 1 : 0})) {
      case 0:
        return {Key(), ""};
      case 1: {
        std::string a = Key(), b = Key();
        if (restricted_ && b < a) std::swap(a, b);
        return {a, b};
      }
      case 2: {
        std::string k = Key();
        return {k, PrefixEnd(k)};
      }
      case 3:
        return {Key(), "\0"s};
      case 4:
        return {prefix_, PrefixEnd(prefix_)};
      default:
        return {"", ""};
    }
  }

 private:
  std::string Key() { return prefix_ + Pick(kKeys); }

  // 0 mostly; else a live lease, or a revoked or never granted one (refused).
  int64_t Lease() {
    switch (Weighted({60, 30, 10})) {
      case 0:
        return 0;
      case 1:
        return LiveOrAnyLease();
      default:
        return Pick(lease_pool_);
    }
  }
  int64_t LiveOrAnyLease() {
    return model_.live_leases.empty() || OneIn(4) ? Pick(lease_pool_) : Pick(model_.live_leases);
  }

  // The current revision (0 or negative), a past one, exactly the
  // compaction's, one below it (compacted) or a future one.
  int64_t ReadRevision() {
    switch (Weighted({45, 25, 5, 7, 8, 5})) {
      case 0:
        return 0;
      case 1:
        return Uniform(model_.compacted, model_.rev);
      case 2:
        return model_.compacted;
      case 3:
        return Uniform(1, std::max<int64_t>(1, model_.compacted - 1));
      case 4:
        return model_.rev + Uniform(1, 3);
      default:
        return -Uniform(1, 3);
    }
  }
  // A revision for filters and compares: around the seed's revisions.
  int64_t NearRevision() { return Uniform(model_.base - 1, model_.rev + 1); }

  Compare Cmp() {
    Compare c;
    const KeyRange s = Span();
    c.set_key(s.key);
    c.set_range_end(s.end);
    c.set_target(static_cast<Compare::CompareTarget>(Uniform(0, 4)));
    c.set_result(static_cast<Compare::CompareResult>(Uniform(0, 3)));
    switch (c.target()) {
      case Compare::VERSION:
        c.set_version(Uniform(0, 3));
        break;
      case Compare::CREATE:
        c.set_create_revision(NearRevision());
        break;
      case Compare::MOD:
        c.set_mod_revision(NearRevision());
        break;
      case Compare::VALUE:
        c.set_value(Pick(kValues));
        break;
      default:
        c.set_lease(OneIn(3) ? 0 : Pick(lease_pool_));
        break;
    }
    return c;
  }

  RequestOp TxnOp(int depth) {
    RequestOp op;
    switch (Weighted({35, 20, 35, depth < 2 && !restricted_ ? 10 : 0})) {
      case 0: {
        PutRequest put = Put();
        if (restricted_) {
          put.set_prev_kv(false);
          put.set_lease(0);
        }
        // etcd 3.4 (and 3.5) panics, "unexpected error during txn", on a
        // put with ignore_value or ignore_lease of a key that a from-key
        // delete earlier in the txn deleted: its duplicate-key check misses
        // from-key deletes, and it checks the put against the state before
        // the txn. (Capstan refuses such a txn with "key not found":
        // RefusedTxnChangesNothing in mvcc/kv_store_model_test.cc.)
        if (txn_deleted_from_key_) {
          put.clear_ignore_value();
          put.clear_ignore_lease();
          txn_puts_after_from_key_delete_ = true;
        }
        *op.mutable_request_put() = put;
        break;
      }
      case 1:
        *op.mutable_request_delete_range() = Delete();
        txn_deleted_from_key_ |= op.request_delete_range().range_end() == "\0"s;
        break;
      case 2:
        *op.mutable_request_range() = Range();
        break;
      default:
        *op.mutable_request_txn() = Txn(depth + 1);
        break;
    }
    return op;
  }

  std::mt19937_64 rng_;
  const std::string prefix_;
  const std::vector<int64_t> lease_pool_;
  const Model& model_;
  // The txn being built has a from-key delete (see TxnOp), and a put after
  // one (Model::no_compaction_at).
  bool txn_deleted_from_key_ = false;
  bool txn_puts_after_from_key_delete_ = false;
  bool restricted_ = false;  // see set_restricted
};

}  // namespace capstan::testing::diff_random

#endif  // CAPSTAN_TESTS_DIFF_RANDOM_GENERATOR_H_
