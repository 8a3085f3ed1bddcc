package main

// A small Go binding of libcapstan's C API (capstan/capstan_c.h), enough for
// this example: open/close, put, delete, list through the watch cache, and
// cache watches delivered on a Go channel.

/*
#cgo pkg-config: capstan
#include <stdlib.h>
#include <stdint.h>
#include <capstan/capstan_c.h>

int openCacheWatch(capstan_store* store, capstan_cache_watch_options* options, uintptr_t handle,
                   capstan_cache_watch** watch, char** error);
*/
import "C"

import (
	"fmt"
	"runtime/cgo"
	"unsafe"
)

// Error is a libcapstan error: a gRPC code and etcd's message.
type Error struct {
	Code    int
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("capstan code %d: %s", e.Code, e.Message) }

func statusError(code C.int, msg *C.char) error {
	if code == C.CAPSTAN_OK {
		return nil
	}
	defer C.capstan_free(unsafe.Pointer(msg))
	return &Error{Code: int(code), Message: C.GoString(msg)}
}

// cbytes returns a C view of b, valid while b is alive and unmoved (the
// call copies it; cgo pins b for the duration of the call).
func cbytes(b []byte) (*C.char, C.size_t) {
	if len(b) == 0 {
		return nil, 0
	}
	return (*C.char)(unsafe.Pointer(&b[0])), C.size_t(len(b))
}

// cStrings returns C copies of ss and the function that frees them.
func cStrings(ss ...string) ([]*C.char, func()) {
	out := make([]*C.char, len(ss))
	for i, s := range ss {
		out[i] = C.CString(s)
	}
	return out, func() {
		for _, p := range out {
			C.free(unsafe.Pointer(p))
		}
	}
}

// Store is an open libcapstan store. Safe for concurrent use.
type Store struct{ s *C.capstan_store }

// Open opens (creating if needed) the store in dataDir.
func Open(dataDir string) (*Store, error) {
	var opts C.capstan_options
	C.capstan_options_init(&opts)
	cdir := C.CString(dataDir)
	defer C.free(unsafe.Pointer(cdir))
	opts.data_dir = cdir
	var s *C.capstan_store
	var msg *C.char
	if err := statusError(C.capstan_open(&opts, &s, &msg), msg); err != nil {
		return nil, err
	}
	return &Store{s}, nil
}

// Close closes the store. Every watch must be closed first.
func (s *Store) Close() { C.capstan_close(s.s) }

func (s *Store) Revision() int64 { return int64(C.capstan_revision(s.s)) }

// Put writes key=value and returns the revision of the write.
func (s *Store) Put(key string, value []byte) (int64, error) {
	k := []byte(key)
	kp, kn := cbytes(k)
	vp, vn := cbytes(value)
	var rev C.int64_t
	var msg *C.char
	err := statusError(C.capstan_put(s.s, kp, kn, vp, vn, 0, &rev, &msg), msg)
	return int64(rev), err
}

// Delete deletes key and returns how many keys were deleted.
func (s *Store) Delete(key string) (int64, error) {
	k := []byte(key)
	kp, kn := cbytes(k)
	var deleted C.int64_t
	var msg *C.char
	err := statusError(C.capstan_delete_range(s.s, kp, kn, nil, 0, &deleted, nil, &msg), msg)
	return int64(deleted), err
}

// Object is one cached object.
type Object struct {
	Key         string
	Value       []byte
	ModRevision int64
}

func goObject(kv *C.capstan_kv) Object {
	return Object{
		Key:         C.GoStringN(kv.key, C.int(kv.key_len)),
		Value:       C.GoBytes(unsafe.Pointer(kv.value), C.int(kv.value_len)),
		ModRevision: int64(kv.mod_revision),
	}
}

// List lists the objects under prefix that match the selectors, through the
// watch cache, and the revision listed.
func (s *Store) List(prefix, labelSelector, fieldSelector string) ([]Object, int64, error) {
	var opts C.capstan_list_options
	cstrs, free := cStrings(prefix, labelSelector, fieldSelector)
	defer free()
	opts.prefix, opts.label_selector, opts.field_selector = cstrs[0], cstrs[1], cstrs[2]
	var res C.capstan_list_result
	var msg *C.char
	if err := statusError(C.capstan_list(s.s, &opts, &res, &msg), msg); err != nil {
		return nil, 0, err
	}
	defer C.capstan_list_result_free(&res)
	objs := unsafe.Slice(res.objects, res.num_objects)
	out := make([]Object, 0, len(objs))
	for i := range objs {
		out = append(out, goObject(&objs[i]))
	}
	return out, int64(res.revision), nil
}

// CacheEvent is one event of a cache watch.
type CacheEvent struct {
	Type     string // ADDED, MODIFIED, DELETED, BOOKMARK
	Revision int64
	Object   Object
	Err      error // set on the last event of a watch that ended
}

// CacheWatch delivers a cache watch's events on Events.
type CacheWatch struct {
	w      *C.capstan_cache_watch
	handle cgo.Handle
	Events chan CacheEvent
}

var eventTypes = [...]string{"ADDED", "MODIFIED", "DELETED", "BOOKMARK"}

// goCacheWatchEvents runs on the watch's own thread (see trampoline.c). It
// blocks that thread, and only that watch, while Events is full: drain
// Events before Close.
//
//export goCacheWatchEvents
func goCacheWatchEvents(handle C.uintptr_t, events *C.capstan_cache_event, n C.size_t,
	endCode C.int, endMessage *C.char) {
	ch := cgo.Handle(handle).Value().(chan CacheEvent)
	for _, e := range unsafe.Slice(events, n) {
		ch <- CacheEvent{Type: eventTypes[e._type], Revision: int64(e.revision), Object: goObject(&e.object)}
	}
	if endCode != 0 {
		ch <- CacheEvent{Err: &Error{Code: int(endCode), Message: C.GoString(endMessage)}}
	}
}

// WatchCache watches the objects under prefix matching fieldSelector,
// changes after resourceVersion ("" starts with the current objects).
func (s *Store) WatchCache(prefix, fieldSelector, resourceVersion string) (*CacheWatch, error) {
	cw := &CacheWatch{Events: make(chan CacheEvent, 1024)}
	cw.handle = cgo.NewHandle(cw.Events)
	var opts C.capstan_cache_watch_options
	cstrs, free := cStrings(prefix, fieldSelector, resourceVersion)
	defer free()
	opts.prefix, opts.field_selector, opts.resource_version = cstrs[0], cstrs[1], cstrs[2]
	var msg *C.char
	if err := statusError(C.openCacheWatch(s.s, &opts, C.uintptr_t(cw.handle), &cw.w, &msg), msg); err != nil {
		cw.handle.Delete()
		return nil, err
	}
	return cw, nil
}

// Close ends the watch; no event is sent after it returns.
func (w *CacheWatch) Close() {
	C.capstan_cache_watch_close(w.w)
	w.handle.Delete()
}

// Version is libcapstan's version.
func Version() string { return C.GoString(C.capstan_version()) }
