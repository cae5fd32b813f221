# The two commands a fresh machine needs: `make demo` and `make test`.
# Each installs what is missing, configures, builds, then runs.
JOBS ?= $(shell nproc)
BUILD ?= build
CMAKE_FLAGS ?=
WERROR ?= ON

.PHONY: all deps configure build test test-debug test-asan bench demo clean format format-check function-length-check

all: build

deps:
	bash scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -G Ninja -DMOETRON_WERROR=$(WERROR) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build format-check function-length-check
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 900

test-debug:
	$(MAKE) test BUILD=build-debug CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Debug"

test-asan:
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMOETRON_SANITIZE=ON"

bench: build
	$(BUILD)/bench/moetron_bench_kernels --json $(BUILD)/bench-kernels.json

# Trains the demo MoE on Debian's fortune files and prints a sample. A second
# run resumes the finished run (nothing is overwritten) and samples again;
# `rm -rf runs/demo` trains afresh.
DEMO_STEPS := $(shell sed -n 's/^steps = //p' configs/demo.toml)
demo: build
	@test -f data/demo/manifest.json || $(BUILD)/moetron prepare-data --input /usr/share/games/fortunes --out data/demo --vocab-size 4096
	$(BUILD)/moetron train --config configs/demo.toml --out runs/demo --resume
	$(BUILD)/moetron generate --checkpoint runs/demo/checkpoints/step-$(DEMO_STEPS) --prompt "A wise man once said" --max-new-tokens 120

clean:
	rm -rf build build-debug build-asan

SOURCES = find src tests bench \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \)

format:
	$(SOURCES) | xargs clang-format -i

# The tree as .clang-format writes it (`make format` fixes it).
format-check: deps
	$(SOURCES) | xargs clang-format --dry-run -Werror

# No function in src/ longer than 150 lines (STYLE.md asks for ~100).
function-length-check:
	python3 scripts/function_lengths.py --max 150 --top 5 src
