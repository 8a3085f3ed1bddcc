#!/usr/bin/env bash
# Where a 3-member cluster spends its CPU and thread switches, by thread name.
#
#   bench/cluster/threads.sh [BENCHMARK ARGS...]
#
# Starts three members of SERVER (default build/release/capstan) on loopback, as
# bench/cluster/compare.sh does (fresh data dirs, fsync on, etcd's default heartbeat and election
# timeout), puts /bench/range/key, and runs etcd's `benchmark` tool with --endpoints=A,B,C
# --conns=10 --clients=100 and the given arguments (default: `put --total=20000 --val-size=256
# --key-space-size=100000`). Around the run it reads every thread's context switches
# (voluntary + involuntary, /proc/PID/task/TID/status) and CPU time (/proc/.../stat) of the
# three members, and prints the requests/s, the p99, and per thread name the switches and CPU
# microseconds per request, summed over the members, and the benchmark client's CPU per request.
# Threads the Go runtime starts carry the
# process's name; those that ran the raft loop are named raft-loop.
#
#   bench/cluster/threads.sh range /bench/range/key --consistency=l --total=20000
#
# Settings: SERVER, MEMBERS (3; 1 gives a single member to compare with), PORT (24200: clients
# PORT..PORT+2, peers PORT+10..PORT+12), ETCDCTL, TLS (1: clients and peers over TLS with client
# certificates, as kubeadm deploys etcd; bench/cluster/tools.sh).
# PROBES=1 also counts, with `perf probe`, Go's P hand-offs (runtime.handoffp) and sysmon's
# sleeps (runtime.usleep, runtime.notetsleep) in SERVER during the run.
# METRICS=1 also prints, per member, how much some of its /metrics counters grew during the run:
# proposals committed and applied, commit groups and the requests in them, log fsyncs and
# backend commits.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "${here}/../.." && pwd)
SERVER=${SERVER:-${repo}/build/release/capstan}
PORT=${PORT:-24200}
MEMBERS=${MEMBERS:-3}
ETCDCTL=${ETCDCTL:-/root/.cache/capstan/etcd-3.5/usr/bin/etcdctl}
source "${here}/tools.sh"
BENCHMARK=$(etcd_benchmark_tool)
if [[ $# -eq 0 ]]; then set -- put --total=20000 --val-size=256 --key-space-size=100000; fi
total=$(echo "$*" | sed -n 's/.*--total[ =]\([0-9]*\).*/\1/p')
[[ -n "${total}" ]] || { echo "threads.sh: give --total" >&2; exit 2; }

WORK=$(mktemp -d /tmp/capstan-threads.XXXXXX)
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -9 "${pid}" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "${pid}" 2>/dev/null || true; done
  if [[ "${PROBES:-0}" == 1 ]]; then perf probe -q -d 'probe_threads:*' 2>/dev/null || true; fi
  rm -rf "${WORK}"
}
trap cleanup EXIT
tls_setup "${WORK}/tls"

last=$((MEMBERS - 1))
peers=$(initial_cluster)
for i in $(seq 0 "${last}"); do
  start_member "${SERVER}" "${WORK}/m${i}" "${i}" "${PORT}" "${peers}" threads-cluster \
    "${WORK}/m${i}.log"
done
endpoints=$(endpoints)
deadline=$((SECONDS + 60))
until "${ETCDCTL}" --endpoints "${endpoints}" "${TLS_CLIENT_FLAGS[@]}" put /bench/range/key \
    "$(head -c 256 /dev/zero | tr '\0' v)" > /dev/null 2>&1; do
  (( SECONDS < deadline )) || { echo "threads.sh: the cluster did not serve" >&2; exit 1; }
  sleep 0.2
done

# One line per thread: "pid/tid name switches cpu_ticks". A thread that ends while it is read
# (a peer connection handed to gRPC) is left out.
snapshot() {
  local pid task name switches ticks
  for pid in "${PIDS[@]}"; do
    for task in /proc/"${pid}"/task/*; do
      name=$(tr ' ' _ 2>/dev/null < "${task}/comm") || continue
      switches=$(awk '/^voluntary_ctxt_switches/ {v = $2} /^nonvoluntary_ctxt_switches/ {n = $2}
                      END {print v + n}' "${task}/status" 2>/dev/null) || continue
      ticks=$(awk '{print $14 + $15}' "${task}/stat" 2>/dev/null) || continue
      echo "${pid}/${task##*/} ${name} ${switches} ${ticks}"
    done
  done | sort
}

probe_pid=""
if [[ "${PROBES:-0}" == 1 ]]; then
  for fn in handoffp usleep notetsleep; do
    perf probe -q -x "${SERVER}" -a "probe_threads:go_${fn}=runtime.${fn}" > /dev/null
  done
  perf stat -e 'probe_threads:*' -p "$(IFS=,; echo "${PIDS[*]}")" -o "${WORK}/probes.txt" \
    > /dev/null 2>&1 &
  probe_pid=$!
fi
# Per member, "member name value" for the counters METRICS=1 reports.
metrics() {
  local i
  for i in $(seq 0 "${last}"); do
    curl -s "${TLS_CLIENT_FLAGS[@]}" "$(endpoint "${i}")/metrics" |
      awk -v m="m${i}" '/^(etcd_server_proposals_(committed|applied)_total|capstan_commit_group(s|_requests)_total|etcd_disk_(wal_fsync|backend_commit)_duration_seconds_count) / {
          print m, $1, $2 }'
  done
}
if [[ "${METRICS:-0}" == 1 ]]; then metrics > "${WORK}/metrics.before"; fi
snapshot > "${WORK}/before"
TIMEFORMAT='%U %S'
{ time "${BENCHMARK}" --endpoints "${endpoints}" "${TLS_CLIENT_FLAGS[@]}" --conns 10 --clients 100 "$@" 2> /dev/null \
    > "${WORK}/bench.txt"; } 2> "${WORK}/bench.time"
tr '\r' '\n' < "${WORK}/bench.txt" | grep -E 'Requests/sec|99% in'
awk -v n="${total}" '{printf "benchmark client   CPU us/request %7.1f\n", ($1 + $2) * 1000000 / n}' \
  "${WORK}/bench.time"
snapshot > "${WORK}/after"
if [[ "${METRICS:-0}" == 1 ]]; then
  metrics > "${WORK}/metrics.after"
  awk -v n="${total}" 'NR == FNR { before[$1 " " $2] = $3; next }
    { d = $3 - before[$1 " " $2]; printf "%s %-52s %10.0f  per request %.3f\n", $1, $2, d, d / n }' \
    "${WORK}/metrics.before" "${WORK}/metrics.after"
fi
if [[ -n "${probe_pid}" ]]; then
  kill -INT "${probe_pid}"
  wait "${probe_pid}" || true
  grep probe_threads "${WORK}/probes.txt"
fi

hz=$(getconf CLK_TCK)
join "${WORK}/before" "${WORK}/after" |
  awk -v n="${total}" -v hz="${hz}" '$2 == $5 {
      cs[$2] += $6 - $3; cpu[$2] += $7 - $4 }
    END {
      for (k in cs) printf "%-18s switches/request %6.3f   CPU us/request %7.1f\n", k, cs[k] / n,
        cpu[k] * 1000000 / hz / n }' | sort -k6 -rn
