#!/usr/bin/env bash
# go_lists.sh: full lists of a large prefix through Go's clientv3, which decodes every response as
# kube-apiserver's client does, with puts from the same process during them; for one or more
# servers, in alternating rounds.
#
#   bench/go_lists.sh BINARY...        # each a capstan or etcd binary
#   ROUNDS=5 bench/go_lists.sh build/release/capstan /root/.cache/capstan/etcd-3.5/usr/bin/etcd
#
# Each round, for each binary in turn: a fresh data dir filled by `capstan-bench fill` with OBJECTS
# (default 100,000) values of VAL_SIZE (default 4,096) bytes under /large/, then bench/golist
# (built once by bench/cluster/tools.sh): puts at 50/s alone for 3 s, one full list, then 4 full
# lists at once with the puts going on. One line per run with golist's figures and the server's
# RSS after it; then, per binary, the medians over the rounds.
set -euo pipefail

source "$(dirname "$0")/lib.sh" golists
source "$(dirname "$0")/cluster/tools.sh"
GOLIST=$(go_tool golist "$(dirname "$0")/golist/main.go")

for round in $(seq 1 "${ROUNDS}"); do
  for bin in "$@"; do
    dir="${WORK}/data"
    rm -rf "${dir}"
    start "${bin}" "${dir}"
    bench --conns 4 --clients 16 fill --prefix /large/ --keys "${OBJECTS}" --val-size "${VAL_SIZE}" \
      --load-batch 16 > /dev/null
    line=$("${GOLIST}" --endpoint "127.0.0.1:${PORT}" --prefix /large/)
    rss=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/${PID}/status")
    echo "${bin} round ${round}: ${line} rss_mib=${rss}" | tee -a "${WORK}/runs"
    kill "${PID}"
    wait "${PID}" 2>/dev/null || true
    PID=
  done
done

echo
python3 - "${WORK}/runs" "$@" <<'PY'
import statistics, sys
runs = [l.split() for l in open(sys.argv[1])]
for binary in sys.argv[2:]:
    mine = [dict(f.split("=", 1) for f in r[3:]) for r in runs if r[0] == binary]
    medians = {k: statistics.median(float(m[k]) for m in mine) for k in mine[0]}
    print(f"{binary} medians over {len(mine)} rounds: " +
          " ".join(f"{k}={v:g}" for k, v in medians.items()))
PY
