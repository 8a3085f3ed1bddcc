package main

/*
#include "capstan_raft.h"
*/
import "C"

import (
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"unsafe"

	"go.etcd.io/etcd/raft"
)

// cLogger is a raft.Logger that hands each line to a C callback. Panic and
// Fatal log the line as an error, then panic; the exported function that
// was running recovers the panic and aborts (recoverPanic).
type cLogger struct {
	fn  C.capstan_raft_log_fn
	ctx unsafe.Pointer // the caller's; never a Go pointer
}

func (l *cLogger) emit(level C.int, line string) {
	callLog(l.fn, l.ctx, level, strings.TrimSuffix(line, "\n"))
}

func (l *cLogger) Debug(v ...interface{}) { l.emit(C.CAPSTAN_RAFT_LOG_DEBUG, fmt.Sprint(v...)) }
func (l *cLogger) Debugf(format string, v ...interface{}) {
	l.emit(C.CAPSTAN_RAFT_LOG_DEBUG, fmt.Sprintf(format, v...))
}
func (l *cLogger) Info(v ...interface{}) { l.emit(C.CAPSTAN_RAFT_LOG_INFO, fmt.Sprint(v...)) }
func (l *cLogger) Infof(format string, v ...interface{}) {
	l.emit(C.CAPSTAN_RAFT_LOG_INFO, fmt.Sprintf(format, v...))
}
func (l *cLogger) Warning(v ...interface{}) { l.emit(C.CAPSTAN_RAFT_LOG_WARNING, fmt.Sprint(v...)) }
func (l *cLogger) Warningf(format string, v ...interface{}) {
	l.emit(C.CAPSTAN_RAFT_LOG_WARNING, fmt.Sprintf(format, v...))
}
func (l *cLogger) Error(v ...interface{}) { l.emit(C.CAPSTAN_RAFT_LOG_ERROR, fmt.Sprint(v...)) }
func (l *cLogger) Errorf(format string, v ...interface{}) {
	l.emit(C.CAPSTAN_RAFT_LOG_ERROR, fmt.Sprintf(format, v...))
}
func (l *cLogger) Fatal(v ...interface{})                 { l.fail(fmt.Sprint(v...)) }
func (l *cLogger) Fatalf(format string, v ...interface{}) { l.fail(fmt.Sprintf(format, v...)) }
func (l *cLogger) Panic(v ...interface{})                 { l.fail(fmt.Sprint(v...)) }
func (l *cLogger) Panicf(format string, v ...interface{}) { l.fail(fmt.Sprintf(format, v...)) }

func (l *cLogger) fail(line string) {
	l.emit(C.CAPSTAN_RAFT_LOG_ERROR, line)
	panic(line)
}

var (
	globalMu sync.Mutex
	// raft's package logger is not readable, so the shim keeps its own copy.
	global raft.Logger = &raft.DefaultLogger{Logger: log.New(os.Stderr, "raft", log.LstdFlags)}
)

func globalLogger() raft.Logger {
	globalMu.Lock()
	defer globalMu.Unlock()
	return global
}

//export capstan_raft_set_logger
func capstan_raft_set_logger(fn C.capstan_raft_log_fn, ctx unsafe.Pointer) {
	defer recoverPanic("capstan_raft_set_logger", 0)
	var l raft.Logger
	if fn != nil {
		l = &cLogger{fn: fn, ctx: ctx}
	} else {
		l = &raft.DefaultLogger{Logger: log.New(os.Stderr, "raft", log.LstdFlags)}
	}
	globalMu.Lock()
	global = l
	globalMu.Unlock()
	raft.SetLogger(l)
}
