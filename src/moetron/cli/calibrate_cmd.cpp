#include "moetron/cli/calibrate_cmd.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <iostream>

#include "moetron/comm/mpi_communicator.h"
#include "moetron/core/error.h"
#include "moetron/kernels/activation.h"
#include "moetron/kernels/attention.h"
#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/matmul.h"
#include "moetron/kernels/norm.h"
#include "moetron/planner/hardware_profile.h"
#include "moetron/planner/memory_model.h"
#include "moetron/train/peak_flops.h"

namespace moetron::cli {

namespace {

// The best of `runs` timings after a warm-up (noise only ever slows a run).
double best_seconds(int runs, const std::function<void()>& fn) {
  fn();
  double best = 1e300;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

// bf16 GEMMs of m x 1024 by 1024 x 1024 (the width of a model's projections).
std::vector<std::pair<double, double>> gemm_rates(kernels::Context& ctx) {
  std::vector<std::pair<double, double>> out;
  const int64_t k = 1024, n = 1024;
  for (const int64_t m : {32, 128, 512, 4096}) {
    Tensor a = Tensor::zeros({m, k}, DType::bf16, MemTag::workspace);
    Tensor b = Tensor::zeros({k, n}, DType::bf16, MemTag::workspace);
    Tensor c = Tensor::empty({m, n}, DType::bf16, MemTag::workspace);
    a.fill(0.5);
    b.fill(0.25);
    const double s = best_seconds(5, [&] { kernels::matmul(ctx, a, b, c, {}); });
    out.emplace_back(static_cast<double>(m), 2.0 * static_cast<double>(m * k * n) / s);
  }
  return out;
}

Tensor filled(const Shape& shape, DType dt, double value) {
  Tensor t = Tensor::empty(shape, dt, MemTag::workspace);
  t.fill(value);
  return t;
}

// The experts' grouped GEMMs as a training step runs them: 8 groups of 512
// rows of a gate/up projection (K 512 -> N 2048), forward, input gradient
// and fp32 weight gradient. Returns FLOP/s.
double grouped_gemm_rate(kernels::Context& ctx) {
  const int64_t groups = 8, rows = 512, k = 512, n = 2048, t = groups * rows;
  std::vector<int64_t> offsets;
  for (int64_t g = 0; g <= groups; ++g) offsets.push_back(g * rows);
  Tensor x = filled({t, k}, DType::bf16, 0.5), w = filled({groups, n, k}, DType::bf16, 0.25);
  Tensor y = filled({t, n}, DType::bf16, 0), dx = filled({t, k}, DType::bf16, 0);
  Tensor dw = filled({groups, n, k}, DType::f32, 0);
  const double s = best_seconds(5, [&] {
    kernels::grouped_matmul(ctx, x, w, offsets, y, /*trans_w=*/true, 0.0f);
    kernels::grouped_matmul(ctx, y, w, offsets, dx, /*trans_w=*/false, 0.0f);
    kernels::grouped_matmul_weight_grad(ctx, y, x, offsets, dw, 1.0f);
  });
  return 3 * 2.0 * static_cast<double>(t * k * n) / s;
}

// The elementwise kernels of one layer as the cost model counts their bytes
// (planner/cost_model.cpp): two RMSNorms forward and backward (5 d
// elements a token each), two residual adds (3 d) and SwiGLU forward and
// backward (8 F), bf16, 4096 tokens of d 512 and F 1024. Returns bytes/s.
double elementwise_rate(kernels::Context& ctx) {
  const int64_t t = 4096, d = 512, f = 1024;
  Tensor x = filled({t, d}, DType::bf16, 0.5), y = filled({t, d}, DType::bf16, 0);
  Tensor dy = filled({t, d}, DType::bf16, 0.1), dx = filled({t, d}, DType::bf16, 0);
  Tensor w = filled({d}, DType::f32, 1), dw = filled({d}, DType::f32, 0);
  Tensor rstd = filled({t}, DType::f32, 0);
  Tensor gate_up = filled({t, 2 * f}, DType::bf16, 0.3), h = filled({t, f}, DType::bf16, 0);
  Tensor dh = filled({t, f}, DType::bf16, 0.1), d_gate_up = filled({t, 2 * f}, DType::bf16, 0);
  const double s = best_seconds(5, [&] {
    for (int i = 0; i < 2; ++i) {
      kernels::rmsnorm_forward(ctx, x, w, 1e-5f, y, rstd);
      kernels::rmsnorm_backward(ctx, dy, x, w, rstd, dx, dw);
      kernels::add(ctx, x, y, dx);
    }
    kernels::swiglu_forward(ctx, gate_up, h);
    kernels::swiglu_backward(ctx, dh, gate_up, d_gate_up);
  });
  return 2.0 * static_cast<double>(t * (16 * d + 8 * f)) / s;
}

// Causal attention forward + backward, bf16, 8 heads of 64: FLOP/s of the
// real work, 12 per visible pair and head dimension (4 forward, 8 backward),
// as the cost model counts it.
double attention_rate(kernels::Context& ctx, int64_t seq) {
  const int64_t b = 4, h = 8, hd = 64;
  auto t = [&](std::initializer_list<int64_t> s) {
    Tensor x = Tensor::empty(Shape(s), DType::bf16, MemTag::workspace);
    x.fill(0.01);
    return x;
  };
  Tensor q = t({b, seq, h, hd}), k = t({b, seq, h, hd}), v = t({b, seq, h, hd});
  Tensor out = t({b, seq, h, hd}), dout = t({b, seq, h, hd});
  Tensor dq = t({b, seq, h, hd}), dk = t({b, seq, h, hd}), dv = t({b, seq, h, hd});
  Tensor lse = Tensor::empty({b, h, seq}, DType::f32, MemTag::workspace);
  const kernels::AttentionMask mask;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const double s = best_seconds(3, [&] {
    kernels::attention_forward(ctx, q, k, v, mask, scale, out, lse);
    kernels::attention_backward(ctx, dout, q, k, v, out, lse, mask, scale, dq, dk, dv);
  });
  const double pairs = static_cast<double>(seq) * static_cast<double>(seq + 1) / 2;
  return 12.0 * static_cast<double>(h * hd) * pairs * static_cast<double>(b) / s;
}

// A streaming copy of 256 MiB: bytes read + written per second.
double memory_bandwidth() {
  const int64_t n = int64_t{64} << 20;
  Tensor a = Tensor::zeros({n}, DType::f32, MemTag::workspace);
  Tensor b = Tensor::zeros({n}, DType::f32, MemTag::workspace);
  const double s =
      best_seconds(3, [&] { std::copy(a.data<float>(), a.data<float>() + n, b.data<float>()); });
  return 2.0 * 4 * static_cast<double>(n) / s;
}

planner::Link link_of(comm::Communicator& world) {
  std::vector<std::pair<double, double>> samples;
  for (const int64_t bytes : {int64_t{8}, int64_t{64} << 10, int64_t{1} << 20, int64_t{4} << 20}) {
    Tensor x = Tensor::zeros({bytes / 4}, DType::f32, MemTag::comm);
    double s = best_seconds(10, [&] {
      world.barrier();
      world.allreduce(x, comm::ReduceOp::sum);
    });
    // The slowest rank's best: an all-reduce ends when the last one has it.
    Tensor t = Tensor::wrap(&s, {1}, DType::f64);
    world.allreduce(t, comm::ReduceOp::max);
    samples.emplace_back(static_cast<double>(bytes), s);
  }
  return planner::fit_link(samples);
}

}  // namespace

CLI::App* add_calibrate_command(CLI::App& app, CalibrateCommand& o) {
  auto* cmd = app.add_subcommand(
      "calibrate",
      "measure this machine with micro-benchmarks and write a hardware profile "
      "for `moetron plan --cluster` (run under mpirun -n 2 to measure the links)");
  cmd->add_option("--out", o.out, "profile written (replaced whole)");
  cmd->add_option("--name", o.name, "the profile's name");
  cmd->add_option("--threads", o.threads, "OpenMP threads of one device (rank)");
  cmd->add_option("--devices-per-node", o.devices_per_node, "0: cores / threads");
  cmd->add_option("--seq-len", o.seq_len, "the attention probe's sequence length");
  return cmd;
}

int run_calibrate_command(const CalibrateCommand& o) {
  MOETRON_CHECK(o.threads >= 1 && o.seq_len >= 16, "--threads >= 1 and --seq-len >= 16");
  MOETRON_CHECK(comm::detect_launch_env().under_mpi,
                "calibrate measures the links between two ranks: run it as `mpirun -n 2 moetron "
                "calibrate ...`");
  std::unique_ptr<comm::Communicator> world = comm::make_mpi_world();
  MOETRON_CHECK(world->size() == 2, "calibrate runs on exactly 2 ranks, got ", world->size());
  kernels::Context ctx(kernels::Backend::cpu, static_cast<int>(o.threads));
  planner::HardwareProfile p;
  p.name = o.name;
  // Compute on rank 0 while rank 1 waits: each probe has its cores alone.
  if (world->rank() == 0) {
    p.peak_flops = train::measure_peak_flops(DType::bf16, static_cast<int>(o.threads));
    const planner::GemmFit g = planner::fit_gemm_rows(gemm_rates(ctx), p.peak_flops);
    p.gemm_efficiency = g.efficiency;
    p.gemm_half_rows = g.half_rows;
    // The probe's 512 rows a group run at m / (m + half) of the large rate.
    p.grouped_gemm_efficiency =
        std::min(1.0, grouped_gemm_rate(ctx) / p.peak_flops * (512 + g.half_rows) / 512);
    p.elementwise_bandwidth = elementwise_rate(ctx);
    p.attention_efficiency = std::min(1.0, attention_rate(ctx, o.seq_len) / p.peak_flops);
    p.memory_bandwidth = memory_bandwidth();
  }
  world->barrier();
  p.intra = p.inter = link_of(*world);
  if (world->rank() != 0) return 0;
  const int64_t cores = std::max<int64_t>(1, ::sysconf(_SC_NPROCESSORS_ONLN));
  p.devices_per_node =
      o.devices_per_node > 0 ? o.devices_per_node : std::max<int64_t>(1, cores / o.threads);
  p.memory_bytes = static_cast<double>(planner::available_memory_bytes()) /
                   static_cast<double>(p.devices_per_node);
  // One machine: a device is a core of the host, so offload has no bus to cross.
  p.host_memory_bytes = p.memory_bytes;
  p.host_memory_bandwidth = p.pcie_bandwidth = p.memory_bandwidth;
  const std::string by = "measured by moetron calibrate: ";
  p.sources = {
      {"device.peak_tflops", by + "the best of 10 bf16 1024^3 GEMMs (train/peak_flops.h)"},
      {"device.gemm_efficiency", by + "bf16 GEMM of 4096 x 1024 x 1024 / peak"},
      {"device.gemm_half_rows", by + "bf16 GEMMs of 32, 128, 512 rows against 4096 (median fit)"},
      {"device.grouped_gemm_efficiency",
       by + "bf16 grouped GEMMs, 8 groups of 512 x 512 -> 2048, forward + input and fp32 weight "
            "gradients / peak, scaled from 512 rows to large"},
      {"device.elementwise_tbps",
       by + "bf16 RMSNorm forward + backward x 2, residual add x 2, SwiGLU forward + backward "
            "on 4096 tokens of d 512, F 1024: the bytes the cost model counts / time"},
      {"device.attention_efficiency", by + "causal attention forward + backward, bf16, 4 x " +
                                          std::to_string(o.seq_len) + " tokens, 8 heads of 64"},
      {"device.memory_gib", by + "available memory / devices per node"},
      {"device.memory_tbps", by + "a 256 MiB f32 copy (bytes read + written)"},
      {"device.devices_per_node", by + "cores / --threads (or --devices-per-node)"},
      {"intra.bandwidth_gbps", by + "2-rank MPI all-reduce of 8 B to 4 MiB (least squares)"},
      {"intra.latency_us", by + "2-rank MPI all-reduce of 8 bytes"},
      {"inter.bandwidth_gbps", "one machine: no link between nodes; set equal to intra"},
      {"inter.latency_us", "one machine: no link between nodes; set equal to intra"},
      {"host.memory_gib", "one machine: a device is a core of the host (device.memory_gib)"},
      {"host.memory_tbps", "one machine: the host's memory is the device's (device.memory_tbps)"},
      {"host.pcie_gbps", "one machine: no bus between device and host; device.memory_tbps"}};
  planner::write_hardware_profile(o.out, p);
  std::cout << "wrote " << o.out << ": peak " << p.peak_flops / 1e9 << " GFLOP/s, GEMM "
            << p.gemm_efficiency << " (half at " << p.gemm_half_rows << " rows), attention "
            << p.attention_efficiency << ", grouped GEMM " << p.grouped_gemm_efficiency
            << ", elementwise " << p.elementwise_bandwidth / 1e9 << " GB/s, memory "
            << p.memory_bandwidth / 1e9 << " GB/s, link " << p.intra.bandwidth / 1e9 << " GB/s + "
            << p.intra.latency * 1e6 << " us\n";
  return 0;
}

}  // namespace moetron::cli
