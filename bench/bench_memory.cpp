// Recompute policies and precision memory (family "memory"): on bench-moe
// at S 2048, micro-batch 2, the activation peak (allocator, measured) and the
// step time of each policy, timed in alternating rounds on one model so the
// shared machine's drift hits every policy alike; the fp32 total peak against
// bf16's; and sqrt checkpointing's activation peak at L = 4, 16, 64 on a
// narrow model with the fitted exponent. Each measurement carries the memory
// model's prediction beside it.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "bench_moe_widths.h"
#include "bench_util.h"
#include "moetron/core/allocator.h"
#include "moetron/core/rng.h"
#include "moetron/kernels/matmul.h"
#include "moetron/nn/transformer.h"
#include "moetron/optim/optimizer.h"
#include "moetron/planner/memory_model.h"

namespace moetron::bench {
namespace {

using clock_type = std::chrono::steady_clock;

struct Setup {
  nn::ModelConfig model;
  nn::MoeConfig moe;
  int64_t batch = 2, seq = 2048;
};

Setup long_bench_moe() {
  Setup s;
  set_bench_moe_widths(s.model, s.moe, 2048);
  return s;
}

Setup narrow(int64_t layers) {
  Setup s;
  s.model.vocab_size = 512;
  s.model.d_model = 64;
  s.model.n_layers = layers;
  s.model.n_heads = 2;
  s.model.n_kv_heads = 2;
  s.model.ffn_hidden = 128;
  s.model.max_seq_len = 2048;
  s.moe.num_experts = 4;
  s.moe.top_k = 2;
  s.moe.expert_hidden = 128;
  return s;
}

planner::MemoryInputs inputs_of(const Setup& s, nn::Precision prec, const nn::RecomputePolicy& p,
                                DType moments = DType::f32, DType masters = DType::f32) {
  planner::MemoryInputs in;
  in.matrix_grad = prec.matrix_grad();
  in.moment_dtype = moments;
  in.master_dtype = masters;
  in.widened_bf16_gemm = kernels::cpu_widens_bf16_matmul();
  in.model = s.model;
  in.moe = s.moe;
  in.precision = prec;
  in.recompute = p;
  in.micro_batch = s.batch;
  in.seq_len = s.seq;
  in.threads = omp_get_max_threads();
  return in;
}

// A model with its optimizer and one batch; step() runs one training step
// under the current policy and returns its seconds and measured peaks.
class Harness {
 public:
  Harness(const Setup& s, nn::Precision prec, int threads, DType moments = DType::f32,
          DType masters = DType::f32)
      : s_(s), ctx_(kernels::Backend::cpu, threads), model_(s.model, s.moe, prec) {
    model_.initialize(1);
    optim::OptimizerOptions oo;
    oo.moment_dtype = moments;
    oo.master_dtype = masters;
    oo.schedule = {1e-4, 0.1, 0, 1000};
    opt_ = std::make_unique<optim::Optimizer>(model_.params(), oo);
    in_ = Tensor::empty({s.batch, s.seq}, DType::i32);
    tgt_ = Tensor::empty({s.batch, s.seq}, DType::i32);
    PhiloxStream rng(3, "tokens");
    for (int64_t i = 0; i < s.batch * s.seq; ++i) {
      in_.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % s.model.vocab_size);
      tgt_.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % s.model.vocab_size);
    }
  }
  struct Step {
    double seconds;
    int64_t activation_peak, total_peak;
  };
  Step step(const nn::RecomputePolicy& p) {
    model_.set_recompute(p);
    Allocator& alloc = cpu_allocator();
    const int64_t act0 = alloc.current(MemTag::activations);
    alloc.reset_peaks();
    const auto t0 = clock_type::now();
    model_.params().zero_grads();
    model_.forward_backward(ctx_, in_, tgt_, 1.0 / static_cast<double>(s_.batch * s_.seq), 1.0,
                            true);
    opt_->step(ctx_, ++n_);
    const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
    return {secs, alloc.peak(MemTag::activations) - act0, alloc.total_peak()};
  }

