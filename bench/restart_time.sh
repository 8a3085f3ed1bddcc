#!/usr/bin/env bash
# restart_time.sh: how long Capstan and etcd take to serve again after a
# restart with KEYS keys (default 1,000,000 of VAL_SIZE=256 bytes).
#
#   bench/restart_time.sh [BUILD_DIR]        # default build/release
#   KEYS=100000 ROUNDS=3 bench/restart_time.sh
#
# Each target gets a fresh data dir, is filled by `capstan-bench fill`, then
# restarted ROUNDS times after a graceful stop (SIGTERM) and ROUNDS times
# after a crash (SIGKILL). "Serving" means a linearizable `etcdctl get` of a
# loaded key succeeds; the time runs from exec to that answer (the port is
# polled every 10 ms, then the get every 20 ms). Prints a markdown table of medians.
set -euo pipefail

BUILD_DIR=${1:-build/release}
KEYS=${KEYS:-1000000}
VAL_SIZE=${VAL_SIZE:-256}
ROUNDS=${ROUNDS:-3}
ETCD=${ETCD:-/usr/bin/etcd}
CAPSTAN=${BUILD_DIR}/capstan
BENCH=${BUILD_DIR}/capstan-bench
WORK=$(mktemp -d /tmp/capstan-restart.XXXXXX)
PID=

cleanup() {
  if [[ -n "${PID}" ]]; then kill -9 "${PID}" 2>/dev/null || true; fi
  rm -rf "${WORK}"
}
trap cleanup EXIT

free_port() {  # a loopback port nothing listens on
  local p
  while :; do
    p=$((20000 + RANDOM % 20000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/${p}") 2>/dev/null; then echo "${p}"; return; fi
  done
}

start() {  # start TARGET DATA_DIR CLIENT_PORT PEER_PORT
  local target=$1 dir=$2 port=$3 peer=$4
  local common=(--data-dir "${dir}" --listen-client-urls "http://127.0.0.1:${port}"
    --advertise-client-urls "http://127.0.0.1:${port}" --quota-backend-bytes 8589934592)
  if [[ ${target} == capstan ]]; then
    "${CAPSTAN}" "${common[@]}" --listen-metrics-urls "http://127.0.0.1:$(free_port)" \
      >>"${WORK}/${target}.log" 2>&1 &
  else
    "${ETCD}" "${common[@]}" --listen-peer-urls "http://127.0.0.1:${peer}" \
      --initial-advertise-peer-urls "http://127.0.0.1:${peer}" \
      --initial-cluster "default=http://127.0.0.1:${peer}" >>"${WORK}/${target}.log" 2>&1 &
  fi
  PID=$!
}

# Sets SERVE_SECONDS: seconds from exec until a linearizable get of a loaded
# key answers.
serve_time() {  # serve_time TARGET DATA_DIR CLIENT_PORT PEER_PORT
  local t0 t1
  t0=$(date +%s.%N)
  start "$@"
  # Wait for the port first: a get dialled before the server listens would
  # sit out gRPC's one-second reconnect backoff.
  until (exec 3<>"/dev/tcp/127.0.0.1/$3") 2>/dev/null; do
    if ! kill -0 "${PID}" 2>/dev/null; then echo "server exited; see ${WORK}/$1.log" >&2; exit 1; fi
    sleep 0.01
  done
  until ETCDCTL_API=3 etcdctl --endpoints "127.0.0.1:$3" --command-timeout=1s \
      get /fill/000000000 --print-value-only >/dev/null 2>&1; do
    if ! kill -0 "${PID}" 2>/dev/null; then echo "server exited; see ${WORK}/$1.log" >&2; exit 1; fi
    sleep 0.02
  done
  t1=$(date +%s.%N)
  SERVE_SECONDS=$(awk -v a="${t0}" -v b="${t1}" 'BEGIN {printf "%.3f", b - a}')
}

stop() {  # stop SIGNAL
  kill "-$1" "${PID}"
  wait "${PID}" 2>/dev/null || true
  PID=
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

declare -A RESULT
for target in capstan etcd; do
  dir="${WORK}/${target}.data"
  port=$(free_port); peer=$(free_port)
  serve_time "${target}" "${dir}" "${port}" "${peer}"
  "${BENCH}" --endpoints "127.0.0.1:${port}" --conns 4 --clients 16 --no-progress \
    fill --keys "${KEYS}" --val-size "${VAL_SIZE}" | grep -E '^\| fill' >&2
  RESULT[${target},size]=$(du -sm "${dir}" | cut -f1)
  for signal in TERM KILL; do
    times=()
    for ((i = 0; i < ROUNDS; i++)); do
      stop "${signal}"
      serve_time "${target}" "${dir}" "${port}" "${peer}"
      times+=("${SERVE_SECONDS}")
      echo "${target} after SIG${signal}: ${times[-1]} s" >&2
    done
    RESULT[${target},${signal}]=$(printf '%s\n' "${times[@]}" | median)
  done
  stop TERM
done

echo
echo "Restart with ${KEYS} keys of ${VAL_SIZE} bytes, median of ${ROUNDS} (seconds from exec to a served get):"
echo
echo "| | Capstan | etcd | Capstan/etcd |"
echo "| --- | ---: | ---: | ---: |"
for signal in TERM KILL; do
  c=${RESULT[capstan,${signal}]}; e=${RESULT[etcd,${signal}]}
  printf '| after SIG%s (s) | %.2f | %.2f | %.2f |\n' "${signal}" "${c}" "${e}" \
    "$(awk -v c="${c}" -v e="${e}" 'BEGIN {print c / e}')"
done
printf '| data dir (MiB) | %s | %s | |\n' "${RESULT[capstan,size]}" "${RESULT[etcd,size]}"
