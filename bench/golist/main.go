// Command golist measures full lists of a large prefix the way kube-apiserver
// makes them, through Go's clientv3 (etcd 3.4's, from Debian), which decodes
// every response into its messages, with puts going on. It runs as one of
// two roles, in two processes, so that the lists can be niced without the
// puts:
//
//	golist --role=puts --endpoint=127.0.0.1:23790 [--put-rate=50]
//	golist --role=lists --endpoint=127.0.0.1:23790 --prefix=/large/ [--concurrent=4] [--warm=N]
//
// The puts role puts at --put-rate (open loop: a slow put does not delay
// the next) until it gets SIGTERM, and prints a line per put:
// "put START_UNIX_NS LATENCY_NS". The lists role makes --warm full lists it
// does not measure, waits --idle, makes one full
// list, then --concurrent full lists at once, and prints
//
//	full_start=NS full_end=NS concurrent_start=NS concurrent_end=NS full_list_ms=A concurrent_list_ms=B objects=N
//
// where B is the median of the concurrent lists' times (wall-clock ns since
// the Unix epoch, to match the puts'). Every list must return the same
// number of objects; either role exits 1 on any error.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/clientv3"
)

func main() {
	role := flag.String("role", "", "puts or lists")
	endpoint := flag.String("endpoint", "127.0.0.1:2379", "the server's client endpoint")
	prefix := flag.String("prefix", "/large/", "the prefix to list")
	concurrent := flag.Int("concurrent", 4, "full lists at once")
	putRate := flag.Int("put-rate", 50, "puts per second")
	idle := flag.Duration("idle", 3*time.Second, "time before the first list")
	warm := flag.Int("warm", 0, "full lists made, and not measured, before the idle time: "+
		"a long-running client such as kube-apiserver has a heap that has held lists before")
	flag.Parse()

	client, err := clientv3.New(clientv3.Config{
		Endpoints:          []string{*endpoint},
		DialTimeout:        10 * time.Second,
		MaxCallRecvMsgSize: 1<<31 - 1,
	})
	if err != nil {
		fail("dial: %v", err)
	}
	defer client.Close()
	switch *role {
	case "puts":
		puts(client, *putRate)
	case "lists":
		lists(client, *prefix, *concurrent, *warm, *idle)
	default:
		fail("--role must be puts or lists")
	}
}

func puts(client *clientv3.Client, rate int) {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	var mu sync.Mutex
	out := make([]string, 0, 1<<12)
	var inflight sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := 0; ; i++ {
		select {
		case <-stop:
			inflight.Wait()
			for _, line := range out {
				fmt.Println(line)
			}
			return
		case <-tick.C:
		}
		inflight.Add(1)
		go func(i int) {
			defer inflight.Done()
			start := time.Now()
			if _, err := client.Put(context.Background(), fmt.Sprintf("/golist/put/%d", i%1000), "v"); err != nil {
				fail("put: %v", err)
			}
			line := fmt.Sprintf("put %d %d", start.UnixNano(), time.Since(start).Nanoseconds())
			mu.Lock()
			out = append(out, line)
			mu.Unlock()
		}(i)
	}
}

func lists(client *clientv3.Client, prefix string, concurrent, warm int, idle time.Duration) {
	list := func() (time.Duration, int) {
		start := time.Now()
		resp, err := client.Get(context.Background(), prefix, clientv3.WithPrefix())
		if err != nil {
			fail("list: %v", err)
		}
		return time.Since(start), len(resp.Kvs)
	}
	for i := 0; i < warm; i++ {
		list()
	}
	time.Sleep(idle)
	fullStart := time.Now()
	full, objects := list()
	fullEnd := time.Now()
	times := make([]time.Duration, concurrent)
	var listers sync.WaitGroup
	concurrentStart := time.Now()
	for i := range times {
		listers.Add(1)
		go func(i int) {
			defer listers.Done()
			var n int
			times[i], n = list()
			if n != objects {
				fail("a concurrent list returned %d objects, the full list %d", n, objects)
			}
		}(i)
	}
	listers.Wait()
	concurrentEnd := time.Now()
	sort.Slice(times, func(a, b int) bool { return times[a] < times[b] })
	fmt.Printf("full_start=%d full_end=%d concurrent_start=%d concurrent_end=%d full_list_ms=%.0f concurrent_list_ms=%.0f objects=%d\n",
		fullStart.UnixNano(), fullEnd.UnixNano(), concurrentStart.UnixNano(), concurrentEnd.UnixNano(),
		ms(full), ms(times[len(times)/2]), objects)
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "golist: "+format+"\n", args...)
	os.Exit(1)
}
