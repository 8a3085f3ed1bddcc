# Capstan: `make run` and `make test` set everything up on a fresh Debian 12 machine.

BUILD_DIR    ?= build/release
BUILD_TYPE   ?= Release
JOBS         ?= $(shell nproc)
DATA_DIR     ?= ./default.capstan
CLIENT_URL   ?= http://127.0.0.1:2379
METRICS_URL  ?= http://127.0.0.1:2381
CTEST_ARGS   ?=

export CCACHE_DIR ?= $(HOME)/.cache/ccache
# Paths relative to the checkout, so every clone shares one compiler cache.
export CCACHE_BASEDIR ?= $(CURDIR)

.PHONY: all deps configure build run test e2e bench bench-cluster bench-catchup bench-scale sanitize sanitize-thread sanitize-address fuzz soak robustness clean

all: build

deps:
	@./scripts/deps.sh

$(BUILD_DIR)/build.ninja: CMakeLists.txt | deps
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

configure: deps $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

run: configure
	cmake --build $(BUILD_DIR) -j $(JOBS) --target capstan
	$(BUILD_DIR)/capstan --name default --data-dir $(DATA_DIR) \
	  --listen-client-urls $(CLIENT_URL) --advertise-client-urls $(CLIENT_URL) \
	  --listen-metrics-urls $(METRICS_URL)

# ctest writes a JUnit report, from which scripts/ctest_summary.py prints at
# the end how many tests were skipped and why, and which tests a runner had
# to retry (RETRIED lines). Passed tests keep up to 1 MiB of their output in
# the report (ctest's default is 1 KiB), so that the e2e runner's closing
# lines are in it. The run's status is ctest's, except that under CI=true
# (.ci/run) a skipped test fails it too: there a missing reference already
# fails its test (tests/reference.h). CTEST_ARGS adds ctest options (.ci/run
# gives a --stop-time).
CTEST_JUNIT = $(abspath $(BUILD_DIR))/ctest-junit.xml
test: build
	rm -f $(CTEST_JUNIT)
	cd $(BUILD_DIR) && { rc=0; ctest --output-on-failure -j 2 --timeout 600 \
	  --output-junit $(CTEST_JUNIT) --test-output-size-passed 1048576 $(CTEST_ARGS) || rc=$$?; \
	  python3 $(CURDIR)/scripts/ctest_summary.py $(CTEST_JUNIT) || [ $$rc -ne 0 ] || rc=1; \
	  exit $$rc; }

# etcd's own end-to-end suite against Capstan (part of `make test` as the
# ctest etcd_e2e); E2E_ARGS="--run REGEX" picks tests, "--server /usr/bin/etcd"
# runs the suite against etcd itself.
E2E_ARGS ?=
e2e: build
	./tests/etcd_e2e/run.sh --server $(BUILD_DIR)/capstan --out $(BUILD_DIR)/etcd-e2e $(E2E_ARGS)

bench: build
	./bench/run.sh $(BUILD_DIR)
	$(MAKE) bench-cluster

# 3-member etcd 3.5 against 3-member Capstan: throughput, p99 and failover (docs/BENCHMARKS.md),
# over plain http, then over TLS as kubeadm deploys etcd (client certificates on client and peer
# URLs), then the same with --listen-client-http-urls (etcd's recommended setting).
bench-cluster: build
	CAPSTAN=$(BUILD_DIR)/capstan ./bench/cluster/compare.sh $(BUILD_DIR)/bench-results/cluster
	TLS=1 FAILOVER_REPS=1 CAPSTAN=$(BUILD_DIR)/capstan ./bench/cluster/compare.sh \
	  $(BUILD_DIR)/bench-results/cluster-tls
	TLS=1 HTTP_APART=1 FAILOVER_REPS=1 CAPSTAN=$(BUILD_DIR)/capstan ./bench/cluster/compare.sh \
	  $(BUILD_DIR)/bench-results/cluster-tls-http-apart

# A stopped member catching up 8 GiB by snapshot, etcd 3.5 against Capstan: time and the leader's
# RSS (docs/BENCHMARKS.md). SIZE=1GiB for a shorter run; needs about 6 x SIZE of free disk.
bench-catchup: build
	CAPSTAN=$(BUILD_DIR)/capstan ./bench/cluster/catchup.sh $(BUILD_DIR)/bench-results/catchup

# 3-member etcd 3.5 against 3-member Capstan at scale: puts while a follower serves 4 full lists,
# the k8s scenario at 10,000 nodes with figures over time, and a leader's isolation to the first
# write (docs/BENCHMARKS.md). About 45 minutes; ROUNDS and PARTS shorten it (bench/cluster/scale.sh).
bench-scale: build
	CAPSTAN=$(BUILD_DIR)/capstan ./bench/cluster/scale.sh $(BUILD_DIR)/bench-results/scale

