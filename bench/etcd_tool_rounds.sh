#!/usr/bin/env bash
# etcd's own `benchmark` tool against one fresh single member of each target, in alternating
# rounds: what a user who benchmarks Capstan against the etcd they run sees.
#
#   bench/etcd_tool_rounds.sh [BENCHMARK ARGS...]
#   bench/etcd_tool_rounds.sh --conns=10 --clients=100 watch-latency --total=1000 --put-rate=200
#
# Each round starts each target in turn (the order rotates from round to round) on loopback with a
# fresh data dir, fsync on, runs the tool once with the given arguments (default: etcd's put
# workload, `--conns=10 --clients=100 put --total=20000 --val-size=256 --key-space-size=100000`)
# and stops it. It prints, per round and as medians over the rounds, the tool's requests/s and its
# p50/p90/p99 (for watch-latency: of the time from the put's answer to each watcher's event), the
# server's CPU (user + system, /proc/PID/stat) per request (--total, or for a workload without it,
# such as watch-get, the requests the tool counted), and each target's median over etcd's.
#
# Targets (TARGETS, default "capstan floor etcd"): capstan (CAPSTAN, build/release/capstan), floor
# (capstan-grpc-floor beside it: gRPC C++ with nothing behind it; it serves put, txn-put, range,
# lease-keepalive and watch-latency), etcd (ETCD, etcd 3.5.16 from ~/.cache/capstan/etcd-3.5).
# TLS=1 serves clients (and the unused peer URL) over TLS with client certificates required, as
# kubeadm deploys etcd (bench/cluster/tools.sh); the floor serves no TLS, so leave it out of TARGETS.
# HTTP_APART=1 adds --listen-client-http-urls (etcd's recommended setting; bench/lib.sh).
# Settings: ROUNDS (5), PORT (23790, and PORT+10 for peers; bench/lib.sh), FLOOR_FLAGS (e.g.
# --model=async), ETCD_BENCHMARK (the tool; default: built once from Debian's etcd source by
# bench/cluster/tools.sh).
set -euo pipefail
ROUNDS=${ROUNDS:-5}

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "${here}/.." && pwd)
# tools.sh first: lib.sh's cleanup, which stops the server in PID, is the one the EXIT trap runs.
source "${here}/cluster/tools.sh"
source "${here}/lib.sh" etcd-tool
TARGETS=${TARGETS:-capstan floor etcd}
CAPSTAN=${CAPSTAN:-${repo}/build/release/capstan}
FLOOR=${FLOOR:-$(dirname "${CAPSTAN}")/capstan-grpc-floor}
BENCH=$(dirname "${CAPSTAN}")/capstan-bench
ETCD=${ETCD:-/root/.cache/capstan/etcd-3.5/usr/bin/etcd}
read -r -a floor_flags <<< "${FLOOR_FLAGS:-}"
BENCHMARK=$(etcd_benchmark_tool)
if [[ $# -eq 0 ]]; then
  set -- --conns=10 --clients=100 put --total=20000 --val-size=256 --key-space-size=100000
fi
total=$(echo "$*" | sed -n 's/.*--total[ =]\([0-9]*\).*/\1/p')
tls_setup "${WORK}/tls"
if [[ "${SCHEME}" == https && " ${TARGETS} " == *" floor "* ]]; then
  echo "etcd_tool_rounds.sh: the floor serves no TLS; set TARGETS without it" >&2
  exit 2
fi

# run_once TARGET ROUND TOOL_ARGS...: one fresh server, one run of the tool; appends a line to
# WORK/results.
run_once() {
  local target=$1 round=$2 bin extra=()
  shift 2
  case "${target}" in
    capstan) bin=${CAPSTAN} ;;
    floor) bin=${FLOOR}; extra=("${floor_flags[@]}") ;;
    etcd) bin=${ETCD} ;;
    *) echo "etcd_tool_rounds.sh: unknown target ${target}" >&2; exit 2 ;;
  esac
  local data=${WORK}/${target}-${round} out=${WORK}/${target}-${round}.out t0 t1
  start "${bin}" "${data}" "${extra[@]}"
  t0=$(cpu_ticks "${PID}")
  "${BENCHMARK}" --endpoints="$(client_endpoint)" ${TLS_CLIENT_FLAGS[@]+"${TLS_CLIENT_FLAGS[@]}"} \
    "$@" > "${out}" 2>&1 || {
    echo "etcd_tool_rounds.sh: the tool failed against ${target}:" >&2
    tail -20 "${out}" >&2; exit 1; }
  t1=$(cpu_ticks "${PID}")
  kill -9 "${PID}"; wait "${PID}" 2>/dev/null || true; PID=
  rm -rf "${data}"
  python3 - "${out}" "${target}" "${round}" "$(( (t1 - t0) * 1000000 / $(getconf CLK_TCK) ))" \
    "${total}" >> "${WORK}/results" <<'EOF2'
