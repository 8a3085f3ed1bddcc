#!/usr/bin/env bash
# What a large cluster asks of its etcd, on 3 members: etcd 3.5's cluster against Capstan's, side
# by side, on loopback (separate processes and data dirs, fsync on, the same --heartbeat-interval
# HEARTBEAT, --election-timeout ELECTION and --quota-backend-bytes 8 GiB for both).
#
#   bench/cluster/scale.sh [OUT_DIR]
#
# For each of ROUNDS rounds, each server in turn (etcd first in odd rounds, Capstan first in even
# ones), each part on a fresh cluster:
#
#   lists   capstan-bench large-list with the writes on the leader and the lists on a follower
#           (--list-endpoints), received by a process of their own (--list-process: in the
#           writer's process they would hold up the puts' answers; it touches the memory it
#           will receive into before the load, so that the lists take it no page faults):
#           LIST_OBJECTS objects of 4 KiB, then puts at 50/s with no list running, one full and
#           one paginated list, and 4 full lists at once with the puts running. The figure is
#           the put p99 during the 4 lists over the idle put p99. The idle puts run twice: right
#           after the load, and again once the three members are quiet (under 5% of a core
#           together over a second, waited for up to SETTLE), when the load's flushes and
#           compactions are done; the table has the ratio to each, the second being the idle one.
#   k8s     capstan-bench k8s --nodes K8S_NODES --pods K8S_PODS --duration K8S_DURATION over all
#           three endpoints with --watch-cache off, so that both servers take the same traffic
#           (Capstan's kubelet lists and watches through its watch cache are not in it): load,
#           initial list, steady state (write throughput, relist and watch latencies), with the
#           steady state's writes per second and the p99 per second of the writes, the relists
#           and the watch events (figures over time: OUT_DIR/plots).
#
# Then, once per server, the isolation of a leader: capstan-robustness with only the
# isolate-leader fault (held ISOLATION_HOLD ms, long enough for an election) over
# ISOLATION_SEEDS campaigns of 30 s; the figure is the time from the isolation to the first
# acknowledged write issued after it (on the majority side: the isolated leader commits nothing).
#
# It prints markdown tables of the medians (min-max over the rounds) and writes every run's JSON
# (OUT_DIR/SERVER-rROUND-PART.json), the servers' logs, and the over-time plots (gnuplot, when
# installed) into OUT_DIR, default a new /tmp/capstan-scale-bench.* directory, kept.
#
# Settings (environment): ROUNDS (2), PARTS ("lists k8s isolation"), SERVERS ("etcd capstan": the
#   servers to run; a rerun of one adds its files to OUT_DIR beside the other's), LIST_OBJECTS (100000),
#   SETTLE (60s: the longest wait for quiet members before the idle puts; 0s measures them only
#   right after the load), LIST_NICE (0: the list process's niceness; at 19 it takes only the CPU the members leave, as a
#   list client on another machine would),
#   K8S_NODES (10000), K8S_PODS (150000), K8S_DURATION (60s), K8S_RELIST (30s), ISOLATION_SEEDS
#   (1-8), ISOLATION_HOLD (5000), HEARTBEAT (100), ELECTION (1000), PORT (24300),
#   CAPSTAN (build/release/capstan), BENCH (capstan-bench beside it), ROBUSTNESS
#   (build/release/tests/cluster/capstan-robustness), ETCD and ETCDCTL (etcd 3.5.16 under
#   /root/.cache/capstan/etcd-3.5/usr/bin).
# Exits 1 when a run fails (a cluster that does not start, a failed request).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "${here}/../.." && pwd)
ROUNDS=${ROUNDS:-2}
PARTS=${PARTS:-lists k8s isolation}
SERVERS=${SERVERS:-etcd capstan}
LIST_OBJECTS=${LIST_OBJECTS:-100000}
LIST_NICE=${LIST_NICE:-0}
SETTLE=${SETTLE:-60s}
K8S_NODES=${K8S_NODES:-10000}
K8S_PODS=${K8S_PODS:-150000}
K8S_DURATION=${K8S_DURATION:-60s}
K8S_RELIST=${K8S_RELIST:-30s}
ISOLATION_SEEDS=${ISOLATION_SEEDS:-1-8}
ISOLATION_HOLD=${ISOLATION_HOLD:-5000}
HEARTBEAT=${HEARTBEAT:-100}
ELECTION=${ELECTION:-1000}
PORT=${PORT:-24300}
CAPSTAN=${CAPSTAN:-${repo}/build/release/capstan}
BENCH=${BENCH:-$(dirname "${CAPSTAN}")/capstan-bench}
ROBUSTNESS=${ROBUSTNESS:-$(dirname "${CAPSTAN}")/tests/cluster/capstan-robustness}
ETCD=${ETCD:-/root/.cache/capstan/etcd-3.5/usr/bin/etcd}
ETCDCTL=${ETCDCTL:-/root/.cache/capstan/etcd-3.5/usr/bin/etcdctl}
OUT=${1:-$(mktemp -d /tmp/capstan-scale-bench.XXXXXX)}
mkdir -p "${OUT}/plots"
OUT=$(cd "${OUT}" && pwd)

