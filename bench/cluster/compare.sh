#!/usr/bin/env bash
# Replicated benchmarks: a 3-member etcd cluster against a 3-member Capstan cluster (MEMBERS=5: of
# five), side by side.
#
#   bench/cluster/compare.sh [OUT_DIR]
#
# For each of ROUNDS rounds, and for each server in turn (etcd first in odd rounds, Capstan first
# in even ones), it starts a cluster of MEMBERS members on loopback (separate processes and data
# dirs under a temp dir, fsync on, --heartbeat-interval HEARTBEAT and --election-timeout ELECTION
# for both) and runs etcd's own `benchmark` tool against all the endpoints
# (--endpoints=A,B,C; the tool spreads its --conns over them, so two thirds of the requests reach
# a follower, four fifths on five members):
#
#   put      --conns=10 --clients=100 put --total=20000 --val-size=256 --key-space-size=100000
#   txn-put  --conns=10 --clients=100 txn-put --txn-ops=4 --total=20000 --val-size=256
#            --key-space-size=100000
#   range    --conns=10 --clients=100 range /bench/range/key --consistency=l --total=20000
#            (the key holds a 256-byte value, put first with etcdctl)
#   lease-keepalive  --conns=10 --clients=100 lease-keepalive --total=20000
#            (a stream per renewal; a follower forwards each renewal to the leader)
#
# recording requests/s, the p99, and the members' CPU time and context switches per request
# of each run. Then, FAILOVER_REPS times per server and round,
# each on a fresh cluster: a light write load (one clientv3 client over all endpoints, one put
# every 10 ms), kill -9 of the leader, and the time from the kill to the first acknowledged put
# issued after it, and to the first Status of a survivor naming a new leader
# (bench/cluster/failover/main.go).
#
# It prints one markdown table: per workload the medians of etcd's and Capstan's ops/s, their
# ratio and both p99s, with the spread (min-max over the rounds); and the failover medians. Every
# run's figures are in OUT_DIR/runs.tsv (default: a new /tmp/capstan-cluster-bench.* directory,
# kept), the servers' logs next to it.
#
# Settings (environment):
#   MEMBERS (3, or 5), TLS (0; 1: clients and peers over TLS with client certificates, as kubeadm
#   deploys etcd; HTTP_APART=1 adds --listen-client-http-urls: bench/cluster/tools.sh), ROUNDS (3),
#   FAILOVER_REPS (5), HEARTBEAT (100), ELECTION (1000), PORT (24100: members use PORT.. for
#   clients, PORT+10.. for peers, PORT+20.. for HTTP apart), TOTAL (20000),
#   CAPSTAN (build/release/capstan), ETCD and ETCDCTL (etcd 3.5.16 under
#   /root/.cache/capstan/etcd-3.5/usr/bin), PERF=1 (perf record -g on Capstan's leader during the
#   put run and on all the members during the range run of round 1; reports in
#   OUT_DIR/perf-put*.txt, perf-range*.txt; perf slows the runs it watches, so take figures from
#   a run without it).
# The Go tools (etcd's benchmark from Debian's etcd source, and the failover client) are built
# once into TOOLS_DIR (/var/tmp/capstan-bench-cluster) by bench/cluster/tools.sh.
# Exits 1 when a run fails (a request error, a cluster that does not start).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "${here}/../.." && pwd)
ROUNDS=${ROUNDS:-3}
FAILOVER_REPS=${FAILOVER_REPS:-5}
HEARTBEAT=${HEARTBEAT:-100}
ELECTION=${ELECTION:-1000}
PORT=${PORT:-24100}
TOTAL=${TOTAL:-20000}
CAPSTAN=${CAPSTAN:-${repo}/build/release/capstan}
ETCD=${ETCD:-/root/.cache/capstan/etcd-3.5/usr/bin/etcd}
ETCDCTL=${ETCDCTL:-/root/.cache/capstan/etcd-3.5/usr/bin/etcdctl}
PERF=${PERF:-0}
OUT=${1:-$(mktemp -d /tmp/capstan-cluster-bench.XXXXXX)}
mkdir -p "${OUT}"
OUT=$(cd "${OUT}" && pwd)

source "${here}/tools.sh"
BENCHMARK=$(etcd_benchmark_tool)
FAILOVER=$(failover_tool "${here}/failover/main.go")

for bin in "${CAPSTAN}" "${ETCD}" "${ETCDCTL}"; do
  [[ -x "${bin}" ]] || { echo "compare.sh: ${bin} is not an executable" >&2; exit 1; }
done

PIDS=()
WORK=$(mktemp -d /tmp/capstan-cluster-data.XXXXXX)
trap cleanup EXIT
tls_setup "${OUT}/tls"

# cluster_cpu_ticks: user + system clock ticks of the members, so far.
cluster_cpu_ticks() {
  local pid total=0
  for pid in "${PIDS[@]}"; do
    total=$((total + $(awk '{print $14 + $15}' "/proc/${pid}/stat")))
  done
  echo "${total}"
}

