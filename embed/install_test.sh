#!/bin/sh
# Installs this build to a temporary prefix, builds an example against the
# installed package and runs it: the acceptance test of libcapstan's
# packaging. For the Go example without `go`: exits 77 (ctest's skip), or
# 1 under CI=true, where a missing reference fails the test.
#
#   install_test.sh cpp|go BUILD_DIR SOURCE_DIR
set -eu
mode=$1
build=$(cd "$2" && pwd)
src=$(cd "$3" && pwd)
work="$build/embed-install-$mode"

if [ "$mode" = go ] && ! command -v go >/dev/null 2>&1; then
  case "${CI:-}" in
    true|TRUE|True|1)
      echo "missing test reference: go (Debian golang-go) not found in \$PATH" \
        "(CI=true: a missing reference fails the test; scripts/deps.sh installs it)" >&2
      exit 1
      ;;
  esac
  echo "go (Debian golang-go) not found in \$PATH: skipping the Go example"
  exit 77
fi

rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
echo "installed to $work/prefix:"
(cd "$work/prefix" && find . -type f | sort)

case "$mode" in
  cpp)
    set --
    if command -v ninja >/dev/null 2>&1; then set -- "$@" -G Ninja; fi
    if command -v ccache >/dev/null 2>&1; then set -- "$@" -DCMAKE_CXX_COMPILER_LAUNCHER=ccache; fi
    cmake -S "$src/examples/embed_cpp" -B "$work/build" "$@" \
      -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/configure.log"
    cmake --build "$work/build"
    "$work/build/embed_cpp" "$work/data"
    ;;
  go)
    pc=$(dirname "$(find "$work/prefix" -name capstan.pc)")
    # No network: the example's go.mod has no dependencies. A fresh build
    # cache each run: Go does not hash the C libraries it links, so a cached
    # build can outlive the libcapstan.a it was made against (Debian's Go
    # ships its standard library prebuilt, so this costs seconds).
    # GOPATH too, so that the build needs no HOME (CI may run without one).
    export PKG_CONFIG_PATH="$pc" GOCACHE="$work/go-cache" GOPATH="$work/go-path" GOPROXY=off \
      GOFLAGS=-buildvcs=false
    # Abseil's pkg-config files wrap -latomic in these linker flags.
    export CGO_LDFLAGS_ALLOW='-Wl,--(push|pop)-state.*'
    (cd "$src/examples/go-cgo" && go build -o "$work/go-cgo" .)
    "$work/go-cgo" "$work/data"
    ;;
  *)
    echo "usage: $0 cpp|go BUILD_DIR SOURCE_DIR" >&2
    exit 2
    ;;
esac
