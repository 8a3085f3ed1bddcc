#!/usr/bin/env bash
# soak.sh: a long mixed-load run against one capstan server, sampling the
# server's RSS, open files, data size and request latency over time.
#
#   SOAK_SECONDS=3600 scripts/soak.sh [BUILD_DIR]      (make soak)
#
# Load: capstan-bench k8s (pod creates/updates/deletes, node leases and
# status updates, events with leases, paginated relists, watches) at fixed
# rates for SOAK_SECONDS, with revision auto-compaction as a Kubernetes API
# server would run it. Every SAMPLE_SECONDS a probe measures put and range
# latency (200 requests each, one client) next to the load.
#
# Output in OUT_DIR (default build/soak-<date>): soak.csv, soak.png (gnuplot),
# server.log, load.log; and a summary comparing the first and last tenth of
# the run. Environment: SOAK_SECONDS (3600), SAMPLE_SECONDS (15), NODES (300),
# POD_CHURN_RATE (300), EVENT_TTL (600), PORT (23790).
#
# Events live EVENT_TTL seconds (their leases expire), so the live data set
# stops growing after EVENT_TTL: memory and files should be flat from then
# on. With Kubernetes' default of an hour, a one-hour run only grows.
set -euo pipefail

BUILD_DIR=${1:-build/release}
SOAK_SECONDS=${SOAK_SECONDS:-3600}
SAMPLE_SECONDS=${SAMPLE_SECONDS:-15}
NODES=${NODES:-300}
POD_CHURN_RATE=${POD_CHURN_RATE:-300}
EVENT_TTL=${EVENT_TTL:-600}
PORT=${PORT:-23790}
OUT_DIR=${OUT_DIR:-build/soak-$(date -u +%Y%m%dT%H%M%S)}
CAPSTAN=$BUILD_DIR/capstan
BENCH=$BUILD_DIR/capstan-bench
EP=127.0.0.1:$PORT

mkdir -p "$OUT_DIR"
DATA=$(mktemp -d /tmp/capstan-soak.XXXXXX)
cleanup() {
  [[ -n ${LOAD_PID:-} ]] && kill "$LOAD_PID" 2>/dev/null || true
  [[ -n ${SERVER_PID:-} ]] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null || true
  rm -rf "$DATA"
}
trap cleanup EXIT

"$CAPSTAN" --data-dir "$DATA/d" \
  --listen-client-urls "http://$EP" --advertise-client-urls "http://$EP" \
  --listen-metrics-urls "http://127.0.0.1:$((PORT + 1))" \
  --auto-compaction-mode revision --auto-compaction-retention 10000 \
  --quota-backend-bytes $((8 << 30)) > "$OUT_DIR/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do
  curl -sf "http://127.0.0.1:$((PORT + 1))/health" > /dev/null && break
  sleep 0.1
done

"$BENCH" --endpoints "$EP" --no-progress --clients 16 --conns 4 \
  --json "$OUT_DIR/load.json" k8s --duration "${SOAK_SECONDS}s" --nodes "$NODES" \
  --pod-churn-rate "$POD_CHURN_RATE" --lease-rate $((NODES / 2)) --event-rate $((NODES / 5)) \
  --event-ttl "$EVENT_TTL" \
  --node-status-rate $((NODES / 10)) --relist-interval 30s > "$OUT_DIR/load.log" 2>&1 &
LOAD_PID=$!

probe() {  # probe put|range -> p50 p99 (ms)
  local cmd=$1 json="$OUT_DIR/probe.json"
  if [[ $cmd == put ]]; then
    "$BENCH" --endpoints "$EP" --no-progress --json "$json" put --total 200 --val-size 256 \
      --key-space-size 1000 > /dev/null 2>&1 || { echo "nan nan"; return; }
  else
    "$BENCH" --endpoints "$EP" --no-progress --json "$json" range /registry/minions/ \
      /registry/minions0 --total 200 --consistency l > /dev/null 2>&1 || { echo "nan nan"; return; }
  fi
  jq -r '.phases[0].latency_ms | "\(.p50) \(.p99)"' "$json"
}

