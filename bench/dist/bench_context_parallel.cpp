// Context parallelism (parallel.cp = the mpirun world): one bench-moe
// training step (forward, backward, AdamW; bf16 compute with fp32 masters,
// micro-batch 1, full causal attention unless
// --window) of a sequence of --seq tokens split over the ranks, each rank
// holding chunks r and 2c-1-r. Reports per rank-maximum median: the step
// time, the time blocked in the cp communicator (the ring's exposed part:
// waiting for a K/V hop after the block's attention, and the backward's
// dK/dV reduce-scatter), the bytes the rank sent against the analytic count,
// and the allocator's peak beside the memory model's. Run the one-rank
// baseline with the same total threads:
//
//   mpirun -np 1 build/bench/moetron_bench_cp --threads 2 --json cp1.json
//   mpirun -np 2 build/bench/moetron_bench_cp --threads 1 --json cp2.json
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "../bench_moe_widths.h"
#include "moetron/comm/mpi_communicator.h"
#include "moetron/core/allocator.h"
#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/kernels/matmul.h"
#include "moetron/nn/transformer.h"
#include "moetron/optim/optimizer.h"
#include "moetron/planner/memory_model.h"

namespace {

using namespace moetron;
using clock_type = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Options {
  int64_t seq = 32768, window = 0, layers = 8, steps = 3;
  int threads = 1;
  bool all_to_all = false;  // --cp-comm all_to_all (Ulysses) instead of ring
  std::string json_path;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--seq") {
      o.seq = std::stoll(v);
    } else if (a == "--window") {
      o.window = std::stoll(v);
    } else if (a == "--layers") {
      o.layers = std::stoll(v);
    } else if (a == "--steps") {
      o.steps = std::stoll(v);
    } else if (a == "--threads") {
      o.threads = std::stoi(v);
    } else if (a == "--cp-comm") {
      MOETRON_CHECK(v == "ring" || v == "all_to_all", "--cp-comm: ring or all_to_all, got ", v);
      o.all_to_all = v == "all_to_all";
    } else if (a == "--json") {
      o.json_path = v;
    } else {
      MOETRON_FAIL("unknown option ", a,
                   " (--seq, --window, --layers, --steps, --threads, --cp-comm, --json)");
    }
  }
  return o;
}

// configs/bench-moe.toml's widths; --window: every layer local (window W,
// 16 global tokens), so ring hops beyond the window are skipped.
void model_of(const Options& o, nn::ModelConfig& m, nn::MoeConfig& e) {
  bench::set_bench_moe_widths(m, e, o.seq);
  m.n_layers = o.layers;
  if (o.window > 0) {
    m.attention_window = o.window;
    // assign(1, 'L'), not = "L": GCC 12 warns (-Wrestrict, a false positive)
    // on the inlined assignment of a one-character literal here.
    m.attention_layer_pattern.assign(1, 'L');
  }
}

// Bytes a rank puts on the cp ring per forward + backward, by the
// algorithm: every ring hop carries its two chunks' K and V (compute dtype);
// the backward's reduce-scatter of the dK/dV sums (accum dtype, 2 x S x
// kv width per sequence) sends (c - 1) / c of them.
double analytic_bytes(const nn::ModelConfig& m, int64_t seq, int64_t c, int64_t hops) {
  const double kv = static_cast<double>(m.n_kv_heads * m.resolved_head_dim());
  const double block = 2.0 * static_cast<double>(seq / c) * kv;    // elements of K and V
  const double forward = static_cast<double>(hops) * block * 2;    // bf16
  const double backward = static_cast<double>(c - 1) * block * 4;  // f32 sums
  return static_cast<double>(m.n_layers) * (forward + backward);
}

// All-to-all (Ulysses): forward sends q, k, v to head-split and the output
// back, backward d_out out and dq, dk, dv back: 8 exchanges of a local
// [S / c, heads, hd] tensor (bf16) a layer, of which (c - 1) / c leaves the
// rank (this bench's model has as many kv heads as query heads); and the
// positions every rank gathers for the document starts.
double analytic_all_to_all_bytes(const nn::ModelConfig& m, int64_t seq, int64_t c) {
  const double local = static_cast<double>(seq / c * m.n_heads * m.resolved_head_dim());
  const double exchanges = 8.0 * local * 2 * static_cast<double>(c - 1) / static_cast<double>(c);
  // Plus each layer's all-gather of the i32 positions (document starts).
  const double positions = static_cast<double>((c - 1) * (seq / c) * 4);
  return static_cast<double>(m.n_layers) * (exchanges + positions);
}

}  // namespace

