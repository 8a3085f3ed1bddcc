// Command failover measures how long a 3-member etcd-API cluster (etcd or
// Capstan) takes to accept writes again after its leader is killed.
//
//	failover --endpoints=A,B,C --pids=PA,PB,PC [--interval=10ms] [--warmup=2s]
//	         [--cacert=CA --cert=CERT --key=KEY]
//
// --pids gives the process of each endpoint, in the same order. The tool:
//
//  1. asks every endpoint for its Status and finds the leader's endpoint;
//  2. runs a light write load: one clientv3 client over all endpoints, one Put
//     every --interval (open loop: a Put that hangs does not delay the next);
//     every Put of the warm-up must succeed;
//  3. sends SIGKILL to the leader's process and notes the time t0;
//  4. keeps writing, and polls Status on the two survivors every
//     --status-interval until one reports a leader that is neither none nor
//     the killed member;
//  5. prints one line: "leader_ms=X write_ms=Y", where X is t0 to the first
//     Status naming the new leader and Y is t0 to the first acknowledged Put
//     among those issued after t0.
//
// --cacert, --cert and --key, as etcdctl's, connect over TLS with a client
// certificate (https endpoints). It exits 1 when no write is acknowledged
// within --timeout.
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/pkg/transport"
)

func main() {
	endpointsFlag := flag.String("endpoints", "", "comma-separated client endpoints")
	pidsFlag := flag.String("pids", "", "comma-separated process ids, one per endpoint")
	interval := flag.Duration("interval", 10*time.Millisecond, "time between two puts")
	statusInterval := flag.Duration("status-interval", 2*time.Millisecond, "time between Status polls")
	warmup := flag.Duration("warmup", 2*time.Second, "writes before the kill")
	putTimeout := flag.Duration("put-timeout", 5*time.Second, "deadline of one put")
	timeout := flag.Duration("timeout", 30*time.Second, "give up after this long without a write")
	cacert := flag.String("cacert", "", "verify the servers' certificates with this CA bundle")
	cert := flag.String("cert", "", "client certificate")
	key := flag.String("key", "", "client certificate's key")
	flag.Parse()

	var tlsConfig *tls.Config
	if *cacert != "" || *cert != "" {
		info := transport.TLSInfo{CertFile: *cert, KeyFile: *key, TrustedCAFile: *cacert}
		c, err := info.ClientConfig()
		if err != nil {
			fail("TLS: %v", err)
		}
		tlsConfig = c
	}

	endpoints := strings.Split(*endpointsFlag, ",")
	var pids []int
	for _, p := range strings.Split(*pidsFlag, ",") {
		n, err := strconv.Atoi(p)
		if err != nil {
			fail("bad --pids: %v", err)
		}
		pids = append(pids, n)
	}
	if len(endpoints) != len(pids) || len(endpoints) < 2 {
		fail("--endpoints and --pids must name the same members (at least 2)")
	}

	// One single-endpoint client per member for Status.
	single := make([]*clientv3.Client, len(endpoints))
	for i, ep := range endpoints {
		c, err := clientv3.New(clientv3.Config{Endpoints: []string{ep}, DialTimeout: 5 * time.Second,
			TLS: tlsConfig})
		if err != nil {
			fail("connect %s: %v", ep, err)
		}
		single[i] = c
	}
	memberIDs := make([]uint64, len(endpoints))
	var leaderID uint64
	deadline := time.Now().Add(*timeout)
	for {
		leaderID = 0
		ok := true
		for i, c := range single {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := c.Status(ctx, endpoints[i])
			cancel()
			if err != nil {
				ok = false
				break
			}
			memberIDs[i] = st.Header.MemberId
			if st.Leader != 0 {
				leaderID = st.Leader
			}
		}
		if ok && leaderID != 0 {
			break
		}
		if time.Now().After(deadline) {
			fail("no leader reported by every member")
		}
		time.Sleep(50 * time.Millisecond)
	}
	leader := -1
	for i, id := range memberIDs {
		if id == leaderID {
			leader = i
		}
	}
	if leader < 0 {
		fail("leader %x is none of the endpoints' members %x", leaderID, memberIDs)
	}

	client, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second,
		TLS: tlsConfig})
	if err != nil {
		fail("connect: %v", err)
	}
	value := strings.Repeat("v", 256)

	var mu sync.Mutex
	var killAt time.Time // zero until the kill
	var firstAck time.Time
	warmupErrors := 0
	acked := make(chan struct{})
	var ackOnce sync.Once

	put := func(seq int, issued time.Time) {
		ctx, cancel := context.WithTimeout(context.Background(), *putTimeout)
		_, err := client.Put(ctx, fmt.Sprintf("/failover/%08d", seq), value)
		cancel()
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if killAt.IsZero() || issued.Before(killAt) {
			if err != nil && killAt.IsZero() {
				warmupErrors++
			}
			return
		}
		if err == nil && (firstAck.IsZero() || now.Before(firstAck)) {
			firstAck = now
			ackOnce.Do(func() { close(acked) })
		}
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the write load
		defer wg.Done()
		ticker := time.NewTicker(*interval)
		defer ticker.Stop()
		for seq := 0; ; seq++ {
			select {
			case <-stop:
				return
			case t := <-ticker.C:
				_ = t
				wg.Add(1)
				go func(seq int, issued time.Time) { defer wg.Done(); put(seq, issued) }(seq, time.Now())
			}
		}
	}()

	time.Sleep(*warmup)
	mu.Lock()
	if warmupErrors > 0 {
		mu.Unlock()
		fail("%d puts failed before the kill", warmupErrors)
	}
	if err := syscall.Kill(pids[leader], syscall.SIGKILL); err != nil {
		mu.Unlock()
		fail("kill %d: %v", pids[leader], err)
	}
	killAt = time.Now()
	mu.Unlock()

	newLeader := make(chan time.Time, len(endpoints))
	for i := range endpoints {
		if i == leader {
			continue
		}
		go func(c *clientv3.Client, ep string) {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
				st, err := c.Status(ctx, ep)
				cancel()
				if err == nil && st.Leader != 0 && st.Leader != leaderID {
					newLeader <- time.Now()
					return
				}
				time.Sleep(*statusInterval)
			}
		}(single[i], endpoints[i])
	}

	var leaderAt time.Time
	limit := time.After(*timeout)
	gotAck := false
	for leaderAt.IsZero() || !gotAck {
		select {
		case t := <-newLeader:
			if leaderAt.IsZero() || t.Before(leaderAt) {
				leaderAt = t
			}
		case <-acked:
			gotAck = true
			acked = nil
		case <-limit:
			fail("no new leader or no acknowledged write %v after the kill", *timeout)
		}
	}
	close(stop)
	mu.Lock()
	ackAt := firstAck
	mu.Unlock()
	fmt.Printf("leader_ms=%.1f write_ms=%.1f\n",
		float64(leaderAt.Sub(killAt).Microseconds())/1000,
		float64(ackAt.Sub(killAt).Microseconds())/1000)
	os.Exit(0) // do not wait for puts still hanging on the dead member
}

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "failover: "+format+"\n", args...)
	os.Exit(1)
}
