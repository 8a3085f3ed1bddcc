// Command golist measures full lists of a large prefix the way kube-apiserver
// makes them: Go's clientv3 (etcd 3.4's, from Debian), which decodes every
// response into its messages, and puts from the same process on a client of
// their own while the lists run.
//
//	golist --endpoint=127.0.0.1:23790 --prefix=/large/ [--concurrent=4] [--put-rate=50]
//
// One round: puts alone for --idle, then one full list, then --concurrent
// full lists at once with the puts going on. It prints one line:
//
//	idle_put_p99_ms=A full_list_ms=B concurrent_list_ms=C put_p99_ms=D puts=N objects=M
//
// where C is the median of the concurrent lists' times and D the p99 of the
// puts issued while they ran. Every list must return the same number of
// objects; the tool exits 1 on any error.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"go.etcd.io/etcd/clientv3"
)

func main() {
	endpoint := flag.String("endpoint", "127.0.0.1:2379", "the server's client endpoint")
	prefix := flag.String("prefix", "/large/", "the prefix to list")
	concurrent := flag.Int("concurrent", 4, "full lists at once")
	putRate := flag.Int("put-rate", 50, "puts per second")
	idle := flag.Duration("idle", 3*time.Second, "puts alone before the lists")
	flag.Parse()

	dial := func() *clientv3.Client {
		c, err := clientv3.New(clientv3.Config{
			Endpoints:          []string{*endpoint},
			DialTimeout:        10 * time.Second,
			MaxCallRecvMsgSize: 1<<31 - 1,
		})
		if err != nil {
			fail("dial: %v", err)
		}
		return c
	}
	lists, writes := dial(), dial()
	defer lists.Close()
	defer writes.Close()
	ctx := context.Background()

	// The puts: one every 1/put-rate seconds (open loop), each timed.
	var mu sync.Mutex
	var latencies []time.Duration
	stop := make(chan struct{})
	var putters sync.WaitGroup
	putters.Add(1)
	go func() {
		defer putters.Done()
		tick := time.NewTicker(time.Second / time.Duration(*putRate))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			putters.Add(1)
			go func(i int) {
				defer putters.Done()
				start := time.Now()
				if _, err := writes.Put(ctx, fmt.Sprintf("/golist/put/%d", i%1000), "v"); err != nil {
					fail("put: %v", err)
				}
				mu.Lock()
				latencies = append(latencies, time.Since(start))
				mu.Unlock()
			}(i)
		}
	}()
	take := func() []time.Duration {
		mu.Lock()
		defer mu.Unlock()
		out := latencies
		latencies = nil
		return out
	}

	list := func() (time.Duration, int) {
		start := time.Now()
		resp, err := lists.Get(ctx, *prefix, clientv3.WithPrefix())
		if err != nil {
			fail("list: %v", err)
		}
		return time.Since(start), len(resp.Kvs)
	}

	time.Sleep(*idle)
	idlePuts := take()
	full, objects := list()
	take()
	times := make([]time.Duration, *concurrent)
	var listers sync.WaitGroup
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
	during := take()
	close(stop)
	putters.Wait()

	sort.Slice(times, func(a, b int) bool { return times[a] < times[b] })
	fmt.Printf("idle_put_p99_ms=%.2f full_list_ms=%.0f concurrent_list_ms=%.0f put_p99_ms=%.2f puts=%d objects=%d\n",
		p99(idlePuts), ms(full), ms(times[len(times)/2]), p99(during), len(during), objects)
}

func p99(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(a, b int) bool { return d[a] < d[b] })
	return ms(d[(len(d)*99+99)/100-1])
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "golist: "+format+"\n", args...)
	os.Exit(1)
}
