/* capstan_raft.h: the C API of Capstan's Go Raft shim, a thin layer over
 * raft.RawNode of go.etcd.io/etcd/raft 3.4 built into one Go c-archive
 * (libcapstan_goraft_shim.a).
 *
 * This header is written by hand and included by both sides: the shim's cgo
 * preamble (shim.go) and the C++ adapter (../go_raft_engine.cc). cgo checks
 * the declarations below against the exported Go functions when it builds
 * the archive. The header cgo generates is not used.
 *
 * Threads. A node is not thread-safe: one thread makes every call on a
 * node, and the node's storage and logger callbacks run on that thread,
 * synchronously inside those calls. In Go 1.19, a call from a thread that Go
 * did not create costs microseconds (the runtime binds an M for each call,
 * with signal-mask syscalls). A call from inside
 * capstan_run_on_go_thread's fn is a plain nested cgo call of about 70 ns.
 *
 * Memory. Buffers the caller passes in are borrowed for the length of the
 * call; Go copies what it keeps. A result the shim allocates is one malloc'd
 * block (every pointer inside points into that block). The caller frees it
 * with free(). Buffers that a storage callback returns belong to the
 * callback's implementation. They must stay valid until that callback
 * returns to Go, which copies them before it makes any other call.
 *
 * Failures. Every exported function recovers a Go panic (a raft invariant
 * violation, a storage callback reporting CAPSTAN_RAFT_ERR_FAILED). It logs
 * the panic and its stack through the node's logger, prints it to stderr and
 * aborts the process. A Go panic never unwinds into the caller. Callbacks
 * must not let C++ exceptions escape into Go.
 */

#ifndef CAPSTAN_REPLICATION_GORAFT_SHIM_CAPSTAN_RAFT_H_
#define CAPSTAN_REPLICATION_GORAFT_SHIM_CAPSTAN_RAFT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A node: a runtime/cgo.Handle. 0 is never a valid node. */
typedef uintptr_t capstan_raft_t;

/* Result codes of the calls that can fail. */
enum {
  CAPSTAN_RAFT_OK = 0,
  CAPSTAN_RAFT_ERR_PROPOSAL_DROPPED = 1, /* raft.ErrProposalDropped */
  CAPSTAN_RAFT_ERR_INVALID_ARGUMENT = 2, /* undecodable bytes, no entries to propose */
  CAPSTAN_RAFT_ERR_STEP_LOCAL_MSG = 3,   /* raft.ErrStepLocalMsg */
  CAPSTAN_RAFT_ERR_STEP_PEER_NOT_FOUND = 4, /* raft.ErrStepPeerNotFound */
  CAPSTAN_RAFT_ERR_OTHER = 5,            /* any other error of raft */
};

/* Result codes of storage callbacks: raft's storage errors. */
enum {
  CAPSTAN_RAFT_STORAGE_OK = 0,
  CAPSTAN_RAFT_ERR_COMPACTED = 1,   /* raft.ErrCompacted */
  CAPSTAN_RAFT_ERR_UNAVAILABLE = 2, /* raft.ErrUnavailable */
  CAPSTAN_RAFT_ERR_SNAPSHOT_TEMPORARILY_UNAVAILABLE = 3,
  CAPSTAN_RAFT_ERR_FAILED = 4, /* anything else: raft panics, the process aborts */
};

/* Log levels of the logger callback. */
enum {
  CAPSTAN_RAFT_LOG_DEBUG = 0,
  CAPSTAN_RAFT_LOG_INFO = 1,
  CAPSTAN_RAFT_LOG_WARNING = 2,
  CAPSTAN_RAFT_LOG_ERROR = 3,
};

/* Borrowed input bytes (a typedef, so that cgo's prototypes keep the const). */
typedef const uint8_t* capstan_raft_cbytes;

/* A borrowed byte string. */
typedef struct capstan_raft_slice {
  const uint8_t* data;
  size_t len;
} capstan_raft_slice;

/* raftpb.HardState. */
typedef struct capstan_raft_hard_state {
  uint64_t term;
  uint64_t vote;
  uint64_t commit;
} capstan_raft_hard_state;

