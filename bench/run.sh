#!/usr/bin/env bash
# `make bench`: runs every Google Benchmark binary in the build dir (short --benchmark_min_time)
# and a `capstan-bench compare` set (Capstan vs a real etcd started here, several rounds), writing
# everything under BUILD_DIR/bench-results/. Builds nothing: `make bench` builds first.
#
#   bench/run.sh BUILD_DIR
#
# Environment: ROUNDS (compare rounds, default 5: this machine's noise needs medians of alternating
# rounds), MIN_TIME (Google Benchmark --benchmark_min_time,
# default 0.05), ETCD (etcd binary, default etcd 3.5 as scripts/deps.sh extracts it, else
# /usr/bin/etcd), SKIP_MICRO=1, SKIP_COMPARE=1, SKIP_ETCD_TOOL=1.
#
# 3. etcd's own `benchmark` tool against Capstan, the gRPC floor and etcd (bench/etcd_tool_rounds.sh,
# ROUNDS rounds each) for put, txn-put, linearizable range, lease-keepalive (the floor on completion
# queues) and watch-latency, and Capstan against etcd for watch-get and stm, into
# BUILD_DIR/bench-results/etcd-tool-<name>.md and SUMMARY.md.
# Exits non-zero if a benchmark failed or any request failed in a compare run.
set -uo pipefail

build=${1:?usage: bench/run.sh BUILD_DIR}
build=$(cd "$build" && pwd)
out=$build/bench-results
rounds=${ROUNDS:-5}
min_time=${MIN_TIME:-0.05}
etcd=${ETCD:-${CAPSTAN_ETCD_BINARY:-$HOME/.cache/capstan/etcd-3.5/usr/bin/etcd}}
[ -x "$etcd" ] || etcd=/usr/bin/etcd
mkdir -p "$out"
status=0

# Plots need Debian's gnuplot; install it when we may, otherwise capstan-bench says it skipped them.
if ! command -v gnuplot >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q gnuplot-nox >/dev/null 2>&1 ||
    echo "bench/run.sh: could not install gnuplot-nox; plots will be skipped" >&2
fi

# 1. Micro-benchmarks: build/<dir>/*/capstan_*_benchmark.
if [ "${SKIP_MICRO:-0}" != 1 ]; then
  for bin in $(find "$build" -mindepth 1 -maxdepth 2 -type f -name 'capstan_*_benchmark' -perm -u+x | sort); do
    name=$(basename "$bin")
    echo "== $name" >&2
    if ! timeout 900 "$bin" --benchmark_min_time="$min_time" \
        --benchmark_out="$out/$name.json" --benchmark_out_format=json > "$out/$name.txt"; then
      echo "bench/run.sh: $name failed" >&2
      status=1
    fi
    cat "$out/$name.txt"
  done
fi

