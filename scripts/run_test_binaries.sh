#!/usr/bin/env bash
# run_test_binaries.sh BUILD_DIR TEST...: runs each GoogleTest binary of a
# (sanitizer) build directly, so every test case in it runs, and prints a
# summary; fails if any binary fails. Used by `make sanitize`.
set -u
build=$1; shift
failed=()
for t in "$@"; do
  bin=$(find "$build" -type f -name "$t" -perm -u+x | head -1)
  if [[ -z $bin ]]; then echo "== $t: not built"; failed+=("$t"); continue; fi
  echo "== $t"
  start=$(date +%s)
  if "$bin" --gtest_brief=1 > "$build/$t.log" 2>&1; then
    echo "   ok ($(( $(date +%s) - start )) s)"
  else
    echo "   FAILED ($(( $(date +%s) - start )) s), log: $build/$t.log"; tail -40 "$build/$t.log"
    failed+=("$t")
  fi
done
if (( ${#failed[@]} )); then echo "failed: ${failed[*]}"; exit 1; fi
echo "all ${#} passed"
