#!/usr/bin/env bash
# Installs the Debian packages Capstan needs to build, run and test, only when missing.
# A warm machine pays one `dpkg -s` per package and nothing else.
set -euo pipefail
packages=(
  g++ cmake ninja-build ccache pkg-config
  librocksdb-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libboost-dev libjemalloc-dev libbenchmark-dev libgtest-dev libgmock-dev
  libcpp-httplib-dev libspdlog-dev libssl-dev prometheus-cpp-dev
  etcd-server etcd-client curl openssl golang-go
  golang-etcd-server-dev  # etcd's sources: its e2e suite (tests/etcd_e2e)
)
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >&2
# Debian's etcd-server package starts a service where systemd runs; Capstan's tests start
# their own etcd on free ports, so the packaged service is not needed.
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet etcd 2>/dev/null; then
  $SUDO systemctl stop etcd || true
fi
