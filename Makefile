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

.PHONY: all deps configure build run test bench sanitize clean

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

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j 2 --timeout 600 $(CTEST_ARGS)

bench: build
	./bench/run.sh $(BUILD_DIR)

sanitize: deps
	cmake -S . -B build/tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCAPSTAN_SANITIZE=thread -DCAPSTAN_BUILD_BENCHMARKS=OFF
	cmake --build build/tsan -j $(JOBS) --target capstan_index_test capstan_mvcc_test
	cd build/tsan && ctest --output-on-failure -R 'capstan_(index|mvcc)' -j 2

clean:
	rm -rf build
