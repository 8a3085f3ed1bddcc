#!/usr/bin/env bash
# go_lists.sh: full lists of a large prefix through Go's clientv3, which decodes every response as
# kube-apiserver's client does, with puts going on; for one or more servers, in alternating rounds.
#
#   bench/go_lists.sh BINARY...        # each a capstan or etcd binary
#   ROUNDS=5 LIST_NICE=19 bench/go_lists.sh build/release/capstan \
#     /root/.cache/capstan/etcd-3.5/usr/bin/etcd
#
# Each round, for each binary in turn: a fresh data dir filled by `capstan-bench fill` with OBJECTS
# (default 100,000) values of VAL_SIZE (default 4,096) bytes under /large/, then two bench/golist
# processes (built once by bench/cluster/tools.sh): one puts at 50/s throughout; the other, at
# niceness LIST_NICE (default 0; at 19 it takes only the CPU the server and the puts leave, as a
# list client on another machine would), waits 3 s, makes one full list, then 4 full lists at
# once. Before that it makes WARM (default 1) full lists it does not measure, so that its Go heap
# has held a list before, as a long-running kube-apiserver's has: the measured full list then
# reuses memory instead of faulting in fresh pages (WARM=0: a fresh client). One line per run:
# the puts' p99 before the lists and during the 4 concurrent ones, the lists' times and the
# server's RSS after them; then, per binary, the medians over the rounds.
set -euo pipefail

# tools.sh first: lib.sh's cleanup, which stops the server in PID, is the one the EXIT trap runs.
source "$(dirname "$0")/cluster/tools.sh"
source "$(dirname "$0")/lib.sh" golists
GOLIST=$(go_tool golist "$(dirname "$0")/golist/main.go")
LIST_NICE=${LIST_NICE:-0}
WARM=${WARM:-1}

for round in $(seq 1 "${ROUNDS}"); do
  for bin in "$@"; do
    dir="${WORK}/data"
    rm -rf "${dir}"
    start "${bin}" "${dir}"
    bench --conns 4 --clients 16 fill --prefix /large/ --keys "${OBJECTS}" --val-size "${VAL_SIZE}" \
      --load-batch 16 > /dev/null
    "${GOLIST}" --role puts --endpoint "127.0.0.1:${PORT}" > "${WORK}/puts" &
    putter=$!
    nice -n "${LIST_NICE}" "${GOLIST}" --role lists --endpoint "127.0.0.1:${PORT}" --prefix /large/ \
      --warm "${WARM}" > "${WORK}/lists"
    kill -TERM "${putter}"
    wait "${putter}"
    rss=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/${PID}/status")
    line=$(python3 - "${WORK}/lists" "${WORK}/puts" <<'PY'
import sys
lists = dict(f.split("=") for f in open(sys.argv[1]).read().split())
puts = [tuple(map(int, l.split()[1:])) for l in open(sys.argv[2]) if l.startswith("put ")]
def p99(window):
    lat = sorted(l for s, l in puts if window[0] <= s < window[1])
    return (lat[max(0, -(-len(lat) * 99 // 100) - 1)] / 1e6, len(lat)) if lat else (0.0, 0)
idle, _ = p99((0, int(lists["full_start"])))
during, n = p99((int(lists["concurrent_start"]), int(lists["concurrent_end"])))
print(f"idle_put_p99_ms={idle:.2f} put_p99_ms={during:.2f} puts={n} "
      f"full_list_ms={lists['full_list_ms']} concurrent_list_ms={lists['concurrent_list_ms']} "
      f"objects={lists['objects']}")
PY
)
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
