#!/usr/bin/env bash
# Peer throughput over http and https peer URLs, alternating: runs
# capstan_peer_transport_benchmark ROUNDS times on its http cases (https:0)
# and ROUNDS times on its https cases (https:1), http first in odd rounds and
# https first in even ones, so that a change in the machine's load weighs on
# both alike. Prints one markdown table: per case the medians over the rounds
# of messages/s, payload MiB/s and process CPU us per message for each
# scheme, the https/http ratio of the medians, and the spread (min-max) of
# messages/s.
#
#   server/peer/peer_transport_benchmark_rounds.sh [OUT_DIR]
#
# Settings (environment): ROUNDS (5), BENCHMARK (the binary; default
# build/release/server/peer/capstan_peer_transport_benchmark), FILTER (a
# further --benchmark_filter regex on the case, e.g. 'bytes:16/'; default
# all). Each run's JSON and log are kept in OUT_DIR (default: a new
# /tmp/capstan-peer-bench.* directory).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "${here}/../.." && pwd)
ROUNDS=${ROUNDS:-5}
BENCHMARK=${BENCHMARK:-${repo}/build/release/server/peer/capstan_peer_transport_benchmark}
FILTER=${FILTER:-}
OUT=${1:-$(mktemp -d /tmp/capstan-peer-bench.XXXXXX)}
mkdir -p "${OUT}"

run() {  # run ROUND SCHEME(0|1)
  local name="r$1-https$2"
  "${BENCHMARK}" --benchmark_filter="https:$2/${FILTER}" --benchmark_out="${OUT}/${name}.json" \
    --benchmark_out_format=json > "${OUT}/${name}.log" 2>&1
}

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for round in $(seq 1 "${ROUNDS}"); do
  if (( round % 2 == 1 )); then order="0 1"; else order="1 0"; fi
  for scheme in ${order}; do
    echo "round ${round}: $([ "${scheme}" = 1 ] && echo https || echo http)" >&2
    run "${round}" "${scheme}"
  done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2

python3 - "${OUT}" "${ROUNDS}" <<'PY'
import glob, json, re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {}  # (case, https) -> list of benchmark entries
for path in sorted(glob.glob(f"{out}/r*-https*.json")):
    for b in json.load(open(path))["benchmarks"]:
        if b.get("error_occurred"):
            sys.exit(f"{path}: {b['name']}: {b.get('error_message')}")
        m = re.match(r"BM_OneWay/https:(\d)/(bytes:\d+/batch:\d+)", b["name"])
        runs.setdefault((m.group(2), m.group(1) == "1"), []).append(b)
med = lambda bs, key: statistics.median(b[key] for b in bs)
print(f"| case | http msg/s | https msg/s | https/http | http MiB/s | https MiB/s "
      f"| http CPU us/msg | https CPU us/msg | http msg/s spread | https msg/s spread |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
cases = sorted({c for c, _ in runs}, key=lambda c: [int(x) for x in re.findall(r"\d+", c)])
for case in cases:
    h, s = runs.get((case, False), []), runs.get((case, True), [])
    if len(h) != rounds or len(s) != rounds:
        sys.exit(f"{case}: {len(h)} http and {len(s)} https runs, want {rounds} each")
    hm, sm = med(h, "items_per_second"), med(s, "items_per_second")
    spread = lambda bs: "{:,.0f}-{:,.0f}".format(min(b["items_per_second"] for b in bs),
                                                 max(b["items_per_second"] for b in bs))
    print(f"| {case} | {hm:,.0f} | {sm:,.0f} | {sm / hm:.2f} "
          f"| {med(h, 'bytes_per_second') / 2**20:,.1f} | {med(s, 'bytes_per_second') / 2**20:,.1f} "
          f"| {med(h, 'cpu_us_per_msg'):.2f} | {med(s, 'cpu_us_per_msg'):.2f} "
          f"| {spread(h)} | {spread(s)} |")
first = lambda https: statistics.median(b["first_delivery_ms"] for (c, t), bs in runs.items()
                                        if t == https for b in bs)
print(f"\nmedian time to the first message delivered (connection, handshake): "
      f"http {first(False):.1f} ms, https {first(True):.1f} ms")
PY
echo "runs kept in ${OUT}" >&2
