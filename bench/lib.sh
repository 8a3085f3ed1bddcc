# Shared by the bench scripts that start their own servers; sourced as
#   source "$(dirname "$0")/lib.sh" NAME
# Settings from the environment (BENCH, OBJECTS, VAL_SIZE, ROUNDS, PORT), a
# work directory /tmp/capstan-NAME.* removed on exit with the server in it,
# and helpers: bench/bench_as (capstan-bench against the server), start and
# cpu_ticks.

BENCH=${BENCH:-build/release/capstan-bench}
OBJECTS=${OBJECTS:-100000}
VAL_SIZE=${VAL_SIZE:-4096}
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-23790}
WORK=$(mktemp -d "/tmp/capstan-$1.XXXXXX")
PID=

cleanup() {
  if [[ -n "${PID}" ]]; then kill -9 "${PID}" 2>/dev/null || true; fi
  rm -rf "${WORK}"
}
trap cleanup EXIT

# capstan-bench against the server, run under a command prefix (word-split on
# purpose: "chrt --idle 0"; empty for none).
bench_as() {
  local prefix=$1; shift
  ${prefix} "${BENCH}" --no-progress --endpoints "$(client_endpoint)" \
    ${TLS_CLIENT_FLAGS[@]+"${TLS_CLIENT_FLAGS[@]}"} "$@"
}
bench() { bench_as "" "$@"; }

# The user + system CPU time of process PID, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# The server's client endpoint: host:port, or an https URL after bench/cluster/tools.sh's
# tls_setup (TLS=1), whose client and member flags bench_as and start then pass. HTTP_APART=1
# also gives the server --listen-client-http-urls on PORT+20 (gRPC alone on the client URL).
client_endpoint() {
  if [[ "${SCHEME:-http}" == https ]]; then echo "https://127.0.0.1:${PORT}"; else
    echo "127.0.0.1:${PORT}"; fi
}

start() {  # start BINARY DATA_DIR [FLAGS...]: the server on PORT, in PID, once it answers
  local scheme=${SCHEME:-http} apart=()
  if [[ "${HTTP_APART:-0}" == 1 ]]; then
    apart=(--listen-client-http-urls "${scheme}://127.0.0.1:$((PORT + 20))")
  fi
  "$1" --data-dir "$2" --listen-client-urls "${scheme}://127.0.0.1:${PORT}" \
    --advertise-client-urls "${scheme}://127.0.0.1:${PORT}" \
    --listen-peer-urls "${scheme}://127.0.0.1:$((PORT + 10))" \
    ${TLS_MEMBER_FLAGS[@]+"${TLS_MEMBER_FLAGS[@]}"} "${apart[@]}" "${@:3}" > "$2.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 300); do
    if bench range /none --total 1 > /dev/null 2>&1; then return; fi
    sleep 0.1
  done
  echo "$1 did not start; log: $2.log" >&2
  exit 1
}