# bench_run SERVER ROUND WORKLOAD ARGS...: one run of etcd's benchmark; appends
# "server round workload ops/s p99_ms cpu_us switches" to runs.tsv: the CPU time of all the
# members and their context switches (counted by `perf stat` when perf is installed), each
# divided by the requests of the run.
bench_run() {
  local server=$1 round=$2 workload=$3 log before after
  shift 3
  log="${OUT}/${server}-r${round}-${workload}.txt"
  local stat_pid=""
  if command -v perf > /dev/null; then
    perf stat -e context-switches -x, -o "${log}.perfstat" -p "$(IFS=,; echo "${PIDS[*]}")" \
      > /dev/null 2>&1 &
    stat_pid=$!
  fi
  before=$(cluster_cpu_ticks)
  timeout 600 "${BENCHMARK}" --endpoints "$(endpoints)" "${TLS_CLIENT_FLAGS[@]}" --conns 10 \
    --clients 100 "$@" \
    2> "${log}.stderr" | tr '\r' '\n' > "${log}"
  after=$(cluster_cpu_ticks)
  local switches=""
  if [[ -n "${stat_pid}" ]]; then
    kill -INT "${stat_pid}" 2>/dev/null || true
    wait "${stat_pid}" 2>/dev/null || true
    switches=$(awk -F, -v n="${TOTAL}" '$3 == "context-switches" && $1 ~ /^[0-9]+$/ {
      printf "%.1f", $1 / n }' "${log}.perfstat" 2>/dev/null || true)
  fi
  if grep -q 'Error distribution' "${log}"; then
    echo "compare.sh: ${server} ${workload} had failed requests:" >&2
    sed -n '/Error distribution/,$p' "${log}" >&2
    exit 1
  fi
  local rate p99 cpu
  rate=$(awk '/Requests\/sec:/ {print $2}' "${log}")
  p99=$(awk '$1 == "99%" && $2 == "in" {printf "%.2f", $3 * 1000}' "${log}")
  [[ -n "${rate}" && -n "${p99}" ]] || { echo "compare.sh: no summary in ${log}" >&2; exit 1; }
  cpu=$(( (after - before) * 1000000 / $(getconf CLK_TCK) / TOTAL ))
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "${server}" "${round}" "${workload}" "${rate}" \
    "${p99}" "${cpu}" "${switches}" >> "${OUT}/runs.tsv"
  echo "  ${server} ${workload}: ${rate} req/s, p99 ${p99} ms, members' CPU ${cpu} us/request," \
    "${switches:-?} context switches/request" >&2
}

# perf_start SERVER ROUND WORKLOAD PIDS: with PERF=1, perf record -g on Capstan's members PIDS
# (comma-separated) in round 1, into OUT/perf-WORKLOAD.data; perf_stop writes its reports.
PERF_PID=
perf_start() {
  [[ "${PERF}" == 1 && "$1" == capstan && "$2" == 1 ]] || return 0
  perf record -g -o "${OUT}/perf-$3.data" -p "$4" > /dev/null 2>&1 &
  PERF_PID=$!
  PERF_NAME=$3
}
perf_stop() {
  [[ -n "${PERF_PID}" ]] || return 0
  kill -INT "${PERF_PID}"
  wait "${PERF_PID}" || true
  PERF_PID=
  perf report -i "${OUT}/perf-${PERF_NAME}.data" --no-children --percent-limit 0.5 --stdio \
    -g none > "${OUT}/perf-${PERF_NAME}.txt" 2>/dev/null || true
  perf report -i "${OUT}/perf-${PERF_NAME}.data" --no-children --sort pid,comm --stdio \
    -g none > "${OUT}/perf-${PERF_NAME}-threads.txt" 2>/dev/null || true
  perf report -i "${OUT}/perf-${PERF_NAME}.data" --children --percent-limit 2 --stdio -g none \
    > "${OUT}/perf-${PERF_NAME}-children.txt" 2>/dev/null || true
}

throughput_round() {  # SERVER BINARY ROUND
  local server=$1 bin=$2 round=$3 leader
  start_cluster "${bin}" "${server}-r${round}"
  leader=$(leader_index)
  perf_start "${server}" "${round}" put "${PIDS[${leader}]}"
  bench_run "${server}" "${round}" put put --total "${TOTAL}" --val-size 256 \
    --key-space-size 100000
  perf_stop
  bench_run "${server}" "${round}" txn-put txn-put --txn-ops 4 --total "${TOTAL}" \
    --val-size 256 --key-space-size 100000
  "${ETCDCTL}" --endpoints "$(endpoints)" "${TLS_CLIENT_FLAGS[@]}" put /bench/range/key \
    "$(head -c 256 /dev/zero | tr '\0' v)" \
    > /dev/null
  perf_start "${server}" "${round}" range "$(IFS=,; echo "${PIDS[*]}")"
  bench_run "${server}" "${round}" range range /bench/range/key --consistency l --total "${TOTAL}"
  perf_stop
  bench_run "${server}" "${round}" lease-keepalive lease-keepalive --total "${TOTAL}"
  stop_cluster
}

