#!/usr/bin/env bash
# migrate.sh: how long a move from etcd to Capstan keeps the cluster down, from
# an etcd that died rather than stopped.
#
#   bench/migrate.sh [CAPSTAN_BINARY]               # default build/release/capstan
#   OBJECTS=1000000 VAL_SIZE=1024 bench/migrate.sh
#
# An etcd (ETCD, default /usr/bin/etcd) is filled with OBJECTS (default
# 100,000) values of VAL_SIZE (default 4,096) bytes by `capstan-bench fill`,
# then killed with SIGKILL while 100 clients put, so that its bbolt file lacks
# its newest acknowledged writes (as after a crash or an OOM kill). Then, each
# timed: `capstan migrate` of its data dir (the copy, then the WAL replay);
# the same with --verify (a full Range at every VERIFY_STRIDE-th revision,
# default 1,000); Capstan's first start on the result, until a linearizable
# Range answers; and, for reference, etcd's own restart on its data dir, which
# replays its WAL too.
# Both must then end at the same revision with the same HashKV.
set -euo pipefail

source "$(dirname "$0")/lib.sh" migrate-bench
CAPSTAN=${1:-build/release/capstan}
ETCD=${ETCD:-/usr/bin/etcd}
VERIFY_STRIDE=${VERIFY_STRIDE:-1000}

seconds_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN {printf "%.2f", b - a}'; }

etcd_dir="${WORK}/etcd.data"
start "${ETCD}" "${etcd_dir}"
bench --conns 4 --clients 16 fill --prefix /registry/pods/ --keys "${OBJECTS}" \
  --val-size "${VAL_SIZE}" > /dev/null
# The load: puts with their answers kept, killed mid-way.
bench --conns 10 --clients 100 put --key-size 8 --val-size 256 --total 1000000 \
  --key-space-size 100000 > "${WORK}/load.out" 2>&1 &
load=$!
sleep 2
kill -9 "${PID}"
wait "${PID}" 2>/dev/null || true
PID=
wait "${load}" 2>/dev/null || true
du_mib() { du -sm "$1" | cut -f1; }
# "revision hash" of the server on PORT.
hashkv() {
  etcdctl --endpoints "127.0.0.1:${PORT}" endpoint hashkv -w json |
    sed -E 's/.*"revision":([0-9]+).*"hash":([0-9]+).*/\1 \2/'
}

t0=$(date +%s.%N)
"${CAPSTAN}" migrate --from-etcd "${etcd_dir}" --data-dir "${WORK}/capstan.data" \
  > "${WORK}/migrate.out" 2> "${WORK}/migrate.err"
migrate_s=$(seconds_since "${t0}")
t0=$(date +%s.%N)
"${CAPSTAN}" migrate --from-etcd "${etcd_dir}" --data-dir "${WORK}/verified.data" --verify \
  --verify-stride "${VERIFY_STRIDE}" > "${WORK}/verify.out" 2> "${WORK}/verify.err"
verify_s=$(seconds_since "${t0}")
rm -rf "${WORK}/verified.data"

# Starts BINARY on DIR, timed until it serves, then reads its HashKV and
# stops it: sets START_S and HASH.
serve_and_hash() {
  local t0
  t0=$(date +%s.%N)
  start "$1" "$2"
  START_S=$(seconds_since "${t0}")
  HASH=$(hashkv)
  kill "${PID}"
  wait "${PID}" 2>/dev/null || true
  PID=
}
serve_and_hash "${CAPSTAN}" "${WORK}/capstan.data"
capstan_start_s=${START_S}; capstan_hash=${HASH}
serve_and_hash "${ETCD}" "${etcd_dir}"
etcd_start_s=${START_S}; etcd_hash=${HASH}

echo "etcd killed after 2 s of puts; capstan migrate's report:"
sed 's/^/    /' "${WORK}/migrate.out"
echo
echo "| ${OBJECTS} values of ${VAL_SIZE} bytes | seconds |"
echo "| --- | ---: |"
echo "| etcd data dir (MiB) | $(du_mib "${etcd_dir}") |"
echo "| capstan migrate (copy and WAL replay) | ${migrate_s} |"
echo "| capstan migrate --verify --verify-stride ${VERIFY_STRIDE} | ${verify_s} |"
echo "| Capstan's first start on the result, until it serves | ${capstan_start_s} |"
echo "| etcd's restart on its own data dir (WAL replay included), for reference | ${etcd_start_s} |"
echo
echo "revision and HashKV: Capstan ${capstan_hash}, etcd after its restart ${etcd_hash}"
if [[ "${capstan_hash}" != "${etcd_hash}" ]]; then
  echo "MISMATCH: the migrated store does not end where etcd does" >&2
  exit 1
fi
