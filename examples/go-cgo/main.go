// go-cgo: a Go program embedding Capstan through libcapstan's C API. It
// opens a store, writes pods in Kubernetes' protobuf storage format, lists
// the pods of one node through the watch cache and watches them while they
// are created, changed and moved away. Exits 1 on any mismatch.
//
//	PKG_CONFIG_PATH=<prefix>/lib/pkgconfig go run . [DATA_DIR]
package main

import (
	"fmt"
	"os"
	"reflect"
	"sort"
	"strconv"
	"time"
)

// ---- A minimal encoder of v1.Pod in Kubernetes' storage format ----------
// "k8s\0" + runtime.Unknown{typeMeta=1{apiVersion=1, kind=2}, raw=2}, raw
// being v1.Pod{metadata=1{name=1, namespace=3, uid=5, labels=11{key=1,
// value=2}}, spec=2{nodeName=10}, status=3{phase=1}}.

func varint(v uint64, out []byte) []byte {
	for v >= 0x80 {
		out = append(out, byte(v)|0x80)
		v >>= 7
	}
	return append(out, byte(v))
}

func field(n int, value []byte, out []byte) []byte {
	out = varint(uint64(n)<<3|2, out)
	out = varint(uint64(len(value)), out)
	return append(out, value...)
}

func encodePod(ns, name, node, phase string, labels map[string]string) []byte {
	var meta, spec, status, pod, typeMeta []byte
	meta = field(1, []byte(name), meta)
	meta = field(3, []byte(ns), meta)
	meta = field(5, []byte("uid-"+ns+"-"+name), meta)
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		entry := field(2, []byte(labels[k]), field(1, []byte(k), nil))
		meta = field(11, entry, meta)
	}
	spec = field(10, []byte(node), spec)
	status = field(1, []byte(phase), status)
	pod = field(3, status, field(2, spec, field(1, meta, pod)))
	typeMeta = field(2, []byte("Pod"), field(1, []byte("v1"), typeMeta))
	return field(2, pod, field(1, typeMeta, []byte("k8s\x00")))
}

// ---------------------------------------------------------------------------

var failures int

func expect(ok bool, what string) {
	if ok {
		fmt.Println("ok  ", what)
	} else {
		fmt.Println("FAIL", what)
		failures++
	}
}

func must(err error, what string) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", what, err)
		os.Exit(1)
	}
}

func podKey(name string) string { return "/registry/pods/default/" + name }

func main() {
	dir := ""
	if len(os.Args) > 1 {
		dir = os.Args[1]
	} else {
		d, err := os.MkdirTemp("", "capstan-go-cgo-")
		must(err, "temp dir")
		defer os.RemoveAll(d)
		dir = d
	}
	fmt.Printf("libcapstan %s from Go, data dir %s\n", Version(), dir)

	store, err := Open(dir)
	must(err, "open")
	defer store.Close()

	nodes := []string{"node-a", "node-b", "node-c"}
	var onB []string
	for i := 0; i < 12; i++ {
		name := "pod-" + strconv.Itoa(10+i)
		app := "db"
		if i%2 == 1 {
			app = "web"
		}
		_, err := store.Put(podKey(name), encodePod("default", name, nodes[i%3], "Running",
			map[string]string{"app": app}))
		must(err, "put")
		if nodes[i%3] == "node-b" {
			onB = append(onB, podKey(name))
		}
	}
	fmt.Printf("wrote 12 pods, store revision %d\n", store.Revision())

	pods, rev, err := store.List("/registry/pods/", "", "spec.nodeName=node-b")
	must(err, "list")
	var keys []string
	for _, p := range pods {
		keys = append(keys, p.Key)
	}
	fmt.Printf("pods on node-b at revision %d: %v\n", rev, keys)
	expect(reflect.DeepEqual(keys, onB), "List(spec.nodeName=node-b) returns exactly node-b's 4 pods")
	expect(rev == store.Revision(), "List is at the store's revision")
	web, _, err := store.List("/registry/pods/", "app=web", "spec.nodeName=node-b")
	must(err, "list with labels")
	expect(len(web) == 2, "List(spec.nodeName=node-b, app=web) returns 2 pods")
	_, _, err = store.List("/registry/pods/", "", "spec.nodeName")
	e, isCapstan := err.(*Error)
	expect(isCapstan && e.Code == 3, "a malformed selector is INVALID_ARGUMENT: "+fmt.Sprint(err))

	w, err := store.WatchCache("/registry/pods/", "spec.nodeName=node-b", strconv.FormatInt(rev, 10))
	must(err, "watch")
	_, err = store.Put(podKey("pod-new"), encodePod("default", "pod-new", "node-b", "Pending", nil))
	must(err, "put")
	_, err = store.Put(podKey("pod-11"), encodePod("default", "pod-11", "node-b", "Succeeded", nil))
	must(err, "put")
	_, err = store.Put(podKey("pod-14"), encodePod("default", "pod-14", "node-c", "Running", nil))
	must(err, "put") // moves off node-b
	_, err = store.Put(podKey("pod-x"), encodePod("default", "pod-x", "node-a", "Running", nil))
	must(err, "put") // never on node-b
	_, err = store.Delete(podKey("pod-17"))
	must(err, "delete")

	var seen []string
	timeout := time.After(10 * time.Second)
	for len(seen) < 4 {
		select {
		case ev := <-w.Events:
			if ev.Err != nil {
				must(ev.Err, "watch ended")
			}
			fmt.Printf("watch event %s %s at revision %d\n", ev.Type, ev.Object.Key, ev.Revision)
			seen = append(seen, ev.Type+" "+ev.Object.Key)
		case <-timeout:
			fmt.Println("timed out waiting for watch events")
			seen = append(seen, "TIMEOUT")
		}
	}
	w.Close()
	want := []string{"ADDED " + podKey("pod-new"), "MODIFIED " + podKey("pod-11"),
		"DELETED " + podKey("pod-14"), "DELETED " + podKey("pod-17")}
	expect(reflect.DeepEqual(seen, want), "node-b's watcher sees ADDED, MODIFIED, DELETED (moved away), DELETED")

	if failures > 0 {
		fmt.Println("go-cgo: FAILED")
		store.Close()
		os.Exit(1)
	}
	fmt.Println("go-cgo: all checks passed")
}
