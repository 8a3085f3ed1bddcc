// Seeded randomized differential tests: the same random sequence of requests
// to real etcd and to Capstan (DiffTest), every answer compared.
//
//   DiffRandomKvTest     Put, DeleteRange, Range, Txn (nested, duplicate
//                        keys), Compact, HashKV and the lease RPCs over a
//                        dozen keys, so that operations collide; now and
//                        then a restart of both servers, clean or a crash
//                        (see below).
//   DiffRandomCachedKvTest  the same on keys under /registry/pods/, where
//                        Capstan's watch cache answers Ranges it can.
//   DiffRandomAuthTest   the KV and lease steps, and watcher creation, as
//                        random identities (root, two users, no token, a
//                        bogus or dropped token) among random changes to
//                        users, roles, permissions and passwords, and auth
//                        turned off and on.
//   DiffRandomWatchTest  watchers with random ranges, start revisions,
//                        prev_kv and filters, created, canceled and asked for
//                        progress before and during a random write sequence;
//                        what each watcher sent is compared as one event
//                        sequence, and the canceled and progress responses
//                        as they are.
//
// Each seed is one test (Seeds/DiffRandomKvTest.Run/Seed3) with its own key
// prefix and lease IDs. Its requests depend only on the seed, on those names
// and on etcd's answers to its earlier requests. It starts with a put and a
// compaction at that put's revision, so that the revisions it picks are the
// same relative to its start whichever seeds ran before. On the first answer
// that differs, the test prints the seed, the step and the request, and stops
// that seed. To see the steps leading there, run that seed alone with
// CAPSTAN_DIFF_VERBOSE=1 (every request and etcd's answer), e.g. for seed 17:
//   CAPSTAN_RANDOM_SEEDS=17 CAPSTAN_DIFF_VERBOSE=1 diff_random_test
//       --gtest_filter='*DiffRandomKvTest.Run/Seed17'
//
// Environment:
//   CAPSTAN_RANDOM_SEEDS  how many seeds (1..N; default 6)
//   CAPSTAN_RANDOM_STEPS  steps per seed (default 600; the watch test takes
//                         half as many)
//
// A restart (about one per thousand KV steps) stops both servers with
// SIGTERM or SIGKILL, starts them again on their data, and reads back the
// seed's keys, the compaction and the leases before the steps go on. etcd
// 3.4 applies some log entries again when it starts, and a request it refused
// may then succeed (see LeaveEtcdNothingToReapply): a put and a Hash before
// each restart leave it none to apply again.
//
// The watch test waits for each Created response before it writes again, so
// that a watcher from the current revision starts at the same revision on
// both servers. Before a compaction, a cancel, a progress request and at the
// end it writes two sentinel revisions (puts, then deletes, of every
// watcher's key) and reads until each watcher has reported them: then every
// watcher has sent all it will, no compaction races a watcher that is still
// catching up, and both servers answer a progress request at once (see
// RequestProgress).
//
// Never generated: a txn that deletes keys from a key on ("\0") and then puts
// one of them with ignore_value or ignore_lease crashes etcd (see TxnOp).
//
// Compared after a normalization, because two etcds differ there too:
//   - LeaseTimeToLive: TTL is the seconds left, truncated, read at two
//     moments: a difference of one is taken as equal. A lease that lived
//     through a restart starts again with its full TTL on each server when
//     that server comes back: each TTL has to fit that rule instead (see
//     FitsRestart). Keys come in Go map order: sorted.
//   - LeaseLeases: every lease of the server, in expiry order: only this
//     seed's, sorted by ID.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <deque>
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

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "diff_watch.h"
#include "google/protobuf/util/message_differencer.h"

