# shellcheck shell=bash
# Sourced by the bench scripts: builds, once, the Go programs they run, and prints
# their paths. Each builds with Debian's Go and Debian's etcd 3.4 Go sources
# (golang-go, golang-etcd-server-dev; installed with apt-get when missing), GOPATH mode.
#
#   etcd_benchmark_tool        etcd's own tools/benchmark, from Debian's etcd source package
#                              (ETCD_BENCHMARK overrides; an existing build in
#                              /var/tmp/etcd-benchmark/bin is reused)
#   failover_tool MAIN_GO      bench/cluster/failover, rebuilt when MAIN_GO changes
#   go_tool NAME MAIN_GO       any one-file Go program (bench/golist), the same way
#
# and starts cluster members the same way for every script:
#
#   start_member BINARY DATA_DIR INDEX PORT PEERS TOKEN LOG [FLAGS...]
#                              member m<INDEX> in the background (its pid appended to PIDS), client
#                              URL 127.0.0.1:PORT+INDEX, peer URL 127.0.0.1:PORT+10+INDEX,
#                              --initial-cluster PEERS, state new, output to LOG
#
# and, for scripts that set PORT, WORK (a data dir they own), OUT, HEARTBEAT, ELECTION, ETCDCTL and
# PIDS=(), a cluster of MEMBERS (3; 5 also fits the ports) at a time:
#
#   start_cluster BINARY LABEL [FLAGS...]
#                              members m0..m<MEMBERS-1> on fresh data dirs under WORK, logs
#                              OUT/LABEL-m*.log; returns once all name one leader (exits 1 after 60 s)
#   stop_cluster               kill -9 of every member in PIDS
#   cleanup                    stop_cluster and remove WORK (for `trap cleanup EXIT`)
#   initial_cluster            --initial-cluster for m0..m<MEMBERS-1>
#   endpoints                  the members' client endpoints, comma-separated
#   endpoint I                 member I's client endpoint
#   leader_index               the index of the member all name as leader, or nothing
#   describe_run               the date, the machine, its load and the two servers' versions, a
#                              line each (the head of a run's env.txt; uses ETCD, CAPSTAN, repo)
#
# With TLS=1, call tls_setup DIR first: members then serve clients and peers over TLS and require
# client certificates on both, as kubeadm deploys etcd (--cert-file, --key-file,
# --trusted-ca-file, --client-cert-auth=true and the --peer-* four), with RSA 2048 keys under one
# CA, as kubeadm makes them; the URLs are https, and TLS_CLIENT_FLAGS holds the --cacert, --cert
# and --key that etcdctl, etcd's benchmark and the failover client need.
#
# With HTTP_APART=1 every member also gets --listen-client-http-urls on PORT+20+INDEX, so that its
# client URL serves gRPC alone (etcd 3.5 otherwise serves gRPC on a TLS client URL through Go's
# HTTP server, sharing the port with its HTTP endpoints).

TOOLS_DIR=${TOOLS_DIR:-/var/tmp/capstan-bench-cluster}
MEMBERS=${MEMBERS:-3}
SCHEME=http
TLS_MEMBER_FLAGS=()
TLS_CLIENT_FLAGS=()

# tls_setup DIR: with TLS=1, a CA and two certificates for 127.0.0.1 in DIR (one every member
# serves and dials its peers with, one for the clients), and the https settings above.
tls_setup() {
  [[ "${TLS:-0}" == 1 ]] || return 0
  local dir=$1 name
  mkdir -p "${dir}"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bench-etcd-ca \
    -keyout "${dir}/ca.key" -out "${dir}/ca.crt" 2> /dev/null
  for name in member client; do
    openssl req -newkey rsa:2048 -nodes -subj "/CN=bench-${name}" -keyout "${dir}/${name}.key" \
      -out "${dir}/${name}.csr" 2> /dev/null
    openssl x509 -req -in "${dir}/${name}.csr" -CA "${dir}/ca.crt" -CAkey "${dir}/ca.key" \
      -CAcreateserial -days 2 -out "${dir}/${name}.crt" -extfile <(printf '%s\n' \
        'subjectAltName=IP:127.0.0.1,DNS:localhost' 'extendedKeyUsage=serverAuth,clientAuth') \
      2> /dev/null
  done
  SCHEME=https
  TLS_MEMBER_FLAGS=(--cert-file "${dir}/member.crt" --key-file "${dir}/member.key"
    --trusted-ca-file "${dir}/ca.crt" --client-cert-auth=true
    --peer-cert-file "${dir}/member.crt" --peer-key-file "${dir}/member.key"
    --peer-trusted-ca-file "${dir}/ca.crt" --peer-client-cert-auth=true)
  TLS_CLIENT_FLAGS=(--cacert "${dir}/ca.crt" --cert "${dir}/client.crt" --key "${dir}/client.key")
}

