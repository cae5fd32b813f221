# The two commands a fresh machine needs: `make demo` and `make test`.
# Each installs what is missing, configures, builds, then runs.
JOBS ?= $(shell nproc)
BUILD ?= build
CMAKE_FLAGS ?=
WERROR ?= ON

.PHONY: all deps configure build test test-debug test-asan bench demo clean format

all: build

deps:
	bash scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -G Ninja -DMOETRON_WERROR=$(WERROR) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

test-debug:
	$(MAKE) test BUILD=build-debug CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Debug"

test-asan:
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOETRON_SANITIZE=ON"

bench: build
	$(BUILD)/bench/moetron_bench_kernels --json $(BUILD)/bench-kernels.json

demo: build
	@echo "demo: the end-to-end training path lands with issue 3; running the kernel benchmark smoke instead"
	$(BUILD)/bench/moetron_bench_kernels --quick

clean:
	rm -rf build build-debug build-asan

format:
	find src tests bench -name '*.cpp' -o -name '*.h' | xargs clang-format -i
