#!/usr/bin/env bash
# keys_only_lists.sh: the time of a keys_only and of a count_only Range over a
# large prefix, as a client sees it, for one or more servers on the same data.
#
#   bench/keys_only_lists.sh BINARY...        # each a capstan or etcd binary
#   OLD=/tmp/capstan-old; bench/keys_only_lists.sh $OLD build/release/capstan $OLD build/release/capstan
#
# The first binary fills one data dir with OBJECTS (default 100,000) values of
# VAL_SIZE (default 4,096) bytes under /large/ (`capstan-bench fill`); every
# binary then serves that same dir in turn (so list them alternating), for
# ROUNDS (default 3) rounds of LISTS (default 5) keys_only lists
# (`etcdctl get /large/ --prefix --keys-only -w protobuf`, output discarded)
# and as many count_only ones (`--count-only -w fields`), after one warm-up
# list. One line per
# round: the median wall time of its lists, etcdctl's start-up included, and
# the server's CPU time (user + system) per keys_only list.
set -euo pipefail

source "$(dirname "$0")/lib.sh" keysonly
ETCDCTL=${ETCDCTL:-${CAPSTAN_ETCDCTL_BINARY:-/root/.cache/capstan/etcd-3.5/usr/bin/etcdctl}}
LISTS=${LISTS:-5}

ctl() { ETCDCTL_API=3 "${ETCDCTL}" --endpoints "127.0.0.1:${PORT}" --command-timeout=60s "$@"; }

# median_ms CMD...: the median wall time of LISTS runs of CMD, in ms.
median_ms() {
  local times=() i t0 t1
  for i in $(seq 1 "${LISTS}"); do
    t0=$(date +%s%N)
    "$@" > /dev/null
    t1=$(date +%s%N)
    times+=($(((t1 - t0) / 1000000)))
  done
  printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}'
}

cpu_ticks() { awk '{print $14 + $15}' "/proc/${PID}/stat"; }

dir="${WORK}/data"
n=0
for bin in "$@"; do
  n=$((n + 1))
  start "${bin}" "${dir}"
  if [[ ${n} -eq 1 ]]; then
    bench --conns 4 --clients 16 fill --prefix /large/ --keys "${OBJECTS}" --val-size "${VAL_SIZE}" \
      --load-batch 16 > /dev/null
  fi
  ctl get /large/ --prefix --keys-only -w protobuf > /dev/null  # warm-up
  keys=$(ctl get /large/ --prefix --count-only -w fields | awk '/"Count"/ {print $3}')
  for round in $(seq 1 "${ROUNDS}"); do
    ticks0=$(cpu_ticks)
    k=$(median_ms ctl get /large/ --prefix --keys-only -w protobuf)
    ticks1=$(cpu_ticks)
    c=$(median_ms ctl get /large/ --prefix --count-only -w fields)
    printf '%s round %d: %s keys; keys_only list %s ms (server CPU %d ms per list), count_only %s ms (medians of %d)\n' \
      "${bin}" "${round}" "${keys}" "${k}" $(((ticks1 - ticks0) * 1000 / $(getconf CLK_TCK) / LISTS)) \
      "${c}" "${LISTS}"
  done
  kill "${PID}"
  wait "${PID}" 2>/dev/null || true
  PID=
done
