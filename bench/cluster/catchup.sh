#!/usr/bin/env bash
# Catch-up of a member that missed SIZE bytes of writes: etcd's 3-member cluster against Capstan's,
# with the leader's memory sampled while it sends the snapshot.
#
#   bench/cluster/catchup.sh [OUT_DIR]
#
# For each server in SERVERS (etcd, then Capstan), on a fresh 3-member cluster of real processes
# on loopback (separate data dirs under WORK_PARENT, fsync on, --snapshot-count SNAPSHOT_COUNT,
# --quota-backend-bytes QUOTA):
#
#   1. one follower is stopped with SIGTERM;
#   2. SIZE bytes are written through the leader with etcd's `benchmark put`: values of VAL_SIZE
#      bytes over SIZE / VAL_SIZE distinct 8-byte keys (--sequential-keys), CLIENTS clients; then
#      SNAPSHOT_COUNT + 6000 puts of 16 bytes to one 9-byte key, so that the leader's Raft log is
#      compacted (to its applied index minus 5000, as etcd does) well past the stopped member;
#   3. a sampler reads the leader's /proc/PID/status (VmRSS, RssAnon, RssFile) and the restarted
#      follower's every 100 ms, from just before the follower is restarted (same command line)
#      until its `endpoint status` revision equals the leader's; then both members' `endpoint
#      hashkv` at that revision must be equal (checked after sampling stops: HashKV reads the whole
#      store, which is not part of the catch-up), and the follower's log must show that it
#      installed a snapshot.
#
# It prints one markdown row per server: the time from the restart to convergence, the leader's
# RSS before, at its peak and the growth, and the growth of its anonymous and file-backed parts
# (each its own peak minus its value before), the follower's peak RSS, the bytes on disk of the
# leader's and the follower's data dirs after convergence, and the load's duration. The raw
# samples are OUT_DIR/SERVER-rss.tsv (ms since the restart, then VmRSS, RssAnon, RssFile of the
# leader and of the follower, KiB), the servers' logs SERVER-m*.log, the bytes of each data dir's
# folders SERVER-disk.txt, the rows OUT_DIR/table.md.
# OUT_DIR defaults to a new /tmp/capstan-catchup-bench.* directory, kept. Each cluster's data is
# deleted once its run is done.
#
# Settings (environment): SIZE (8GiB; a byte count or a number with KiB, MiB, GiB), VAL_SIZE
# (65536), SNAPSHOT_COUNT (10000), CLIENTS (16), QUOTA (twice SIZE plus 2 GiB), SERVERS
# ("etcd capstan"), PORT (24200: members use PORT..PORT+2 for clients, PORT+10..PORT+12 for
# peers), HEARTBEAT (100), ELECTION (1000), CONVERGE_TIMEOUT (3600 s), WORK_PARENT (/tmp),
# CAPSTAN (build/release/capstan), ETCD and ETCDCTL (etcd 3.5.16 under
# /root/.cache/capstan/etcd-3.5/usr/bin). The data of one cluster needs about 6 x SIZE of free
# disk while it runs (the catching-up follower holds the received checkpoint and its old store at
# once).
# When the leadership moves during the load, the member that leads afterwards is sampled; when it
# moves during the catch-up, the run fails.
# etcd's benchmark tool is found or built by bench/cluster/tools.sh.
# Exits 1 when a run fails (a cluster that does not start, a load error, no convergence, a hash
# mismatch, a follower that did not install a snapshot).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "${here}/../.." && pwd)

bytes_of() {  # 64KiB, 1GiB, 1048576 -> bytes
  local v=$1
  case "${v}" in
    *KiB) echo $(( ${v%KiB} << 10 )) ;;
    *MiB) echo $(( ${v%MiB} << 20 )) ;;
    *GiB) echo $(( ${v%GiB} << 30 )) ;;
    *) echo $(( v )) ;;
  esac
}

