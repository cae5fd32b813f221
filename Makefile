# The two commands a fresh machine needs: `make demo` and `make test`.
# Each installs what is missing, configures, builds, then runs.
JOBS ?= $(shell nproc)
BUILD ?= build
CMAKE_FLAGS ?=
WERROR ?= ON

.PHONY: all deps configure build test test-debug test-asan bench demo demo-multimodal clean format format-check function-length-check

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

# Trains the multimodal demo (configs/multimodal-demo.toml) on the corpus
# `prepare-data --multimodal` makes from Debian's fortunes, DejaVu fonts and
# espeak-ng, then captions a held-out scene (a colour-shape pair never seen in
# training), reads a rendered word, transcribes speech, samples text and
# scores each task on 100 examples. A second run resumes the finished run and
# prints again; `rm -rf runs/demo-multimodal` trains afresh.
MM_STEPS := $(shell sed -n 's/^steps = //p' configs/multimodal-demo.toml)
MM_CKPT = runs/demo-multimodal/checkpoints/step-$(MM_STEPS)
MM_SAMPLES = data/multimodal/samples
demo-multimodal: build
	@test -f data/multimodal/manifest.json || $(BUILD)/moetron prepare-data --multimodal --out data/multimodal --n-mels 40 --export-samples 4
	$(BUILD)/moetron train --config configs/multimodal-demo.toml --out runs/demo-multimodal --resume
	@echo "== caption of held-out scene 0 (the reference, then the model's):"
	@$(BUILD)/moetron generate --checkpoint $(MM_CKPT) --record heldout:0 --task caption
	@echo "== OCR of $(MM_SAMPLES)/ocr-0000.png (reference: $$(grep '^ocr-0000.png' $(MM_SAMPLES)/index.tsv | cut -f2)):"
	@$(BUILD)/moetron generate --checkpoint $(MM_CKPT) --image $(MM_SAMPLES)/ocr-0000.png --task ocr
	@echo "== ASR of $(MM_SAMPLES)/asr-0000.wav (reference: $$(grep '^asr-0000.wav' $(MM_SAMPLES)/index.tsv | cut -f2)):"
	@$(BUILD)/moetron generate --checkpoint $(MM_CKPT) --audio $(MM_SAMPLES)/asr-0000.wav
	@echo "== text sample:"
	@$(BUILD)/moetron generate --checkpoint $(MM_CKPT) --prompt "A wise man once said" --max-new-tokens 60
	@echo "== task metrics (first 100 examples):"
	@$(BUILD)/moetron eval --checkpoint $(MM_CKPT) --task caption --split heldout --examples 100 --batch 50
	@$(BUILD)/moetron eval --checkpoint $(MM_CKPT) --task ocr --examples 100 --batch 50
	@$(BUILD)/moetron eval --checkpoint $(MM_CKPT) --task asr --examples 100 --batch 50
	@$(BUILD)/moetron eval --checkpoint $(MM_CKPT) --task lm --examples 100

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