# Fault campaigns (docs/RELIABILITY.md): seeds ROBUSTNESS_SEEDS of ROBUSTNESS_SECONDS each, on 3 and
# on 5 members and on 3 over peer TLS, etcd 3.5 first (which keeps the checkers honest), then
# Capstan. The totals are the last lines of $(BUILD_DIR)/robustness.log. make test runs a few
# short seeds of the same campaign.
ROBUSTNESS_SEEDS   ?= 1-8
ROBUSTNESS_SECONDS ?= 60
robustness: build
	@rm -f $(BUILD_DIR)/robustness.log
	@for flavor in etcd capstan; do for members in 3 5 "3 --peer-tls"; do \
	  $(BUILD_DIR)/tests/cluster/capstan-robustness --flavor=$$flavor --members=$$members \
	    --seeds=$(ROBUSTNESS_SEEDS) --duration=$(ROBUSTNESS_SECONDS)s --quiet \
	    | tee -a $(BUILD_DIR)/robustness.log; \
	done; done; grep '^TOTAL' $(BUILD_DIR)/robustness.log; \
	! grep '^TOTAL' $(BUILD_DIR)/robustness.log | grep -qv ' 0 campaigns failed'

sanitize: sanitize-thread sanitize-address

# TSan: the tests that run Capstan code on several threads at once (index,
# storage, mvcc, watch hub and lessor, watch cache, bulk reads, the embedding
# API). Reports inside uninstrumented Debian libraries are suppressed by
# scripts/tsan.supp, each entry with its reason (docs/RELIABILITY.md).
TSAN_TESTS := capstan_index_test capstan_storage_test capstan_mvcc_test \
  capstan_mvcc_concurrency_test capstan_watch_hub_test capstan_lease_test capstan_watchcache_test \
  capstan_bulk_reads_test capstan_embed_test capstan_embed_c_test
sanitize-thread: deps
	cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAPSTAN_SANITIZE=thread -DCAPSTAN_BUILD_BENCHMARKS=OFF
	cmake --build build/tsan -j $(JOBS) --target $(TSAN_TESTS)
	TSAN_OPTIONS="suppressions=$(CURDIR)/scripts/tsan.supp halt_on_error=0 second_deadlock_stack=1" \
	  ./scripts/run_test_binaries.sh build/tsan $(TSAN_TESTS)

# ASan+UBSan: the unit and concurrency tests of index, storage, mvcc and the
# watch cache, plus the fault-injection test (docs/RELIABILITY.md).
ASAN_TESTS := capstan_index_test capstan_storage_test capstan_bbolt_reader_test \
  capstan_mvcc_test capstan_mvcc_concurrency_test capstan_mvcc_model_test \
  capstan_watch_hub_test capstan_lease_test capstan_auth_store_test capstan_watchcache_test fault_injection_test
sanitize-address: deps
	cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo '-DCAPSTAN_SANITIZE=address;undefined' -DCAPSTAN_BUILD_BENCHMARKS=OFF
	cmake --build build/asan -j $(JOBS) --target $(ASAN_TESTS)
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ./scripts/run_test_binaries.sh build/asan $(ASAN_TESTS)

# libFuzzer targets built with clang (ASan+UBSan, coverage on Capstan code)
# in build/fuzz, each run for FUZZ_SECONDS from its checked-in corpus. New
# inputs go to build/fuzz/corpus/NAME, crashes to build/fuzz/artifacts/.
FUZZ_SECONDS ?= 60
FUZZERS      := request continue_token index_extractor bbolt_reader config_file etcd_wal go_unmarshal
fuzz: deps
	@command -v clang++ >/dev/null || \
	  { echo "make fuzz: clang++ is missing (scripts/deps.sh installs Debian's clang)" >&2; exit 1; }
	cmake -S . -B build/fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCAPSTAN_FUZZ=ON \
	  '-DCAPSTAN_SANITIZE=address;undefined' -DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link \
	  -DCAPSTAN_BUILD_BENCHMARKS=OFF
	cmake --build build/fuzz -j $(JOBS) --target capstan_fuzzers
	mkdir -p build/fuzz/artifacts
	for f in $(FUZZERS); do \
	  mkdir -p build/fuzz/corpus/$$f; \
	  echo "== $$f ($(FUZZ_SECONDS) s), log: build/fuzz/$$f.log"; \
	  UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	    build/fuzz/tests/fuzz/$${f}_fuzzer -max_total_time=$(FUZZ_SECONDS) \
	    -max_len=65536 -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
	    -artifact_prefix=build/fuzz/artifacts/$$f- build/fuzz/corpus/$$f tests/fuzz/corpus/$$f \
	    > build/fuzz/$$f.log 2>&1 || { tail -n 60 build/fuzz/$$f.log; exit 1; }; \
	  grep -E 'DONE|stat::(number_of_executed_units|peak_rss_mb)' build/fuzz/$$f.log; \
	done

# A long mixed-load run (default 1 h) sampling RSS, open files and latency
# (SOAK_SECONDS=600 make soak), then the crash test with CRASH_KILLS kills.
# Not part of make test. The tools scripts/soak.sh calls are installed (or
# found missing) before the hour starts, not when its plot is drawn.
CRASH_KILLS ?= 60
SOAK_TOOLS  := curl jq bc gnuplot python3
soak: build
	@./scripts/deps.sh soak
	@for t in $(SOAK_TOOLS); do command -v $$t >/dev/null || \
	  { echo "make soak: $$t is missing (scripts/deps.sh soak installs it)" >&2; exit 1; }; done
	./scripts/soak.sh $(BUILD_DIR)
	CAPSTAN_CRASH_KILLS=$(CRASH_KILLS) $(BUILD_DIR)/tests/crash_test

clean:
	rm -rf build
