#!/usr/bin/env bash
# snapshot.sh: `etcdctl snapshot save` from each server holding the same data,
# and the puts that run meanwhile.
#
#   bench/snapshot.sh BINARY...                    # each a capstan or etcd binary
#   bench/snapshot.sh build/release/capstan /usr/bin/etcd
#
# Every binary gets one data dir, filled once with OBJECTS (default 100,000)
# values of VAL_SIZE (default 4,096) bytes by `capstan-bench fill`, then ROUNDS
# (default 3) rounds of one snapshot save while a separate process puts at
# 100/s for its first 2 s. One line per round: the save's wall time, the
# snapshot's size, the server's CPU time during it and its RSS growth 2 s in,
# and the puts' p99 and max.
set -euo pipefail

source "$(dirname "$0")/lib.sh" snapshot-bench
# Where etcdctl writes the snapshot: on the servers' disk by default;
# SNAP_DIR=/dev/shm keeps the client's writes off it.
SNAP_DIR=${SNAP_DIR:-${WORK}}

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

for binary in "$@"; do
  name=$(basename "${binary}")
  dir="${WORK}/${name}.data"
  start "${binary}" "${dir}"
  bench fill --prefix /snap/ --keys "${OBJECTS}" --val-size "${VAL_SIZE}" > /dev/null
  for round in $(seq "${ROUNDS}"); do
    ticks=$(cpu_ticks "${PID}")
    rss=$(rss_kib "${PID}")
    # The save in the background, timed; puts at 100/s for its first 2 s.
    ( start=$(date +%s.%N)
      etcdctl --endpoints "127.0.0.1:${PORT}" snapshot save "${SNAP_DIR}/snap.db" > /dev/null 2>&1
      echo "${start} $(date +%s.%N)" > "${WORK}/save.time" ) &
    save=$!
    sleep 0.2
    puts=$(bench --conns 1 --clients 1 put --rate 100 --total 200 --key-size 8 --val-size 256 2>&1)
    rss_peak=$(rss_kib "${PID}")
    wait "${save}"
    ticks=$(( $(cpu_ticks "${PID}") - ticks ))
    read -r start end < "${WORK}/save.time"
    size=$(stat -c %s "${SNAP_DIR}/snap.db")
    p99=$(awk '/99% in/ {print $3 * 1000}' <<< "${puts}")
    max=$(awk '/Slowest:/ {print $2 * 1000}' <<< "${puts}")
    printf '%s round %d: save %.2f s, %d MiB, server CPU %.2f s, RSS +%d MiB; puts meanwhile p99 %s ms, max %s ms\n' \
      "${name}" "${round}" "$(echo "${end} - ${start}" | bc)" $((size >> 20)) \
      "$(echo "${ticks} / $(getconf CLK_TCK)" | bc -l)" $(( (rss_peak - rss) / 1024 )) "${p99}" "${max}"
    rm -f "${SNAP_DIR}/snap.db"
  done
  kill -9 "${PID}"
  wait "${PID}" 2>/dev/null || true
  PID=
  rm -rf "${dir}"
done
