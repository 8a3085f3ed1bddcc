/* libcapstan's C API: the Capstan store in process, for C and for Go (cgo).
 *
 * The C API wraps the C++ API (capstan.h); see it for the semantics of each
 * operation. Everything here follows these rules:
 *
 * Handles: capstan_store, capstan_watch and capstan_cache_watch are opaque.
 * A handle is created by one function (capstan_open, capstan_watch_open,
 * capstan_cache_watch_open) and freed by exactly one call to its close function.
 * Every watch must be closed before its store.
 *
 * Errors: every fallible function returns a capstan_code: CAPSTAN_OK (0) or
 * a gRPC status code with etcd's meaning. If `error` is not NULL and the
 * call failed, *error receives a malloc'd NUL-terminated message (etcd's
 * exact text, e.g. "etcdserver: mvcc: required revision has been
 * compacted") that the caller frees with capstan_free. On success *error is
 * set to NULL.
 *
 * Memory: keys and values are byte strings (pointer + length, may contain
 * NUL). Inputs are copied before the call returns. Results that hold
 * arrays (capstan_range_result, capstan_txn_result, capstan_list_result)
 * are filled by the library and released with their _free function; the
 * pointers inside stay valid until then. Data passed to a callback is
 * valid only during the callback.
 *
 * Threads: every function may be called from any thread concurrently,
 * except that a handle must not be used after (or while) it is closed.
 * Watch callbacks run on a thread the library owns (one per watch), one
 * call at a time and in order; they may call other functions of the store
 * but must not close their own watch. From Go, call back into Go through an
 * exported function and pass a runtime/cgo.Handle as user_data.
 *
 * Linking: libcapstan is a static library written in C++; link it with a C++
 * linker or add the libraries `pkg-config --libs capstan` lists.
 */

#ifndef CAPSTAN_CAPSTAN_C_H_
#define CAPSTAN_CAPSTAN_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct capstan_store capstan_store;
typedef struct capstan_watch capstan_watch;
typedef struct capstan_cache_watch capstan_cache_watch;

/* gRPC status codes, as etcd clients see them. */
typedef enum capstan_code {
  CAPSTAN_OK = 0,
  CAPSTAN_CANCELLED = 1,
  CAPSTAN_UNKNOWN = 2,
  CAPSTAN_INVALID_ARGUMENT = 3,
  CAPSTAN_DEADLINE_EXCEEDED = 4,
  CAPSTAN_NOT_FOUND = 5,
  CAPSTAN_ALREADY_EXISTS = 6,
  CAPSTAN_PERMISSION_DENIED = 7,
  CAPSTAN_RESOURCE_EXHAUSTED = 8,
  CAPSTAN_FAILED_PRECONDITION = 9,
  CAPSTAN_ABORTED = 10,
  CAPSTAN_OUT_OF_RANGE = 11,
  CAPSTAN_UNIMPLEMENTED = 12,
  CAPSTAN_INTERNAL = 13,
  CAPSTAN_UNAVAILABLE = 14,
  CAPSTAN_DATA_LOSS = 15,
  CAPSTAN_UNAUTHENTICATED = 16
} capstan_code;

/* Frees a message or any other memory the library handed out with "free
 * with capstan_free". NULL is ignored. */
void capstan_free(void* p);

/* The library version ("0.1.0"); a static string. */
const char* capstan_version(void);

/* ---- Opening a store ---------------------------------------------------- */

typedef enum capstan_log_level {
  CAPSTAN_LOG_DEBUG = 0,
  CAPSTAN_LOG_INFO = 1,
  CAPSTAN_LOG_WARN = 2,
  CAPSTAN_LOG_ERROR = 3,
  CAPSTAN_LOG_OFF = 4
} capstan_log_level;

/* Options for capstan_open. Initialize with capstan_options_init, then set
 * fields; strings are borrowed for the duration of capstan_open only. Lists
 * are comma-separated. */
typedef struct capstan_options {
  const char* data_dir;              /* required */
  const char* name;                  /* "default" */
  int fsync;                         /* 1; 0 is --unsafe-no-fsync */
  int64_t quota_backend_bytes;       /* 0: etcd's default (2 GiB); <0: none */
  int64_t max_txn_ops;               /* 128 */
  int64_t max_request_bytes;         /* 1572864 */
  int64_t auto_compaction_revisions; /* 0: off */
  /* NULL: the Kubernetes defaults (/registry/pods/, /registry/minions/,
   * /registry/leases/); "": no watch cache. */
  const char* watch_cache_prefixes;
  /* Serve etcd's gRPC API (and, on http:// URLs, its JSON gateway) on these
   * URLs ("http://127.0.0.1:0"); NULL or "": no network endpoint. */
  const char* listen_client_urls;
  const char* listen_metrics_urls;
  /* Any other capstan/etcd flag, verbatim ("--max-concurrent-streams=10"). */
  const char* const* extra_flags;
  size_t num_extra_flags;
  capstan_log_level log_level; /* CAPSTAN_LOG_WARN */
} capstan_options;