namespace capstan::testing {
namespace {

using namespace etcdserverpb;  // NOLINT: the messages are the vocabulary here
using namespace std::string_literals;

std::vector<uint64_t> Seeds() {
  std::vector<uint64_t> seeds;
  for (int i = 1; i <= EnvCount("CAPSTAN_RANDOM_SEEDS", 6); ++i) seeds.push_back(i);
  return seeds;
}

int Steps() { return EnvCount("CAPSTAN_RANDOM_STEPS", 600); }

// Key suffixes under the seed's prefix: few, so that writes collide; keys
// that start with others, for prefix ranges; 0x00 and 0xff bytes at the edges.
const std::vector<std::string> kKeys = {"a", "a/1", "a/2", "ab",     "b", "b\0"s,
                                        "c", "c/1", "d",   "e\xff"s, "f", "\xff"s};
// Few values, so that VALUE compares and sorts meet equal values.
const std::vector<std::string> kValues = {"", "v0", "v1", "v2", "w", "\0"s, "\xff"s};

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
const Mix kKvMix = {{StepKind::kPut, 22},     {StepKind::kDelete, 8},     {StepKind::kRange, 25},
                    {StepKind::kTxn, 25},     {StepKind::kCompact, 2},    {StepKind::kGrant, 5},
                    {StepKind::kRevoke, 4},   {StepKind::kTimeToLive, 5}, {StepKind::kLeases, 2},
                    {StepKind::kHashKv, 3},   {StepKind::kRestart, 0.1}};
const Mix kWatchMix = {
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
  TxnRequest Txn(int depth = 0) {
    if (depth == 0) txn_deleted_from_key_ = false;
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
      case 0:
        c.set_revision(Uniform(std::min(model_.compacted + 1, model_.rev), model_.rev));
        break;
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
    r.set_keys(!restricted_ && OneIn(2));
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

  // Requests for a user whom etcd checks otherwise than Capstan does (see
  // docs/COMPATIBILITY.md): etcd 3.4 lets through nested txns and a txn's
  // put with prev_kv or a lease that a plain request is refused, and lists
  // any lease's keys; and etcd's answer for a reversed range depends on the
  // shape of its interval tree. So: no nested txn, no prev_kv or lease on a
  // txn's puts, no keys in LeaseTimeToLive, no reversed ranges.
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
  // The txn being built has a from-key delete (see TxnOp).
  bool txn_deleted_from_key_ = false;
  bool restricted_ = false;  // see set_restricted
};

class DiffRandomTest : public DiffTest, public ::testing::WithParamInterface<uint64_t> {
 protected:
  uint64_t seed() const { return GetParam(); }
  // Where a failure happened, for its message: "seed N, step M".
  std::string At() const { return absl::StrCat("seed ", seed(), ", step ", step_); }
  // Where the seed's keys live: the test's own prefix, unless a suite
  // places them elsewhere.
  virtual std::string Root() const { return prefix(); }
  std::string RootKey(std::string_view suffix) const { return Root() + std::string(suffix); }

  // Puts the seed's first key and compacts at its revision, so that the
  // seed's revisions and compaction state don't depend on earlier seeds.
  bool BeginSeed() {
    // From the test's prefix, as DiffKvTest::LeaseId: leases outlive their test.
    const auto lease_base =
        static_cast<int64_t>((std::hash<std::string>()(Root()) & 0xffffffffffULL) << 4);
    for (int i = 1; i <= kLeasePool; ++i) lease_pool_.push_back(lease_base + i);
    gen_ = std::make_unique<RequestGenerator>(seed(), Root(), lease_pool_, &model_);
    PutRequest put;
    put.set_key(RootKey("begin"));
    if (!Step(put)) return false;
    model_.base = model_.rev;
    CompactionRequest compact;
    compact.set_revision(model_.base);
    return Step(compact);
  }

  // Sends `req` to both servers and compares the answers. On a difference,
  // reports the seed, the step and the request and returns false.
  template <typename Req>
  bool Step(const Req& req) {
    ++step_;
    auto p = Both(req);
    DropNondeterminism(&p);
    if (auto same = Same(p); !same) {
      ADD_FAILURE() << At() << ": "
                    << req.GetDescriptor()->name() << AfterRestart() << acting_as_ << "\n"
                    << Describe(req) << same.message();
      return false;
    }
    last_ok_ = p.etcd.status.ok();
    if (last_ok_) {
      model_.rev = p.etcd.resp.header().revision();
      Learn(req);
    }
    return true;
  }

  // The KV tests: the seed's steps of the KV and lease kinds.
  void RunKvSteps() {
    if (!BeginSeed()) return;
    for (int i = 0; i < Steps(); ++i) {
      if (!KvStep(gen_->Kind(kKvMix))) return;
    }
  }

  // One step of the KV and lease kinds.
  bool KvStep(StepKind kind) {
    switch (kind) {
      case StepKind::kPut:
        return Step(gen_->Put());
      case StepKind::kDelete:
        return Step(gen_->Delete());
      case StepKind::kRange:
        return Step(gen_->Range());
      case StepKind::kTxn:
        return Step(gen_->Txn());
      case StepKind::kCompact:
        return Step(gen_->Compact());
      case StepKind::kGrant:
        return Step(gen_->Grant());
      case StepKind::kRevoke:
        return Step(gen_->Revoke());
      case StepKind::kTimeToLive:
        return Step(gen_->TimeToLive());
      case StepKind::kLeases:
        return Step(LeaseLeasesRequest());
      case StepKind::kHashKv: {
        // The whole key history: once an earlier test left the servers
        // apart, it differs in every later one.
        const HashKVRequest r = gen_->HashKv();
        return Resynced() || Step(r);
      }
      case StepKind::kRestart:
        return Restart();
      case StepKind::kWatch:
      case StepKind::kCancelWatch:
      case StepKind::kProgress:
      case StepKind::kAuthAdmin:
      case StepKind::kAuthenticate:
        break;
    }
    ADD_FAILURE() << "not a KV step";
    return false;
  }

  // Called once both servers serve again after a restart, before what
  // survived is read back (as whoever this hook leaves the steps running as).
  virtual bool Restarted() { return true; }

  // Whether a user or role name belongs to this seed (or is root): lists of
  // users and roles are compared on those only.
  bool OwnName(const std::string& name) const {
    return name == "root" || absl::EndsWith(name, absl::StrCat(".", seed()));
  }

  Model model_;
  std::unique_ptr<RequestGenerator> gen_;
  int step_ = 0;
  // etcd's answer to the last step was OK.
  bool last_ok_ = false;
  // Who the steps run as, for failure messages (" as ..."; empty: no auth).
  std::string acting_as_;
  // The tokens of the last Authenticate step: etcd's, capstan's.
  std::string auth_tokens_[2];

 private:
  // The seed's last restart.
  struct RestartInfo {
    int step = 0;
    bool crash = false;
    Clock::time_point began;
  };

  // Restarts both servers, as a crash (SIGKILL) or cleanly (SIGTERM), and
  // reads back from both what must have survived. Every later step is
  // compared as before.
  bool Restart() {
    if (!LeaveEtcdNothingToReapply()) return false;
    ++step_;
    last_restart_ = RestartInfo{step_, gen_->OneIn(2), Clock::now()};
    if (absl::Status s = RestartBoth(last_restart_->crash); !s.ok()) {
      ADD_FAILURE() << At() << ": restart" << AfterRestart()
                    << ": " << s;
      return false;
    }
    restored_leases_ = model_.live_leases;
    return Restarted() && CheckRestored();
  }

  // etcd 3.4 saves the index of the last log entry it applied only along
  // with a change to the keys, and at start-up applies the entries after it
  // again, where some no longer fail as they did: a txn refused for a
  // range's revision (compacted or future) succeeds, since etcd drops the
  // ranges of a txn that no client waits for (etcd-io/etcd#18667), and so
  // does a put refused for a lease granted after it. Capstan keeps what it
  // answered. So before a restart a put moves etcd's saved index past every
  // entry, and a Hash (etcd's commits its backend first; Capstan's only
  // reads) makes that durable before a SIGKILL.
  bool LeaveEtcdNothingToReapply() {
    PutRequest put;
    put.set_key(RootKey("restart"));
    return Step(put) && Step(HashRequest());
  }

  // Every key of the seed with its revisions, at the same revision; the
  // whole key history (HashKV); the compaction (a read just below it
  // refused, one at it served); every lease with its keys.
  bool CheckRestored() {
    const int64_t rev = model_.rev;
    RangeRequest all;
    all.set_key(Root());
    all.set_range_end(PrefixEnd(Root()));
    if (!Step(all)) return false;
    if (model_.rev != rev) {
      ADD_FAILURE() << At() << AfterRestart()
                    << ": etcd's revision went from " << rev << " to " << model_.rev;
      return false;
    }
    RangeRequest below = all;
    below.set_revision(model_.compacted - 1);
    RangeRequest at = all;
    at.set_revision(model_.compacted);
    if ((!Resynced() && !Step(HashKVRequest())) || !Step(below) || !Step(at) ||
        !Step(LeaseLeasesRequest())) {
      return false;
    }
    for (int64_t id : model_.live_leases) {
      LeaseTimeToLiveRequest ttl;
      ttl.set_id(id);
      ttl.set_keys(true);
      if (!Step(ttl)) return false;
    }
    return true;
  }

  // For failure messages: the seed's last restart, if any.
  std::string AfterRestart() const {
    if (!last_restart_) return "";
    return absl::StrCat(" (after the restart with ", last_restart_->crash ? "SIGKILL" : "SIGTERM",
                        " at step ", last_restart_->step, ")");
  }

  // What etcd's successful answer changed (the revision aside).
  template <typename Req>
  void Learn(const Req&) {}
  void Learn(const LeaseGrantRequest& r) { model_.live_leases.insert(r.id()); }
  void Learn(const LeaseRevokeRequest& r) {
    model_.live_leases.erase(r.id());
    restored_leases_.erase(r.id());
  }
  void Learn(const CompactionRequest& r) { model_.compacted = r.revision(); }

  // See the file comment.
  template <typename Resp>
  void DropNondeterminism(AnswerPair<Resp>*) {}
  void DropNondeterminism(AnswerPair<LeaseTimeToLiveResponse>* p) {
    for (auto* a : {&p->etcd, &p->capstan}) {
      auto* keys = a->resp.mutable_keys();
      std::sort(keys->begin(), keys->end());
    }
    // Only seconds left of a live lease (-1: not found; 0: expired).
    const int64_t etcd_ttl = p->etcd.resp.ttl();
    const int64_t capstan_ttl = p->capstan.resp.ttl();
    if (etcd_ttl <= 0 || capstan_ttl <= 0) return;
    const bool same = restored_leases_.contains(p->etcd.resp.id())
                          ? FitsRestart(p->etcd.resp) && FitsRestart(p->capstan.resp)
                          : std::abs(capstan_ttl - etcd_ttl) <= 1;
    if (same) p->capstan.resp.set_ttl(etcd_ttl);
  }
  // A lease that lived through a restart starts again with its full granted
  // TTL, on etcd and on Capstan (docs/RELIABILITY.md, "Leases after a restart";
  // etcd 3.4 adds its election timeout, 1 s, and counts from its election,
  // Capstan from its start). The servers come back at different moments, so
  // each TTL only has to fit that rule: at most the granted TTL, at least
  // that less the time since the restart began.
  bool FitsRestart(const LeaseTimeToLiveResponse& r) const {
    const int64_t since =
        std::chrono::ceil<std::chrono::seconds>(Clock::now() - last_restart_->began).count();
    return r.ttl() <= r.grantedttl() && r.ttl() >= r.grantedttl() - since;
  }
  // Tokens differ between servers: kept for the steps that follow.
  void DropNondeterminism(AnswerPair<AuthenticateResponse>* p) {
    auth_tokens_[0] = p->etcd.resp.token();
    auth_tokens_[1] = p->capstan.resp.token();
    p->etcd.resp.clear_token();
    p->capstan.resp.clear_token();
  }
  // Users and roles of earlier seeds: left out.
  void DropNondeterminism(AnswerPair<AuthUserListResponse>* p) {
    for (auto* a : {&p->etcd, &p->capstan}) OnlyOwnNames(a->resp.mutable_users());
  }
  void DropNondeterminism(AnswerPair<AuthRoleListResponse>* p) {
    for (auto* a : {&p->etcd, &p->capstan}) OnlyOwnNames(a->resp.mutable_roles());
  }
  void OnlyOwnNames(google::protobuf::RepeatedPtrField<std::string>* names) const {
    std::vector<std::string> own;
    for (const auto& n : *names) {
      if (OwnName(n)) own.push_back(n);
    }
    names->Clear();
    for (auto& n : own) names->Add(std::move(n));
  }
  void DropNondeterminism(AnswerPair<LeaseLeasesResponse>* p) {
    for (auto* a : {&p->etcd, &p->capstan}) {
      std::vector<int64_t> ids;
      for (const auto& l : a->resp.leases()) {
        if (std::find(lease_pool_.begin(), lease_pool_.end(), l.id()) != lease_pool_.end()) {
          ids.push_back(l.id());
        }
      }
      std::sort(ids.begin(), ids.end());
      a->resp.clear_leases();
      for (int64_t id : ids) a->resp.add_leases()->set_id(id);
    }
  }

  std::vector<int64_t> lease_pool_;
  std::optional<RestartInfo> last_restart_;
  // The leases that lived through the last restart, and live still.
  std::set<int64_t> restored_leases_;
};

auto SeedName = [](const ::testing::TestParamInfo<uint64_t>& info) {
  return "Seed" + std::to_string(info.param);
};

// ===========================================================================
// KV and leases

class DiffRandomKvTest : public DiffRandomTest {};

TEST_P(DiffRandomKvTest, Run) { RunKvSteps(); }

INSTANTIATE_TEST_SUITE_P(Seeds, DiffRandomKvTest, ::testing::ValuesIn(Seeds()), SeedName);

// The same steps on keys under /registry/pods/, a prefix Capstan's watch
// cache holds, so that Ranges inside it are answered by the cache where it
// can (server/api/cache_range.h) and the rest by the store. A suite of its own
// has servers of its own; seeds run in order, so a from-key range of one
// seed sees no other seed's keys.
class DiffRandomCachedKvTest : public DiffRandomTest {
 protected:
  std::string Root() const override {
    return absl::StrFormat("/registry/pods/seed%04d/", seed());
  }
};

TEST_P(DiffRandomCachedKvTest, Run) { RunKvSteps(); }

INSTANTIATE_TEST_SUITE_P(Seeds, DiffRandomCachedKvTest, ::testing::ValuesIn(Seeds()), SeedName);

// ===========================================================================
// Auth

// Users, roles and permissions changed at random among the KV and lease
// steps, each step sent as a random identity: root, one of the seed's two
// users (whatever roles they hold by then), no token, or a token neither
// server issued. Auth is enabled after the seed's users and roles are made,
// disabled and enabled again now and then, and disabled at the end, so that
// the suite's other checks (DiffTest::TearDown) run without tokens. A token
// stays in use after its user was deleted, its password changed, auth was
// disabled or the servers restarted, until an Authenticate step replaces it:
// both servers must then refuse it alike.
constexpr double kAuthAdminWeight = 30, kAuthenticateWeight = 6, kAuthWatchWeight = 6;
const Mix kAuthMix = [] {
  Mix m = kKvMix;
  m.push_back({StepKind::kAuthAdmin, kAuthAdminWeight});
  m.push_back({StepKind::kAuthenticate, kAuthenticateWeight});
  m.push_back({StepKind::kWatch, kAuthWatchWeight});
  return m;
}();

class DiffRandomAuthTest : public DiffRandomTest {
 protected:
  void TearDown() override {
    DisableAuth();
    DiffRandomTest::TearDown();
  }

  // The seed's users (with their passwords) and roles, made before auth is
  // enabled; root (password kRootPassword, role root) is made by the first
  // seed and kept.
  bool BeginAuthSeed() {
    if (!BeginSeed()) return false;
    users_ = {Name("u1"), Name("u2")};
    // The seed's roles, then the special role root.
    roles_ = {Name("r1"), Name("r2"), Name("r3"), "root"};
    AuthUserAddRequest root;
    root.set_name("root");
    root.set_password(kRootPassword);
    // The root role too: a seed may have deleted it while auth was off.
    AuthRoleAddRequest root_role;
    root_role.set_name("root");
    AuthUserGrantRoleRequest grant_root;
    grant_root.set_user("root");
    grant_root.set_role("root");
    if (!Step(root) || !Step(root_role) || !Step(grant_root)) return false;
    passwords_["root"] = kRootPassword;
    for (const auto& u : users_) {
      AuthUserAddRequest add;
      add.set_name(u);
      add.set_password(kPasswords[0]);
      if (!Step(add)) return false;
      passwords_[u] = kPasswords[0];
    }
    for (size_t i = 0; i + 1 < roles_.size(); ++i) {
      AuthRoleAddRequest add;
      add.set_name(roles_[i]);
      if (!Step(add)) return false;
    }
    if (!EnableAuth()) return false;
    if (!auth_enabled_) {
      ADD_FAILURE() << At() << ": both servers refused to enable auth; the seed would test none";
      return false;
    }
    for (const auto& u : {"root"s, users_[0], users_[1]}) {
      if (!Authenticate(u, passwords_[u])) return false;
    }
    return true;
  }

  bool AuthStep(StepKind kind) {
    switch (kind) {
      case StepKind::kAuthAdmin:
        return AdminStep();
      case StepKind::kAuthenticate: {
        const std::string user = gen_->Pick(AllUsers());
        return Authenticate(user, gen_->OneIn(6) ? "wrong" : passwords_[user]);
      }
      case StepKind::kWatch:
        return WatchOnce();
      case StepKind::kRestart:
        // Root, with a fresh token, makes the writes and reads a restart
        // needs (a refused write would leave etcd entries to apply again:
        // LeaveEtcdNothingToReapply).
        if (auth_enabled_ && !Authenticate("root", kRootPassword)) return false;
        ActAs(auth_enabled_ ? "root" : "");
        return KvStep(kind);
      default:
        ActAs(Identity());
        return KvStep(kind);
    }
  }

 private:
  static constexpr char kRootPassword[] = "rootpw";
  static constexpr std::array<const char*, 2> kPasswords = {"pw1", "pw2"};

  // name.<seed>: the seed's own, and OwnName's.
  std::string Name(const char* base) const { return absl::StrCat(base, ".", seed()); }
  std::vector<std::string> AllUsers() const { return {"root", users_[0], users_[1]}; }
  // A password the user may have (a seed user's is one of kPasswords).
  std::string Password() { return gen_->Pick(kPasswords); }

  // Who a KV or lease step runs as: root, a user of the seed, no one, or a
  // token neither server issued.
  std::string Identity() {
    switch (gen_->Weighted({30, 25, 25, 8, 4})) {
      case 0:
        return "root";
      case 1:
        return users_[0];
      case 2:
        return users_[1];
      case 3:
        return "";
      default:
        return kBogus;
    }
  }
  // Later steps carry who's last token on each server (none for "").
  void ActAs(const std::string& who) {
    // Root with a valid token is checked alike by etcd 3.4; anyone else
    // (root with a dropped token too) is not (see set_restricted).
    auto it = user_tokens_.find(who);
    gen_->set_restricted(!(who == "root" && it != user_tokens_.end() && it->second.valid));
    acting_as_ = absl::StrCat(" as ", who.empty() ? "(no token)" : who);
    // While auth is off etcd 3.4 still refuses an unknown token, 3.5 and
    // Capstan look at none (docs/COMPATIBILITY.md): no token then.
    if (!auth_enabled_) {
      acting_as_ += " (auth off: no token)";
      SetTokens("", "");
      return;
    }
    if (who == kBogus) {
      SetTokens("bogus.7", "bogus.7");
    } else if (it == user_tokens_.end()) {
      SetTokens("", "");
    } else {
      SetTokens(it->second.token[0], it->second.token[1]);
    }
  }

  // A watcher made as a random identity, on a stream of its own on each
  // server: its first answer is compared (Created; created and canceled,
  // "permission denied", for an identity that may not read the range or
  // a bad token), then both streams close.
  bool WatchOnce() {
    ActAs(Identity());
    ++step_;
    WatchRequest req;
    *req.mutable_create_request() = gen_->Watch();
    // etcd checks a watch from a key on ("\0") as a watch of that key alone,
    // which Capstan does not copy (docs/COMPATIBILITY.md): for anyone whose
    // checks matter, such a watcher ends at the seed's last key instead.
    if (gen_->restricted() && req.create_request().range_end() == "\0"s) {
      req.mutable_create_request()->set_range_end(PrefixEnd(Root()));
    }
    WatchClient e(etcd_stubs().watch.get(), token(false));
    WatchClient c(capstan_stubs().watch.get(), token(true));
    EXPECT_TRUE(e.Send(req) && c.Send(req)) << At() << ": a watch stream broke";
    const std::optional<WatchResponse> first[2] = {e.Next(kEventWait), c.Next(kEventWait)};
    if (!first[0] || !first[1]) {
      ADD_FAILURE() << At() << ": watch" << acting_as_ << ": no answer from "
                    << (!first[0] ? "etcd" : "capstan") << "\n"
                    << Describe(req);
      return false;
    }
    if (auto same = SameResponse(*first[0], *first[1], etcd(), capstan()); !same) {
      ADD_FAILURE() << At() << ": watch" << acting_as_ << "\n" << Describe(req) << same.message();
      return false;
    }
    return true;
  }

  // Authenticate as user; on success the steps' tokens for user are the new
  // ones.
  bool Authenticate(const std::string& user, const std::string& password) {
    ActAs("");
    AuthenticateRequest r;
    r.set_name(user);
    r.set_password(password);
    if (!Step(r)) return false;
    if (last_ok_) user_tokens_[user] = Token{{auth_tokens_[0], auth_tokens_[1]}, true};
    return true;
  }

  // A change to users, roles or permissions, or a read of them; mostly as
  // root, sometimes as someone else, who may not. Root's roles change (etcd
  // refuses while auth is on), never root itself, so that it can always
  // sign in again.
  bool AdminStep() {
    ActAs(gen_->OneIn(6) ? Identity() : "root");
    // Auth is mostly on: once off, it comes back soon.
    if (!auth_enabled_ && gen_->OneIn(3)) return EnableAuth();
    const std::string seed_user = gen_->Pick(users_);
    const std::string user = gen_->OneIn(10) ? "root" : seed_user;
    const std::string role = gen_->Pick(roles_);
    switch (gen_->Weighted({30, 14, 12, 6, 3, 3, 3, 2, 3, 4, 4, 2, 2, 1, 1})) {
      case 0: {
        AuthRoleGrantPermissionRequest r;
        r.set_name(role);
        const auto span = PermissionSpan();
        r.mutable_perm()->set_key(span.key);
        r.mutable_perm()->set_range_end(span.end);
        r.mutable_perm()->set_permtype(static_cast<authpb::Permission::Type>(gen_->Uniform(0, 2)));
        if (!Step(r)) return false;
        if (last_ok_) granted_.push_back({role, span.key, span.end});
        return true;
      }
      case 1: {
        AuthRoleRevokePermissionRequest r;
        if (!granted_.empty() && !gen_->OneIn(4)) {
          const Grant g = gen_->Pick(granted_);
          r.set_role(g.role);
          r.set_key(g.key);
          r.set_range_end(g.end);
        } else {
          const auto span = gen_->Span();
          r.set_role(role);
          r.set_key(span.key);
          r.set_range_end(span.end);
        }
        return Step(r);
      }
      case 2: {
        AuthUserGrantRoleRequest r;
        r.set_user(user);
        r.set_role(role);
        return Step(r);
      }
      case 3: {
        AuthUserRevokeRoleRequest r;
        r.set_name(user);
        r.set_role(role);
        return Step(r);
      }
      case 4: {
        AuthRoleAddRequest r;
        r.set_name(role);
        return Step(r);
      }
      case 5: {
        AuthRoleDeleteRequest r;
        r.set_role(role);
        return Step(r);
      }
      case 6: {
        AuthUserAddRequest r;
        r.set_name(seed_user);
        r.set_password(Password());
        if (!Step(r)) return false;
        if (last_ok_) passwords_[seed_user] = r.password();
        return true;
      }
      case 7: {
        AuthUserDeleteRequest r;
        r.set_name(seed_user);
        if (!Step(r)) return false;
        if (last_ok_) DropTokens(seed_user);
        return true;
      }
      case 8: {
        AuthUserChangePasswordRequest r;
        r.set_name(seed_user);
        r.set_password(Password());
        if (!Step(r)) return false;
        if (last_ok_) {
          passwords_[seed_user] = r.password();
          DropTokens(seed_user);
        }
        return true;
      }
      case 9: {
        AuthUserGetRequest r;
        r.set_name(user);
        return Step(r);
      }
      case 10: {
        // Not of root: etcd 3.4 lists what was granted to it, 3.5 and
        // Capstan one permission on every key (docs/SECURITY.md).
        AuthRoleGetRequest r;
        r.set_role(role == "root" ? roles_[0] : role);
        return Step(r);
      }
      case 11:
        return Step(AuthUserListRequest());
      case 12:
        return Step(AuthRoleListRequest());
      case 13: {
        if (!Step(AuthDisableRequest())) return false;
        if (last_ok_) {
          auth_enabled_ = false;
          DropTokens();
        }
        return true;
      }
      default:
        return EnableAuth();
    }
  }

  bool EnableAuth() {
    if (!Step(AuthEnableRequest())) return false;
    if (last_ok_) auth_enabled_ = true;
    return true;
  }

  // A range etcd 3.5 and Capstan grant a permission on (etcd 3.4 also
  // grants empty and reversed ones, which 3.5 refuses as "invalid auth
  // management": docs/COMPATIBILITY.md).
  RequestGenerator::KeyRange PermissionSpan() {
    for (;;) {
      auto span = gen_->Span();
      if (!span.key.empty() &&
          (span.end.empty() || span.key < span.end || span.end == "\0"s)) {
        return span;
      }
    }
  }

  // After a restart every token is gone on both servers: root signs in
  // again for the reads that check what survived.
  bool Restarted() override {
    DropTokens();
    if (!auth_enabled_) return true;
    if (!Authenticate("root", kRootPassword)) return false;
    ActAs("root");
    return true;
  }

  // Turns auth off on both servers, as root, whatever the seed left; not
  // compared (a seed that failed may have left the servers apart).
  void DisableAuth() {
    for (ServerStubs* s : {&etcd_stubs(), &capstan_stubs()}) {
      grpc::ClientContext actx;
      actx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
      AuthenticateRequest a;
      a.set_name("root");
      a.set_password(kRootPassword);
      AuthenticateResponse token;
      if (!s->auth->Authenticate(&actx, a, &token).ok()) continue;  // auth is off
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + kRpcDeadline);
      ctx.AddMetadata("token", token.token());
      AuthDisableResponse resp;
      grpc::Status st = s->auth->AuthDisable(&ctx, AuthDisableRequest(), &resp);
      EXPECT_TRUE(st.ok()) << "AuthDisable: " << Describe(st);
    }
    SetTokens("", "");
  }

  // A user's last token on each server; no longer valid once the servers
  // dropped it (the steps go on sending it).
  struct Token {
    std::array<std::string, 2> token;  // etcd's, capstan's
    bool valid = false;
  };
  // Marks user's tokens (everyone's for "") as dropped by the servers.
  void DropTokens(const std::string& user = "") {
    for (auto& [name, t] : user_tokens_) {
      if (user.empty() || name == user) t.valid = false;
    }
  }

  struct Grant {
    std::string role, key, end;
  };
  static constexpr char kBogus[] = "(bogus)";

  std::vector<std::string> users_, roles_;
  std::map<std::string, std::string> passwords_;
  std::map<std::string, Token> user_tokens_;  // by user
  std::vector<Grant> granted_;  // permissions granted (some revoked since)
  bool auth_enabled_ = false;
};

TEST_P(DiffRandomAuthTest, Run) {
  if (!BeginAuthSeed()) return;
  for (int i = 0; i < Steps(); ++i) {
    if (!AuthStep(gen_->Kind(kAuthMix))) return;
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, DiffRandomAuthTest, ::testing::ValuesIn(Seeds()), SeedName);

// ===========================================================================
// Watch

// What one watcher sent after its Created response, without the response
// boundaries, which legitimately differ (etcd sends a catching-up watcher's
// history in batches, Capstan may join revisions queued behind a slow reader:
// docs/COMPATIBILITY.md): its events in order, and how it ended.
struct WatcherLog {
  WatchResponse merged;  // watch_id, events, canceled, cancel_reason, compact_revision
  int64_t last_event_rev = 0;
  WatchResponse cancel;  // the response that canceled it, whole

  void Add(const WatchResponse& r) {
    merged.set_watch_id(r.watch_id());
    for (const auto& ev : r.events()) {
      *merged.add_events() = ev;
      last_event_rev = ev.kv().mod_revision();
    }
    if (r.canceled()) {
      merged.set_canceled(true);
      merged.set_cancel_reason(r.cancel_reason());
      cancel = r;
    }
    if (r.compact_revision() != 0) merged.set_compact_revision(r.compact_revision());
  }
};

// One server's Watch stream, and what each of its watchers sent so far.
class WatchLogs {
 public:
  explicit WatchLogs(etcdserverpb::Watch::Stub* stub) : client_(stub) {}

  bool Send(const WatchRequest& r) { return client_.Send(r); }

  // The next Created response (the answer to the last create request, since
  // each create waits for its answer), or nothing after kEventWait.
  std::optional<WatchResponse> AwaitCreated() { return AwaitFirst(&created_); }
  // The next answer to a progress request, or nothing after kEventWait.
  std::optional<WatchResponse> AwaitProgress() { return AwaitFirst(&progress_); }

  // Reads responses until done() or the deadline. Returns done().
  template <typename Pred>
  bool ReadUntil(const Pred& done, Clock::time_point deadline) {
    while (!done()) {
      std::optional<WatchResponse> r = client_.Next(deadline - Clock::now());
      if (!r) return done();
      if (r->created()) {
        created_.push_back(std::move(*r));
      } else if (IsProgress(*r)) {
        progress_.push_back(std::move(*r));
      } else {
        logs_[r->watch_id()].Add(*r);
      }
    }
    return true;
  }

  const WatcherLog& log(int64_t id) { return logs_[id]; }

 private:
  std::optional<WatchResponse> AwaitFirst(std::deque<WatchResponse>* queue) {
    ReadUntil([queue] { return !queue->empty(); }, Clock::now() + kEventWait);
    if (queue->empty()) return std::nullopt;
    WatchResponse r = std::move(queue->front());
    queue->pop_front();
    return r;
  }

  WatchClient client_;
  std::deque<WatchResponse> created_;
  std::deque<WatchResponse> progress_;
  std::map<int64_t, WatcherLog> logs_;
};

class DiffRandomWatchTest : public DiffRandomTest {
 protected:
  struct Watcher {
    WatchCreateRequest req;
    int created_at_step = 0;
    int64_t id = 0;     // from etcd's Created response
    int64_t start = 0;  // the first revision it can report
    bool puts = true;   // its filters let puts through
    bool deletes = true;
    bool compacted = false;  // starts below the compaction: to be canceled
    bool canceled = false;   // by a cancel step
  };

  bool BeginWatchSeed() {
    if (!BeginSeed()) return false;
    etcd_logs_ = std::make_unique<WatchLogs>(etcd_stubs().watch.get());
    capstan_logs_ = std::make_unique<WatchLogs>(capstan_stubs().watch.get());
    return true;
  }

  bool WatchStep(StepKind kind) {
    switch (kind) {
      case StepKind::kWatch:
        return CreateWatcher();
      case StepKind::kCancelWatch:
        return CancelWatcher();
      case StepKind::kProgress:
        return RequestProgress();
      case StepKind::kCompact: {
        // A compaction cancels a watcher still catching up from below it,
        // and etcd reads an event's prev_kv when it sends the event: both
        // would race the compaction, so every watcher catches up first.
        // Physical, so that a watcher created later at exactly the
        // compaction revision reads history after the compaction finished.
        if (!Quiesce()) return false;
        CompactionRequest c = gen_->Compact();
        c.set_physical(true);
        return Step(c);
      }
      default:
        return KvStep(kind);
    }
  }

  // Creates a random watcher on both streams and compares the Created
  // responses. Waits for them, so that a watcher from the current revision
  // starts at the same revision on both servers.
  bool CreateWatcher() {
    ++step_;
    WatchRequest req;
    *req.mutable_create_request() = gen_->Watch();
    // Client-chosen IDs from 100 on, so that they don't take the automatic ones.
    if (gen_->OneIn(2)) req.mutable_create_request()->set_watch_id(100 + step_);
    SendBoth(req);
    const std::optional<WatchResponse> e = etcd_logs_->AwaitCreated();
    const std::optional<WatchResponse> c = capstan_logs_->AwaitCreated();
    auto what = [&] {
      return absl::StrCat(At(), ": watch create\n", Describe(req));
    };
    if (!e || !c) {
      ADD_FAILURE() << what() << "no Created response from " << (e ? "capstan" : "etcd");
      return false;
    }
    if (auto same = SameResponse(*e, *c, etcd(), capstan()); !same) {
      ADD_FAILURE() << what() << same.message();
      return false;
    }
    if (e->canceled()) return true;
    const WatchCreateRequest& cr = req.create_request();
    Watcher w;
    w.req = cr;
    w.created_at_step = step_;
    w.id = e->watch_id();
    w.start = cr.start_revision() != 0 ? cr.start_revision() : e->header().revision() + 1;
    w.compacted = cr.start_revision() != 0 && cr.start_revision() < model_.compacted;
    for (int f : cr.filters()) {
      if (f == WatchCreateRequest::NOPUT) w.puts = false;
      if (f == WatchCreateRequest::NODELETE) w.deletes = false;
    }
    watchers_.push_back(w);
    return true;
  }

  // Cancels a random live watcher on both streams and compares the canceled
  // responses. Every watcher catches up first, so that the events each
  // server sends before the cancel are the same.
  bool CancelWatcher() {
    const std::vector<Watcher*> live = LiveWatchers();
    if (live.empty()) return true;
    if (!Quiesce()) return false;
    Watcher& w = *gen_->Pick(live);
    ++step_;
    w.canceled = true;
    const WatchRequest req = CancelReq(w.id);
    SendBoth(req);
    const auto deadline = Clock::now() + kEventWait;
    for (WatchLogs* side : {etcd_logs_.get(), capstan_logs_.get()}) {
      if (!side->ReadUntil([&] { return side->log(w.id).merged.canceled(); }, deadline)) {
        ADD_FAILURE() << At() << ": "
                      << Name(side)
                      << " did not cancel watch id " << w.id;
        return false;
      }
    }
    if (auto same = SameResponse(etcd_logs_->log(w.id).cancel, capstan_logs_->log(w.id).cancel,
                                 etcd(), capstan());
        !same) {
      ADD_FAILURE() << At() << ": watch cancel\n"
                    << Describe(req) << same.message();
      return false;
    }
    return true;
  }

  // Sends a progress request on both streams once every watcher caught up,
  // and compares the answers. etcd 3.4 answers a progress request at once,
  // etcd 3.5 and Capstan once every watcher of the stream is synced, and not
  // at all on a stream without watchers (docs/COMPATIBILITY.md). So only a
  // stream with a live watcher, every watcher synced, is asked: there both
  // answer with the current revision.
  bool RequestProgress() {
    if (LiveWatchers().empty()) return true;
    if (!Quiesce()) return false;
    ++step_;
    SendBoth(ProgressReq());
    const std::optional<WatchResponse> e = etcd_logs_->AwaitProgress();
    const std::optional<WatchResponse> c = capstan_logs_->AwaitProgress();
    const std::string what = absl::StrCat(At(), ": watch progress\n");
    if (!e || !c) {
      ADD_FAILURE() << what << "no progress response from " << (e ? "capstan" : "etcd");
      return false;
    }
    if (auto same = SameResponse(*e, *c, etcd(), capstan()); !same) {
      ADD_FAILURE() << what << same.message();
      return false;
    }
    return true;
  }

  const char* Name(const WatchLogs* side) const {
    return side == etcd_logs_.get() ? "etcd" : "capstan";
  }

  void SendBoth(const WatchRequest& req) {
    EXPECT_TRUE(etcd_logs_->Send(req)) << "etcd stream broke";
    EXPECT_TRUE(capstan_logs_->Send(req)) << "capstan stream broke";
  }

  // The watchers that neither a compaction nor a cancel step canceled.
  std::vector<Watcher*> LiveWatchers() {
    std::vector<Watcher*> live;
    for (Watcher& w : watchers_) {
      if (!w.compacted && !w.canceled) live.push_back(&w);
    }
    return live;
  }

  // Writes two revisions that every watcher sees (puts of the watchers' keys,
  // then their deletes), after padding up to the last start revision, and
  // reads both streams until each watcher sent everything up to them.
  bool Quiesce() {
    int64_t last_start = 0;
    for (const Watcher& w : watchers_) last_start = std::max(last_start, w.start);
    while (model_.rev + 1 < last_start) {
      PutRequest pad;
      pad.set_key(RootKey("pad"));
      if (!Step(pad)) return false;
    }
    std::set<std::string> keys;
    for (const Watcher& w : watchers_) keys.insert(w.req.key());
    if (keys.empty()) return true;
    TxnRequest puts, deletes;
    for (const std::string& k : keys) {
      PutRequest* put = puts.add_success()->mutable_request_put();
      put->set_key(k);
      put->set_value("sentinel");
      deletes.add_success()->mutable_request_delete_range()->set_key(k);
    }
    if (!Step(puts)) return false;
    const int64_t puts_rev = model_.rev;
    if (!Step(deletes)) return false;
    const int64_t deletes_rev = model_.rev;

    const auto deadline = Clock::now() + kEventWait;
    for (WatchLogs* side : {etcd_logs_.get(), capstan_logs_.get()}) {
      auto caught_up = [&](const Watcher& w) {
        const WatcherLog& log = side->log(w.id);
        // etcd cancels a watcher from below the compaction when it first
        // syncs it, naming the compaction of that moment: wait for it.
        if (w.compacted || log.merged.canceled()) return log.merged.canceled();
        const int64_t last = w.deletes ? deletes_rev : w.puts ? puts_rev : 0;
        return last == 0 || log.last_event_rev >= last;
      };
      auto all = [&] { return std::all_of(watchers_.begin(), watchers_.end(), caught_up); };
      if (side->ReadUntil(all, deadline)) continue;
      CompareWatchers();
      ::testing::Message late;
      for (const Watcher& w : watchers_) {
        if (!caught_up(w)) late << "\n  watch id " << w.id << ": " << Describe(w.req);
      }
      ADD_FAILURE() << At() << ": "
                    << Name(side)
                    << " did not send these watchers' events up to revision " << deletes_rev
                    << " within " << std::chrono::seconds(kEventWait).count() << " s:" << late;
      return false;
    }
    return true;
  }

  // Compares what each watcher sent on both servers: the first event that
  // differs, else the whole log (more events on one side, how it ended).
  void CompareWatchers() {
    for (const Watcher& w : watchers_) {
      const WatchResponse& e = etcd_logs_->log(w.id).merged;
      const WatchResponse& c = capstan_logs_->log(w.id).merged;
      const std::string what =
          absl::StrCat("seed ", seed(), ": watch id ", w.id, ", created at step ",
                       w.created_at_step, ":\n", Describe(w.req));
      int i = 0;
      while (i < std::min(e.events_size(), c.events_size()) &&
             google::protobuf::util::MessageDifferencer::Equals(e.events(i), c.events(i))) {
        ++i;
      }
      if (i < std::min(e.events_size(), c.events_size())) {
        ADD_FAILURE() << what << "event " << i << " differs:\netcd:\n"
                      << Describe(e.events(i)) << "capstan:\n"
                      << Describe(c.events(i));
      } else if (auto same = SameResponse(e, c, etcd(), capstan()); !same) {
        ADD_FAILURE() << what << same.message();
      }
    }
  }

 private:
  std::unique_ptr<WatchLogs> etcd_logs_;
  std::unique_ptr<WatchLogs> capstan_logs_;
  std::vector<Watcher> watchers_;
};

TEST_P(DiffRandomWatchTest, Run) {
  if (!BeginWatchSeed()) return;
  // Some watchers before the first write, more among the writes.
  for (int i = 0; i < 4; ++i) {
    if (!CreateWatcher()) return;
  }
  for (int i = 0; i < Steps() / 2; ++i) {
    if (!WatchStep(gen_->Kind(kWatchMix))) return;
  }
  if (Quiesce()) CompareWatchers();
}

INSTANTIATE_TEST_SUITE_P(Seeds, DiffRandomWatchTest, ::testing::ValuesIn(Seeds()), SeedName);

}  // namespace
}  // namespace capstan::testing