source "${here}/tools.sh"
for bin in "${CAPSTAN}" "${BENCH}" "${ETCD}" "${ETCDCTL}"; do
  [[ -x "${bin}" ]] || { echo "scale.sh: ${bin} is not an executable" >&2; exit 1; }
done
QUOTA=(--quota-backend-bytes 8589934592)

PIDS=()
WORK=$(mktemp -d /tmp/capstan-scale-data.XXXXXX)
trap cleanup EXIT

# bench SERVER ROUND PART ARGS...: capstan-bench with ARGS, its JSON in OUT/SERVER-rROUND-PART.json.
bench() {
  local server=$1 round=$2 part=$3
  shift 3
  local json="${OUT}/${server}-r${round}-${part}.json"
  if ! timeout 3600 "${BENCH}" --no-progress --json "${json}" "$@" \
      > "${OUT}/${server}-r${round}-${part}.txt" 2> "${OUT}/${server}-r${round}-${part}.stderr"; then
    echo "scale.sh: ${server} ${part} failed; see ${OUT}/${server}-r${round}-${part}.{txt,stderr}" >&2
    exit 1
  fi
  echo "  ${server} ${part}: ${json}" >&2
}

lists_round() {  # SERVER BINARY ROUND
  local server=$1 bin=$2 round=$3 leader follower
  start_cluster "${bin}" "${server}-r${round}-lists" "${QUOTA[@]}"
  leader=$(leader_index)
  follower=$(( (leader + 1) % 3 ))
  bench "${server}" "${round}" lists --endpoints "$(endpoint "${leader}")" --conns 10 --clients 100 \
    large-list --list-endpoints "$(endpoint "${follower}")" --list-process --list-nice "${LIST_NICE}" \
    --objects "${LIST_OBJECTS}" \
    --min-size 4096 --max-size 4096 --lists 1 --concurrent-lists 4 --put-rate 50 \
    --put-idle-duration 10s --settle "${SETTLE}" --settle-pids "$(IFS=,; echo "${PIDS[*]}")"
  stop_cluster
}

k8s_round() {  # SERVER BINARY ROUND
  local server=$1 bin=$2 round=$3
  start_cluster "${bin}" "${server}-r${round}-k8s" "${QUOTA[@]}"
  bench "${server}" "${round}" k8s --endpoints "$(endpoints)" --conns 8 --clients 64 \
    k8s --nodes "${K8S_NODES}" --pods "${K8S_PODS}" --duration "${K8S_DURATION}" \
    --relist-interval "${K8S_RELIST}" --etcd-node-lists 2 --watch-cache off
  stop_cluster
}

isolation_runs() {  # SERVER
  local server=$1
  CAPSTAN_BINARY=${CAPSTAN} CAPSTAN_ETCD_BINARY=${ETCD} CAPSTAN_ETCDCTL_BINARY=${ETCDCTL} \
    timeout 3600 "${ROBUSTNESS}" --flavor="${server}" --members=3 --seeds="${ISOLATION_SEEDS}" \
    --duration=30s --faults=isolate-leader --hold="${ISOLATION_HOLD}-${ISOLATION_HOLD}ms" --quiet \
    > "${OUT}/${server}-isolation.txt" 2>&1 || {
    echo "scale.sh: ${server} isolation campaign failed; see ${OUT}/${server}-isolation.txt" >&2
    exit 1
  }
  echo "  ${server} isolation: ${OUT}/${server}-isolation.txt" >&2
}

{
  describe_run
  echo "rounds: ${ROUNDS}; parts: ${PARTS}; --heartbeat-interval ${HEARTBEAT} --election-timeout ${ELECTION}"
  echo "lists: ${LIST_OBJECTS} x 4 KiB (list process at nice ${LIST_NICE}, idle puts after up to ${SETTLE} for quiet members); k8s: ${K8S_NODES} nodes, ${K8S_PODS} pods, ${K8S_DURATION}," \
    "relist every ${K8S_RELIST}; isolation: seeds ${ISOLATION_SEEDS}, held ${ISOLATION_HOLD} ms"
} > "${OUT}/env.txt"
cat "${OUT}/env.txt" >&2

for round in $(seq 1 "${ROUNDS}"); do
  if (( round % 2 == 1 )); then order=(etcd capstan); else order=(capstan etcd); fi
  for server in "${order[@]}"; do
    [[ " ${SERVERS} " == *" ${server} "* ]] || continue
    if [[ "${server}" == etcd ]]; then bin=${ETCD}; else bin=${CAPSTAN}; fi
    for part in ${PARTS}; do
      case "${part}" in
        lists) echo "== round ${round}: ${server} lists" >&2; lists_round "${server}" "${bin}" "${round}" ;;
        k8s) echo "== round ${round}: ${server} k8s" >&2; k8s_round "${server}" "${bin}" "${round}" ;;
      esac
    done
  done
done
if [[ " ${PARTS} " == *" isolation "* ]]; then
  for server in ${SERVERS}; do
    echo "== isolation: ${server}" >&2
    isolation_runs "${server}"
  done
fi
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "${OUT}/env.txt"

python3 "${here}/scale_report.py" "${OUT}" > "${OUT}/table.md"
cat "${OUT}/env.txt"
echo
cat "${OUT}/table.md"
