#!/usr/bin/env bash
# gRPC C++'s server models on capstan-grpc-floor (gRPC with nothing behind it): the callback API
# that Capstan's services use against the completion-queue API with a thread per queue, for 1, 2
# and 4 queues, each beside etcd 3.5 in alternating rounds, on a unary call (put, linearizable
# range) and on a stream per call (etcd's stream-per-renewal keep-alive). Prints one markdown table
# per workload and queue count (capstan-bench compare's), with the server CPU per request.
#
#   bench/server_models.sh BUILD_DIR
#
# Environment: ROUNDS (default 5), QUEUES (default "1 2 4"), ETCD (default etcd 3.5 as
# scripts/deps.sh extracts it), OUT (default BUILD_DIR/bench-results/server-models).
set -euo pipefail

build=$(cd "${1:?usage: bench/server_models.sh BUILD_DIR}" && pwd)
rounds=${ROUNDS:-5}
etcd=${ETCD:-${CAPSTAN_ETCD_BINARY:-$HOME/.cache/capstan/etcd-3.5/usr/bin/etcd}}
out=${OUT:-$build/bench-results/server-models}
mkdir -p "$out"

workloads=(
  "lease-keepalive|lease-keepalive --total 10000"
  "put|put --key-size 8 --val-size 256 --total 20000 --key-space-size 100000"
  "range|range /bench/range/key --populate 1 --val-size 256 --total 20000"
)
for queues in ${QUEUES:-1 2 4}; do
  for w in "${workloads[@]}"; do
    name=${w%%|*}
    args=${w#*|}
    echo "== $name, $queues queues" >&2
    # shellcheck disable=SC2086
    CAPSTAN_GRPC_FLOOR_QUEUES=$queues timeout 1800 "$build/capstan-bench" compare \
      --rounds "$rounds" --etcd-binary "$etcd" --targets floor,floor-async,etcd \
      --conns 10 --clients 100 --markdown "$out/$name-q$queues.md" $args > /dev/null
    echo "### $name, async with $queues queues"
    echo
    cat "$out/$name-q$queues.md"
    echo
  done
done
