#!/usr/bin/env python3
"""Puts and ranges through etcd's JSON gateway (POST /v3/kv/put, /v3/kv/range).

Each client holds one kept-alive HTTP/1.1 connection and sends its requests
one after another; the run reports requests per second and latency
percentiles for each phase. Run it against Capstan and against etcd in turn:

  bench/http_gateway.py --endpoint 127.0.0.1:2379 --clients 8 --total 4000
"""

import argparse
import base64
import http.client
import json
import threading
import time


def percentile(sorted_values, p):
    if not sorted_values:
        return 0.0
    i = min(len(sorted_values) - 1, int(round(p / 100.0 * (len(sorted_values) - 1))))
    return sorted_values[i]


def run_phase(host, port, clients, total, make_body, path):
    per_client = total // clients
    latencies = []
    errors = [0]
    lock = threading.Lock()

    def worker(c):
        conn = http.client.HTTPConnection(host, port, timeout=30)
        mine = []
        for i in range(per_client):
            body = make_body(c, i)
            start = time.perf_counter()
            conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            mine.append(time.perf_counter() - start)
            if resp.status != 200:
                with lock:
                    errors[0] += 1
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker, args=(c,)) for c in range(clients)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "requests": len(latencies),
        "errors": errors[0],
        "per_second": len(latencies) / elapsed,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", default="127.0.0.1:2379", help="host:port of the client URL")
    parser.add_argument("--clients", type=int, default=8, help="connections, each one request at a time")
    parser.add_argument("--total", type=int, default=4000, help="requests per phase")
    parser.add_argument("--val-size", type=int, default=256, help="bytes of each value")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    host, port = args.endpoint.rsplit(":", 1)
    value = base64.b64encode(b"v" * args.val_size).decode()

    def key(c, i):
        return base64.b64encode(b"/http-bench/%04d/%06d" % (c, i)).decode()

    results = {
        "put": run_phase(host, int(port), args.clients, args.total,
                         lambda c, i: json.dumps({"key": key(c, i), "value": value}), "/v3/kv/put"),
        "range": run_phase(host, int(port), args.clients, args.total,
                           lambda c, i: json.dumps({"key": key(c, i)}), "/v3/kv/range"),
    }
    if args.json:
        print(json.dumps(results))
        return
    for phase, r in results.items():
        print("%-6s %6d requests, %d errors: %8.0f req/s, p50 %.2f ms, p99 %.2f ms" %
              (phase, r["requests"], r["errors"], r["per_second"], r["p50_ms"], r["p99_ms"]))


if __name__ == "__main__":
    main()
