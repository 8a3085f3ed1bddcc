#!/usr/bin/env bash
# Runs etcd's own end-to-end suite against Capstan.
#
# The suite is etcd 3.4's tests/e2e from Debian's golang-etcd-server-dev. Its
# harness starts "<bin-dir>/etcd" with etcd's flags, waits for etcd's startup
# lines, and drives the server with the real etcdctl (v2 and v3) and curl.
# Here "etcd" in the bin dir is the server under test.
#
# usage: tests/etcd_e2e/run.sh [options]
#   --server PATH   the server under test (default: build/release/capstan);
#                   /usr/bin/etcd runs the suite against etcd itself
#   --out DIR       test binary, logs and summary (default: build/etcd-e2e)
#   --run REGEX     only the tests whose names match
#   --skip REGEX    leave out the tests whose names match (an extended
#                   regular expression)
#   --expect FILE   the tests expected to fail, one name per line with the
#                   reason (default: tests/etcd_e2e/expected_failures.txt);
#                   /dev/null expects every test to pass
#   --no-retry      count a failure at once (by default a failed test runs
#                   once more before it counts: some of etcd's tests race
#                   their own timeouts on a loaded machine)
#
# Every test that needed a retry is reported: a "RETRIED <test>: ..." line on
# stderr when it happens and again at the end (`make test` lists these lines
# from the ctest output), and "(retried: ...)" on its line in the summary.
#
# Without its references (etcd's sources, go, etcdctl, curl, the server) the
# run exits 77, which ctest counts as a skip; under CI=true it exits 2, a
# failure naming what is missing.
#
# Each test runs in its own process: a test that fails can leave its servers
# running on the suite's fixed ports (20000 and up), which would fail every
# later test. Exit status 0 when exactly the expected tests fail; a listed
# test that passes is reported too, so the list stays true.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
server="$root/build/release/capstan"
out="$root/build/etcd-e2e"
run_re="."
skip_re=""
expect="$root/tests/etcd_e2e/expected_failures.txt"
retry=1
while [ $# -gt 0 ]; do
  case "$1" in
    --server) server=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --run) run_re=$2; shift 2 ;;
    --skip) skip_re=$2; shift 2 ;;
    --expect) expect=$2; shift 2 ;;
    --no-retry) retry=0; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

src=/usr/share/gocode/src/go.etcd.io/etcd
missing=()
for need in "$src/tests/e2e" /usr/bin/go /usr/bin/etcdctl /usr/bin/curl /usr/bin/patch "$server"; do
  [ -e "$need" ] || missing+=("$need")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "run.sh: missing test reference: ${missing[*]} (scripts/deps.sh installs" \
    "golang-etcd-server-dev, golang-go, etcd-client, curl and patch; make build the server)" >&2
  case "${CI:-}" in
    true|TRUE|True|1) echo "run.sh: CI=true: a missing reference fails the run" >&2; exit 2 ;;
  esac
  exit 77
fi
server=$(cd "$(dirname "$server")" && pwd)/$(basename "$server")
mkdir -p "$out"
out=$(cd "$out" && pwd)

