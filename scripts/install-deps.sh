#!/usr/bin/env bash
# Installs the Debian packages moetron needs to build, test and run.
# libjs-chart.js is compiled into the binary (the monitor's dashboard);
# prometheus and chromium (with a font) run in the monitor's tests.
# FreeType (with the DejaVu fonts), espeak-ng, FFTW and libpng generate and
# read the multimodal data (rendered text, speech, log-mel features, images).
# GNU time gives the benchmark scripts' peak RSS. PyTorch (python3-torch, 213
# packages) is not here: only bench/trainer_vs_pytorch.sh --install-torch
# installs it, as issue 24 asks.
# Idempotent: runs `apt-get update` once, and only when something is missing.
set -euo pipefail

packages=(
  cmake ninja-build g++ make pkg-config
  libdnnl-dev
  libopenmpi-dev openmpi-bin
  libtomlplusplus-dev nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libxxhash-dev
  libsentencepiece-dev
  zlib1g-dev
  libcpp-httplib-dev
  libjs-chart.js
  prometheus chromium fonts-dejavu-core
  fortunes
  libfreetype-dev libpng-dev libespeak-ng-dev libfftw3-dev
  clang-format python3 time
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