start_member() {
  local bin=$1 dir=$2 i=$3 port=$4 peers=$5 token=$6 log=$7 split=()
  shift 7
  if [[ "${HTTP_APART:-0}" == 1 ]]; then
    split=(--listen-client-http-urls "${SCHEME}://127.0.0.1:$((port + 20 + i))")
  fi
  "${bin}" --name "m${i}" --data-dir "${dir}" \
    --listen-client-urls "${SCHEME}://127.0.0.1:$((port + i))" \
    --advertise-client-urls "${SCHEME}://127.0.0.1:$((port + i))" \
    --listen-peer-urls "${SCHEME}://127.0.0.1:$((port + 10 + i))" \
    --initial-advertise-peer-urls "${SCHEME}://127.0.0.1:$((port + 10 + i))" \
    --initial-cluster "${peers}" --initial-cluster-token "${token}" \
    --initial-cluster-state new "${TLS_MEMBER_FLAGS[@]}" "${split[@]}" "$@" > "${log}" 2>&1 &
  PIDS+=($!)
}

go_deps() {
  if ! command -v go > /dev/null || [[ ! -d /usr/share/gocode/src/go.etcd.io/etcd ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q golang-go golang-etcd-server-dev \
      dpkg-dev >&2
  fi
}

etcd_benchmark_tool() {
  if [[ -n "${ETCD_BENCHMARK:-}" ]]; then echo "${ETCD_BENCHMARK}"; return; fi
  if [[ -x /var/tmp/etcd-benchmark/bin/benchmark ]]; then
    echo /var/tmp/etcd-benchmark/bin/benchmark
    return
  fi
  local bin=${TOOLS_DIR}/benchmark
  if [[ ! -x "${bin}" ]]; then
    echo "tools.sh: building etcd's benchmark tool into ${TOOLS_DIR} (one time)" >&2
    go_deps
    local apt=${TOOLS_DIR}/apt
    mkdir -p "${apt}/parts" "${apt}/lists/partial" "${TOOLS_DIR}/src"
    # The machine's own Debian sources, as source-package entries.
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
      > "${apt}/parts/src.sources"
    local opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=${apt}/parts"
      -o "Dir::State::Lists=${apt}/lists")
    apt-get "${opts[@]}" update -q >&2
    (cd "${TOOLS_DIR}/src" && apt-get "${opts[@]}" source -q etcd >&2)
    local src
    src=$(ls -d "${TOOLS_DIR}"/src/etcd-3.4*/ | head -1)
    mkdir -p "${TOOLS_DIR}/gopath/src/go.etcd.io/etcd/tools"
    cp -r "${src}/tools/benchmark" "${TOOLS_DIR}/gopath/src/go.etcd.io/etcd/tools/"
    GO111MODULE=off GOPATH="${TOOLS_DIR}/gopath:/usr/share/gocode" \
      GOCACHE="${TOOLS_DIR}/gocache" go build -o "${bin}" go.etcd.io/etcd/tools/benchmark >&2
  fi
  echo "${bin}"
}

# go_tool NAME MAIN_GO: builds the one-file Go program MAIN_GO as TOOLS_DIR/NAME (again when
# MAIN_GO changes) and prints its path.
go_tool() {
  local name=$1 main_go=$2 bin=${TOOLS_DIR}/$1
  local pkg=${TOOLS_DIR}/gopath/src/capstanbench/$1
  if [[ ! -x "${bin}" ]] || ! cmp -s "${main_go}" "${pkg}/main.go"; then
    echo "tools.sh: building ${name} into ${TOOLS_DIR}" >&2
    go_deps
    mkdir -p "${pkg}"
    cp "${main_go}" "${pkg}/main.go"
    GO111MODULE=off GOPATH="${TOOLS_DIR}/gopath:/usr/share/gocode" \
      GOCACHE="${TOOLS_DIR}/gocache" go build -o "${bin}" "capstanbench/${name}" >&2
  fi
  echo "${bin}"
}

failover_tool() { go_tool failover "$1"; }

# leader_of_status [N]: reads `etcdctl endpoint status -w json` of N (3)
# members on stdin and prints the index of the member all N name as
# leader, or nothing.
leader_of_status() {
  python3 -c '
import json, sys
try:
    st = json.load(sys.stdin)
except ValueError:
    sys.exit(0)
if len(st) != int(sys.argv[1]):
    sys.exit(0)
leaders = {s["Status"].get("leader", 0) for s in st}
ids = [s["Status"]["header"].get("member_id", 0) for s in st]
if len(leaders) == 1 and next(iter(leaders)) in ids:
    print(ids.index(next(iter(leaders))))
' "${1:-3}"
}

endpoint() {
  if [[ "${SCHEME}" == https ]]; then echo "https://127.0.0.1:$((PORT + $1))"; else
    echo "127.0.0.1:$((PORT + $1))"; fi
}
endpoints() {
  local i list=""
  for (( i = 0; i < MEMBERS; i++ )); do list+="${list:+,}$(endpoint "${i}")"; done
  echo "${list}"
}
initial_cluster() {
  local i list=""
  for (( i = 0; i < MEMBERS; i++ )); do
    list+="${list:+,}m${i}=${SCHEME}://127.0.0.1:$((PORT + 10 + i))"
  done
  echo "${list}"
}

stop_cluster() {
  local pid
  for pid in "${PIDS[@]}"; do kill -9 "${pid}" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "${pid}" 2>/dev/null || true; done
  PIDS=()
}
cleanup() { stop_cluster; rm -rf "${WORK}"; }

start_cluster() {
  local bin=$1 label=$2 i peers
  shift 2
  rm -rf "${WORK:?}"/*
  peers=$(initial_cluster)
  for (( i = 0; i < MEMBERS; i++ )); do
    start_member "${bin}" "${WORK}/m${i}" "${i}" "${PORT}" "${peers}" bench-cluster \
      "${OUT}/${label}-m${i}.log" \
      --heartbeat-interval "${HEARTBEAT}" --election-timeout "${ELECTION}" "$@"
  done
  local deadline=$((SECONDS + 60))
  while (( SECONDS < deadline )); do
    if [[ -n "$(leader_index)" ]]; then return 0; fi
    sleep 0.2
  done
  echo "${0##*/}: ${label} cluster did not elect a leader; logs in ${OUT}/${label}-m*.log" >&2
  exit 1
}

leader_index() {
  "${ETCDCTL}" --endpoints "$(endpoints)" "${TLS_CLIENT_FLAGS[@]}" --command-timeout 2s \
    endpoint status -w json 2>/dev/null |
    leader_of_status "${MEMBERS}"
}

describe_run() {
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "machine: $(nproc) cores, $(uname -r), load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "etcd: $("${ETCD}" --version | head -1)"
  echo "capstan: ${CAPSTAN} ($(git -C "${repo}" rev-parse --short HEAD 2>/dev/null || echo '?'))"
  if [[ "${SCHEME}" == https ]]; then
    echo "tls: clients and peers over TLS with client certificates (RSA 2048, as kubeadm's)"
  fi
  if [[ "${HTTP_APART:-0}" == 1 ]]; then
    echo "members: --listen-client-http-urls apart from the client URLs (gRPC alone on those)"
  fi
}
