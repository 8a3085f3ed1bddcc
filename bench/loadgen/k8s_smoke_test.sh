#!/usr/bin/env bash
# A tiny k8s scenario against Capstan and etcd, both started by `compare`:
# it must complete without a failed request; against Capstan the kubelets'
# lists and watches by node run (every pod write's event arrives on its
# node's watch, or the run fails), against etcd they are n/a and the lists
# by node are etcd's equivalent.
#
#   bench/loadgen/k8s_smoke_test.sh BUILD_DIR
set -euo pipefail

build=$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)
out=$(timeout 300 "$build/capstan-bench" --no-progress compare --rounds 1 --conns 2 --clients 8 \
  k8s --nodes 20 --pods 200 --duration 3s --relist-interval 2s --pod-churn-rate 20 --etcd-node-lists 1) ||
  { echo "$out"; echo "FAIL: k8s run failed" >&2; exit 1; }
fail() { echo "$out"; echo "FAIL: $*" >&2; exit 1; }
grep -q '^| list by node (kubelet start) p99 (ms) | [0-9.]* | - |' <<<"$out" ||
  fail "no kubelet-start lists by node against Capstan only"
grep -q '^| node watches (watches) | 20.00 | - |' <<<"$out" || fail "not 20 node watches"
grep -q '^| list by node p99 (ms) | [0-9.]* | [0-9.]* |' <<<"$out" || fail "no lists by node on both"
grep -q 'node watch delivery p99 .* | n/a |' <<<"$out" || fail "no n/a node watch row for etcd"
echo PASS