SIZE=$(bytes_of "${SIZE:-8GiB}")
VAL_SIZE=$(bytes_of "${VAL_SIZE:-65536}")
SNAPSHOT_COUNT=${SNAPSHOT_COUNT:-10000}
CLIENTS=${CLIENTS:-16}
QUOTA=$(bytes_of "${QUOTA:-$(( 2 * SIZE + (2 << 30) ))}")
SERVERS=${SERVERS:-etcd capstan}
PORT=${PORT:-24200}
HEARTBEAT=${HEARTBEAT:-100}
ELECTION=${ELECTION:-1000}
CONVERGE_TIMEOUT=${CONVERGE_TIMEOUT:-3600}
WORK_PARENT=${WORK_PARENT:-/tmp}
CAPSTAN=${CAPSTAN:-${repo}/build/release/capstan}
ETCD=${ETCD:-/root/.cache/capstan/etcd-3.5/usr/bin/etcd}
ETCDCTL=${ETCDCTL:-/root/.cache/capstan/etcd-3.5/usr/bin/etcdctl}
OUT=${1:-$(mktemp -d /tmp/capstan-catchup-bench.XXXXXX)}
mkdir -p "${OUT}"
OUT=$(cd "${OUT}" && pwd)
KEYS=$(( SIZE / VAL_SIZE ))
(( KEYS > 0 )) || { echo "catchup.sh: SIZE ${SIZE} is below VAL_SIZE ${VAL_SIZE}" >&2; exit 1; }

source "${here}/tools.sh"
BENCHMARK=$(etcd_benchmark_tool)

for bin in "${CAPSTAN}" "${ETCD}" "${ETCDCTL}" "${BENCHMARK}"; do
  [[ -x "${bin}" ]] || { echo "catchup.sh: ${bin} is not an executable" >&2; exit 1; }
done

PIDS=(0 0 0)
SAMPLER=
WORK=$(mktemp -d "${WORK_PARENT}/capstan-catchup-data.XXXXXX")
stop_cluster() {
  local pid
  for pid in "${PIDS[@]}"; do if (( pid > 0 )); then kill -9 "${pid}" 2>/dev/null || true; fi; done
  for pid in "${PIDS[@]}"; do if (( pid > 0 )); then wait "${pid}" 2>/dev/null || true; fi; done
  PIDS=(0 0 0)
}
cleanup() {
  if [[ -n "${SAMPLER}" ]]; then kill "${SAMPLER}" 2>/dev/null || true; fi
  stop_cluster
  rm -rf "${WORK}"
}
trap cleanup EXIT


# start_member BINARY LABEL I: member mI in the background, its pid in PIDS[I]; the same command
# line starts it the first time and restarts it on its data dir.
start_member() {
  local bin=$1 label=$2 i=$3 peers="" j
  for j in 0 1 2; do peers+="${peers:+,}m${j}=http://127.0.0.1:$((PORT + 10 + j))"; done
  "${bin}" --name "m${i}" --data-dir "${WORK}/m${i}" \
    --listen-client-urls "http://$(endpoint "${i}")" \
    --advertise-client-urls "http://$(endpoint "${i}")" \
    --listen-peer-urls "http://127.0.0.1:$((PORT + 10 + i))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((PORT + 10 + i))" \
    --initial-cluster "${peers}" --initial-cluster-token catchup-bench \
    --initial-cluster-state new \
    --heartbeat-interval "${HEARTBEAT}" --election-timeout "${ELECTION}" \
    --snapshot-count "${SNAPSHOT_COUNT}" --quota-backend-bytes "${QUOTA}" \
    >> "${OUT}/${label}-m${i}.log" 2>&1 &
  PIDS[i]=$!
}

# status_json ENDPOINTS: etcdctl endpoint status -w json, or nothing.
status_json() {
  "${ETCDCTL}" --endpoints "$1" --command-timeout 5s endpoint status -w json 2>/dev/null || true
}

