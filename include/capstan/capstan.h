// libcapstan: the Capstan storage engine in process (the C++ API).
//
// A Store is one Capstan member opened on a data directory: etcd's
// multi-version key-value store (Range, Put, DeleteRange, Txn, Compact with
// etcd's semantics and revisions), its watches and leases, and the
// Kubernetes watch cache (List and Watch of cached resources with label and
// field selectors, served from secondary indexes). Optionally it also
// serves etcd's gRPC API on client URLs from the same store, so etcdctl and
// every etcd client see what the embedding process writes.
//
//   capstan::Options options;
//   options.data_dir = "/var/lib/myapp/capstan";
//   auto store = capstan::Store::Open(options);
//   if (!store.ok()) { ...store.status().message()... }
//   (*store)->Put("/registry/pods/default/web-0", bytes);
//   capstan::ListOptions list;
//   list.prefix = "/registry/pods/";
//   list.field_selector = "spec.nodeName=node-1";
//   auto pods = (*store)->List(list);
//
// This header is the whole public C++ face: it needs only the C++17
// standard library. Errors are capstan::Status values carrying the gRPC
// status code and the exact message etcd (or, for the watch cache,
// kube-apiserver) gives for the same condition; no exception is thrown for
// an expected failure.
//
// Ownership: Store::Open returns the only owner of a Store. Watch and
// CacheWatch handles are owned by the caller and must be destroyed before
// their Store. Every result is returned by value and owned by the caller.
//
// Thread safety: Store, Watch and CacheWatch are safe for concurrent use
// from any number of threads without external synchronization, except
// where a method says otherwise. Callbacks run on threads owned by the
// library (one per callback watch) and never under a library lock. The
// plain value types (Status, Result, options and results) are like
// std::string: const use from many threads is safe, mutation needs the
// caller's synchronization.

#ifndef CAPSTAN_CAPSTAN_H_
#define CAPSTAN_CAPSTAN_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace capstan {

// ---- Errors ------------------------------------------------------------

// gRPC's status codes, with their numeric values: what an etcd client
// would see for the same request.
enum class StatusCode : int {
  kOk = 0,
  kCancelled = 1,
  kUnknown = 2,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kOutOfRange = 11,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// The outcome of an operation: OK, or a code with etcd's exact text
// ("etcdserver: mvcc: required revision has been compacted") or the watch
// cache's kube-apiserver text ("too old resource version: 5 (12)").
// A plain value; copy freely.
class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OK", or the code's name and the message: "OUT_OF_RANGE: etcdserver: ...".
  std::string ToString() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

// A value or the Status saying why there is none (like absl::StatusOr).
// Owns its value; a plain value type.
template <typename T>
class Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit, like absl::StatusOr
  // REQUIRES: !status.ok().
  Result(Status status) : status_(std::move(status)) {}  // NOLINT

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  // REQUIRES: ok().
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }
  T&& operator*() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

// ---- Opening a store ---------------------------------------------------

enum class LogLevel { kDebug, kInfo, kWarn, kError, kOff };

