#!/usr/bin/env bash
# put_during_lists.sh: put latency from one client while four full lists of a
# large prefix run, seen from a separate process (so the lists' client does
# not share the put's connection or threads), for one or more servers.
#
#   bench/put_during_lists.sh BINARY...           # each a capstan or etcd binary
#   bench/put_during_lists.sh build/release/capstan /usr/bin/etcd
#   OLD=/tmp/capstan-old; bench/put_during_lists.sh $OLD build/release/capstan $OLD build/release/capstan
#
# Every binary gets one data dir, filled once with OBJECTS (default 100,000)
# values of VAL_SIZE (default 4,096) bytes under /large/ by `capstan-bench
# fill`, then ROUNDS (default 3) rounds of: 12 full lists, 4 at a time, with
# puts at 50/s from another process. One line per round: the puts' max and
# p99, the lists' mean time, and the server's minor page faults and RSS.
#
# Who wins the CPU (to find where the put's tail comes from; the policies
# need CAP_SYS_NICE):
#   LIST_SCHED="chrt --idle 0"   prefix of the lists' client command
#   PUT_SCHED="chrt -f 1"        prefix of the puts' client command
#   FIFO_THREADS="committer answerer"   server threads (by name) made
#                                       SCHED_FIFO 1 once it serves
set -euo pipefail

source "$(dirname "$0")/lib.sh" putlists

fifo_threads() {  # SCHED_FIFO 1 for the server's threads named in FIFO_THREADS
  local t
  for t in /proc/"${PID}"/task/*; do
    if [[ " ${FIFO_THREADS:-} " == *" $(cat "${t}/comm") "* ]]; then chrt -f -p 1 "${t##*/}"; fi
  done
}

n=0
for bin in "$@"; do
  n=$((n + 1))
  dir="${WORK}/data-${n}"
  start "${bin}" "${dir}"
  fifo_threads
  bench --conns 4 --clients 16 fill --prefix /large/ --keys "${OBJECTS}" --val-size "${VAL_SIZE}" \
    --load-batch 16 > /dev/null
  # One warm-up round of lists (block cache, page cache, kept memory).
  bench --conns 4 --clients 4 range /large/ --prefix --total 4 > /dev/null
  for round in $(seq 1 "${ROUNDS}"); do
    faults0=$(awk '{print $10}' "/proc/${PID}/stat")
    bench_as "${LIST_SCHED:-}" --conns 4 --clients 4 range /large/ --prefix --total 12 \
      > "${WORK}/lists" 2>&1 &
    lists=$!
    sleep 1
    puts=$(bench_as "${PUT_SCHED:-}" --conns 1 --clients 1 put --rate 50 --total 250 --key-size 8 --val-size 256 2>&1)
    wait "${lists}"
    faults1=$(awk '{print $10}' "/proc/${PID}/stat")
    max=$(awk '/Slowest:/ {print $2 * 1000}' <<< "${puts}")
    p99=$(awk '/99% in/ {print $3 * 1000}' <<< "${puts}")
    list=$(awk '/Average:/ {print $2}' "${WORK}/lists")
    rss=$(awk '/VmRSS/ {print int($2 / 1024)}' "/proc/${PID}/status")
    printf '%s round %d: put max %s ms, p99 %s ms; full list mean %s s; minor faults %d; RSS %d MiB\n' \
      "${bin}" "${round}" "${max}" "${p99}" "${list}" $((faults1 - faults0)) "${rss}"
  done
  kill "${PID}"
  wait "${PID}" 2>/dev/null || true
  PID=
  rm -rf "${dir}"
done
