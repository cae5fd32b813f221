#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh --bundle runs on a GPU machine that lacks
# this project's build dependencies (oneDNN, toml++, SentencePiece, ...):
# every test binary, the NCCL communicator test and the GPU benchmark from a
# CUDA build, with the shared libraries they load that such a machine may
# not have. Left out, because the GPU machine has its own and they must match
# it: the C library family and libstdc++/libgcc_s (older here than there),
# the CUDA toolkit and driver (cudart, cuBLAS, cuBLASLt, NCCL, libcuda), and
# MPI with everything it loads (mpirun there must match libmpi).
#
#   scripts/gpu-bundle.sh BUILD_DIR OUT.tar.gz
set -euo pipefail

build="${1:?usage: gpu-bundle.sh BUILD_DIR OUT.tar.gz}"
out="${2:?usage: gpu-bundle.sh BUILD_DIR OUT.tar.gz}"
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[[ -x "$build/bench/moetron_bench_cuda" ]] ||
  { echo "gpu-bundle: $build has no CUDA build (moetron_bench_cuda missing)" >&2; exit 2; }

stage="$(mktemp -d)"
mkdir -p "$stage/bin" "$stage/lib"
cp "$build"/tests/*_test "$build"/tests/comm_nccl_communicator_mpitest \
  "$build"/bench/moetron_bench_cuda "$stage/bin/"
strip --strip-unneeded "$stage"/bin/*

# Libraries the machine brings: by soname pattern, and MPI's own closure.
system='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libutil|libresolv|libstdc\+\+|'
system+='libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl|libnvidia)\.so'
mpi_lib="$(ldd "$stage/bin/comm_nccl_communicator_mpitest" | awk '/libmpi\.so/ {print $3}')"
mpi_closure="$( (echo "$mpi_lib"; ldd "$mpi_lib" | awk '/=> \// {print $3}') | xargs -n1 basename)"
for f in "$stage"/bin/*; do ldd "$f"; done | awk '/=> \// {print $1, $3}' | sort -u |
  while read -r soname path; do
    [[ "$soname" =~ $system ]] && continue
    grep -qx "$soname" <<<"$mpi_closure" && continue
    cp -L "$path" "$stage/lib/$soname"
  done

git -C "$src" rev-parse --short HEAD >"$stage/COMMIT"
{
  echo "built $(date -u +%FT%TZ) on $(uname -n), $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "libraries:"; ls -la "$stage/lib"
} >"$stage/MANIFEST"
tar -czf "$out" -C "$stage" .
rm -rf "$stage"
echo "gpu-bundle: $out ($(du -h "$out" | cut -f1))"