import re, sys
out, target, rnd, cpu_us, total = sys.argv[1:6]
text = open(out).read()
rps = re.search(r"Requests/sec:\s+([0-9.]+)", text)
# Without --total (watch-get runs until its watchers caught up), the requests
# the tool counted: its rate times its duration.
secs = re.search(r"Total:\s+([0-9.]+) secs", text)
count = int(total) if total else (float(rps.group(1)) * float(secs.group(1)) if rps and secs else 0)
cpu_us = int(cpu_us) / count if count else float("nan")
q = {p: re.search(r"^\s+%s%% in ([0-9.]+) secs" % p, text, re.M) for p in ("50", "90", "99")}
ms = {p: float(m.group(1)) * 1000 if m else float("nan") for p, m in q.items()}
print(target, rnd, float(rps.group(1)) if rps else float("nan"), ms["50"], ms["90"], ms["99"],
      f"{cpu_us:.0f}")
EOF2
  tail -1 "${WORK}/results" | awk '{printf "round %s %-8s %10.0f req/s  p50 %.2f  p90 %.2f  p99 %.2f ms  server CPU %s us/request\n", $2, $1, $3, $4, $5, $6, $7}' >&2
}

read -r -a targets <<< "${TARGETS}"
echo "etcd_tool_rounds.sh: ${ROUNDS} rounds of: benchmark $*" >&2
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for round in $(seq 1 "${ROUNDS}"); do
  n=${#targets[@]}
  for k in $(seq 0 $((n - 1))); do
    run_once "${targets[$(( (k + round - 1) % n ))]}" "${round}" "$@"
  done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "${WORK}/results" "${TARGETS}" "$*" <<'EOF'
import statistics, sys
path, targets, args = sys.argv[1], sys.argv[2].split(), sys.argv[3]
rows = [line.split() for line in open(path)]
cols = [("requests/s", 2, "{:.0f}"), ("p50 ms", 3, "{:.2f}"), ("p90 ms", 4, "{:.2f}"),
        ("p99 ms", 5, "{:.2f}"), ("server CPU us/request", 6, "{:.0f}")]
med = {t: [statistics.median(float(r[i]) for r in rows if r[0] == t) for _, i, _ in cols]
       for t in targets if any(r[0] == t for r in rows)}
print(f"`benchmark {args}`, medians of {max(int(r[1]) for r in rows)} rounds")
print()
head = ["metric"] + list(med) + [f"{t}/etcd" for t in med if t != "etcd" and "etcd" in med]
print("| " + " | ".join(head) + " |")
print("| --- |" + " ---: |" * (len(head) - 1))
for k, (name, _, fmt) in enumerate(cols):
    cells = [fmt.format(med[t][k]) for t in med]
    if "etcd" in med:
        cells += [f"{med[t][k] / med['etcd'][k]:.2f}" if med["etcd"][k] else "-" for t in med if t != "etcd"]
    print(f"| {name} | " + " | ".join(cells) + " |")
print()
print("Per round, p99 ms: " + "; ".join(
    f"{t} " + ", ".join(f"{float(r[5]):.1f}" for r in rows if r[0] == t) for t in med))
EOF
