#!/usr/bin/env bash
# A small large-list run with the lists in a list process, against Capstan
# and etcd, both started by `compare`: it must complete without a failed
# request, and the list process, which reserved its memory before the load,
# must receive the four concurrent lists (80 MB) with few page faults (one
# per 4 KiB page received would be 20,000).
#
#   bench/loadgen/large_list_smoke_test.sh BUILD_DIR
set -euo pipefail

build=$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)
out=$(timeout 300 "$build/capstan-bench" --no-progress compare --rounds 1 --targets capstan,etcd \
  --conns 2 --clients 8 large-list --objects 5000 --min-size 4096 --max-size 4096 --lists 1 \
  --concurrent-lists 4 --put-rate 50 --put-idle-duration 1s --list-process --list-nice 19) ||
  { echo "$out"; echo "FAIL: large-list run failed" >&2; exit 1; }
fail() { echo "$out"; echo "FAIL: $*" >&2; exit 1; }
grep -q '^| failed requests (all rounds) | 0 | 0 |' <<<"$out" || fail "failed requests"
grep -q '^| list process reserved MiB (MiB) | 117.0 | 117.0 |' <<<"$out" ||
  fail "the list process did not reserve 1.5 x 4 x 5,000 x 4 KiB"
row=$(grep '^| list process page faults, concurrent () |' <<<"$out") ||
  fail "no page-fault row for the concurrent lists"
for faults in $(awk -F'|' '{print $3, $4}' <<<"$row"); do
  awk -v f="$faults" 'BEGIN { exit !(f + 0 < 5000) }' ||
    fail "the concurrent lists took $faults page faults"
done
echo PASS