void capstan_options_init(capstan_options* options);

/* Opens (creating if needed) the store; on success *store is the new handle,
 * to be closed with capstan_close. */
int capstan_open(const capstan_options* options, capstan_store** store, char** error);

/* Stops serving, finishes queued writes and frees the store.
 * REQUIRES: every watch of the store is closed. NULL is ignored. */
void capstan_close(capstan_store* store);

/* The current and the compacted revision. */
int64_t capstan_revision(capstan_store* store);
int64_t capstan_compact_revision(capstan_store* store);

/* Writes the ports listen_client_urls were bound to into ports (up to max);
 * returns how many URLs there are. */
size_t capstan_client_ports(capstan_store* store, int* ports, size_t max);

/* ---- Key-value operations ---------------------------------------------- */

/* One mvccpb.KeyValue (or a cached object). */
typedef struct capstan_kv {
  const char* key;
  size_t key_len;
  const char* value;
  size_t value_len;
  int64_t create_revision;
  int64_t mod_revision;
  int64_t version;
  int64_t lease;
} capstan_kv;

/* Range over [key, range_end): range_end_len 0 is the key alone, "\0" (len
 * 1) every key >= key. */
typedef struct capstan_range_options {
  int64_t limit;
  int64_t revision;
  int keys_only;
  int count_only;
} capstan_range_options;

typedef struct capstan_range_result {
  int64_t revision;
  int64_t count;
  int more;
  capstan_kv* kvs;
  size_t num_kvs;
  void* internal_;
} capstan_range_result;

/* options may be NULL (defaults). Free *result with capstan_range_result_free. */
int capstan_range(capstan_store* store, const char* key, size_t key_len, const char* range_end,
                  size_t range_end_len, const capstan_range_options* options,
                  capstan_range_result* result, char** error);
void capstan_range_result_free(capstan_range_result* result);

/* *revision (may be NULL) receives the revision of the write. */
int capstan_put(capstan_store* store, const char* key, size_t key_len, const char* value,
                size_t value_len, int64_t lease, int64_t* revision, char** error);
int capstan_delete_range(capstan_store* store, const char* key, size_t key_len,
                         const char* range_end, size_t range_end_len, int64_t* deleted,
                         int64_t* revision, char** error);
int capstan_compact(capstan_store* store, int64_t revision, int physical, char** error);

/* Transactions: build with capstan_txn_new and the capstan_txn_* calls,
 * run with capstan_txn_commit, free with capstan_txn_free. A builder is
 * used by one thread at a time. */
typedef struct capstan_txn capstan_txn;

typedef enum capstan_compare_target {
  CAPSTAN_COMPARE_VERSION = 0,
  CAPSTAN_COMPARE_CREATE = 1,
  CAPSTAN_COMPARE_MOD = 2,
  CAPSTAN_COMPARE_VALUE = 3,
  CAPSTAN_COMPARE_LEASE = 4
} capstan_compare_target;

typedef enum capstan_compare_result {
  CAPSTAN_EQUAL = 0,
  CAPSTAN_GREATER = 1,
  CAPSTAN_LESS = 2,
  CAPSTAN_NOT_EQUAL = 3
} capstan_compare_result;

/* Which branch an operation goes to. */
typedef enum capstan_branch { CAPSTAN_FAILURE = 0, CAPSTAN_SUCCESS = 1 } capstan_branch;

capstan_txn* capstan_txn_new(void);
void capstan_txn_free(capstan_txn* txn);
/* number is used for every target but VALUE, value for VALUE. */
void capstan_txn_compare(capstan_txn* txn, capstan_compare_target target,
                         capstan_compare_result result, const char* key, size_t key_len,
                         int64_t number, const char* value, size_t value_len);
void capstan_txn_range(capstan_txn* txn, capstan_branch branch, const char* key, size_t key_len,
                       const char* range_end, size_t range_end_len);
void capstan_txn_put(capstan_txn* txn, capstan_branch branch, const char* key, size_t key_len,
                     const char* value, size_t value_len, int64_t lease);
void capstan_txn_delete(capstan_txn* txn, capstan_branch branch, const char* key, size_t key_len,
                        const char* range_end, size_t range_end_len);

typedef enum capstan_op_type {
  CAPSTAN_OP_RANGE = 0,
  CAPSTAN_OP_PUT = 1,
  CAPSTAN_OP_DELETE = 2
} capstan_op_type;

/* The result of one operation of the branch taken: for a range its count
 * and kvs, for a delete the number deleted in count. */
typedef struct capstan_op_result {
  capstan_op_type type;
  int64_t count;
  capstan_kv* kvs;
  size_t num_kvs;
} capstan_op_result;

typedef struct capstan_txn_result {
  int64_t revision;
  int succeeded;
  capstan_op_result* results;
  size_t num_results;
  void* internal_;
} capstan_txn_result;