 private:
  Setup s_;
  kernels::Context ctx_;
  nn::Transformer model_;
  std::unique_ptr<optim::Optimizer> opt_;
  Tensor in_, tgt_;
  int64_t n_ = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void bench_policies(Runner& runner) {
  Setup s = long_bench_moe();
  if (runner.quick()) {
    s.model.n_layers = 2;
    s.seq = 512;
  }
  const int64_t layers = s.model.n_layers;
  const std::vector<nn::RecomputePolicy> policies = {
      nn::make_recompute_policy("none", {}, layers),
      nn::make_recompute_policy("selective", {}, layers),
      nn::make_recompute_policy("full", {}, layers), nn::make_recompute_policy("sqrt", {}, layers)};
  Harness h(s, nn::Precision::bf16(), runner.threads());
  for (const auto& p : policies)
    h.step(p);  // warm-up: primitives, first touch of every policy's buffers
  const int rounds = runner.quick() ? 1 : 3;
  std::vector<std::vector<double>> secs(policies.size());
  std::vector<Harness::Step> last(policies.size());
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < policies.size(); ++i) {
      last[i] = h.step(policies[i]);
      secs[i].push_back(last[i].seconds);
    }
  }
  const double base_s = median(secs[0]);
  const auto base_act = static_cast<double>(last[0].activation_peak);
  for (size_t i = 0; i < policies.size(); ++i) {
    const planner::MemoryEstimate est =
        planner::estimate_memory(inputs_of(s, nn::Precision::bf16(), policies[i]));
    Result res;
    res.name = "memory/bench-moe-s" + std::to_string(s.seq) + "/bf16/" + policies[i].name;
    res.labels["policy"] = nn::describe(policies[i]);
    res.labels["tokens"] = std::to_string(s.batch * s.seq);
    std::string rounds_s;
    for (double x : secs[i]) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%s%.2f", rounds_s.empty() ? "" : " ", x);
      rounds_s.append(buf);
    }
    res.labels["seconds_per_round"] = rounds_s;
    res.metrics["seconds"] = median(secs[i]);
    res.metrics["time_vs_none"] = median(secs[i]) / base_s;
    res.metrics["activation_peak_mb"] = static_cast<double>(last[i].activation_peak) / 1e6;
    res.metrics["activation_predicted_mb"] =
        static_cast<double>(est.peak_of(MemTag::activations)) / 1e6;
    res.metrics["activation_reduction_vs_none"] =
        base_act / static_cast<double>(last[i].activation_peak);
    res.metrics["total_peak_mb"] = static_cast<double>(last[i].total_peak) / 1e6;
    res.metrics["total_predicted_mb"] = static_cast<double>(est.total_peak) / 1e6;
    runner.record(res);
  }
}

