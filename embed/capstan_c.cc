// libcapstan's C API (include/capstan/capstan_c.h) over the C++ API.

#include "capstan/capstan_c.h"

#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "capstan/capstan.h"

struct capstan_store {
  std::unique_ptr<capstan::Store> store;
};

struct capstan_watch {
  std::unique_ptr<capstan::Watch> watch;
};

struct capstan_cache_watch {
  std::unique_ptr<capstan::CacheWatch> watch;
};

struct capstan_txn {
  std::vector<capstan::Compare> compare;
  std::vector<capstan::Op> success, failure;
};

namespace {

std::string Bytes(const char* p, size_t n) { return p == nullptr ? std::string() : std::string(p, n); }
std::string Str(const char* p) { return p == nullptr ? std::string() : std::string(p); }

std::vector<std::string> List(const char* p) {
  std::vector<std::string> out;
  if (p == nullptr) return out;
  for (absl::string_view part : absl::StrSplit(p, ',', absl::SkipWhitespace())) {
    out.emplace_back(part.data(), part.size());
  }
  return out;
}

char* Dup(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  std::memcpy(out, s.data(), s.size());
  out[s.size()] = '\0';
  return out;
}

int Fail(const capstan::Status& s, char** error) {
  if (error != nullptr) *error = s.ok() ? nullptr : Dup(s.message());
  return static_cast<int>(s.code());
}

int Ok(char** error) {
  if (error != nullptr) *error = nullptr;
  return CAPSTAN_OK;
}

// Views of a KeyValue or Object; valid while kv lives.
template <typename KV>
capstan_kv View(const KV& kv) {
  capstan_kv out;
  out.key = kv.key.data();
  out.key_len = kv.key.size();
  out.value = kv.value.data();
  out.value_len = kv.value.size();
  out.create_revision = kv.create_revision;
  out.mod_revision = kv.mod_revision;
  out.version = kv.version;
  out.lease = kv.lease;
  return out;
}

// What a result struct's internal_ owns.
struct RangeHolder {
  capstan::RangeResult result;
  std::vector<capstan_kv> views;
};

struct TxnHolder {
  capstan::TxnResult result;
  std::deque<std::vector<capstan_kv>> views;  // one per op result
  std::vector<capstan_op_result> ops;
};

struct ListHolder {
  capstan::ListResult result;
  std::vector<capstan_kv> views;
};

capstan::LogLevel LevelOf(capstan_log_level l) {
  switch (l) {
    case CAPSTAN_LOG_DEBUG: return capstan::LogLevel::kDebug;
    case CAPSTAN_LOG_INFO: return capstan::LogLevel::kInfo;
    case CAPSTAN_LOG_WARN: return capstan::LogLevel::kWarn;
    case CAPSTAN_LOG_ERROR: return capstan::LogLevel::kError;
    case CAPSTAN_LOG_OFF: return capstan::LogLevel::kOff;
  }
  return capstan::LogLevel::kWarn;
}

capstan::Op RangeOp(const char* key, size_t key_len, const char* end, size_t end_len) {
  capstan::RangeOptions o;
  o.range_end = Bytes(end, end_len);
  return capstan::Op::Range(Bytes(key, key_len), o);
}

}  // namespace

