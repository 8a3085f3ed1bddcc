// Package main is Capstan's Go Raft shim: the C API of capstan_raft.h over
// raft.RawNode of go.etcd.io/etcd/raft 3.4, built with
// -buildmode=c-archive into one archive that only the capstan binary links.
//
// The shim stays thin: it converts between C structs and raft's types, and
// everything around the node (the log's storage, transport, apply) is the
// caller's. A node is a runtime/cgo.Handle, so C never holds a Go pointer.
package main

/*
#include "capstan_raft.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"runtime/cgo"
	"runtime/debug"
	"unsafe"

	"go.etcd.io/etcd/raft"
	pb "go.etcd.io/etcd/raft/raftpb"
)

func main() {}

// node is what a capstan_raft_t handle refers to.
type node struct {
	id     uint64
	rn     *raft.RawNode
	logger raft.Logger
	// The Ready handed out by capstan_raft_ready_get, kept until Advance
	// (3.4's RawNode.Advance takes it back).
	pending    raft.Ready
	hasPending bool
}

func get(h C.capstan_raft_t) *node { return cgo.Handle(h).Value().(*node) }

// recoverPanic, deferred first in every exported function, turns a Go panic
// into a logged abort: a panic must never unwind into C or C++ frames.
func recoverPanic(fn string, h C.capstan_raft_t) {
	r := recover()
	if r == nil {
		return
	}
	msg := fmt.Sprintf("capstan goraft: Go panic in %s: %v\n%s", fn, r, debug.Stack())
	if l := loggerOf(h); l != nil {
		l.Error(msg)
	}
	die(msg)
}

// loggerOf returns the logger of node h, or the global one when h is not a
// live node.
func loggerOf(h C.capstan_raft_t) (l raft.Logger) {
	defer func() {
		if recover() != nil {
			l = globalLogger()
		}
	}()
	if h == 0 {
		return globalLogger()
	}
	return get(h).logger
}

func code(err error) C.int {
	switch {
	case err == nil:
		return C.CAPSTAN_RAFT_OK
	case errors.Is(err, raft.ErrProposalDropped):
		return C.CAPSTAN_RAFT_ERR_PROPOSAL_DROPPED
	case errors.Is(err, raft.ErrStepLocalMsg):
		return C.CAPSTAN_RAFT_ERR_STEP_LOCAL_MSG
	case errors.Is(err, raft.ErrStepPeerNotFound):
		return C.CAPSTAN_RAFT_ERR_STEP_PEER_NOT_FOUND
	}
	return C.CAPSTAN_RAFT_ERR_OTHER
}

// cBytes is a view of borrowed C memory; whatever Go keeps must be copied.
func cBytes(p C.capstan_raft_cbytes, n C.size_t) []byte {
	if p == nil || n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(p)), int(n))
}

func copyBytes(p C.capstan_raft_cbytes, n C.size_t) []byte {
	b := cBytes(p, n)
	if b == nil {
		return nil
	}
	return append([]byte(nil), b...)
}

//export capstan_run_on_go_thread
func capstan_run_on_go_thread(fn C.capstan_raft_thread_fn, arg unsafe.Pointer) {
	defer recoverPanic("capstan_run_on_go_thread", 0)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// fn's calls into the shim are nested cgo calls on this goroutine's
		// thread, which already has an M.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		callThreadFn(fn, arg)
	}()
	<-done
}

//export capstan_run_steps
func capstan_run_steps(fn C.capstan_raft_step_fn, arg unsafe.Pointer) {
	defer recoverPanic("capstan_run_steps", 0)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for callStepFn(fn, arg) {
			// A goroutine is "running" from one scheduling to the next. One
			// that stays in a cgo call for 10 ms is, to sysmon, both too
			// long in a syscall and running too long: sysmon takes its P
			// away, and the next call back into Go must find a P again and
			// wake sysmon from its deep sleep, a cycle of a dozen thread
			// wake-ups. Passing through the scheduler between steps starts
			// a new scheduling; unlocked, it costs no thread switch.
			runtime.Gosched()
		}
	}()
	<-done
}

//export capstan_raft_new
func capstan_raft_new(config *C.capstan_raft_config, errOut **C.char) (h C.capstan_raft_t) {
	// A bad configuration or a failing storage makes raft panic while the
	// node is built; that is an error for the caller, not a crash.
	defer func() {
		if r := recover(); r != nil {
			if errOut != nil {
				*errOut = C.CString(fmt.Sprint(r))
			}
			h = 0
		}
	}()
	c := config
	if c.storage == nil {
		panic("no storage")
	}
	if c.id == 0 {
		panic("id must not be zero")
	}
	if c.max_inflight_msgs <= 0 {
		panic("max_inflight_msgs must be positive")
	}
	n := &node{id: uint64(c.id)}
	if c.log != nil {
		n.logger = &cLogger{fn: c.log, ctx: c.log_ctx}
	} else {
		n.logger = globalLogger()
	}
	cfg := &raft.Config{
		ID:                        uint64(c.id),
		ElectionTick:              int(c.election_tick),
		HeartbeatTick:             int(c.heartbeat_tick),
		Storage:                   cStorage{c.storage},
		Applied:                   uint64(c.applied),
		MaxSizePerMsg:             uint64(c.max_size_per_msg),
		MaxCommittedSizePerReady:  uint64(c.max_committed_size_per_ready),
		MaxUncommittedEntriesSize: uint64(c.max_uncommitted_entries_size),
		MaxInflightMsgs:           int(c.max_inflight_msgs),
		CheckQuorum:               c.check_quorum != 0,
		PreVote:                   c.pre_vote != 0,
		Logger:                    n.logger,
	}
	rn, err := raft.NewRawNode(cfg)
	if err != nil {
		panic(err)
	}
	if c.n_bootstrap_voters > 0 {
		// etcd's StartNode: ConfChange entries for the peers at 1..n.
		ids := unsafe.Slice((*uint64)(unsafe.Pointer(c.bootstrap_voters)), int(c.n_bootstrap_voters))
		peers := make([]raft.Peer, len(ids))
		var contexts []C.capstan_raft_slice
		if c.bootstrap_contexts != nil {
			contexts = unsafe.Slice(c.bootstrap_contexts, int(c.n_bootstrap_voters))
		}
		for i, id := range ids {
			peers[i] = raft.Peer{ID: id}
			if contexts != nil {
				// Copied: Bootstrap keeps the bytes in the entries.
				peers[i].Context = C.GoBytes(unsafe.Pointer(contexts[i].data), C.int(contexts[i].len))
			}
		}
		if err := rn.Bootstrap(peers); err != nil {
			panic(err)
		}
	}
	n.rn = rn
	return C.capstan_raft_t(cgo.NewHandle(n))
}

//export capstan_raft_free
func capstan_raft_free(h C.capstan_raft_t) {
	defer recoverPanic("capstan_raft_free", 0)
	cgo.Handle(h).Delete()
}

//export capstan_raft_tick
func capstan_raft_tick(h C.capstan_raft_t) {
	defer recoverPanic("capstan_raft_tick", h)
	get(h).rn.Tick()
}

//export capstan_raft_campaign
func capstan_raft_campaign(h C.capstan_raft_t) C.int {
	defer recoverPanic("capstan_raft_campaign", h)
	return code(get(h).rn.Campaign())
}

//export capstan_raft_propose
func capstan_raft_propose(h C.capstan_raft_t, entries *C.capstan_raft_slice, n C.size_t) C.int {
	defer recoverPanic("capstan_raft_propose", h)
	nd := get(h)
	if n == 0 {
		// raft panics on an empty MsgProp.
		return C.CAPSTAN_RAFT_ERR_INVALID_ARGUMENT
	}
	in := unsafe.Slice(entries, int(n))
	total := 0
	for i := range in {
		total += int(in[i].len)
	}
	buf := make([]byte, 0, total) // one allocation for the group's data
	ents := make([]pb.Entry, len(in))
	for i := range in {
		start := len(buf)
		buf = append(buf, cBytes(in[i].data, in[i].len)...)
		ents[i].Data = buf[start:len(buf):len(buf)]
	}
	// One MsgProp, as RawNode.Propose sends for one entry.
	return code(nd.rn.Step(pb.Message{Type: pb.MsgProp, From: nd.id, Entries: ents}))
}

//export capstan_raft_propose_conf_change
func capstan_raft_propose_conf_change(h C.capstan_raft_t, v2 C.int, data C.capstan_raft_cbytes, n C.size_t) C.int {
	defer recoverPanic("capstan_raft_propose_conf_change", h)
	nd := get(h)
	cc, ok := decodeConfChange(v2 != 0, cBytes(data, n))
	if !ok {
		return C.CAPSTAN_RAFT_ERR_INVALID_ARGUMENT
	}
	return code(nd.rn.ProposeConfChange(cc))
}

func decodeConfChange(v2 bool, b []byte) (pb.ConfChangeI, bool) {
	if v2 {
		var cc pb.ConfChangeV2
		if cc.Unmarshal(b) != nil {
			return nil, false
		}
		return cc, true
	}
	var cc pb.ConfChange
	if cc.Unmarshal(b) != nil {
		return nil, false
	}
	return cc, true
}

//export capstan_raft_apply_conf_change
func capstan_raft_apply_conf_change(h C.capstan_raft_t, entryType C.uint32_t, data C.capstan_raft_cbytes, n C.size_t,
	out **C.capstan_raft_conf_state) C.int {
	defer recoverPanic("capstan_raft_apply_conf_change", h)
	nd := get(h)
	var v2 bool
	switch pb.EntryType(entryType) {
	case pb.EntryConfChange:
	case pb.EntryConfChangeV2:
		v2 = true
	default:
		return C.CAPSTAN_RAFT_ERR_INVALID_ARGUMENT
	}
	cc, ok := decodeConfChange(v2, cBytes(data, n))
	if !ok {
		return C.CAPSTAN_RAFT_ERR_INVALID_ARGUMENT
	}
	*out = newConfStateBlock(nd.rn.ApplyConfChange(cc))
	return C.CAPSTAN_RAFT_OK
}

//export capstan_raft_step
func capstan_raft_step(h C.capstan_raft_t, data C.capstan_raft_cbytes, n C.size_t) C.int {
	defer recoverPanic("capstan_raft_step", h)
	nd := get(h)
	var m pb.Message
	// Unmarshal copies every byte field, so nothing keeps the C buffer.
	if m.Unmarshal(cBytes(data, n)) != nil {
		return C.CAPSTAN_RAFT_ERR_INVALID_ARGUMENT
	}
	// RawNode.Step refuses local message types (raft.IsLocalMsg), as
	// raft.Node.Step ignores them.
	return code(nd.rn.Step(m))
}

//export capstan_raft_read_index
func capstan_raft_read_index(h C.capstan_raft_t, context C.capstan_raft_cbytes, n C.size_t) {
	defer recoverPanic("capstan_raft_read_index", h)
	get(h).rn.ReadIndex(copyBytes(context, n))
}

//export capstan_raft_transfer_leader
func capstan_raft_transfer_leader(h C.capstan_raft_t, to C.uint64_t) {
	defer recoverPanic("capstan_raft_transfer_leader", h)
	get(h).rn.TransferLeader(uint64(to))
}

//export capstan_raft_report_unreachable
func capstan_raft_report_unreachable(h C.capstan_raft_t, id C.uint64_t) {
	defer recoverPanic("capstan_raft_report_unreachable", h)
	get(h).rn.ReportUnreachable(uint64(id))
}

//export capstan_raft_report_snapshot
func capstan_raft_report_snapshot(h C.capstan_raft_t, id C.uint64_t, failure C.int) {
	defer recoverPanic("capstan_raft_report_snapshot", h)
	status := raft.SnapshotFinish
	if failure != 0 {
		status = raft.SnapshotFailure
	}
	get(h).rn.ReportSnapshot(uint64(id), status)
}

//export capstan_raft_has_ready
func capstan_raft_has_ready(h C.capstan_raft_t) C.int {
	defer recoverPanic("capstan_raft_has_ready", h)
	if get(h).rn.HasReady() {
		return 1
	}
	return 0
}

//export capstan_raft_ready_get
func capstan_raft_ready_get(h C.capstan_raft_t) *C.capstan_raft_ready {
	defer recoverPanic("capstan_raft_ready_get", h)
	nd := get(h)
	if nd.hasPending {
		panic("capstan_raft_ready_get before the previous Ready was advanced")
	}
	nd.pending = nd.rn.Ready()
	nd.hasPending = true
	return newReadyBlock(&nd.pending)
}

//export capstan_raft_advance
func capstan_raft_advance(h C.capstan_raft_t) {
	defer recoverPanic("capstan_raft_advance", h)
	nd := get(h)
	if !nd.hasPending {
		panic("capstan_raft_advance without a Ready")
	}
	rd := nd.pending
	nd.pending, nd.hasPending = raft.Ready{}, false
	nd.rn.Advance(rd)
}

//export capstan_raft_status_get
func capstan_raft_status_get(h C.capstan_raft_t) *C.capstan_raft_status {
	defer recoverPanic("capstan_raft_status_get", h)
	return newStatusBlock(get(h).rn)
}