# The test binary, rebuilt when Debian's sources or the patches change. It is
# built from a copy of tests/e2e with the patches beside this script applied
# (fixes of the suite itself that later etcd has), in GOPATH mode: the first
# GOPATH entry holds the copy, /usr/share/gocode everything it imports.
bin="$out/e2e.test"
patches=("$root"/tests/etcd_e2e/*.patch)
if [ ! -x "$bin" ] ||
   [ -n "$(find "$src/tests/e2e" "$src/pkg/expect" "${patches[@]}" -newer "$bin" \( -name '*.go' -o -name '*.patch' \) -print -quit)" ]; then
  echo "run.sh: building etcd's e2e suite into $bin" >&2
  gopath="$out/gopath"
  rm -rf "$gopath"
  mkdir -p "$gopath/src/go.etcd.io/etcd/tests"
  cp -r "$src/tests/e2e" "$gopath/src/go.etcd.io/etcd/tests/e2e"
  chmod -R u+w "$gopath"
  for p in "${patches[@]}"; do
    patch -s -p1 -d "$gopath/src/go.etcd.io/etcd/tests/e2e" < "$p"
  done
  (cd "$gopath/src/go.etcd.io/etcd" && GO111MODULE=off GOPATH="$gopath:/usr/share/gocode" GOFLAGS= \
    GOCACHE="${GOCACHE:-$out/gocache}" go test -c -o "$bin.tmp" ./tests/e2e)
  mv "$bin.tmp" "$bin"
fi

# The tests find their certificates at ../../integration/fixtures and write
# into their working directory: run them from a tree of our own.
work="$out/tree/tests/e2e"
mkdir -p "$work" "$out/bin"
ln -sfn "$src/integration" "$out/tree/integration"
ln -sfn "$server" "$out/bin/etcd"
ln -sfn /usr/bin/etcdctl "$out/bin/etcdctl"

declare -A expected=()
while read -r name _; do
  [ -n "$name" ] && expected[$name]=1
done < <(grep -v '^[[:space:]]*\(#\|$\)' "$expect")

run_one() {  # test-name log -> exit status of the test
  local tmp rc
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/capstan-e2e.XXXXXX")
  set +e
  (cd "$work" && TMPDIR="$tmp" timeout 300 "$bin" -test.v -test.run "^$1\$" \
    -bin-dir "$out/bin" -cert-dir "$out/tree/integration/fixtures") > "$2" 2>&1
  rc=$?
  set -e
  # Servers and clients a failed test left behind: their data dirs are in $tmp.
  pkill -9 -f -- "$tmp" 2>/dev/null || true
  rm -rf "$tmp"
  return $rc
}

summary="$out/summary.txt"
: > "$summary"
unexpected=0 fixed=0 passed=0 failed=0 skipped=0
retried=()  # "test (how the retry went)"
start=$(date +%s)
mkdir -p "$out/logs"
rm -f "$out"/logs/*.log.first
for t in $("$bin" -test.list "$run_re" | awk -v skip="$skip_re" '/^Test/ && (skip == "" || $0 !~ skip)'); do
  log="$out/logs/$t.log"
  status=PASS
  retry_note=""
  if ! run_one "$t" "$log"; then
    status=FAIL
    if [ $retry -eq 1 ] && [ -z "${expected[$t]:-}" ]; then
      mv "$log" "$log.first"
      if run_one "$t" "$log"; then
        status=PASS
        retry_note="failed once, passed on retry"
      else
        retry_note="failed, and failed again on retry"
      fi
      retried+=("$t: $retry_note; first run's log: $log.first")
      echo "RETRIED ${retried[-1]}" >&2
    fi
  fi
  grep -q -- "^--- SKIP: $t " "$log" && status=SKIP
  case $status in
    PASS) passed=$((passed + 1)) ;;
    SKIP) skipped=$((skipped + 1)) ;;
    FAIL) failed=$((failed + 1)) ;;
  esac
  note=""
  if [ $status = FAIL ] && [ -z "${expected[$t]:-}" ]; then
    note=" UNEXPECTED"
    unexpected=$((unexpected + 1))
    echo "== $t failed; $log:" >&2
    grep -v '^=== RUN' "$log" | head -n 20 | cut -c1-400 >&2 || true  # head may close the pipe early
  elif [ $status = PASS ] && [ -n "${expected[$t]:-}" ]; then
    note=" (listed as failing in $(basename "$expect"): remove it)"
    fixed=$((fixed + 1))
  fi
  [ -n "$retry_note" ] && note="$note (retried: $retry_note)"
  echo "$status $t$note" >> "$summary"
done

echo "etcd e2e against $server: $passed passed, $failed failed ($((failed - unexpected)) expected)," \
  "$skipped skipped, ${#retried[@]} retried in $(( $(date +%s) - start )) s; summary: $summary"
for r in "${retried[@]}"; do
  echo "RETRIED $r"
done
if [ $unexpected -gt 0 ] || [ $fixed -gt 0 ]; then
  grep -E 'UNEXPECTED|remove it' "$summary" >&2
  exit 1
fi