struct Options {
  // REQUIRED. Created if missing; holds the same layout as `capstan
  // --data-dir`, so a data directory can move between the binary and an
  // embedding process (not at the same time: a directory is locked by the
  // one process that has it open).
  std::string data_dir;
  // The member name (--name).
  std::string name = "default";
  // False: do not fsync commits (--unsafe-no-fsync): faster, and a crash
  // may lose acknowledged writes.
  bool fsync = true;
  // --quota-backend-bytes: 0 is etcd's default (2 GiB), negative is no
  // quota. Over the quota writes fail with "etcdserver: mvcc: database
  // space exceeded" and the NOSPACE alarm is raised.
  int64_t quota_backend_bytes = 0;
  // --max-txn-ops and --max-request-bytes.
  int64_t max_txn_ops = 128;
  int64_t max_request_bytes = 1572864;
  // Group commit bounds (--backend-batch-limit, --backend-batch-interval);
  // 0: Capstan's defaults.
  int64_t backend_batch_limit = 0;
  std::chrono::microseconds backend_batch_interval{0};
  // Auto compaction, as etcd's --auto-compaction-mode/-retention: keep
  // this many revisions, or (when auto_compaction_period is non-zero)
  // compact periodically to the revision of one period ago. 0: off.
  int64_t auto_compaction_revisions = 0;
  std::chrono::seconds auto_compaction_period{0};
  // Expired leases revoked per second at most (--lease-revoke-rate).
  int64_t lease_revoke_rate = 1000;
  // Memory for uncompressed storage blocks read (--backend-cache-bytes).
  int64_t backend_cache_bytes = int64_t{256} << 20;
  // Key prefixes the watch cache serves (--watch-cache-prefixes). Prefixes
  // containing "/pods/", "/minions/" or "/leases/" get the Kubernetes
  // indexes of that resource (pods: metadata.namespace, spec.nodeName,
  // status.phase and labels). Empty: no watch cache (List and CacheWatch
  // answer NOT_FOUND).
  std::vector<std::string> watch_cache_prefixes = {"/registry/pods/", "/registry/minions/",
                                                   "/registry/leases/"};
  // Serve etcd's gRPC API from this store on these URLs
  // (--listen-client-urls, e.g. "http://127.0.0.1:2379"; port 0 picks a
  // free port, see Store::ClientPorts), and on http:// URLs etcd's JSON
  // gateway and /health, /version, /metrics too. Empty: no network endpoint.
  std::vector<std::string> listen_client_urls;
  // HTTP /metrics, /health, /version on these URLs (--listen-metrics-urls).
  std::vector<std::string> listen_metrics_urls;
  // Any other `capstan`/`etcd` flag, verbatim ("--max-concurrent-streams=100").
  // They are parsed and validated exactly as the capstan binary does; ETCD_*
  // environment variables are not read.
  std::vector<std::string> extra_flags;
  // What the library logs to stderr (process-wide: the logger is shared).
  LogLevel log_level = LogLevel::kWarn;
};

// ---- Key-value types (etcd's mvccpb.KeyValue and request options) --------

struct KeyValue {
  std::string key;
  std::string value;
  int64_t create_revision = 0;
  int64_t mod_revision = 0;
  int64_t version = 0;
  int64_t lease = 0;
};

// The range_end that makes a range cover every key starting with prefix
// (etcd's clientv3.GetPrefixRangeEnd): "\0" (all keys) for an empty prefix.
std::string PrefixEnd(std::string_view prefix);

enum class SortOrder { kNone, kAscend, kDescend };
enum class SortTarget { kKey, kVersion, kCreate, kMod, kValue };

struct RangeOptions {
  // "": the key alone; "\0": every key >= key; otherwise [key, range_end).
  std::string range_end;
  int64_t limit = 0;     // 0: no limit
  int64_t revision = 0;  // 0: the current revision
  SortOrder sort_order = SortOrder::kNone;
  SortTarget sort_target = SortTarget::kKey;
  bool serializable = false;  // a single member reads the same either way
  bool keys_only = false;
  bool count_only = false;
  int64_t min_mod_revision = 0, max_mod_revision = 0;
  int64_t min_create_revision = 0, max_create_revision = 0;
};

struct RangeResult {
  int64_t revision = 0;  // the store's revision when read (header.revision)
  std::vector<KeyValue> kvs;
  bool more = false;
  int64_t count = 0;
};

struct PutOptions {
  int64_t lease = 0;
  bool prev_kv = false;
  bool ignore_value = false;
  bool ignore_lease = false;
};

struct PutResult {
  int64_t revision = 0;
  std::optional<KeyValue> prev_kv;  // when asked for and the key existed
};

struct DeleteOptions {
  std::string range_end;  // as RangeOptions::range_end
  bool prev_kv = false;
};

