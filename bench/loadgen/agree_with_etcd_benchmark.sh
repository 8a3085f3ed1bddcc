#!/usr/bin/env bash
# How far capstan-bench's `put` agrees with etcd's own `benchmark put` (../shared/tools/etcd-benchmark)
# run against the same server: starts one server (etcd or capstan) on free loopback ports with a
# fresh data dir, runs both tools alternately ROUNDS times with the same flags, and prints the
# medians of each tool and their ratio.
#
#   bench/loadgen/agree_with_etcd_benchmark.sh BUILD_DIR [etcd|capstan] [ROUNDS]
set -euo pipefail

build=$(cd "${1:?usage: $0 BUILD_DIR [etcd|capstan] [ROUNDS]}" && pwd)
target=${2:-etcd}
rounds=${3:-5}
here=$(cd "$(dirname "$0")" && pwd)
etcd_benchmark=${ETCD_BENCHMARK:-$here/../../../shared/tools/etcd-benchmark}
# CAPSTAN_BENCH_FLAGS: extra global flags for capstan-bench only (e.g. --request-timeout=60s).
extra=${CAPSTAN_BENCH_FLAGS:-}
flags=${FLAGS:---conns=10 --clients=100 put --key-size=8 --val-size=256 --total=20000 --key-space-size=100000}

case $target in
  etcd) server=${ETCD:-/usr/bin/etcd} ;;
  capstan) server=$build/server/capstan; [ -x "$server" ] || server=$build/capstan ;;
  *) echo "target must be etcd or capstan" >&2; exit 2 ;;
esac

ports=($(python3 -c 'import socket
s=[socket.socket() for _ in range(3)]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))'))
work=$(mktemp -d /tmp/capstan-agree-XXXXXX)
client=http://127.0.0.1:${ports[0]}
peer=http://127.0.0.1:${ports[1]}
"$server" --name=bench --data-dir="$work/data" --listen-client-urls=$client --advertise-client-urls=$client \
  --listen-peer-urls=$peer --initial-advertise-peer-urls=$peer --initial-cluster=bench=$peer \
  --listen-metrics-urls=http://127.0.0.1:${ports[2]} > "$work/server.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  ETCDCTL_API=3 timeout 2 etcdctl --endpoints=$client get /ready >/dev/null 2>&1 && break
  sleep 0.1
done

# Requests/sec, p50, p90, p99 (ms) from etcd's "Summary:" text, which both tools print.
parse() {
  tr '\r' '\n' | awk '
    /Requests\/sec:/ { rps = $2 }
    /^ *50% in/ { p50 = $3 * 1000 } /^ *90% in/ { p90 = $3 * 1000 } /^ *99% in/ { p99 = $3 * 1000 }
    END { printf "%s %.3f %.3f %.3f\n", rps, p50, p90, p99 }'
}

: > "$work/etcd-benchmark.txt"
: > "$work/capstan-bench.txt"
for r in $(seq "$rounds"); do
  order="etcd-benchmark capstan-bench"
  [ $((r % 2)) = 0 ] && order="capstan-bench etcd-benchmark"
  for tool in $order; do
    if [ $tool = etcd-benchmark ]; then
      line=$(timeout 300 "$etcd_benchmark" --endpoints=127.0.0.1:${ports[0]} $flags 2>/dev/null | parse)
    else
      line=$(timeout 300 "$build/capstan-bench" --no-progress $extra --endpoints=127.0.0.1:${ports[0]} $flags | parse)
    fi
    echo "round $r $tool: req/s p50 p90 p99 (ms) = $line" >&2
    echo "$line" >> "$work/$tool.txt"
  done
done

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo
echo "$target, $rounds rounds each, alternating: \`$flags\`"
echo
echo "| metric | etcd benchmark | capstan-bench | capstan-bench/etcd benchmark |"
echo "| --- | ---: | ---: | ---: |"
col=1
for metric in "req/s" "p50 ms" "p90 ms" "p99 ms"; do
  a=$(cut -d' ' -f$col "$work/etcd-benchmark.txt" | median)
  b=$(cut -d' ' -f$col "$work/capstan-bench.txt" | median)
  printf "| %s | %.2f | %.2f | %.2f |\n" "$metric" "$a" "$b" "$(echo "$b / $a" | bc -l)"
  col=$((col + 1))
done
