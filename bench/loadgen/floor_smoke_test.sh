#!/usr/bin/env bash
# capstan-grpc-floor serves what it is measured with, and `compare` runs three
# targets: a small put, lease-keepalive and large-list (full and paginated
# lists, each checked for every object) against Capstan, the floor and etcd,
# each without a failed request, with both ratio columns to etcd.
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
echo PASS