# leader_index: the endpoint index (0-2) of the member that all three name as leader, or nothing.
leader_index() {
  status_json "$(endpoint 0),$(endpoint 1),$(endpoint 2)" | leader_of_status
}

# self_leader I: prints I when member I reports itself as the leader.
self_leader() {
  status_json "$(endpoint "$1")" | python3 -c '
import json, sys
try:
    st = json.load(sys.stdin)[0]["Status"]
except (ValueError, IndexError, KeyError):
    sys.exit(0)
if st.get("leader", 0) == st["header"].get("member_id", -1):
    print(sys.argv[1])
' "$1"
}

# revision I: the store revision member I reports in Status, or nothing.
revision() {
  status_json "$(endpoint "$1")" | python3 -c '
import json, sys
try:
    print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])
except (ValueError, IndexError, KeyError):
    pass
'
}

# hashkv I REV: member I's HashKV at REV.
hashkv() {
  "${ETCDCTL}" --endpoints "$(endpoint "$1")" --command-timeout 600s endpoint hashkv \
    --rev "$2" -w json | python3 -c 'import json, sys; print(json.load(sys.stdin)[0]["HashKV"]["hash"])'
}

now_ms() { date +%s%3N; }

# The sampler: every 100 ms, VmRSS, RssAnon and RssFile (KiB) of the leader (pid argv[1]) and of
# the member whose pid is in the file argv[2] (empty until it is written), as a line of
# "ms_since_argv[4] leader_rss leader_anon leader_file follower_rss follower_anon follower_file"
# into argv[3]; stops when the file argv[5] exists.
SAMPLER_PY='
import os, sys, time
leader, pid_file, out, t0, stop = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
def mem(pid):
    v = {"VmRSS": "", "RssAnon": "", "RssFile": ""}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k = line.split(":")[0]
                if k in v:
                    v[k] = line.split()[1]
    except (OSError, ValueError):
        pass
    return [v["VmRSS"], v["RssAnon"], v["RssFile"]]
with open(out, "w") as f:
    f.write("ms\tleader_rss_kib\tleader_anon_kib\tleader_file_kib\t"
            "follower_rss_kib\tfollower_anon_kib\tfollower_file_kib\n")
    nxt = time.monotonic()
    while not os.path.exists(stop):
        try:
            follower = open(pid_file).read().strip()
        except OSError:
            follower = ""
        row = mem(leader) + (mem(follower) if follower else ["", "", ""])
        f.write("\t".join([str(int(time.time() * 1000) - t0)] + row) + "\n")
        f.flush()
        nxt += 0.1
        time.sleep(max(0.0, nxt - time.monotonic()))
'

