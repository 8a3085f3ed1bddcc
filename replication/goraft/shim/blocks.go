package main

/*
#include <stdlib.h>
#include "capstan_raft.h"
*/
import "C"

import (
	"unsafe"

	"go.etcd.io/etcd/raft"
	pb "go.etcd.io/etcd/raft/raftpb"
	"go.etcd.io/etcd/raft/tracker"
)

// block lays out one malloc'd result: the fixed structs first, then the
// arrays (8-byte aligned), then byte payloads. Every pointer inside the
// block points into it, so the caller frees it with one free().
type block struct {
	base unsafe.Pointer
	buf  []byte
	off  int
}

const align = 8

func roundUp(n int) int { return (n + align - 1) &^ (align - 1) }

func newBlock(size int) *block {
	base := C.malloc(C.size_t(size))
	if base == nil {
		panic("out of memory")
	}
	return &block{base: base, buf: unsafe.Slice((*byte)(base), size)}
}

// take reserves n bytes (8-byte aligned) and zeroes them.
func (b *block) take(n int) unsafe.Pointer {
	if n == 0 {
		return nil
	}
	p := unsafe.Pointer(&b.buf[b.off])
	z := b.buf[b.off : b.off+roundUp(n)]
	for i := range z { // compiled to memclr
		z[i] = 0
	}
	b.off += len(z)
	return p
}

// bytes copies s into the block (not zeroed first: s overwrites it).
func (b *block) bytes(s []byte) (*C.uint8_t, C.size_t) {
	if len(s) == 0 {
		return nil, 0
	}
	p := unsafe.Pointer(&b.buf[b.off])
	copy(b.buf[b.off:], s)
	b.off += roundUp(len(s))
	return (*C.uint8_t)(p), C.size_t(len(s))
}

func (b *block) ids(s []uint64) (*C.uint64_t, C.size_t) {
	if len(s) == 0 {
		return nil, 0
	}
	p := b.take(8 * len(s))
	copy(unsafe.Slice((*uint64)(p), len(s)), s)
	return (*C.uint64_t)(p), C.size_t(len(s))
}

func confStateSize(cs *pb.ConfState) int {
	return 8 * (len(cs.Voters) + len(cs.Learners) + len(cs.VotersOutgoing) + len(cs.LearnersNext))
}

func (b *block) confState(dst *C.capstan_raft_conf_state, cs *pb.ConfState) {
	dst.voters, dst.n_voters = b.ids(cs.Voters)
	dst.learners, dst.n_learners = b.ids(cs.Learners)
	dst.voters_outgoing, dst.n_voters_outgoing = b.ids(cs.VotersOutgoing)
	dst.learners_next, dst.n_learners_next = b.ids(cs.LearnersNext)
	if cs.AutoLeave {
		dst.auto_leave = 1
	}
}

func newConfStateBlock(cs *pb.ConfState) *C.capstan_raft_conf_state {
	hdr := roundUp(int(unsafe.Sizeof(C.capstan_raft_conf_state{})))
	b := newBlock(hdr + confStateSize(cs))
	out := (*C.capstan_raft_conf_state)(b.take(hdr))
	b.confState(out, cs)
	return out
}

func entriesSize(es []pb.Entry) int {
	n := roundUp(int(unsafe.Sizeof(C.capstan_raft_entry{})) * len(es))
	for i := range es {
		n += roundUp(len(es[i].Data))
	}
	return n
}

func (b *block) entries(es []pb.Entry) (*C.capstan_raft_entry, C.size_t) {
	if len(es) == 0 {
		return nil, 0
	}
	p := (*C.capstan_raft_entry)(b.take(int(unsafe.Sizeof(C.capstan_raft_entry{})) * len(es)))
	out := unsafe.Slice(p, len(es))
	for i := range es {
		out[i].index = C.uint64_t(es[i].Index)
		out[i].term = C.uint64_t(es[i].Term)
		out[i]._type = C.uint32_t(es[i].Type)
		out[i].data, out[i].data_len = b.bytes(es[i].Data)
	}
	return p, C.size_t(len(es))
}