struct DeleteResult {
  int64_t revision = 0;
  int64_t deleted = 0;
  std::vector<KeyValue> prev_kvs;
};

// One comparison of a Txn (etcdserverpb.Compare).
struct Compare {
  enum class Result { kEqual, kGreater, kLess, kNotEqual };
  enum class Target { kVersion, kCreate, kMod, kValue, kLease };

  std::string key;
  std::string range_end;  // compare every key of the range
  Target target = Target::kVersion;
  Result result = Result::kEqual;
  int64_t number = 0;  // for kVersion, kCreate, kMod and kLease
  std::string value;   // for kValue

  static Compare Value(std::string key, Result r, std::string value);
  static Compare Version(std::string key, Result r, int64_t version);
  static Compare CreateRevision(std::string key, Result r, int64_t rev);
  static Compare ModRevision(std::string key, Result r, int64_t rev);
  static Compare Lease(std::string key, Result r, int64_t lease);
};

// One operation of a Txn branch (etcdserverpb.RequestOp).
struct Op {
  enum class Type { kRange, kPut, kDelete, kTxn };

  Type type = Type::kRange;
  std::string key;
  std::string value;     // kPut
  RangeOptions range;    // kRange
  PutOptions put;        // kPut
  DeleteOptions del;     // kDelete
  std::vector<Compare> txn_compare;  // kTxn (a nested transaction)
  std::vector<Op> txn_success;
  std::vector<Op> txn_failure;

  static Op Range(std::string key, RangeOptions options = {});
  static Op Put(std::string key, std::string value, PutOptions options = {});
  static Op Delete(std::string key, DeleteOptions options = {});
  static Op Txn(std::vector<Compare> compare, std::vector<Op> success, std::vector<Op> failure);
};

// The result of one Op; the member for its type is filled.
struct OpResult {
  Op::Type type = Op::Type::kRange;
  RangeResult range;
  PutResult put;
  DeleteResult del;
  bool txn_succeeded = false;  // kTxn
  std::vector<OpResult> txn_results;
};

struct TxnResult {
  int64_t revision = 0;
  bool succeeded = false;
  std::vector<OpResult> results;  // of the branch taken
};

// ---- Watches on keys (etcd's Watch) -----------------------------------

struct WatchOptions {
  std::string range_end;       // as RangeOptions::range_end
  int64_t start_revision = 0;  // 0: changes after the current revision
  bool prev_kv = false;
  bool no_put = false;     // filter out puts
  bool no_delete = false;  // filter out deletes
  // Periodic empty batches with progress_notify set (etcd's
  // --experimental-watch-progress-notify-interval).
  bool progress_notify = false;
};

struct Event {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  KeyValue kv;  // for kDelete: key and mod_revision (the delete's revision)
  std::optional<KeyValue> prev_kv;
};

// What one etcd WatchResponse carries: the events of one or more
// revisions, in revision order, or a progress notification, or the end.
struct WatchBatch {
  int64_t revision = 0;  // header revision
  std::vector<Event> events;
  bool progress_notify = false;
  // Set on the last batch of a watch that ended on its own: the start
  // revision was compacted (OUT_OF_RANGE "etcdserver: mvcc: required
  // revision has been compacted", compact_revision set), or the store is
  // closing (UNAVAILABLE).
  Status end;
  int64_t compact_revision = 0;
};

// A callback watch's function. Runs on the watch's own thread, one batch
// at a time in order; it may call the Store but must not destroy or
// Cancel its own Watch.
using WatchCallback = std::function<void(const WatchBatch& batch)>;

// One watch on a key or range. Destroying it cancels the watch; after the
// destructor (or Cancel) returns, its callback is not running and never
// runs again.
class Watch {
 public:
  ~Watch();
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