/* raftpb.ConfState. */
typedef struct capstan_raft_conf_state {
  const uint64_t* voters;
  size_t n_voters;
  const uint64_t* learners;
  size_t n_learners;
  const uint64_t* voters_outgoing;
  size_t n_voters_outgoing;
  const uint64_t* learners_next;
  size_t n_learners_next;
  int auto_leave;
} capstan_raft_conf_state;

/* raftpb.SnapshotMetadata (a snapshot's data never passes the shim). */
typedef struct capstan_raft_snapshot_meta {
  uint64_t index;
  uint64_t term;
  capstan_raft_conf_state conf_state;
} capstan_raft_snapshot_meta;

/* raftpb.Entry. */
typedef struct capstan_raft_entry {
  uint64_t index;
  uint64_t term;
  uint32_t type; /* raftpb.EntryType */
  const uint8_t* data;
  size_t data_len;
} capstan_raft_entry;

/* An outgoing raftpb.Message, marshaled. */
typedef struct capstan_raft_message {
  uint64_t to;
  uint32_t type; /* raftpb.MessageType */
  const uint8_t* bytes;
  size_t len;
} capstan_raft_message;

/* raft.ReadState. */
typedef struct capstan_raft_read_state {
  uint64_t index;
  const uint8_t* context;
  size_t context_len;
} capstan_raft_read_state;

/* raft.Ready, in one malloc'd block. */
typedef struct capstan_raft_ready {
  int has_soft_state;
  uint64_t lead;
  uint32_t role; /* raft.StateType */
  int has_hard_state;
  capstan_raft_hard_state hard_state;
  int has_snapshot;
  capstan_raft_snapshot_meta snapshot;
  int must_sync;
  const capstan_raft_entry* entries; /* to append */
  size_t n_entries;
  const capstan_raft_entry* committed; /* to apply */
  size_t n_committed;
  const capstan_raft_message* messages;
  size_t n_messages;
  const capstan_raft_read_state* read_states;
  size_t n_read_states;
} capstan_raft_ready;

/* tracker.Progress of one peer. */
typedef struct capstan_raft_progress {
  uint64_t id;
  uint64_t match;
  uint64_t next;
  uint32_t state; /* tracker.StateType */
  int learner;
  int recent_active;
} capstan_raft_progress;

/* raft.BasicStatus and, on a leader, the progress of every peer; one
 * malloc'd block. */
typedef struct capstan_raft_status {
  uint64_t id;
  capstan_raft_hard_state hard_state;
  uint64_t lead;
  uint32_t role;
  uint64_t applied;
  uint64_t lead_transferee;
  const capstan_raft_progress* progress;
  size_t n_progress;
} capstan_raft_status;

typedef void (*capstan_raft_thread_fn)(void* arg);
/* One step of a loop: nonzero to be called again. */
typedef int (*capstan_raft_step_fn)(void* arg);

/* Receives one log line (not NUL-terminated, no trailing newline). */
typedef void (*capstan_raft_log_fn)(void* ctx, int level, const char* line, size_t len);

/* raft.Storage, implemented by the caller. Each callback returns a
 * CAPSTAN_RAFT_STORAGE_* or CAPSTAN_RAFT_ERR_* storage code. The pointers it
 * stores through its out-parameters stay valid until it returns to Go. */
typedef struct capstan_raft_storage {
  void* ctx;
  int (*initial_state)(void* ctx, capstan_raft_hard_state* hard_state,
                       capstan_raft_conf_state* conf_state);
  /* Entries [lo, hi), at most max_size bytes but at least one. */
  int (*entries)(void* ctx, uint64_t lo, uint64_t hi, uint64_t max_size,
                 const capstan_raft_entry** entries, size_t* n);
  int (*term)(void* ctx, uint64_t i, uint64_t* term);
  int (*first_index)(void* ctx, uint64_t* index);
  int (*last_index)(void* ctx, uint64_t* index);
  int (*snapshot)(void* ctx, capstan_raft_snapshot_meta* meta);
} capstan_raft_storage;