CSV=$OUT_DIR/soak.csv
echo "seconds,rss_mib,open_fds,data_mib,keys,put_p50_ms,put_p99_ms,range_p50_ms,range_p99_ms" > "$CSV"
start=$(date +%s)
while kill -0 "$LOAD_PID" 2>/dev/null; do
  now=$(date +%s)
  rss_kb=$(awk '/^VmRSS/ {print $2}' "/proc/$SERVER_PID/status")
  fds=$(ls "/proc/$SERVER_PID/fd" | wc -l)
  data_kb=$(du -sk "$DATA/d" | cut -f1)
  keys=$(curl -sf "http://127.0.0.1:$((PORT + 1))/metrics" |
         awk '/^etcd_debugging_mvcc_keys_total / {print $2}')
  read -r pp50 pp99 <<< "$(probe put)"
  read -r rp50 rp99 <<< "$(probe range)"
  printf '%d,%.1f,%d,%.1f,%s,%s,%s,%s,%s\n' $((now - start)) "$(bc -l <<< "$rss_kb/1024")" "$fds" \
    "$(bc -l <<< "$data_kb/1024")" "${keys:-nan}" "$pp50" "$pp99" "$rp50" "$rp99" | tee -a "$CSV"
  sleep "$SAMPLE_SECONDS"
done
wait "$LOAD_PID" || echo "load generator exited with $?"
LOAD_PID=

gnuplot <<GP
set terminal pngcairo size 1200,900
set output "$OUT_DIR/soak.png"
set datafile separator ","
set multiplot layout 3,1 title "capstan soak: $SOAK_SECONDS s of k8s load ($NODES nodes, $POD_CHURN_RATE pod changes/s)"
set xlabel "seconds"
set ylabel "MiB"
plot "$CSV" using 1:2 skip 1 with lines title "RSS", "$CSV" using 1:4 skip 1 with lines title "data dir"
set ylabel "open fds"
set y2label "live keys"
set y2tics
plot "$CSV" using 1:3 skip 1 with lines title "open files", \
     "$CSV" using 1:5 skip 1 axes x1y2 with lines title "live keys"
unset y2tics
unset y2label
set ylabel "ms"
set logscale y
plot "$CSV" using 1:6 skip 1 with lines title "put p50", "$CSV" using 1:7 skip 1 with lines title "put p99", \
     "$CSV" using 1:8 skip 1 with lines title "range p50", "$CSV" using 1:9 skip 1 with lines title "range p99"
unset multiplot
GP

# Is anything growing? Warm-up is the first fifth of the run or EVENT_TTL,
# whichever is longer (caches and memtables fill, the live set grows until
# the first events expire); the medians of the first and last tenth after
# it compare.
python3 - "$CSV" "$EVENT_TTL" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1])))
warm = max(float(rows[-1]["seconds"]) / 5, float(sys.argv[2]))
rows = [r for r in rows if float(r["seconds"]) >= warm] or rows[-1:]
n = max(1, len(rows) // 10)
def med(part, col):
    vals = [float(r[col]) for r in part if r[col] not in ("nan", "")]
    return statistics.median(vals) if vals else float("nan")
print(f"after warm-up: {len(rows)} samples from {rows[0]['seconds']} to {rows[-1]['seconds']} s; "
      f"medians of the first and last {n}:")
for col in ("rss_mib", "open_fds", "data_mib", "keys", "put_p50_ms", "put_p99_ms", "range_p50_ms", "range_p99_ms"):
    a, b = med(rows[:n], col), med(rows[-n:], col)
    print(f"  {col:14s} {a:10.2f} -> {b:10.2f}  ({(b / a - 1) * 100 if a else float('nan'):+.0f}%)")
PY
echo "CSV: $CSV  chart: $OUT_DIR/soak.png  load: $OUT_DIR/load.log"