extern "C" {

void capstan_free(void* p) { std::free(p); }

const char* capstan_version(void) { return capstan::Version(); }

void capstan_options_init(capstan_options* options) {
  std::memset(options, 0, sizeof(*options));
  const capstan::Options defaults;
  options->fsync = 1;
  options->max_txn_ops = defaults.max_txn_ops;
  options->max_request_bytes = defaults.max_request_bytes;
  options->log_level = CAPSTAN_LOG_WARN;
}

int capstan_open(const capstan_options* options, capstan_store** store, char** error) {
  capstan::Options o;
  o.data_dir = Str(options->data_dir);
  if (options->name != nullptr) o.name = options->name;
  o.fsync = options->fsync != 0;
  o.quota_backend_bytes = options->quota_backend_bytes;
  o.max_txn_ops = options->max_txn_ops;
  o.max_request_bytes = options->max_request_bytes;
  o.auto_compaction_revisions = options->auto_compaction_revisions;
  if (options->watch_cache_prefixes != nullptr) {
    o.watch_cache_prefixes = List(options->watch_cache_prefixes);
  }
  o.listen_client_urls = List(options->listen_client_urls);
  o.listen_metrics_urls = List(options->listen_metrics_urls);
  for (size_t i = 0; i < options->num_extra_flags; ++i) {
    o.extra_flags.push_back(Str(options->extra_flags[i]));
  }
  o.log_level = LevelOf(options->log_level);
  auto opened = capstan::Store::Open(o);
  if (!opened.ok()) return Fail(opened.status(), error);
  *store = new capstan_store{std::move(*opened)};
  return Ok(error);
}

void capstan_close(capstan_store* store) { delete store; }

int64_t capstan_revision(capstan_store* store) { return store->store->Revision(); }
int64_t capstan_compact_revision(capstan_store* store) { return store->store->CompactRevision(); }

size_t capstan_client_ports(capstan_store* store, int* ports, size_t max) {
  std::vector<int> all = store->store->ClientPorts();
  for (size_t i = 0; i < all.size() && i < max; ++i) ports[i] = all[i];
  return all.size();
}

int capstan_range(capstan_store* store, const char* key, size_t key_len, const char* range_end,
                  size_t range_end_len, const capstan_range_options* options,
                  capstan_range_result* result, char** error) {
  std::memset(result, 0, sizeof(*result));
  capstan::RangeOptions o;
  o.range_end = Bytes(range_end, range_end_len);
  if (options != nullptr) {
    o.limit = options->limit;
    o.revision = options->revision;
    o.keys_only = options->keys_only != 0;
    o.count_only = options->count_only != 0;
  }
  auto r = store->store->Range(std::string_view(key, key_len), o);
  if (!r.ok()) return Fail(r.status(), error);
  auto* holder = new RangeHolder{std::move(*r), {}};
  for (const auto& kv : holder->result.kvs) holder->views.push_back(View(kv));
  result->revision = holder->result.revision;
  result->count = holder->result.count;
  result->more = holder->result.more ? 1 : 0;
  result->kvs = holder->views.data();
  result->num_kvs = holder->views.size();
  result->internal_ = holder;
  return Ok(error);
}

void capstan_range_result_free(capstan_range_result* result) {
  delete static_cast<RangeHolder*>(result->internal_);
  std::memset(result, 0, sizeof(*result));
}

int capstan_put(capstan_store* store, const char* key, size_t key_len, const char* value,
                size_t value_len, int64_t lease, int64_t* revision, char** error) {
  capstan::PutOptions o;
  o.lease = lease;
  auto r = store->store->Put(std::string_view(key, key_len), std::string_view(value, value_len), o);
  if (!r.ok()) return Fail(r.status(), error);
  if (revision != nullptr) *revision = r->revision;
  return Ok(error);
}

int capstan_delete_range(capstan_store* store, const char* key, size_t key_len,
                         const char* range_end, size_t range_end_len, int64_t* deleted,
                         int64_t* revision, char** error) {
  capstan::DeleteOptions o;
  o.range_end = Bytes(range_end, range_end_len);
  auto r = store->store->DeleteRange(std::string_view(key, key_len), o);
  if (!r.ok()) return Fail(r.status(), error);
  if (deleted != nullptr) *deleted = r->deleted;
  if (revision != nullptr) *revision = r->revision;
  return Ok(error);
}

int capstan_compact(capstan_store* store, int64_t revision, int physical, char** error) {
  auto r = store->store->Compact(revision, physical != 0);
  if (!r.ok()) return Fail(r.status(), error);
  return Ok(error);
}

capstan_txn* capstan_txn_new(void) { return new capstan_txn; }
void capstan_txn_free(capstan_txn* txn) { delete txn; }

void capstan_txn_compare(capstan_txn* txn, capstan_compare_target target,
                         capstan_compare_result result, const char* key, size_t key_len,
                         int64_t number, const char* value, size_t value_len) {
  capstan::Compare c;
  c.key = Bytes(key, key_len);
  c.target = static_cast<capstan::Compare::Target>(target);
  c.result = static_cast<capstan::Compare::Result>(result);
  c.number = number;
  c.value = Bytes(value, value_len);
  txn->compare.push_back(std::move(c));
}

static std::vector<capstan::Op>& Branch(capstan_txn* txn, capstan_branch branch) {
  return branch == CAPSTAN_SUCCESS ? txn->success : txn->failure;
}

void capstan_txn_range(capstan_txn* txn, capstan_branch branch, const char* key, size_t key_len,
                       const char* range_end, size_t range_end_len) {
  Branch(txn, branch).push_back(RangeOp(key, key_len, range_end, range_end_len));
}

void capstan_txn_put(capstan_txn* txn, capstan_branch branch, const char* key, size_t key_len,
                     const char* value, size_t value_len, int64_t lease) {
  capstan::PutOptions o;
  o.lease = lease;
  Branch(txn, branch).push_back(capstan::Op::Put(Bytes(key, key_len), Bytes(value, value_len), o));
}

void capstan_txn_delete(capstan_txn* txn, capstan_branch branch, const char* key, size_t key_len,
                        const char* range_end, size_t range_end_len) {
  capstan::DeleteOptions o;
  o.range_end = Bytes(range_end, range_end_len);
  Branch(txn, branch).push_back(capstan::Op::Delete(Bytes(key, key_len), o));
}

int capstan_txn_commit(capstan_store* store, const capstan_txn* txn, capstan_txn_result* result,
                       char** error) {
  std::memset(result, 0, sizeof(*result));
  auto r = store->store->Txn(txn->compare, txn->success, txn->failure);
  if (!r.ok()) return Fail(r.status(), error);
  auto* holder = new TxnHolder;
  holder->result = std::move(*r);
  for (const auto& op : holder->result.results) {
    capstan_op_result out{};
    auto& views = holder->views.emplace_back();
    switch (op.type) {
      case capstan::Op::Type::kRange:
        out.type = CAPSTAN_OP_RANGE;
        out.count = op.range.count;
        for (const auto& kv : op.range.kvs) views.push_back(View(kv));
        break;
      case capstan::Op::Type::kPut: out.type = CAPSTAN_OP_PUT; break;
      case capstan::Op::Type::kDelete:
        out.type = CAPSTAN_OP_DELETE;
        out.count = op.del.deleted;
        break;
      case capstan::Op::Type::kTxn: break;  // the C builder makes no nested txns
    }
    out.kvs = views.data();
    out.num_kvs = views.size();
    holder->ops.push_back(out);
  }
  result->revision = holder->result.revision;
  result->succeeded = holder->result.succeeded ? 1 : 0;
  result->results = holder->ops.data();
  result->num_results = holder->ops.size();
  result->internal_ = holder;
  return Ok(error);
}

void capstan_txn_result_free(capstan_txn_result* result) {
  delete static_cast<TxnHolder*>(result->internal_);
  std::memset(result, 0, sizeof(*result));
}

int capstan_lease_grant(capstan_store* store, int64_t ttl, int64_t id, int64_t* id_out,
                        int64_t* ttl_out, char** error) {
  auto r = store->store->LeaseGrant(ttl, id);
  if (!r.ok()) return Fail(r.status(), error);
  if (id_out != nullptr) *id_out = r->id;
  if (ttl_out != nullptr) *ttl_out = r->ttl;
  return Ok(error);
}

int capstan_lease_revoke(capstan_store* store, int64_t id, char** error) {
  auto r = store->store->LeaseRevoke(id);
  if (!r.ok()) return Fail(r.status(), error);
  return Ok(error);
}

int capstan_lease_keepalive(capstan_store* store, int64_t id, int64_t* ttl, char** error) {
  auto r = store->store->LeaseKeepAlive(id);
  if (!r.ok()) return Fail(r.status(), error);
  if (ttl != nullptr) *ttl = *r;
  return Ok(error);
}

int64_t capstan_lease_ttl(capstan_store* store, int64_t id, int64_t* granted_ttl) {
  capstan::LeaseInfo info = store->store->LeaseTimeToLive(id);
  if (granted_ttl != nullptr) *granted_ttl = info.granted_ttl;
  return info.ttl;
}

int capstan_watch_open(capstan_store* store, const char* key, size_t key_len,
                       const char* range_end, size_t range_end_len,
                       const capstan_watch_options* options, capstan_watch_fn fn, void* user_data,
                       capstan_watch** watch, char** error) {
  capstan::WatchOptions o;
  o.range_end = Bytes(range_end, range_end_len);
  if (options != nullptr) {
    o.start_revision = options->start_revision;
    o.prev_kv = options->prev_kv != 0;
    o.progress_notify = options->progress_notify != 0;
  }
  auto callback = [fn, user_data](const capstan::WatchBatch& batch) {
    std::vector<capstan_event> events;
    events.reserve(batch.events.size());
    for (const auto& e : batch.events) {
      capstan_event out{};
      out.type = e.type == capstan::Event::Type::kDelete ? CAPSTAN_EVENT_DELETE : CAPSTAN_EVENT_PUT;
      out.kv = View(e.kv);
      if (e.prev_kv) {
        out.has_prev_kv = 1;
        out.prev_kv = View(*e.prev_kv);
      }
      events.push_back(out);
    }
    fn(user_data, batch.revision, events.data(), events.size(), static_cast<int>(batch.end.code()),
       batch.end.ok() ? nullptr : batch.end.message().c_str());
  };
  auto w = store->store->Watch(std::string_view(key, key_len), o, callback);
  if (!w.ok()) return Fail(w.status(), error);
  *watch = new capstan_watch{std::move(*w)};
  return Ok(error);
}

void capstan_watch_close(capstan_watch* watch) { delete watch; }

int capstan_list(capstan_store* store, const capstan_list_options* options,
                 capstan_list_result* result, char** error) {
  std::memset(result, 0, sizeof(*result));
  capstan::ListOptions o;
  o.prefix = Str(options->prefix);
  o.label_selector = Str(options->label_selector);
  o.field_selector = Str(options->field_selector);
  o.resource_version = Str(options->resource_version);
  o.limit = options->limit;
  o.continue_token = Str(options->continue_token);
  auto r = store->store->List(o);
  if (!r.ok()) return Fail(r.status(), error);
  auto* holder = new ListHolder{std::move(*r), {}};
  for (const auto& obj : holder->result.objects) holder->views.push_back(View(obj));
  result->revision = holder->result.revision;
  result->objects = holder->views.data();
  result->num_objects = holder->views.size();
  result->continue_token = holder->result.continue_token.c_str();
  result->internal_ = holder;
  return Ok(error);
}

void capstan_list_result_free(capstan_list_result* result) {
  delete static_cast<ListHolder*>(result->internal_);
  std::memset(result, 0, sizeof(*result));
}

int capstan_cache_watch_open(capstan_store* store,
                             const capstan_cache_watch_options* options,
                             capstan_cache_watch_fn fn, void* user_data,
                             capstan_cache_watch** watch, char** error) {
  capstan::CacheWatchOptions o;
  o.prefix = Str(options->prefix);
  o.label_selector = Str(options->label_selector);
  o.field_selector = Str(options->field_selector);
  o.resource_version = Str(options->resource_version);
  o.allow_bookmarks = options->allow_bookmarks != 0;
  o.send_initial_events = options->send_initial_events != 0;
  auto callback = [fn, user_data](const std::vector<capstan::CacheEvent>& events,
                                  const capstan::Status& end) {
    std::vector<capstan_cache_event> out;
    out.reserve(events.size());
    for (const auto& e : events) {
      capstan_cache_event c{};
      c.type = static_cast<capstan_cache_event_type>(e.type);
      c.revision = e.revision;
      c.object = View(e.object);
      if (e.prev_object) {
        c.has_prev_object = 1;
        c.prev_object = View(*e.prev_object);
      }
      c.initial_events_end = e.initial_events_end ? 1 : 0;
      out.push_back(c);
    }
    fn(user_data, out.data(), out.size(), static_cast<int>(end.code()),
       end.ok() ? nullptr : end.message().c_str());
  };
  auto w = store->store->CacheWatch(o, callback);
  if (!w.ok()) return Fail(w.status(), error);
  *watch = new capstan_cache_watch{std::move(*w)};
  return Ok(error);
}

void capstan_cache_watch_close(capstan_cache_watch* watch) { delete watch; }

int capstan_wait_cache_ready(capstan_store* store, int64_t timeout_ms) {
  return store->store->WaitCacheReady(std::chrono::milliseconds(timeout_ms)) ? 1 : 0;
}

}  // extern "C"