int main(int argc, char** argv) {
  std::shared_ptr<comm::Communicator> world = comm::make_mpi_world();
  try {
    const Options o = parse(argc, argv);
    const int64_t c = world->size();
    nn::ModelConfig model;
    nn::MoeConfig moe;
    model_of(o, model, moe);
    const nn::Precision prec = nn::Precision::bf16();
    Allocator& alloc = cpu_allocator();
    const MemStats before = alloc.stats();
    alloc.reset_peaks();
    std::vector<double> step_s, blocked_s, comm_s;
    int64_t bytes = 0;
    {
      kernels::Context ctx(kernels::Backend::cpu, o.threads);
      nn::Transformer t(model, moe, prec);
      t.initialize(1);
      if (c > 1) t.set_context_group(world.get(), o.all_to_all);
      optim::OptimizerOptions oo;
      oo.schedule = {1e-3, 0.1, 0, 100};
      optim::Optimizer opt(t.params(), oo);
      Tensor in = Tensor::empty({1, o.seq}, DType::i32),
             tgt = Tensor::empty({1, o.seq}, DType::i32);
      PhiloxStream rng(3, "tokens");  // the same tokens on every rank
      for (int64_t i = 0; i < o.seq; ++i) {
        in.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % model.vocab_size);
        tgt.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % model.vocab_size);
      }
      for (int64_t step = 0; step < o.steps; ++step) {
        world->barrier();
        const comm::CommStats s0 = world->total_stats();
        const auto t0 = clock_type::now();
        t.params().zero_grads();
        t.forward_backward(ctx, in, tgt, 1.0 / static_cast<double>(o.seq), 1.0, true);
        // (a cp job reduces the gradients over the cp ranks here: a
        // data-parallel cost, left out to time the sequence split alone)
        opt.step(ctx, step + 1);
        const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
        const comm::CommStats s1 = world->total_stats();
        if (step == 0) continue;  // warmup: first-touch of every buffer
        step_s.push_back(secs);
        blocked_s.push_back(s1.blocked_seconds - s0.blocked_seconds);
        comm_s.push_back(s1.seconds - s0.seconds);
        bytes = s1.bytes_sent - s0.bytes_sent;
      }
    }
    const int64_t peak = alloc.total_peak() - before.total_current;
    const int64_t act_peak =
        alloc.peak(MemTag::activations) - before.current[static_cast<size_t>(MemTag::activations)];
    planner::MemoryInputs mi;
    mi.model = model;
    mi.moe = moe;
    mi.precision = prec;
    mi.micro_batch = 1;
    mi.seq_len = o.seq;
    mi.threads = o.threads;
    mi.matrix_grad = prec.matrix_grad();
    mi.widened_bf16_gemm = kernels::cpu_widens_bf16_matmul();
    mi.layout.cp = c;
    mi.cp_all_to_all = o.all_to_all;
    mi.layout.stage_rank = world->rank();
    // The model's activations (the part cp divides); its total would add the
    // gradient reducer this bench leaves out.
    const int64_t predicted = planner::estimate_memory(mi).peak_of(MemTag::activations);
    Tensor v = Tensor::empty({5}, DType::f64);
    v.data<double>()[0] = median(step_s);
    v.data<double>()[1] = median(blocked_s);
    v.data<double>()[2] = median(comm_s);
    v.data<double>()[3] = static_cast<double>(peak);
    v.data<double>()[4] = static_cast<double>(act_peak);
    // Each rank's own medians too: who waits for whom.
    Tensor mine = Tensor::empty({2}, DType::f64), all = Tensor::empty({2 * c}, DType::f64);
    mine.data<double>()[0] = median(step_s);
    mine.data<double>()[1] = median(blocked_s);
    world->allgather(mine, all);
    world->allreduce(v, comm::ReduceOp::max);
    const int64_t hops = o.window > 0 ? -1 : c - 1;
    if (world->rank() == 0) {
      const double* r = v.data<double>();
      const double analytic = o.all_to_all ? analytic_all_to_all_bytes(model, o.seq, c)
                              : hops >= 0  ? analytic_bytes(model, o.seq, c, hops)
                                           : 0;
      std::printf("%-4s %7s %9s %11s %9s %12s %12s %9s %9s %9s\n", "cp", "seq", "s/step",
                  "blocked_s", "comm_s", "bytes", "analytic", "peak_MB", "act_MB", "act_pred");
      std::printf("%-4lld %7lld %9.2f %11.3f %9.3f %12lld %12.0f %9.1f %9.1f %9.1f\n",
                  static_cast<long long>(c), static_cast<long long>(o.seq), r[0], r[1], r[2],
                  static_cast<long long>(bytes), analytic, r[3] / 1e6, r[4] / 1e6,
                  static_cast<double>(predicted) / 1e6);
      nlohmann::json per_rank = nlohmann::json::array();
      for (int64_t k = 0; k < c; ++k) {
        per_rank.push_back({{"rank", k},
                            {"step_s", all.data<double>()[2 * k]},
                            {"blocked_s", all.data<double>()[2 * k + 1]}});
        std::printf("  rank %lld: step %.2f s, blocked %.3f s\n", static_cast<long long>(k),
                    all.data<double>()[2 * k], all.data<double>()[2 * k + 1]);
      }
      if (!o.json_path.empty()) {
        const nlohmann::json j = {{"cp", c},
                                  {"cp_comm", o.all_to_all ? "all_to_all" : "ring"},
                                  {"seq", o.seq},
                                  {"window", o.window},
                                  {"layers", o.layers},
                                  {"threads_per_rank", o.threads},
                                  {"step_s", r[0]},
                                  {"us_per_token", r[0] / static_cast<double>(o.seq) * 1e6},
                                  {"ring_blocked_s", r[1]},
                                  {"comm_s", r[2]},
                                  {"bytes_sent_rank0", bytes},
                                  {"analytic_bytes", analytic},
                                  {"peak_bytes_max", r[3]},
                                  {"activation_peak_bytes_max", r[4]},
                                  {"predicted_activation_bytes_rank0", predicted},
                                  {"per_rank", per_rank}};
        std::ofstream(o.json_path) << j.dump(2) << "\n";
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "rank " << world->rank() << ": " << e.what() << "\n";
    return 1;
  }
}