/* raft.Config. */
typedef struct capstan_raft_config {
  uint64_t id;
  int election_tick;
  int heartbeat_tick;
  int pre_vote;
  int check_quorum;
  uint64_t applied;
  uint64_t max_size_per_msg;
  uint64_t max_committed_size_per_ready;
  uint64_t max_uncommitted_entries_size;
  int max_inflight_msgs;
  /* etcd's StartNode peers: n > 0 bootstraps an empty log with their
   * ConfChange entries (RawNode.Bootstrap); 0 restarts from storage. */
  const uint64_t* bootstrap_voters;
  size_t n_bootstrap_voters;
  /* The context of each bootstrap voter's ConfChange entry (etcd's member
   * JSON), n_bootstrap_voters of them; NULL: none. Copied. */
  const capstan_raft_slice* bootstrap_contexts;
  /* Required; must stay valid (and unmoved) until capstan_raft_free. */
  const capstan_raft_storage* storage;
  /* The node's logger (raft.Config.Logger); NULL: the global logger. */
  capstan_raft_log_fn log;
  void* log_ctx;
} capstan_raft_config;

/* Sets the global logger (raft.SetLogger): the logger of nodes without one
 * and of the raft package itself. It may be called from any thread. NULL
 * restores raft's default logger (stderr). */
void capstan_raft_set_logger(capstan_raft_log_fn fn, void* ctx);

/* Runs fn(arg) on a goroutine locked to its OS thread and returns when fn
 * returns. Calls into the shim made from inside fn are cheap. */
void capstan_run_on_go_thread(capstan_raft_thread_fn fn, void* arg);

/* Calls fn(arg) on a goroutine until it returns 0, and returns then. The
 * goroutine yields to Go's scheduler between two calls (so that Go's
 * monitor never takes it for a goroutine that runs too long) and is not
 * locked to a thread: consecutive calls may run on different threads, never
 * at the same time. Calls into the shim made from inside fn are cheap. */
void capstan_run_steps(capstan_raft_step_fn fn, void* arg);

/* The pointer arguments to the functions below are only read. */

/* Makes a node. Returns 0 and sets *error (malloc'd, NUL-terminated; the
 * caller frees it) when the configuration is invalid, the storage fails, or
 * bootstrap voters are given for a non-empty log. */
capstan_raft_t capstan_raft_new(capstan_raft_config* config, char** error);
void capstan_raft_free(capstan_raft_t node);

void capstan_raft_tick(capstan_raft_t node);
int capstan_raft_campaign(capstan_raft_t node);
/* Proposes n entries as one MsgProp. */
int capstan_raft_propose(capstan_raft_t node, capstan_raft_slice* entries, size_t n);
/* A marshaled raftpb.ConfChange (v2 = 0) or ConfChangeV2 (v2 != 0). */
int capstan_raft_propose_conf_change(capstan_raft_t node, int v2, capstan_raft_cbytes data, size_t len);
/* Applies a committed configuration entry (entry_type 1: ConfChange, 2:
 * ConfChangeV2). Sets *conf_state to a malloc'd block the caller frees. */
int capstan_raft_apply_conf_change(capstan_raft_t node, uint32_t entry_type, capstan_raft_cbytes data,
                                   size_t len, capstan_raft_conf_state** conf_state);
/* Steps a marshaled raftpb.Message from a peer. */
int capstan_raft_step(capstan_raft_t node, capstan_raft_cbytes data, size_t len);
void capstan_raft_read_index(capstan_raft_t node, capstan_raft_cbytes context, size_t len);
void capstan_raft_transfer_leader(capstan_raft_t node, uint64_t to);
void capstan_raft_report_unreachable(capstan_raft_t node, uint64_t id);
void capstan_raft_report_snapshot(capstan_raft_t node, uint64_t id, int failure);
int capstan_raft_has_ready(capstan_raft_t node);
/* REQUIRES: capstan_raft_has_ready, and the previous Ready was advanced.
 * Returns a malloc'd block the caller frees (after advance). */
capstan_raft_ready* capstan_raft_ready_get(capstan_raft_t node);
/* Tells the node that the last Ready was persisted, sent and applied. */
void capstan_raft_advance(capstan_raft_t node);
/* Returns a malloc'd block the caller frees. */
capstan_raft_status* capstan_raft_status_get(capstan_raft_t node);

#ifdef __cplusplus
}
#endif

#endif /* CAPSTAN_REPLICATION_GORAFT_SHIM_CAPSTAN_RAFT_H_ */
