#!/usr/bin/env bash
# `--target-leader` as etcd's benchmark has it: against a 3-member Capstan
# cluster, with the endpoints listed followers first, every put of the run
# reaches the leader (its grpc_server_handled_total for Put counts them all,
# the followers' count none); with no endpoint that answers, the tool fails
# with etcd's message instead of running.
#
#   bench/loadgen/target_leader_smoke_test.sh BUILD_DIR
set -euo pipefail

build=$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
PORT=${PORT:-25470}
HEARTBEAT=100
ELECTION=1000
ETCDCTL=${CAPSTAN_ETCDCTL_BINARY:-${CAPSTAN_REFERENCE_DIR:-${HOME}/.cache/capstan/etcd-3.5}/usr/bin/etcdctl}
[[ -x "${ETCDCTL}" ]] || { echo "FAIL: no etcdctl at ${ETCDCTL}" >&2; exit 1; }
WORK=$(mktemp -d /tmp/capstan-target-leader.XXXXXX)
OUT=$(mktemp -d /tmp/capstan-target-leader-logs.XXXXXX)
PIDS=()
source "${here}/../cluster/tools.sh"
trap 'cleanup; rm -rf "${OUT}"' EXIT
fail() { echo "FAIL: $*" >&2; tail -5 "${OUT}"/*.log >&2 || true; exit 1; }

start_cluster "${build}/capstan" target-leader
leader=$(leader_index)
[[ -n "${leader}" ]] || fail "no leader"
# The followers first: the first endpoint is not the leader.
eps=""
for i in 0 1 2; do [[ "${i}" == "${leader}" ]] || eps+="http://$(endpoint "${i}"),"; done
eps+="http://$(endpoint "${leader}")"

puts() {
  curl -s "http://$(endpoint "$1")/metrics" |
    awk '/^grpc_server_handled_total\{/ && /grpc_method="Put"/ && /grpc_code="OK"/ {n += $NF}
         END {print n + 0}'
}
before=()
for i in 0 1 2; do before[i]=$(puts "${i}"); done
out=$(timeout 120 "${build}/capstan-bench" --no-progress --target-leader --endpoints "${eps}" \
  --conns 3 --clients 6 put --total 300 --key-space-size 100 2>&1) ||
  { echo "${out}"; fail "capstan-bench --target-leader failed"; }
grep -q "Total:" <<<"${out}" || { echo "${out}"; fail "no summary"; }
for i in 0 1 2; do
  n=$(( $(puts "${i}") - before[i] ))
  if [[ "${i}" == "${leader}" ]]; then
    [[ "${n}" -eq 300 ]] || fail "the leader (m${i}) answered ${n} puts, not 300"
  else
    [[ "${n}" -eq 0 ]] || fail "follower m${i} answered ${n} puts"
  fi
done

# put --compact-interval compacts while the puts run, and --check-hashkv
# prints etcd's "HashKV Summary:" of the first endpoint (the leader here),
# the hash the member itself gives etcdctl once the writes are over.
out=$(timeout 120 "${build}/capstan-bench" --no-progress --target-leader --endpoints "${eps}" \
  --conns 2 --clients 4 put --total 2000 --rate 2000 --key-space-size 100 \
  --compact-interval 200ms --compact-index-delta 100 --check-hashkv 2>&1) ||
  { echo "${out}"; fail "put --compact-interval --check-hashkv failed"; }
grep -q "^HashKV Summary:" <<<"${out}" || { echo "${out}"; fail "no HashKV summary"; }
grep -q "Endpoint: http://$(endpoint "${leader}")\$" <<<"${out}" ||
  { echo "${out}"; fail "the summary is not the leader's"; }
hash=$(sed -n 's/^\tHashKV: \([0-9]*\)$/\1/p' <<<"${out}")
want=$("${ETCDCTL}" --endpoints "$(endpoint "${leader}")" endpoint hashkv -w json |
  sed -n 's/.*"hash":\([0-9]*\).*/\1/p')
[[ -n "${hash}" && "${hash}" == "${want}" ]] || fail "HashKV ${hash:-none}, the member's ${want:-none}"
compacted=$("${ETCDCTL}" --endpoints "$(endpoint "${leader}")" get foo --rev=1 2>&1 || true)
grep -q "required revision has been compacted" <<<"${compacted}" ||
  { echo "${compacted}"; fail "no compaction while the puts ran"; }

# Nothing answers on these ports: etcd's tool's message, and a failed run.
if out=$("${build}/capstan-bench" --no-progress --target-leader --dial-timeout 1s \
  --endpoints "127.0.0.1:$((PORT + 7))" put --total 10 2>&1); then
  echo "${out}"; fail "a run without a leader to find succeeded"
fi
grep -q "failed to find a leader endpoint" <<<"${out}" || { echo "${out}"; fail "wrong error"; }
echo PASS