failover_round() {  # SERVER BINARY ROUND
  local server=$1 bin=$2 round=$3 rep line
  for rep in $(seq 1 "${FAILOVER_REPS}"); do
    start_cluster "${bin}" "${server}-r${round}-failover"
    line=$(timeout 120 "${FAILOVER}" --endpoints "$(endpoints)" "${TLS_CLIENT_FLAGS[@]}" \
      --pids "$(IFS=,; echo "${PIDS[*]}")" --interval 10ms \
      2>> "${OUT}/${server}-failover-client.log") || {
      echo "compare.sh: ${server} failover run failed; logs in ${OUT}/${server}-r${round}-failover-m*.log" \
        "and ${OUT}/${server}-failover-client.log" >&2
      exit 1
    }
    stop_cluster
    # leader_ms=X write_ms=Y
    local lms wms
    lms=$(echo "${line}" | sed -n 's/.*leader_ms=\([0-9.]*\).*/\1/p')
    wms=$(echo "${line}" | sed -n 's/.*write_ms=\([0-9.]*\).*/\1/p')
    printf '%s\t%s\tfailover-leader\t%s\t\n' "${server}" "${round}" "${lms}" >> "${OUT}/runs.tsv"
    printf '%s\t%s\tfailover-write\t%s\t\n' "${server}" "${round}" "${wms}" >> "${OUT}/runs.tsv"
    echo "  ${server} failover ${rep}: new leader ${lms} ms, first write ${wms} ms" >&2
  done
}

: > "${OUT}/runs.tsv"
{
  describe_run
  echo "members: ${MEMBERS}, rounds: ${ROUNDS}, failover repetitions per round: ${FAILOVER_REPS}," \
    "--heartbeat-interval ${HEARTBEAT} --election-timeout ${ELECTION}"
} > "${OUT}/env.txt"
cat "${OUT}/env.txt" >&2

for round in $(seq 1 "${ROUNDS}"); do
  if (( round % 2 == 1 )); then order=(etcd capstan); else order=(capstan etcd); fi
  for server in "${order[@]}"; do
    if [[ "${server}" == etcd ]]; then bin=${ETCD}; else bin=${CAPSTAN}; fi
    echo "== round ${round}: ${server}" >&2
    throughput_round "${server}" "${bin}" "${round}"
    failover_round "${server}" "${bin}" "${round}"
  done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "${OUT}/env.txt"

python3 - "${OUT}/runs.tsv" > "${OUT}/table.md" <<'EOF'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    server, _, workload, value, p99, cpu, sw = (line.rstrip("\n").split("\t") + ["", ""])[:7]
    runs.setdefault((server, workload), []).append(
        (float(value), float(p99) if p99 else None, float(cpu) if cpu else None,
         float(sw) if sw else None))

def cell(values, fmt):
    if any(v is None for v in values):
        return "-"
    med = statistics.median(values)
    return f"{fmt.format(med)} ({fmt.format(min(values))}-{fmt.format(max(values))})"

print("| workload | etcd ops/s | Capstan ops/s | Capstan/etcd | etcd p99 ms | Capstan p99 ms "
      "| etcd CPU us/op | Capstan CPU us/op | etcd cs/op | Capstan cs/op |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for w in ("put", "txn-put", "range", "lease-keepalive"):
    e, c = runs.get(("etcd", w)), runs.get(("capstan", w))
    if not e or not c:
        continue
    er, cr = [r[0] for r in e], [r[0] for r in c]
    print(f"| {w} | {cell(er, '{:.0f}')} | {cell(cr, '{:.0f}')} | "
          f"{statistics.median(cr) / statistics.median(er):.2f} | "
          f"{cell([r[1] for r in e], '{:.1f}')} | {cell([r[1] for r in c], '{:.1f}')} | "
          f"{cell([r[2] for r in e], '{:.0f}')} | {cell([r[2] for r in c], '{:.0f}')} | "
          f"{cell([r[3] for r in e], '{:.1f}')} | {cell([r[3] for r in c], '{:.1f}')} |")
print()
print("| failover (kill -9 of the leader) | etcd ms | Capstan ms | Capstan/etcd |")
print("| --- | ---: | ---: | ---: |")
for w, name in (("failover-leader", "new leader in Status"),
                ("failover-write", "first acknowledged write")):
    e, c = runs.get(("etcd", w)), runs.get(("capstan", w))
    if not e or not c:
        continue
    ev, cv = [r[0] for r in e], [r[0] for r in c]
    print(f"| {name} | {cell(ev, '{:.0f}')} | {cell(cv, '{:.0f}')} | "
          f"{statistics.median(cv) / statistics.median(ev):.2f} |")
print()
print("CPU: user + system time of the members during the run, per request; cs: their "
      "context switches per request (perf stat).")
print(f"Medians, (min-max) over {len(runs.get(('etcd', 'put'), []))} rounds; failover over "
      f"{len(runs.get(('etcd', 'failover-write'), []))} kills per server.")
EOF
cat "${OUT}/env.txt"
echo
cat "${OUT}/table.md"
echo
echo "runs: ${OUT}/runs.tsv" >&2
