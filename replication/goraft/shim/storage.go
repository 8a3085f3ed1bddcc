package main

/*
#include "capstan_raft.h"

static inline int capstan_raft_call_initial_state(const capstan_raft_storage* s, capstan_raft_hard_state* hs,
                                                  capstan_raft_conf_state* cs) {
  return s->initial_state(s->ctx, hs, cs);
}
static inline int capstan_raft_call_entries(const capstan_raft_storage* s, uint64_t lo, uint64_t hi,
                                            uint64_t max_size, const capstan_raft_entry** out, size_t* n) {
  return s->entries(s->ctx, lo, hi, max_size, out, n);
}
static inline int capstan_raft_call_term(const capstan_raft_storage* s, uint64_t i, uint64_t* term) {
  return s->term(s->ctx, i, term);
}
static inline int capstan_raft_call_first_index(const capstan_raft_storage* s, uint64_t* i) {
  return s->first_index(s->ctx, i);
}
static inline int capstan_raft_call_last_index(const capstan_raft_storage* s, uint64_t* i) {
  return s->last_index(s->ctx, i);
}
static inline int capstan_raft_call_snapshot(const capstan_raft_storage* s, capstan_raft_snapshot_meta* meta) {
  return s->snapshot(s->ctx, meta);
}
*/
import "C"

import (
	"fmt"
	"unsafe"

	"go.etcd.io/etcd/raft"
	pb "go.etcd.io/etcd/raft/raftpb"
)

// cStorage is raft.Storage over the caller's callbacks. The struct is C
// memory that the caller keeps alive for the node's life.
type cStorage struct{ s *C.capstan_raft_storage }

var _ raft.Storage = cStorage{}

func storageError(rc C.int, op string) error {
	switch rc {
	case C.CAPSTAN_RAFT_STORAGE_OK:
		return nil
	case C.CAPSTAN_RAFT_ERR_COMPACTED:
		return raft.ErrCompacted
	case C.CAPSTAN_RAFT_ERR_UNAVAILABLE:
		return raft.ErrUnavailable
	case C.CAPSTAN_RAFT_ERR_SNAPSHOT_TEMPORARILY_UNAVAILABLE:
		return raft.ErrSnapshotTemporarilyUnavailable
	}
	return fmt.Errorf("raft storage %s failed (code %d)", op, int(rc))
}

func ids(p *C.uint64_t, n C.size_t) []uint64 {
	if n == 0 {
		return nil
	}
	return append([]uint64(nil), unsafe.Slice((*uint64)(unsafe.Pointer(p)), int(n))...)
}

func confStateFromC(c *C.capstan_raft_conf_state) pb.ConfState {
	return pb.ConfState{
		Voters:         ids(c.voters, c.n_voters),
		Learners:       ids(c.learners, c.n_learners),
		VotersOutgoing: ids(c.voters_outgoing, c.n_voters_outgoing),
		LearnersNext:   ids(c.learners_next, c.n_learners_next),
		AutoLeave:      c.auto_leave != 0,
	}
}

func (c cStorage) InitialState() (pb.HardState, pb.ConfState, error) {
	var hs C.capstan_raft_hard_state
	var cs C.capstan_raft_conf_state
	if err := storageError(C.capstan_raft_call_initial_state(c.s, &hs, &cs), "InitialState"); err != nil {
		return pb.HardState{}, pb.ConfState{}, err
	}
	return pb.HardState{Term: uint64(hs.term), Vote: uint64(hs.vote), Commit: uint64(hs.commit)},
		confStateFromC(&cs), nil
}

func (c cStorage) Entries(lo, hi, maxSize uint64) ([]pb.Entry, error) {
	var p *C.capstan_raft_entry
	var n C.size_t
	rc := C.capstan_raft_call_entries(c.s, C.uint64_t(lo), C.uint64_t(hi), C.uint64_t(maxSize), &p, &n)
	if err := storageError(rc, "Entries"); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	in := unsafe.Slice(p, int(n))
	total := 0
	for i := range in {
		total += int(in[i].data_len)
	}
	buf := make([]byte, 0, total) // one allocation for every entry's data
	ents := make([]pb.Entry, len(in))
	for i := range in {
		e := &in[i]
		ents[i] = pb.Entry{Index: uint64(e.index), Term: uint64(e.term), Type: pb.EntryType(e._type)}
		if e.data_len > 0 {
			start := len(buf)
			buf = append(buf, unsafe.Slice((*byte)(unsafe.Pointer(e.data)), int(e.data_len))...)
			ents[i].Data = buf[start:len(buf):len(buf)]
		}
	}
	return ents, nil
}

func (c cStorage) Term(i uint64) (uint64, error) {
	var t C.uint64_t
	err := storageError(C.capstan_raft_call_term(c.s, C.uint64_t(i), &t), "Term")
	return uint64(t), err
}

func (c cStorage) FirstIndex() (uint64, error) {
	var i C.uint64_t
	err := storageError(C.capstan_raft_call_first_index(c.s, &i), "FirstIndex")
	return uint64(i), err
}

func (c cStorage) LastIndex() (uint64, error) {
	var i C.uint64_t
	err := storageError(C.capstan_raft_call_last_index(c.s, &i), "LastIndex")
	return uint64(i), err
}

func (c cStorage) Snapshot() (pb.Snapshot, error) {
	var m C.capstan_raft_snapshot_meta
	if err := storageError(C.capstan_raft_call_snapshot(c.s, &m), "Snapshot"); err != nil {
		return pb.Snapshot{}, err
	}
	return pb.Snapshot{Metadata: pb.SnapshotMetadata{
		Index: uint64(m.index), Term: uint64(m.term), ConfState: confStateFromC(&m.conf_state),
	}}, nil
}
