#!/usr/bin/env bash
# Installs the Debian packages Capstan needs to build, run and test, only when missing.
# A warm machine pays one `dpkg -s` per package (and, where systemd runs, one
# `systemctl is-enabled etcd`) and nothing else.
#
#   scripts/deps.sh          what `make build`, `make test` and `make fuzz` need
#   scripts/deps.sh soak     and what `make soak` needs besides (bc, gnuplot)
set -euo pipefail
packages=(
  g++ cmake ninja-build ccache pkg-config
  librocksdb-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libboost-dev libjemalloc-dev libbenchmark-dev libgtest-dev libgmock-dev
  libcpp-httplib-dev libspdlog-dev libssl-dev prometheus-cpp-dev
  python3                 # source checks (check_layers) and make test's summary of skips
  etcd-server etcd-client curl openssl golang-go  # the tests' references
  golang-etcd-server-dev  # etcd's sources: its e2e suite (tests/etcd_e2e)
  clang                   # make fuzz (libFuzzer), the thread-safety check in make test
  jq                      # make soak, bench scripts
)
for group in "$@"; do
  case "$group" in
    soak) packages+=(bc gnuplot-nox) ;;  # scripts/soak.sh: its table and its plot
    *) echo "deps: unknown group $group (known: soak)" >&2; exit 2 ;;
  esac
done
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q >&2
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi
# Debian's etcd-server package enables and starts an etcd service where systemd
# runs, which takes port 2379 (the port `make run` serves on) now and after
# every reboot. Capstan's tests start their own etcd on free ports, so the
# packaged service is disabled, not only stopped.
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1 &&
  { systemctl is-enabled --quiet etcd 2>/dev/null || systemctl is-active --quiet etcd 2>/dev/null; }; then
  echo "deps: disabling the packaged etcd service (it would take port 2379)" >&2
  $SUDO systemctl disable --now etcd >&2 || echo "deps: could not disable the etcd service" >&2
fi
