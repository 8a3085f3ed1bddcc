#!/usr/bin/env bash
# capstan-grpc-floor serves what it is measured with, and `compare` runs three
# targets: a small put, lease-keepalive and large-list (full and paginated
# lists, each checked for every object) against Capstan, the floor and etcd,
# each without a failed request, with both ratio columns to etcd. Then each of
# the floor's durable shapes (--durable, with and without an answer thread, on
# both server models) answers a put run only with every put in its log.
#
#   bench/loadgen/floor_smoke_test.sh BUILD_DIR
set -euo pipefail

build=$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)
fail() { echo "$out"; echo "FAIL: $*" >&2; exit 1; }
for workload in "put --total 2000 --key-space-size 1000" "lease-keepalive --total 2000" \
  "large-list --objects 300 --lists 1 --concurrent-lists 2 --put-idle-duration 1s"; do
  # shellcheck disable=SC2086
  out=$(timeout 120 "$build/capstan-bench" --no-progress compare --rounds 1 \
    --targets capstan,floor,etcd --conns 2 --clients 8 $workload 2>&1) ||
    fail "compare $workload failed"
  grep -q '^| metric | Capstan | gRPC floor | etcd | Capstan/etcd | gRPC floor/etcd |$' <<<"$out" ||
    fail "no three-target table with ratios to etcd"
  grep -q '^| failed requests (all rounds) | 0 | 0 | 0 |' <<<"$out" || fail "requests failed"
  # Throughput of each target, and both ratios, are numbers.
  grep -Eq '^\| [a-z() -]+ throughput \(req/s\)( \| [0-9.]+){5} \|$' \
    <<<"$out" || fail "no throughput row with every value and ratio"
done

dir=$(mktemp -d)
pid=
cleanup() {
  [[ -n "$pid" ]] && kill "$pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
for shape in "--model=callback --answer-thread" "--model=callback" \
  "--model=async --answer-thread --answer-queue" "--model=async --answer-queue" "--model=async"; do
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  # shellcheck disable=SC2086
  "$build/capstan-grpc-floor" --listen-client-urls="http://127.0.0.1:$port" --durable="$dir" \
    $shape 2>"$dir/stderr" &
  pid=$!
  for _ in $(seq 100); do
    grep -q 'serving on' "$dir/stderr" && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  out=$(timeout 60 "$build/capstan-bench" --no-progress --endpoints "127.0.0.1:$port" \
    --conns 2 --clients 8 put --total 2000 --key-size 8 --val-size 64 --key-space-size 1000 2>&1) ||
    { cat "$dir/stderr" >&2; fail "put against the floor $shape --durable failed"; }
  grep -q '2000 ok, 0 errors' <<<"$out" || fail "puts failed against the floor $shape --durable"
  # Every answered put's key (8 bytes) and value (64) are in the log.
  size=$(stat -c %s "$dir/capstan-grpc-floor.log")
  [[ "$size" -eq $((2000 * 72)) ]] || fail "the floor $shape --durable logged $size bytes, not $((2000 * 72))"
  kill "$pid"
  wait "$pid" || true
  pid=
  [[ ! -e "$dir/capstan-grpc-floor.log" ]] || fail "the floor $shape left its log behind"
done
echo PASS