// newReadyBlock copies rd into one malloc'd capstan_raft_ready. Messages are
// marshaled straight into the block.
func newReadyBlock(rd *raft.Ready) *C.capstan_raft_ready {
	hdr := roundUp(int(unsafe.Sizeof(C.capstan_raft_ready{})))
	size := hdr + entriesSize(rd.Entries) + entriesSize(rd.CommittedEntries)
	msgSizes := make([]int, len(rd.Messages))
	size += roundUp(int(unsafe.Sizeof(C.capstan_raft_message{})) * len(rd.Messages))
	for i := range rd.Messages {
		msgSizes[i] = rd.Messages[i].Size()
		size += roundUp(msgSizes[i])
	}
	size += roundUp(int(unsafe.Sizeof(C.capstan_raft_read_state{})) * len(rd.ReadStates))
	for i := range rd.ReadStates {
		size += roundUp(len(rd.ReadStates[i].RequestCtx))
	}
	hasSnap := !raft.IsEmptySnap(rd.Snapshot)
	if hasSnap {
		size += confStateSize(&rd.Snapshot.Metadata.ConfState)
	}

	b := newBlock(size)
	r := (*C.capstan_raft_ready)(b.take(hdr))
	if rd.SoftState != nil {
		r.has_soft_state = 1
		r.lead = C.uint64_t(rd.SoftState.Lead)
		r.role = C.uint32_t(rd.SoftState.RaftState)
	}
	if !raft.IsEmptyHardState(rd.HardState) {
		r.has_hard_state = 1
		r.hard_state = C.capstan_raft_hard_state{
			term: C.uint64_t(rd.HardState.Term), vote: C.uint64_t(rd.HardState.Vote),
			commit: C.uint64_t(rd.HardState.Commit),
		}
	}
	if hasSnap {
		r.has_snapshot = 1
		r.snapshot.index = C.uint64_t(rd.Snapshot.Metadata.Index)
		r.snapshot.term = C.uint64_t(rd.Snapshot.Metadata.Term)
		b.confState(&r.snapshot.conf_state, &rd.Snapshot.Metadata.ConfState)
	}
	if rd.MustSync {
		r.must_sync = 1
	}
	r.entries, r.n_entries = b.entries(rd.Entries)
	r.committed, r.n_committed = b.entries(rd.CommittedEntries)
	if len(rd.Messages) > 0 {
		p := (*C.capstan_raft_message)(b.take(int(unsafe.Sizeof(C.capstan_raft_message{})) * len(rd.Messages)))
		ms := unsafe.Slice(p, len(rd.Messages))
		for i := range rd.Messages {
			m := &rd.Messages[i]
			ms[i].to = C.uint64_t(m.To)
			ms[i]._type = C.uint32_t(m.Type)
			dst := b.take(msgSizes[i])
			if msgSizes[i] > 0 {
				if _, err := m.MarshalTo(unsafe.Slice((*byte)(dst), msgSizes[i])); err != nil {
					panic(err)
				}
			}
			ms[i].bytes, ms[i].len = (*C.uint8_t)(dst), C.size_t(msgSizes[i])
		}
		r.messages, r.n_messages = p, C.size_t(len(ms))
	}
	if len(rd.ReadStates) > 0 {
		p := (*C.capstan_raft_read_state)(b.take(int(unsafe.Sizeof(C.capstan_raft_read_state{})) * len(rd.ReadStates)))
		rs := unsafe.Slice(p, len(rd.ReadStates))
		for i := range rd.ReadStates {
			rs[i].index = C.uint64_t(rd.ReadStates[i].Index)
			rs[i].context, rs[i].context_len = b.bytes(rd.ReadStates[i].RequestCtx)
		}
		r.read_states, r.n_read_states = p, C.size_t(len(rs))
	}
	return r
}

// newStatusBlock: BasicStatus, and the progress of every peer on a leader
// (as raft.Status fills it).
func newStatusBlock(rn *raft.RawNode) *C.capstan_raft_status {
	st := rn.BasicStatus()
	type peer struct {
		id  uint64
		typ raft.ProgressType
		pr  tracker.Progress
	}
	var peers []peer
	if st.RaftState == raft.StateLeader {
		rn.WithProgress(func(id uint64, typ raft.ProgressType, pr tracker.Progress) {
			peers = append(peers, peer{id, typ, pr})
		})
	}
	hdr := roundUp(int(unsafe.Sizeof(C.capstan_raft_status{})))
	psz := int(unsafe.Sizeof(C.capstan_raft_progress{}))
	b := newBlock(hdr + roundUp(psz*len(peers)))
	s := (*C.capstan_raft_status)(b.take(hdr))
	s.id = C.uint64_t(st.ID)
	s.hard_state = C.capstan_raft_hard_state{
		term: C.uint64_t(st.Term), vote: C.uint64_t(st.Vote), commit: C.uint64_t(st.Commit),
	}
	s.lead = C.uint64_t(st.Lead)
	s.role = C.uint32_t(st.RaftState)
	s.applied = C.uint64_t(st.Applied)
	s.lead_transferee = C.uint64_t(st.LeadTransferee)
	if len(peers) > 0 {
		p := (*C.capstan_raft_progress)(b.take(psz * len(peers)))
		ps := unsafe.Slice(p, len(peers))
		for i, pe := range peers {
			ps[i].id = C.uint64_t(pe.id)
			ps[i].match = C.uint64_t(pe.pr.Match)
			ps[i].next = C.uint64_t(pe.pr.Next)
			ps[i].state = C.uint32_t(pe.pr.State)
			if pe.typ == raft.ProgressTypeLearner {
				ps[i].learner = 1
			}
			if pe.pr.RecentActive {
				ps[i].recent_active = 1
			}
		}
		s.progress, s.n_progress = p, C.size_t(len(ps))
	}
	return s
}
