// moetron_bench_cuda [--quick] [--json FILE]: the CUDA backend on one GPU.
// GEMM TFLOP/s through kernels::matmul (cuBLASLt) at 8192^3 on random data,
// and each own kernel's bandwidth: the bytes it must move at the least (every
// input read once, every output written once) over its time, next to a
// device-to-device copy's as the ceiling. Times are CUDA events on the
// context's stream around repeated calls, after warm-up calls.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>

#include "moetron/core/cuda/stream.h"
#include "moetron/core/device.h"
#include "moetron/core/rng.h"
#include "moetron/kernels/activation.h"
#include "moetron/kernels/adamw.h"
#include "moetron/kernels/cross_entropy.h"
#include "moetron/kernels/cuda/cuda_state.h"
#include "moetron/kernels/embedding.h"
#include "moetron/kernels/matmul.h"
#include "moetron/kernels/norm.h"

namespace moetron::bench {
namespace {

using kernels::Context;
using nlohmann::json;

struct Bench {
  Context ctx{kernels::Backend::cuda};
  bool quick = false;
  json gemm = json::array();
  json kernels = json::array();
  double copy_gbs = 0;
};

// Milliseconds per call of fn, averaged over `iters` calls after two warm-ups.
double time_ms(Bench& b, int iters, const std::function<void()>& fn) {
  fn();
  fn();
  b.ctx.synchronize();
  if (b.quick) iters = std::max(1, iters / 5);
  gpu::Event start(true), stop(true);
  const gpu::Stream& stream = b.ctx.cuda_state().stream;
  start.record(stream);
  for (int i = 0; i < iters; ++i) fn();
  stop.record(stream);
  stop.synchronize();
  return stop.elapsed_ms(start) / iters;
}

// Uniform random data (the GEMM rate on zeros is ~10% higher), filled on
// the host in parallel chunks (one Philox stream, as one fill would give).
Tensor device_uniform(const Shape& shape, DType dtype, const char* name, float lo = -1,
                      float hi = 1) {
  const Tensor host = Tensor::empty(shape, dtype, MemTag::workspace);
  const Tensor flat = host.reshape({host.numel()});
  constexpr int64_t kChunk = int64_t{1} << 20;
  const int64_t chunks = (flat.numel() + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    Tensor part = flat.slice(c * kChunk, std::min(flat.numel(), (c + 1) * kChunk));
    fill_uniform(part, 7, name, lo, hi, static_cast<uint64_t>(c * kChunk));
  }
  return host.clone_to(cuda_allocator(), MemTag::workspace);
}

Tensor device_empty(const Shape& shape, DType dtype) {
  return Tensor::empty(shape, dtype, MemTag::workspace, cuda_allocator());
}

// ids uniform in [0, V) (with repeats, as tokens have), on the host.
Tensor host_ids(int64_t T, int64_t V) {
  Tensor ids = Tensor::empty({T}, DType::i32, MemTag::workspace);
  PhiloxStream rng(11, "bench ids");
  for (int64_t t = 0; t < T; ++t) {
    ids.data<int32_t>()[t] = static_cast<int32_t>(rng.next_u32() % static_cast<uint32_t>(V));
  }
  return ids;
}

void record_kernel(Bench& b, const std::string& name, const std::string& shape, double bytes,
                   double ms) {
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  b.kernels.push_back({{"kernel", name},
                       {"shape", shape},
                       {"ms", ms},
                       {"bytes", bytes},
                       {"gb_per_s", gbs},
                       {"of_copy", b.copy_gbs > 0 ? gbs / b.copy_gbs : 0.0}});
  std::cout << name << "  " << shape << "  " << ms << " ms  " << gbs << " GB/s  ("
            << (b.copy_gbs > 0 ? 100 * gbs / b.copy_gbs : 0.0) << "% of copy)" << std::endl;
}

void bench_copy(Bench& b) {
  const int64_t n = int64_t{1} << 30;  // bytes
  const Tensor src = device_empty({n}, DType::u8), dst = device_empty({n}, DType::u8);
  gpu::check(cudaMemset(src.raw(), 1, static_cast<size_t>(n)), "cudaMemset");
  const cudaStream_t st = b.ctx.cuda_state().stream.get();
  const double ms = time_ms(b, 20, [&] {
    gpu::check(
        cudaMemcpyAsync(dst.raw(), src.raw(), static_cast<size_t>(n), cudaMemcpyDeviceToDevice, st),
        "cudaMemcpyAsync");
  });
  b.copy_gbs = 2.0 * static_cast<double>(n) / (ms * 1e-3) / 1e9;
  record_kernel(b, "device_copy", "1 GiB", 2.0 * static_cast<double>(n), ms);
}

void bench_gemm(Bench& b, DType in, DType out, bool trans_b) {
  const int64_t n = 8192;
  const Tensor a = device_uniform({n, n}, in, "a"), w = device_uniform({n, n}, in, "b");
  const Tensor c = device_empty({n, n}, out);
  kernels::MatmulArgs args;
  args.trans_b = trans_b;
  const double ms = time_ms(b, 20, [&] { kernels::matmul(b.ctx, a, w, c, args); });
  const double tflops = 2.0 * n * n * n / (ms * 1e-3) / 1e12;
  const std::string name =
      std::string(dtype_name(in)) + "->" + std::string(dtype_name(out)) + (trans_b ? " NT" : " NN");
  b.gemm.push_back({{"gemm", name}, {"m", n}, {"n", n}, {"k", n}, {"ms", ms}, {"tflops", tflops}});
  std::cout << "gemm " << name << " 8192^3  " << ms << " ms  " << tflops << " TFLOP/s" << std::endl;
}

void bench_norm_swiglu(Bench& b) {
  const int64_t T = 16384, D = 4096, F = 8192;
  const Tensor x = device_uniform({T, D}, DType::bf16, "x"), y = device_empty({T, D}, DType::bf16);
  const Tensor w = device_uniform({D}, DType::f32, "w"), r = device_empty({T}, DType::f32);
  const Tensor dx = device_empty({T, D}, DType::bf16), dw = device_empty({D}, DType::f32);
  const double td = static_cast<double>(T * D);
  record_kernel(b, "rmsnorm_forward", "bf16 16384x4096", 4 * td,
                time_ms(b, 50, [&] { kernels::rmsnorm_forward(b.ctx, x, w, 1e-5f, y, r); }));
  record_kernel(b, "rmsnorm_backward", "bf16 16384x4096", 6 * td,
                time_ms(b, 50, [&] { kernels::rmsnorm_backward(b.ctx, y, x, w, r, dx, dw); }));
  const Tensor gu = device_uniform({T, 2 * F}, DType::bf16, "gu");
  const Tensor o = device_empty({T, F}, DType::bf16), dgu = device_empty({T, 2 * F}, DType::bf16);
  const double tf = static_cast<double>(T * F);
  record_kernel(b, "swiglu_forward", "bf16 16384x(2x8192)", 6 * tf,
                time_ms(b, 50, [&] { kernels::swiglu_forward(b.ctx, gu, o); }));
  record_kernel(b, "swiglu_backward", "bf16 16384x(2x8192)", 10 * tf,
                time_ms(b, 50, [&] { kernels::swiglu_backward(b.ctx, o, gu, dgu); }));
}

void bench_xent_adamw(Bench& b) {
  const int64_t T = 4096, V = 32000;
  const Tensor logits = device_uniform({T, V}, DType::bf16, "logits", -4, 4);
  const Tensor dl = device_empty({T, V}, DType::bf16), losses = device_empty({T}, DType::f32);
  const Tensor targets = host_ids(T, V).clone_to(cuda_allocator(), MemTag::workspace);
  record_kernel(b, "cross_entropy", "bf16 4096x32000 (+ target check readback)",
                4.0 * static_cast<double>(T * V), time_ms(b, 50, [&] {
                  kernels::cross_entropy(b.ctx, logits, targets, 1.0f / T, losses, dl);
                }));
  const int64_t n = int64_t{64} << 20;
  const Tensor master = device_uniform({n}, DType::f32, "master");
  const Tensor grad = device_uniform({n}, DType::bf16, "grad");
  const Tensor m = device_uniform({n}, DType::f32, "m"),
               v = device_uniform({n}, DType::f32, "v", 0, 1);
  const Tensor copy = device_empty({n}, DType::bf16);
  kernels::AdamWArgs args;
  record_kernel(
      b, "adamw_step", "64M f32 master/m/v, bf16 grad and copy", 28.0 * static_cast<double>(n),
      time_ms(b, 20, [&] { kernels::adamw_step(b.ctx, master, grad, m, v, args, copy); }));
}

void bench_embedding(Bench& b) {
  const int64_t T = 16384, V = 32000, D = 4096;
  const Tensor ids_host = host_ids(T, V);
  const Tensor ids = ids_host.clone_to(cuda_allocator(), MemTag::workspace);
  const Tensor table = device_uniform({V, D}, DType::bf16, "table");
  const Tensor out = device_empty({T, D}, DType::bf16);
  const Tensor dtable = Tensor::zeros({V, D}, DType::f32, MemTag::workspace, cuda_allocator());
  const double td = static_cast<double>(T * D);
  record_kernel(b, "embedding_forward", "bf16 16384 tokens x 4096 (+ id check readback)", 4 * td,
                time_ms(b, 50, [&] { kernels::embedding_forward(b.ctx, ids, table, out, 0); }));
  std::set<int32_t> rows(ids_host.data<int32_t>(), ids_host.data<int32_t>() + T);
  const double bytes = 2 * td + 8.0 * static_cast<double>(rows.size()) * static_cast<double>(D);
  record_kernel(b, "embedding_backward", "bf16 dout 16384x4096 into f32 32000x4096", bytes,
                time_ms(b, 20, [&] { kernels::embedding_backward(b.ctx, ids, out, dtable, 0); }));
}

json device_info() {
  cudaDeviceProp p{};
  gpu::check(cudaGetDeviceProperties(&p, 0), "cudaGetDeviceProperties");
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  return {{"name", p.name},
          {"sm_count", p.multiProcessorCount},
          {"compute_capability", std::to_string(p.major) + "." + std::to_string(p.minor)},
          {"memory_gib", static_cast<double>(p.totalGlobalMem) / (1 << 30)},
          {"driver", driver},
          {"runtime", runtime}};
}

}  // namespace
}  // namespace moetron::bench

int main(int argc, char** argv) {
  using namespace moetron::bench;
  std::string json_path;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--quick") {
      quick = true;
    } else if (a == "--json" && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::cerr << "usage: moetron_bench_cuda [--quick] [--json FILE]\n";
      return 2;
    }
  }
  try {
    Bench b;
    b.quick = quick;
    bench_copy(b);
    bench_gemm(b, moetron::DType::bf16, moetron::DType::bf16, false);
    bench_gemm(b, moetron::DType::bf16, moetron::DType::bf16, true);
    bench_gemm(b, moetron::DType::bf16, moetron::DType::f32, true);
    bench_gemm(b, moetron::DType::f32, moetron::DType::f32, true);
    bench_norm_swiglu(b);
    bench_xent_adamw(b);
    bench_embedding(b);
    const json out = {{"device", device_info()},
                      {"device_copy_gb_per_s", b.copy_gbs},
                      {"gemm", b.gemm},
                      {"kernels", b.kernels},
                      {"peak_device_bytes", moetron::cuda_allocator().total_peak()}};
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    std::cout << out.dump() << "\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
