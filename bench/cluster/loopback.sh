#!/usr/bin/env bash
# What moving big answers over loopback costs a cluster's writes, with no server in the transfer:
# a 3-member cluster (Capstan by default) takes puts through its leader at 50/s (4 KiB values)
# for 10 s with nothing else running, then 10 s while loopback_blast moves bytes between two
# processes of its own (4 streams of BLAST_MIB MiB each, again and again), in ROUNDS alternating
# pairs. The put p99 of each half is what bench/cluster/scale.sh's lists part measures while a
# follower serves 4 full lists, without the follower.
#
#   bench/cluster/loopback.sh
#
# Settings (environment): ROUNDS (4), BLAST_MIB (400: 1.6 GB a pass, four full lists of 100,000
#   values of 4 KiB), SENDER_NICE (0: a server's sending threads), RECEIVER_NICE (19: the list
#   client of LIST_NICE=19), RECV_ALLOC (unset; set: the receivers keep each stream in one
#   fresh buffer, as a client keeps a response), SERVER (capstan, or etcd), PORT (24400),
#   CAPSTAN, BENCH, ETCD, ETCDCTL as in scale.sh.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "${here}/../.." && pwd)
ROUNDS=${ROUNDS:-4}
BLAST_MIB=${BLAST_MIB:-400}
SENDER_NICE=${SENDER_NICE:-0}
RECEIVER_NICE=${RECEIVER_NICE:-19}
SERVER=${SERVER:-capstan}
PORT=${PORT:-24400}
HEARTBEAT=100
ELECTION=1000
CAPSTAN=${CAPSTAN:-${repo}/build/release/capstan}
BENCH=${BENCH:-$(dirname "${CAPSTAN}")/capstan-bench}
ETCD=${ETCD:-/root/.cache/capstan/etcd-3.5/usr/bin/etcd}
ETCDCTL=${ETCDCTL:-/root/.cache/capstan/etcd-3.5/usr/bin/etcdctl}

source "${here}/tools.sh"
mkdir -p "${TOOLS_DIR}"
blast=${TOOLS_DIR}/loopback_blast
if [[ ! -x "${blast}" || "${here}/loopback_blast.c" -nt "${blast}" ]]; then
  cc -O2 -pthread -o "${blast}" "${here}/loopback_blast.c"
fi

PIDS=()
WORK=$(mktemp -d /tmp/capstan-loopback-data.XXXXXX)
OUT=$(mktemp -d /tmp/capstan-loopback-logs.XXXXXX)  # the members' logs, kept
trap cleanup EXIT
bin=${CAPSTAN}
[[ "${SERVER}" == etcd ]] && bin=${ETCD}
start_cluster "${bin}" "${SERVER}" --quota-backend-bytes 8589934592
leader=$(leader_index)

p99() {  # the put p99 (ms) of 10 s of puts at 50/s through the leader
  "${BENCH}" --no-progress --endpoints "$(endpoint "${leader}")" --conns 4 --clients 16 put \
    --rate 50 --duration 10s --total 1000000 --val-size 4096 --key-space-size 100000 |
    awk '/99% in/ { printf "%.1f\n", $3 * 1000; exit }'
}

echo "server: ${SERVER} (logs in ${OUT}); ${ROUNDS} rounds; loopback_blast ${BLAST_MIB} MiB x 4 streams, senders at" \
  "nice ${SENDER_NICE}, receivers at nice ${RECEIVER_NICE}${RECV_ALLOC:+, receivers keep each stream}"
idle=() blasted=()
for ((r = 1; r <= ROUNDS; r++)); do
  idle+=("$(p99)")
  (
    end=$((SECONDS + 11))
    while ((SECONDS < end)); do "${blast}" "${BLAST_MIB}" 4 "${RECEIVER_NICE}" "${SENDER_NICE}"; done
  ) &
  blaster=$!
  blasted+=("$(p99)")
  wait "${blaster}"
  echo "round ${r}: put p99 ${idle[-1]} ms idle, ${blasted[-1]} ms during the transfers"
done
median() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
echo "median put p99: $(median "${idle[@]}") ms idle, $(median "${blasted[@]}") ms during the transfers"