# 2. Capstan vs etcd, side by side.
bench=$build/capstan-bench
if [ "${SKIP_COMPARE:-0}" != 1 ]; then
  if [ ! -x "$bench" ]; then
    echo "bench/run.sh: $bench not built; skipping the compare set" >&2
    status=1
  elif [ ! -x "$etcd" ]; then
    echo "bench/run.sh: no etcd at $etcd (apt-get install etcd-server); skipping the compare set" >&2
    status=1
  else
    summary=$out/SUMMARY.md
    {
      echo "# capstan-bench compare set"
      echo
      echo "$(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -r), etcd $("$etcd" --version | head -1 | awk '{print $3}')"
      echo
    } > "$summary"
    run_compare() {  # name, then the arguments after `compare`
      local name=$1
      shift
      echo "== compare $name" >&2
      if ! timeout 1200 "$bench" compare --rounds "$rounds" --etcd-binary "$etcd" \
          --json "$out/compare-$name.json" --markdown "$out/compare-$name.md" \
          --plot "$out/plots" "$@"; then
        echo "bench/run.sh: compare $name failed" >&2
        status=1
      fi
      [ -f "$out/compare-$name.md" ] && { cat "$out/compare-$name.md"; echo; } >> "$summary"
    }
    # put, large-list and lease-keepalive also run against capstan-grpc-floor,
    # gRPC with no server behind it: the most any gRPC C++ server could reach
    # here.
    run_compare put --targets capstan,floor,etcd --conns 10 --clients 100 \
      put --key-size 8 --val-size 256 --total 20000 --key-space-size 100000
    run_compare range --conns 10 --clients 100 \
      range /bench/range/key --populate 1 --val-size 256 --total 20000
    run_compare range-prefix100-s --conns 10 --clients 100 \
      range /bench/p/ --prefix --populate 100 --val-size 256 --total 10000 --consistency s
    run_compare txn-put --conns 10 --clients 100 \
      txn-put --key-size 8 --val-size 256 --total 10000 --key-space-size 100000
    run_compare large-list-small --targets capstan,floor,etcd --conns 4 --clients 32 \
      large-list --objects 5000 --lists 3 --concurrent-lists 4 --put-rate 50
    # The issue-sized form: 100,000 objects of 4 KiB, the lists received by a
    # process of their own at nice 19 (a list client on another machine
    # takes none of the servers' CPU), so that the puts measure the server.
    run_compare large-list-100k --conns 4 --clients 32 \
      large-list --objects 100000 --min-size 4096 --max-size 4096 --lists 1 \
      --concurrent-lists 4 --put-rate 50 --list-process --list-nice 19
    run_compare compaction-small --conns 4 --clients 16 \
      compaction --keys 100000 --rate 200
    echo "== restart time" >&2
    if ! KEYS=100000 ROUNDS=1 ETCD="$etcd" "$(dirname "$0")/restart_time.sh" "$build" \
        > "$out/restart-time.md"; then
      echo "bench/run.sh: restart_time.sh failed" >&2
      status=1
    fi
    cat "$out/restart-time.md" >> "$summary"
    echo "== snapshot save" >&2
    if ! OBJECTS=20000 ROUNDS=1 SNAP_DIR=/dev/shm BENCH="$bench" "$(dirname "$0")/snapshot.sh" \
        "$build/capstan" "$etcd" > "$out/snapshot.txt"; then
      echo "bench/run.sh: snapshot.sh failed" >&2
      status=1
    fi
    cat "$out/snapshot.txt" >> "$summary"
    echo "== migration from a killed etcd" >&2
    if ! OBJECTS=20000 VAL_SIZE=1024 ETCD="$etcd" BENCH="$bench" "$(dirname "$0")/migrate.sh" \
        "$build/capstan" > "$out/migrate.txt"; then
      echo "bench/run.sh: migrate.sh failed" >&2
      status=1
    fi
    cat "$out/migrate.txt" >> "$summary"
    # Watch and lease workloads (docs/BENCHMARKS.md, "Watch" and "Leases"), in a short form.
    run_compare watch-1key --conns 10 --clients 10 \
      watch --streams 10 --watch-per-stream 100 --watched-key-total 1 --put-total 200
    run_compare watch-latency --conns 4 --clients 10 watch-latency --total 300 --put-rate 100
    # The shape of etcd's own watch-latency runs: 100 watchers of one key, 200 puts/s.
    run_compare watch-latency-100 --conns 10 --clients 100 watch-latency --total 1000 --put-rate 200
    run_compare watch-10k --conns 10 --clients 10 \
      watch --streams 100 --watch-per-stream 100 --watched-key-total 10000 --sequential-keys \
      --key-space-size 10000 --put-rate 1000 --put-total 3000
    run_compare watch-prefix --conns 10 --clients 100 watch-prefix --total 20000 --put-rate 20000
    run_compare lease-keepalive --targets capstan,floor,etcd --conns 10 --clients 100 \
      lease-keepalive --total 10000
    run_compare lease-keepalive-stream --conns 10 --clients 100 lease-keepalive --total 20000 --stream
    run_compare lock --conns 10 --clients 100 lock --total 10000
    run_compare lock-contended --conns 10 --clients 100 lock --total 3000 --names 1
    run_compare lease-storm --conns 10 --clients 50 \
      lease-storm --leases 20000 --expiring 2000 --ttl 30 --expiring-ttl 5 --idle 3s
    echo "bench/run.sh: summary in $summary" >&2
  fi
fi

# 3. etcd's own benchmark tool, as a user would run it.
if [ "${SKIP_ETCD_TOOL:-0}" != 1 ]; then
  here=$(cd "$(dirname "$0")" && pwd)
  tool_run() {  # NAME [ENV=V...] -- TOOL ARGS...
    local name=$1 envs=()
    shift
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    if env ROUNDS="$rounds" ETCD="$etcd" CAPSTAN="$build/capstan" "${envs[@]}" \
        "$here/etcd_tool_rounds.sh" "$@" > "$out/etcd-tool-$name.md" 2> "$out/etcd-tool-$name.log"; then
      { echo; echo "## etcd's benchmark: $name"; echo; cat "$out/etcd-tool-$name.md"; } >> "$out/SUMMARY.md"
    else
      echo "bench/run.sh: etcd_tool_rounds.sh $name failed; see $out/etcd-tool-$name.log" >&2
      status=1
    fi
  }
  tool_run put -- --conns=10 --clients=100 put --total=20000 --val-size=256 --key-space-size=100000
  tool_run txn-put -- --conns=10 --clients=100 txn-put --txn-ops=4 --total=20000 --val-size=256 \
    --key-space-size=100000
  tool_run range -- --conns=10 --clients=100 range /bench/key --consistency=l --total=20000
  tool_run lease-keepalive FLOOR_FLAGS=--model=async -- --conns=10 --clients=100 lease-keepalive \
    --total=20000
  tool_run watch-latency -- --conns=10 --clients=100 watch-latency --total=1000 --put-rate=200
  # The floor serves neither: Capstan and etcd only.
  tool_run watch-get TARGETS="capstan etcd" -- --conns=10 --clients=100 watch-get --watchers=10000 \
    --streams=10 --events=8
  tool_run stm TARGETS="capstan etcd" -- --conns=10 --clients=100 stm --total=10000 --keys=1000 \
    --keys-per-txn=2
  echo "bench/run.sh: etcd's benchmark tool results in $out/etcd-tool-*.md" >&2
fi
exit $status
