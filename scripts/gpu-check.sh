#!/usr/bin/env bash
# The GPU check (issue 23): on a machine with an NVIDIA GPU, runs every CUDA
# test (each test binary's tests matching *Cuda*, Device.* and CudaStream.*),
# the NCCL communicator test at 1 rank, and the GPU benchmark
# (bench/gpu/bench_cuda.cpp), and writes one JSON summary.
#
#   scripts/gpu-check.sh --bundle FILE.tar.gz|DIR [--out DIR]   binaries built elsewhere
#                                                              (scripts/gpu-bundle.sh)
#   scripts/gpu-check.sh [--build-dir DIR] [--out DIR]         build here first (all cores)
#
# Output under --out (default $OUT, else ./gpu-check-out): gpu-check.json (the
# summary, also printed last), bench-cuda.json, gpu-check.log. Exit status 0
# only when a GPU was seen, every selected test ran and passed (a skip on a
# GPU machine is a failure: the test did not run where it must), and the
# benchmark finished; otherwise non-zero, with the reason on stderr.
set -uo pipefail

die() {
  echo "gpu-check: $*" >&2
  exit 2
}

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bundle="" build_dir="" out="${OUT:-$PWD/gpu-check-out}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bundle) bundle="${2:?--bundle needs a path}"; shift 2 ;;
    --build-dir) build_dir="${2:?--build-dir needs a path}"; shift 2 ;;
    --out) out="${2:?--out needs a path}"; shift 2 ;;
    *) die "unknown argument '$1' (expected --bundle PATH, --build-dir DIR, --out DIR)" ;;
  esac
done
mkdir -p "$out" || die "cannot create $out"
out="$(cd "$out" && pwd)"
log="$out/gpu-check.log"
: >"$log"
say() { echo "$*" | tee -a "$log"; }

# 1. A GPU, or stop here: nothing below means anything without one.
command -v nvidia-smi >/dev/null || die "no GPU: nvidia-smi is not installed"
gpus="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)" ||
  die "no GPU: nvidia-smi failed: $gpus"
[[ -n "$gpus" ]] || die "no GPU: nvidia-smi lists none"
say "GPU: $gpus"
command -v python3 >/dev/null || die "python3 is needed to write the JSON summary"

# 2. The binaries: unpacked from a bundle, or built here.
if [[ -n "$bundle" ]]; then
  if [[ -f "$bundle" ]]; then
    dir="$(mktemp -d)"
    tar -xzf "$bundle" -C "$dir" || die "cannot unpack $bundle"
    bundle="$dir"
  fi
  [[ -d "$bundle/bin" ]] || die "$bundle has no bin/ (make one with scripts/gpu-bundle.sh)"
  bin="$bundle/bin"
  export LD_LIBRARY_PATH="$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  commit="$(cat "$bundle/COMMIT" 2>/dev/null || echo unknown)"
else
  src="$(cd "$here/.." && pwd)"
  build_dir="${build_dir:-$src/build-gpu}"
  say "building in $build_dir"
  cmake -S "$src" -B "$build_dir" -G Ninja -DMOETRON_CUDA=ON -DMOETRON_NCCL=ON \
    -DCMAKE_CUDA_ARCHITECTURES=native >>"$log" 2>&1 || die "configure failed (see $log)"
  cmake --build "$build_dir" -j "$(nproc)" >>"$log" 2>&1 || die "build failed (see $log)"
  bin="$(mktemp -d)"
  cp "$build_dir"/tests/*_test "$build_dir"/tests/comm_nccl_communicator_mpitest \
    "$build_dir"/bench/moetron_bench_cuda "$bin"/ || die "built binaries missing"
  commit="$(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)"
fi
# The CUDA toolkit's libraries (cuBLASLt, NCCL) come from the machine; name
# their usual home in case the loader is not told about it.
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d "$d" ]] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
done
missing="$(for f in "$bin"/*; do ldd "$f" | grep 'not found' | sed "s|^|$(basename "$f"): |"; done)"
[[ -z "$missing" ]] || die "shared libraries not found:"$'\n'"$missing"

# 3. Every CUDA test of every test binary, one gtest JSON report each.
reports="$(mktemp -d)"
filter='*Cuda*:Device.*:CudaStream.*:-*WithoutAGpu*'
for t in "$bin"/*_test; do
  name="$(basename "$t")"
  n="$("$t" --gtest_list_tests --gtest_filter="$filter" | grep -c '^  ')"
  [[ "$n" -gt 0 ]] || continue
  say "== $name ($n tests)"
  echo "$n" >"$reports/$name.expected"  # a binary that dies writes no report
  # A hung binary must not eat the machine's time: it fails with no report.
  timeout 300 "$t" --gtest_filter="$filter" --gtest_output="json:$reports/$name.json" >>"$log" 2>&1
  say "   exit $? at ${SECONDS}s"
done
# 4. The NCCL communicator at one rank (one GPU).
if [[ -x "$bin/comm_nccl_communicator_mpitest" ]]; then
  say "== comm_nccl_communicator_mpitest (mpirun -np 1)"
  n="$("$bin/comm_nccl_communicator_mpitest" --gtest_list_tests 2>/dev/null | grep -c '^  ')"
  echo "$n" >"$reports/comm_nccl_communicator_mpitest_np1.expected"
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
    timeout 120 mpirun -np 1 -x LD_LIBRARY_PATH "$bin/comm_nccl_communicator_mpitest" \
    --gtest_output="json:$reports/comm_nccl_communicator_mpitest_np1.json" >>"$log" 2>&1
  say "   exit $? at ${SECONDS}s"
fi
# 5. The benchmark.
say "== moetron_bench_cuda"
timeout 300 "$bin/moetron_bench_cuda" --json "$out/bench-cuda.json" >>"$log" 2>&1
bench_rc=$?
say "   exit $bench_rc at ${SECONDS}s"

# 6. The summary; its exit status is the check's.
python3 "$here/gpu_check_summary.py" --reports "$reports" --bench "$out/bench-cuda.json" \
  --bench-rc "$bench_rc" --gpu "$gpus" --commit "$commit" --out "$out/gpu-check.json"