  // Pull watches only (those opened without a callback); one caller at a
  // time. Waits up to timeout for the next batch. Returns false on
  // timeout (batch untouched); true with the batch otherwise. After a
  // batch with a non-OK end, returns that batch again at once.
  bool Next(WatchBatch* batch, std::chrono::milliseconds timeout);

  // Ends the watch (idempotent). REQUIRES: not called from its callback.
  void Cancel();

  // The watch id the store assigned (as etcd's WatchResponse.watch_id).
  int64_t id() const;

  // Made by Store only.
  struct Impl;
  explicit Watch(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

// ---- Leases -------------------------------------------------------------

struct LeaseGrantResult {
  int64_t revision = 0;
  int64_t id = 0;
  int64_t ttl = 0;  // seconds granted (etcd's minimum TTL applied)
};

struct LeaseInfo {
  int64_t id = 0;
  int64_t ttl = -1;  // seconds left; -1: the lease does not exist (as etcd)
  int64_t granted_ttl = 0;
  std::vector<std::string> keys;  // sorted; only when asked for
};

// ---- The watch cache (Kubernetes List/Watch) ---------------------------

// One stored object as the cache holds it (its mvccpb.KeyValue).
struct Object {
  std::string key;
  std::string value;  // the stored bytes (Kubernetes protobuf or JSON)
  int64_t create_revision = 0;
  int64_t mod_revision = 0;  // the object's resourceVersion
  int64_t version = 0;
  int64_t lease = 0;
};

// Kubernetes' resourceVersionMatch.
enum class ResourceVersionMatch { kUnset, kNotOlderThan, kExact };

struct ListOptions {
  // A key prefix within one cached resource prefix ("/registry/pods/" or
  // one namespace, "/registry/pods/default/").
  std::string prefix;
  // Kubernetes selectors: "app=web,tier!=db", "spec.nodeName=node-1".
  std::string label_selector;
  std::string field_selector;
  // "": the latest state (waits until the cache has the store's current
  // revision); "0": any state the cache has; "N": as match says.
  std::string resource_version;
  ResourceVersionMatch match = ResourceVersionMatch::kUnset;
  int64_t limit = 0;
  std::string continue_token;  // from a previous ListResult
};

struct ListResult {
  int64_t revision = 0;  // the resourceVersion listed
  std::vector<Object> objects;  // in key order
  std::string continue_token;   // set when more objects follow
  std::optional<int64_t> remaining_item_count;
};

struct CacheWatchOptions {
  std::string prefix;
  std::string label_selector;
  std::string field_selector;
  // "" or "0": ADDED events for the current objects first; "N": changes
  // after revision N (OUT_OF_RANGE "too old resource version" when the
  // cache's history no longer reaches N).
  std::string resource_version;
  bool allow_bookmarks = false;
  bool send_initial_events = false;
};

struct CacheEvent {
  enum class Type { kAdded, kModified, kDeleted, kBookmark };
  Type type = Type::kBookmark;
  int64_t revision = 0;
  // After the change; for kDeleted its last state; empty for bookmarks.
  Object object;
  std::optional<Object> prev_object;  // for kModified
  bool initial_events_end = false;
};

// A callback cache watch's function: a batch of events in order, or (with
// events empty and end not OK) the end of the watch (a watcher too slow, a
// re-list, the store closing). Runs on the watch's own thread; must not
// destroy or Cancel its own CacheWatch.
using CacheWatchCallback =
    std::function<void(const std::vector<CacheEvent>& events, const Status& end)>;

// One watch on the watch cache. Destroying it cancels the watch; after the
// destructor (or Cancel) returns its callback never runs again.
class CacheWatch {
 public:
  ~CacheWatch();
  CacheWatch(const CacheWatch&) = delete;
  CacheWatch& operator=(const CacheWatch&) = delete;

  // Pull watches only; one caller at a time. Waits up to timeout for
  // events and appends up to max_events of them. Returns OK (possibly with
  // no events, on timeout) while the watch lives, or why it ended.
  Status Next(std::vector<CacheEvent>* events, std::chrono::milliseconds timeout,
              size_t max_events = 1024);

  // Ends the watch (idempotent). REQUIRES: not called from its callback.
  void Cancel();

  // The revision the watch started after.
  int64_t start_revision() const;

  // Made by Store only.
  struct Impl;
  explicit CacheWatch(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

// ---- The store ----------------------------------------------------------

// One Capstan member on a data directory (one open Store per directory).
// Safe for concurrent use from any number of threads. Owned by whoever Open
// returned it to; the Watch and CacheWatch handles it gives out must be
// destroyed before it.
class Store {
 public:
  // Opens (creating if needed) the store in options.data_dir, rebuilds its
  // index, starts the watch cache's initial lists and, when
  // listen_client_urls is set, serves etcd's gRPC API on them. Fails with
  // etcd's flag error text for an invalid option.
  static Result<std::unique_ptr<Store>> Open(const Options& options);

  // Stops serving, lets queued writes finish and closes the store.
  // REQUIRES: every Watch and CacheWatch of this store is destroyed.
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Writes return once the write is durable (fsync unless disabled) and
  // visible to every reader and watcher.
  Result<RangeResult> Range(std::string_view key, const RangeOptions& options = {});
  Result<PutResult> Put(std::string_view key, std::string_view value,
                        const PutOptions& options = {});
  Result<DeleteResult> DeleteRange(std::string_view key, const DeleteOptions& options = {});
  Result<TxnResult> Txn(const std::vector<Compare>& compare, const std::vector<Op>& success,
                        const std::vector<Op>& failure);
  // Compacts history up to revision; with physical, returns after the
  // compacted revisions are deleted from disk. Returns the store revision.
  Result<int64_t> Compact(int64_t revision, bool physical = false);
  // The current revision and the compacted one.
  int64_t Revision() const;
  int64_t CompactRevision() const;

  // Watches key (or the range options.range_end says). Without a callback
  // the watch is pulled with Watch::Next; with one, batches are pushed to
  // it on the watch's own thread. Fails like etcd's Created-and-canceled
  // response (e.g. a compacted start revision).
  Result<std::unique_ptr<capstan::Watch>> Watch(std::string_view key,
                                                const WatchOptions& options = {},
                                                WatchCallback callback = nullptr);

  // ttl in seconds; id 0 lets the store choose.
  Result<LeaseGrantResult> LeaseGrant(int64_t ttl, int64_t id = 0);
  // Deletes the lease and every key attached to it; returns the revision.
  Result<int64_t> LeaseRevoke(int64_t id);
  // Renews the lease for its TTL; returns the TTL. NOT_FOUND
  // "etcdserver: requested lease not found" when it does not exist.
  Result<int64_t> LeaseKeepAlive(int64_t id);
  LeaseInfo LeaseTimeToLive(int64_t id, bool keys = false);
  std::vector<int64_t> Leases();

  // The watch cache. NOT_FOUND when prefix is not cached.
  Result<ListResult> List(const ListOptions& options);
  Result<std::unique_ptr<capstan::CacheWatch>> CacheWatch(const CacheWatchOptions& options,
                                                          CacheWatchCallback callback = nullptr);
  // Waits until every cached resource has its initial list; false on
  // timeout. (List and CacheWatch wait by themselves; this is for
  // start-up probes.)
  bool WaitCacheReady(std::chrono::milliseconds timeout);

  // The ports listen_client_urls were bound to, in order.
  std::vector<int> ClientPorts() const;
  // This member's ids (as etcd's ResponseHeader and MemberList show them).
  uint64_t ClusterId() const;
  uint64_t MemberId() const;

  struct Impl;

 private:
  explicit Store(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The library's version ("0.1.0") and the etcd API version it implements.
const char* Version();
const char* EtcdApiVersion();

}  // namespace capstan

#endif  // CAPSTAN_CAPSTAN_H_