/* Free *result with capstan_txn_result_free (also after a failure). */
int capstan_txn_commit(capstan_store* store, const capstan_txn* txn, capstan_txn_result* result,
                       char** error);
void capstan_txn_result_free(capstan_txn_result* result);

/* ---- Leases -------------------------------------------------------------- */

/* id 0 lets the store choose; *id_out and *ttl_out may be NULL. */
int capstan_lease_grant(capstan_store* store, int64_t ttl, int64_t id, int64_t* id_out,
                        int64_t* ttl_out, char** error);
int capstan_lease_revoke(capstan_store* store, int64_t id, char** error);
/* CAPSTAN_NOT_FOUND when the lease does not exist. */
int capstan_lease_keepalive(capstan_store* store, int64_t id, int64_t* ttl, char** error);
/* Seconds left, or -1 when the lease does not exist; *granted_ttl may be NULL. */
int64_t capstan_lease_ttl(capstan_store* store, int64_t id, int64_t* granted_ttl);

/* ---- Watches on keys ----------------------------------------------------- */

typedef enum capstan_event_type { CAPSTAN_EVENT_PUT = 0, CAPSTAN_EVENT_DELETE = 1 } capstan_event_type;

typedef struct capstan_event {
  capstan_event_type type;
  capstan_kv kv;
  int has_prev_kv;
  capstan_kv prev_kv;
} capstan_event;

/* A batch of events (one etcd WatchResponse), or with end_code non-zero the
 * end of the watch (e.g. CAPSTAN_OUT_OF_RANGE: the start revision was
 * compacted). Everything passed is valid during the call only. */
typedef void (*capstan_watch_fn)(void* user_data, int64_t revision, const capstan_event* events,
                                 size_t num_events, int end_code, const char* end_message);

typedef struct capstan_watch_options {
  int64_t start_revision; /* 0: changes from now on */
  int prev_kv;
  int progress_notify;
} capstan_watch_options;

/* Watches [key, range_end) (range_end_len 0: the key alone); options may be
 * NULL. On success *watch is the handle to close with capstan_watch_close. */
int capstan_watch_open(capstan_store* store, const char* key, size_t key_len,
                       const char* range_end, size_t range_end_len,
                       const capstan_watch_options* options, capstan_watch_fn fn, void* user_data,
                       capstan_watch** watch, char** error);
/* Cancels and frees the watch; after it returns fn never runs again.
 * REQUIRES: not called from the watch's own callback. NULL is ignored. */
void capstan_watch_close(capstan_watch* watch);

/* ---- The watch cache (Kubernetes List/Watch) ---------------------------- */

/* Strings may be NULL (empty). */
typedef struct capstan_list_options {
  const char* prefix;
  const char* label_selector;
  const char* field_selector;
  const char* resource_version;
  int64_t limit;
  const char* continue_token;
} capstan_list_options;

typedef struct capstan_list_result {
  int64_t revision;
  capstan_kv* objects;
  size_t num_objects;
  const char* continue_token; /* "" when no more objects follow */
  void* internal_;
} capstan_list_result;

/* Free *result with capstan_list_result_free. */
int capstan_list(capstan_store* store, const capstan_list_options* options,
                 capstan_list_result* result, char** error);
void capstan_list_result_free(capstan_list_result* result);

typedef enum capstan_cache_event_type {
  CAPSTAN_ADDED = 0,
  CAPSTAN_MODIFIED = 1,
  CAPSTAN_DELETED = 2,
  CAPSTAN_BOOKMARK = 3
} capstan_cache_event_type;

typedef struct capstan_cache_event {
  capstan_cache_event_type type;
  int64_t revision;
  capstan_kv object; /* for DELETED its last state; empty for bookmarks */
  int has_prev_object;
  capstan_kv prev_object;
  int initial_events_end;
} capstan_cache_event;

typedef struct capstan_cache_watch_options {
  const char* prefix;
  const char* label_selector;
  const char* field_selector;
  const char* resource_version; /* NULL or "": ADDED events for current objects first */
  int allow_bookmarks;
  int send_initial_events;
} capstan_cache_watch_options;

/* Events in order, or with end_code non-zero the end of the watch. */
typedef void (*capstan_cache_watch_fn)(void* user_data, const capstan_cache_event* events,
                                       size_t num_events, int end_code, const char* end_message);

int capstan_cache_watch_open(capstan_store* store,
                             const capstan_cache_watch_options* options,
                             capstan_cache_watch_fn fn, void* user_data,
                             capstan_cache_watch** watch, char** error);
/* As capstan_watch_close. */
void capstan_cache_watch_close(capstan_cache_watch* watch);

/* 1 once every cached resource has its initial list, 0 on timeout. */
int capstan_wait_cache_ready(capstan_store* store, int64_t timeout_ms);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* CAPSTAN_CAPSTAN_C_H_ */
