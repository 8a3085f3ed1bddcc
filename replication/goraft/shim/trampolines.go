package main

// C helpers and the Go functions that call them. They live in a file
// without //export: a preamble there is copied into _cgo_export.c, where
// _GoString_'s accessors are not declared.

/*
#include <stdio.h>
#include <stdlib.h>
#include "capstan_raft.h"

static inline void capstan_raft_call_thread_fn(capstan_raft_thread_fn fn, void* arg) { fn(arg); }

static inline int capstan_raft_call_step_fn(capstan_raft_step_fn fn, void* arg) { return fn(arg); }

static inline void capstan_raft_call_log(capstan_raft_log_fn fn, void* ctx, int level, _GoString_ line) {
  fn(ctx, level, _GoStringPtr(line), _GoStringLen(line));
}

static inline void capstan_raft_die(_GoString_ message) {
  fprintf(stderr, "%.*s\n", (int)_GoStringLen(message), _GoStringPtr(message));
  fflush(stderr);
  abort();
}
*/
import "C"

import "unsafe"

// Calls a capstan_run_on_go_thread function.
func callThreadFn(fn C.capstan_raft_thread_fn, arg unsafe.Pointer) {
	C.capstan_raft_call_thread_fn(fn, arg)
}

// Calls a capstan_run_steps function; true: call it again.
func callStepFn(fn C.capstan_raft_step_fn, arg unsafe.Pointer) bool {
	return C.capstan_raft_call_step_fn(fn, arg) != 0
}

// Calls a logger callback; line is only borrowed for the call.
func callLog(fn C.capstan_raft_log_fn, ctx unsafe.Pointer, level C.int, line string) {
	C.capstan_raft_call_log(fn, ctx, level, line)
}

// Prints message to stderr and aborts the process.
func die(message string) { C.capstan_raft_die(message) }