run_server() {  # SERVER BINARY
  local server=$1 bin=$2 i leader follower deadline
  rm -rf "${WORK:?}"/*
  : > "${OUT}/${server}-m0.log"; : > "${OUT}/${server}-m1.log"; : > "${OUT}/${server}-m2.log"
  for i in 0 1 2; do start_member "${bin}" "${server}" "${i}"; done
  deadline=$((SECONDS + 60))
  leader=
  while (( SECONDS < deadline )); do
    leader=$(leader_index)
    [[ -z "${leader}" ]] || break
    sleep 0.2
  done
  [[ -n "${leader}" ]] || {
    echo "catchup.sh: the ${server} cluster elected no leader; logs in ${OUT}/${server}-m*.log" >&2
    exit 1
  }
  follower=$(( (leader + 1) % 3 ))
  echo "  ${server}: leader m${leader}, stopping m${follower} (SIGTERM)" >&2
  kill -TERM "${PIDS[follower]}"
  wait "${PIDS[follower]}" || true
  PIDS[follower]=0

  echo "  ${server}: writing ${KEYS} values of ${VAL_SIZE} bytes" >&2
  local t_load=${SECONDS}
  "${BENCHMARK}" --endpoints "$(endpoint "${leader}")" --conns 4 --clients "${CLIENTS}" \
    put --total "${KEYS}" --val-size "${VAL_SIZE}" --key-size 8 --sequential-keys \
    --key-space-size "${KEYS}" 2> "${OUT}/${server}-load.stderr" | tr '\r' '\n' \
    > "${OUT}/${server}-load.txt"
  "${BENCHMARK}" --endpoints "$(endpoint "${leader}")" --conns 1 --clients 16 \
    put --total $(( SNAPSHOT_COUNT + 6000 )) --val-size 16 --key-size 9 --key-space-size 1 \
    2>> "${OUT}/${server}-load.stderr" | tr '\r' '\n' >> "${OUT}/${server}-load.txt"
  local load_s=$(( SECONDS - t_load ))
  if grep -q 'Error distribution' "${OUT}/${server}-load.txt"; then
    echo "catchup.sh: the ${server} load had failed requests:" >&2
    sed -n '/Error distribution/,$p' "${OUT}/${server}-load.txt" >&2
    exit 1
  fi
  if [[ -z "$(self_leader "${leader}")" ]]; then
    # The leadership moved during the load: sample the member that leads now.
    leader=$(( 3 - leader - follower ))
    [[ -n "$(self_leader "${leader}")" ]] || {
      echo "catchup.sh: no ${server} member leads after the load" >&2
      exit 1
    }
    echo "  ${server}: the leadership moved to m${leader} during the load" >&2
  fi
  local target
  target=$(revision "${leader}")
  [[ -n "${target}" ]] || { echo "catchup.sh: no status from the ${server} leader" >&2; exit 1; }
  echo "  ${server}: loaded in ${load_s} s, revision ${target}; restarting m${follower}" >&2

  # Let the page cache write back the load, so that the catch-up does not compete with it.
  sync
  local t0 pid_file="${OUT}/${server}-follower.pid" stop_file="${OUT}/${server}-sampler.stop"
  rm -f "${pid_file}" "${stop_file}"
  t0=$(now_ms)
  python3 -c "${SAMPLER_PY}" "${PIDS[leader]}" "${pid_file}" "${OUT}/${server}-rss.tsv" "${t0}" \
    "${stop_file}" &
  SAMPLER=$!
  sleep 0.3  # a few samples of the leader before the restart
  local t_restart
  t_restart=$(now_ms)
  start_member "${bin}" "${server}" "${follower}"
  echo "${PIDS[follower]}" > "${pid_file}"
  deadline=$((SECONDS + CONVERGE_TIMEOUT))
  local t_converged=
  while (( SECONDS < deadline )); do
    if [[ "$(revision "${follower}")" == "${target}" ]]; then t_converged=$(now_ms); break; fi
    sleep 0.2
  done
  touch "${stop_file}"
  wait "${SAMPLER}" || true
  SAMPLER=
  if [[ -z "$(self_leader "${leader}")" ]]; then
    echo "catchup.sh: the ${server} leadership moved during the catch-up; the samples are not" \
      "the sending leader's" >&2
    exit 1
  fi
  [[ -n "${t_converged}" ]] || {
    echo "catchup.sh: the ${server} follower did not reach revision ${target} in" \
      "${CONVERGE_TIMEOUT} s; logs in ${OUT}/${server}-m*.log" >&2
    exit 1
  }
  local converge_s
  converge_s=$(awk -v a="${t_restart}" -v b="${t_converged}" 'BEGIN { printf "%.1f", (b - a) / 1000 }')
  echo "  ${server}: converged in ${converge_s} s; checking hashkv" >&2

  local hl hf
  hl=$(hashkv "${leader}" "${target}")
  hf=$(hashkv "${follower}" "${target}")
  if [[ "${hl}" != "${hf}" ]]; then
    echo "catchup.sh: ${server} hashkv at ${target}: leader ${hl}, follower ${hf}" >&2
    exit 1
  fi
  local snapshot_line
  if [[ "${server}" == etcd ]]; then
    snapshot_line='applied snapshot'
  else
    snapshot_line='installed a snapshot'
  fi
  grep -q "${snapshot_line}" "${OUT}/${server}-m${follower}.log" || {
    echo "catchup.sh: the ${server} follower caught up without a snapshot (no \"${snapshot_line}\"" \
      "in ${OUT}/${server}-m${follower}.log): the load did not compact the log past it" >&2
    exit 1
  }
  local disk_leader disk_follower
  disk_leader=$(du -sb "${WORK}/m${leader}" | cut -f1)
  disk_follower=$(du -sb "${WORK}/m${follower}" | cut -f1)
  du -b -d 2 "${WORK}/m${leader}" "${WORK}/m${follower}" | sed "s|${WORK}/||" \
    > "${OUT}/${server}-disk.txt"
  stop_cluster
  rm -rf "${WORK:?}"/*

  python3 - "${OUT}/${server}-rss.tsv" "${t_restart}" "${t0}" "${server}" "${converge_s}" \
    "${disk_leader}" "${disk_follower}" "${load_s}" "${hl}" >> "${OUT}/table.md" <<'EOF'
import sys
path, t_restart, t0, server, converge, disk_l, disk_f, load_s, h = sys.argv[1:]
offset = int(t_restart) - int(t0)
rows = [l.rstrip("\n").split("\t") for l in open(path)][1:]
def col(i, after):
    return [int(r[i]) for r in rows if r[i] and (int(r[0]) >= offset) == after]
mib = lambda kib: kib / 1024
before = [col(i, False)[-1] for i in (1, 2, 3)]
peak = [max(col(i, True)) for i in (1, 2, 3)]
fpeak = max(col(4, True) or [0])
name = "etcd 3.5.16" if server == "etcd" else "Capstan"
print(f"| {name} | {converge} | {mib(before[0]):.0f} | {mib(peak[0]):.0f} | "
      f"{mib(peak[0] - before[0]):.0f} | {mib(peak[1] - before[1]):.0f} | "
      f"{mib(peak[2] - before[2]):.0f} | {mib(fpeak):.0f} | {int(disk_l) / 2**30:.2f} | "
      f"{int(disk_f) / 2**30:.2f} | {load_s} |")
EOF
  tail -1 "${OUT}/table.md" >&2
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "machine: $(nproc) cores, $(uname -r), load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "etcd: $("${ETCD}" --version | head -1)"
  echo "capstan: ${CAPSTAN} ($(git -C "${repo}" rev-parse --short HEAD 2>/dev/null || echo '?'))"
  echo "size: ${SIZE} bytes (${KEYS} values of ${VAL_SIZE} bytes), --snapshot-count ${SNAPSHOT_COUNT}," \
    "--quota-backend-bytes ${QUOTA}, --heartbeat-interval ${HEARTBEAT} --election-timeout ${ELECTION}"
  echo "free disk at start: $(df -h --output=avail "${WORK_PARENT}" | tail -1)"
} > "${OUT}/env.txt"
cat "${OUT}/env.txt" >&2
{
  echo "| server | converged s | leader RSS before MiB | leader RSS peak MiB | leader RSS growth MiB" \
    "| RssAnon growth MiB | RssFile growth MiB | follower RSS peak MiB | leader disk GiB" \
    "| follower disk GiB | load s |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
} > "${OUT}/table.md"

for server in ${SERVERS}; do
  if [[ "${server}" == etcd ]]; then bin=${ETCD}; else bin=${CAPSTAN}; fi
  echo "== ${server}" >&2
  run_server "${server}" "${bin}"
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "${OUT}/env.txt"

cat "${OUT}/env.txt"
echo
cat "${OUT}/table.md"
echo
echo "samples: ${OUT}/*-rss.tsv" >&2
