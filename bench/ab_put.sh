#!/usr/bin/env bash
# Two Capstan builds side by side on etcd's put workload: ROUNDS rounds, each
# running every binary once, alternately, each on a fresh data directory
# (as `capstan-bench compare` starts its servers), and printing per run the
# puts per second, the p99 (ms), the server's CPU per put (us) and the
# number of group commits. For changes too small to show in a single run on
# a noisy machine: compare the medians.
#
#   bench/ab_put.sh OLD_BINARY NEW_BINARY [MORE_BINARIES...]
#
# Settings: ROUNDS (default 3), TOTAL puts per run (50000), and those of
# lib.sh (BENCH, PORT).
set -euo pipefail

source "$(dirname "$0")/lib.sh" abput
TOTAL=${TOTAL:-50000}
[[ $# -ge 2 ]] || { echo "usage: $0 BINARY BINARY [BINARY...]" >&2; exit 2; }

hz=$(getconf CLK_TCK)

echo "| round | binary | puts/s | p99 (ms) | server CPU per put (us) | groups |"
echo "| ---: | --- | ---: | ---: | ---: | ---: |"
for round in $(seq 1 "${ROUNDS}"); do
  for bin in "$@"; do
    rm -rf "${WORK}/data"
    start "${bin}" "${WORK}/data"
    before=$(cpu_ticks "${PID}")
    row=$(bench --conns 10 --clients 100 put --key-size 8 --val-size 256 --total "${TOTAL}" \
      --key-space-size 100000 | grep -E '^\| put \|')
    after=$(cpu_ticks "${PID}")
    groups=$(curl -s "http://127.0.0.1:${PORT}/metrics" |
      awk '/^capstan_commit_groups_total/ {print $2}' || true)
    kill "${PID}"
    wait "${PID}" 2>/dev/null || true
    PID=
    # | put | ok | errors | req/s | p50 | p90 | p99 | ...
    rate=$(echo "${row}" | awk -F'|' '{gsub(/ /, "", $5); print $5}')
    p99=$(echo "${row}" | awk -F'|' '{gsub(/ /, "", $8); print $8}')
    cpu=$(( (after - before) * 1000000 / hz / TOTAL ))
    echo "| ${round} | ${bin} | ${rate} | ${p99} | ${cpu} | ${groups} |"
  done
done