// fp32 training against bf16 training in its memory modes: the bf16 working
// copy alone, then bf16 hidden-matrix gradients (train.grad_dtype) and bf16
// moments (optim.moment_dtype), each alone and together, and with the bf16
// copies as their own masters (optim.master_dtype), with bf16 or 8-bit moments.
void bench_precision(Runner& runner) {
  Setup s = long_bench_moe();
  if (runner.quick()) {
    s.model.n_layers = 2;
    s.seq = 512;
  }
  struct Mode {
    const char* name;
    nn::Precision prec;
    DType moments;
    DType masters = DType::f32;
  };
  nn::Precision bf16_grads = nn::Precision::bf16();
  bf16_grads.bf16_matrix_grads = true;
  const std::vector<Mode> modes = {
      {"f32", nn::Precision::fp32(), DType::f32},
      {"bf16", nn::Precision::bf16(), DType::f32},
      {"bf16+grads", bf16_grads, DType::f32},
      {"bf16+moments", nn::Precision::bf16(), DType::bf16},
      {"bf16+grads+moments", bf16_grads, DType::bf16},
      {"bf16+masters", nn::Precision::bf16(), DType::f32, DType::bf16},
      {"bf16+grads+moments+masters", bf16_grads, DType::bf16, DType::bf16},
      {"bf16+grads+int8 moments+masters", bf16_grads, DType::u8, DType::bf16}};
  const nn::RecomputePolicy none;
  double fp32_total = 0;
  for (const Mode& m : modes) {
    cpu_allocator().release_cached();
    const int64_t before = cpu_allocator().total_current();
    cpu_allocator().reset_peaks();
    Harness::Step st{};
    {
      Harness h(s, m.prec, runner.threads(), m.moments, m.masters);
      st = h.step(none);
    }
    const planner::MemoryEstimate est =
        planner::estimate_memory(inputs_of(s, m.prec, none, m.moments, m.masters));
    // Model construction, optimizer state and the step: the run's whole peak.
    const double total = static_cast<double>(cpu_allocator().total_peak() - before) / 1e6;
    if (fp32_total == 0) fp32_total = total;
    Result res;
    res.name = std::string("memory/bench-moe-s") + std::to_string(s.seq) + "/total/" + m.name;
    res.metrics["seconds"] = st.seconds;
    res.metrics["total_peak_mb"] = total;
    res.metrics["total_predicted_mb"] = static_cast<double>(est.total_peak) / 1e6;
    res.metrics["below_fp32"] = 1.0 - total / fp32_total;
    res.metrics["activation_peak_mb"] = static_cast<double>(st.activation_peak) / 1e6;
    res.metrics["activation_predicted_mb"] =
        static_cast<double>(est.peak_of(MemTag::activations)) / 1e6;
    runner.record(res);
  }
}

void bench_sqrt_scaling(Runner& runner) {
  std::vector<double> xs, ys;
  for (int64_t layers :
       runner.quick() ? std::vector<int64_t>{4, 16} : std::vector<int64_t>{4, 16, 64}) {
    Setup s = narrow(layers);
    if (runner.quick()) s.seq = 512;
    Harness h(s, nn::Precision::bf16(), runner.threads());
    const nn::RecomputePolicy sq = nn::make_recompute_policy("sqrt", {}, layers);
    const nn::RecomputePolicy none;
    h.step(sq);
    const Harness::Step st = h.step(sq);
    const Harness::Step base = h.step(none);
    const planner::MemoryEstimate est =
        planner::estimate_memory(inputs_of(s, nn::Precision::bf16(), sq));
    Result res;
    res.name = "memory/sqrt-scaling/narrow-L" + std::to_string(layers);
    res.labels["segment"] = std::to_string(sq.segment);
    res.metrics["activation_peak_mb"] = static_cast<double>(st.activation_peak) / 1e6;
    res.metrics["activation_predicted_mb"] =
        static_cast<double>(est.peak_of(MemTag::activations)) / 1e6;
    res.metrics["activation_none_mb"] = static_cast<double>(base.activation_peak) / 1e6;
    res.metrics["seconds"] = st.seconds;
    res.metrics["seconds_none"] = base.seconds;
    runner.record(res);
    xs.push_back(std::log(static_cast<double>(layers)));
    ys.push_back(std::log(static_cast<double>(st.activation_peak)));
  }
  // Least-squares slope of log(activation peak) on log(L).
  const double n = static_cast<double>(xs.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    sx += xs[i];
    sy += ys[i];
    sxx += xs[i] * xs[i];
    sxy += xs[i] * ys[i];
  }
  Result fit;
  fit.name = "memory/sqrt-scaling/exponent";
  fit.metrics["exponent"] = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  runner.record(fit);
}

}  // namespace

MOETRON_BENCH("memory_policies", bench_policies);
MOETRON_BENCH("memory_precision", bench_precision);
MOETRON_BENCH("memory_sqrt", bench_sqrt_scaling);

}  // namespace moetron::bench
