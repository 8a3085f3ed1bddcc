#!/usr/bin/env bash
# Installs the Debian packages Capstan needs to build, run and test, only when missing.
# A warm machine pays one `dpkg -s` per package (and, where systemd runs, one
# `systemctl is-enabled etcd`) and nothing else.
#
#   scripts/deps.sh          what `make build`, `make test` and `make fuzz` need
#   scripts/deps.sh soak     and what `make soak` needs besides (bc, gnuplot)
#
# The tests' reference is etcd 3.5 (Debian trixie's etcd-server and
# etcd-client), extracted into $CAPSTAN_REFERENCE_DIR (default
# ~/.cache/capstan/etcd-3.5) and never installed: Debian 12's own etcd 3.4
# stays installed for the tests about 3.4 data directories. The packages come
# through a private apt configuration that adds the trixie suite of the
# machine's own Debian mirror; the system's apt sources stay untouched.
set -euo pipefail
packages=(
  g++ cmake ninja-build ccache pkg-config
  librocksdb-dev libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libboost-dev libjemalloc-dev libbenchmark-dev libgtest-dev libgmock-dev
  libcpp-httplib-dev libspdlog-dev libssl-dev prometheus-cpp-dev
  nlohmann-json3-dev      # etcd's member records (JSON in conf-change entries and the store)
  python3                 # source checks (check_layers) and make test's summary of skips
  etcd-server etcd-client curl openssl golang-go  # the tests' references
  golang-etcd-server-dev  # etcd's sources: its e2e suite (tests/etcd_e2e), its raft (replication/goraft)
  golang-github-gogo-protobuf-dev golang-github-golang-protobuf-1-3-dev  # raft's protobuf packages
  clang                   # make fuzz (libFuzzer), the thread-safety check in make test
  jq                      # make soak, bench scripts
  patch                   # tests/etcd_e2e: fixes of etcd's e2e suite
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
# etcd 3.5, the reference of every differential test (tests/process_fixture.h).
reference_dir=${CAPSTAN_REFERENCE_DIR:-$HOME/.cache/capstan/etcd-3.5}
fetch_etcd_reference() {
  local work uri opts version
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  # The mirror this machine already uses (deb822 or one-line format).
  uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
  [ -n "$uri" ] || uri=$(awk '$1 == "deb" && $2 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
  [ -n "$uri" ] || { echo "deps: no Debian mirror found in apt's sources" >&2; return 1; }
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/debs" "$work/root"
  printf 'Types: deb\nURIs: %s\nSuites: trixie\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
    "$uri" >"$work/trixie.sources"
  opts=(-q -o Dir::Etc::sourcelist="$work/trixie.sources" -o Dir::Etc::sourceparts=/dev/null
    -o Dir::State::Lists="$work/lists" -o Dir::Cache="$work/cache" -o APT::Sandbox::User="$(id -un)")
  # apt's output names the mirror; it is shown, without the name, only on failure.
  apt_quiet() {
    "$@" >"$work/apt.log" 2>&1 || { sed "s|$uri|<mirror>|g" "$work/apt.log" >&2; return 1; }
  }
  apt_quiet apt-get "${opts[@]}" update
  version=$(apt-cache "${opts[@]}" show etcd-server 2>/dev/null |
    awk '/^Version: 3\.5\./ {print $2; exit}')
  [ -n "$version" ] || { echo "deps: trixie has no etcd-server 3.5" >&2; return 1; }
  (cd "$work/debs" && apt_quiet apt-get "${opts[@]}" download "etcd-server=$version" "etcd-client=$version")
  for deb in "$work"/debs/*.deb; do dpkg -x "$deb" "$work/root"; done
  "$work/root/usr/bin/etcd" --version >/dev/null
  echo "$version" >"$work/root/VERSION"
  mkdir -p "$(dirname "$reference_dir")"
  rm -rf "$reference_dir"
  mv "$work/root" "$reference_dir"
  echo "deps: etcd $version extracted into $reference_dir" >&2
}
if [ ! -x "$reference_dir/usr/bin/etcd" ] || [ ! -x "$reference_dir/usr/bin/etcdctl" ]; then
  echo "deps: fetching the reference etcd 3.5 (Debian trixie's packages)" >&2
  fetch_etcd_reference
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
