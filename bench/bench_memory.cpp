// Recompute policies and precision memory (family "memory"): on bench-moe
// (S 512, micro-batch 8) and its long-sequence variant (S 2048, micro-batch
// 2), the activation peak (allocator, measured) and the step time of each
// policy, timed in alternating rounds on one model so the shared machine's
// drift hits every policy alike; each recompute module alone, ranked by
// activation bytes saved per FLOP recomputed; the fp32 total peak against
// bf16's; and sqrt checkpointing's activation peak at L = 4, 16, 64 on a
// narrow model with the fitted exponent. Each measurement carries the memory
// model's prediction beside it.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_moe_widths.h"
#include "bench_util.h"
#include "moetron/core/allocator.h"
#include "moetron/core/rng.h"
#include "moetron/kernels/matmul.h"
#include "moetron/nn/flops.h"
#include "moetron/nn/recompute.h"
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
    double recompute_seconds;  // nn::recompute_seconds() of this step
  };
  Step step(const nn::RecomputePolicy& p) {
    model_.set_recompute(p);
    Allocator& alloc = cpu_allocator();
    const int64_t act0 = alloc.current(MemTag::activations);
    alloc.reset_peaks();
    nn::reset_recompute_seconds();
    const auto t0 = clock_type::now();
    model_.params().zero_grads();
    model_.forward_backward(ctx_, in_, tgt_, 1.0 / static_cast<double>(s_.batch * s_.seq), 1.0,
                            true);
    opt_->step(ctx_, ++n_);
    const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
    return {secs, alloc.peak(MemTag::activations) - act0, alloc.total_peak(),
            nn::recompute_seconds()};
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

// The median over rounds of a / b, each round's pair timed back to back: the
// machine's slow drift cancels within a pair.
double paired_ratio(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> r;
  for (size_t i = 0; i < a.size(); ++i) r.push_back(a[i] / b[i]);
  return median(r);
}

// bench-moe itself (S 512, micro-batch 8) and its long-sequence variant
// (S 2048, micro-batch 2): 4096 tokens a step each.
std::vector<Setup> policy_setups(bool quick) {
  Setup long_seq = long_bench_moe();
  Setup short_seq = long_bench_moe();
  short_seq.seq = 512;
  short_seq.batch = 8;
  if (quick) {  // distinct lengths, so the result names stay distinct
    for (Setup* s : {&long_seq, &short_seq}) s->model.n_layers = 2;
    short_seq.seq = 128;
    long_seq.seq = 256;
  }
  return {short_seq, long_seq};
}

std::string rounds_label(const std::vector<double>& secs) {
  std::string out;
  for (double x : secs) {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%s%.3f", out.empty() ? "" : " ", x);
    out.append(buf);
  }
  return out;
}

// Every policy of `sets` stepped once per round, in order, for `rounds`
// rounds on one model (after a warm-up step of each), so the shared
// machine's drift hits each alike: each policy's step seconds, rebuild
// seconds and last step.
struct Rounds {
  std::vector<std::vector<double>> secs, rebuild;
  std::vector<Harness::Step> last;
};
Rounds alternate(Harness& h, const std::vector<nn::RecomputePolicy>& sets, int rounds) {
  for (const auto& p : sets) h.step(p);  // warm-up: primitives, first touch of buffers
  Rounds out{std::vector<std::vector<double>>(sets.size()),
             std::vector<std::vector<double>>(sets.size()),
             std::vector<Harness::Step>(sets.size())};
  for (int r = 0; r < rounds; ++r) {
    for (size_t i = 0; i < sets.size(); ++i) {
      out.last[i] = h.step(sets[i]);
      out.secs[i].push_back(out.last[i].seconds);
      out.rebuild[i].push_back(out.last[i].recompute_seconds);
    }
  }
  return out;
}

// Every policy in alternating rounds on one model; the time ratio is of
// medians (paired and minima beside it).
void policies_on(Runner& runner, const Setup& s) {
  const int64_t layers = s.model.n_layers;
  const std::vector<nn::RecomputePolicy> policies = {
      nn::make_recompute_policy("none", {}, layers),
      nn::make_recompute_policy("selective", {}, layers),
      nn::make_recompute_policy("full", {}, layers), nn::make_recompute_policy("sqrt", {}, layers)};
  Harness h(s, nn::Precision::bf16(), runner.threads());
  const auto [secs, rebuild, last] = alternate(h, policies, runner.quick() ? 1 : 9);
  const double base_s = median(secs[0]);
  const double base_min = *std::min_element(secs[0].begin(), secs[0].end());
  const auto base_act = static_cast<double>(last[0].activation_peak);
  for (size_t i = 0; i < policies.size(); ++i) {
    const planner::MemoryEstimate est =
        planner::estimate_memory(inputs_of(s, nn::Precision::bf16(), policies[i]));
    Result res;
    res.name = "memory/bench-moe-s" + std::to_string(s.seq) + "/bf16/" + policies[i].name;
    res.labels["policy"] = nn::describe(policies[i]);
    res.labels["tokens"] = std::to_string(s.batch * s.seq);
    res.labels["seconds_per_round"] = rounds_label(secs[i]);
    res.metrics["seconds"] = median(secs[i]);
    res.metrics["time_vs_none"] = median(secs[i]) / base_s;
    res.metrics["paired_time_vs_none"] = paired_ratio(secs[i], secs[0]);
    res.metrics["min_time_vs_none"] = *std::min_element(secs[i].begin(), secs[i].end()) / base_min;
    // Time spent in the rebuilds themselves, as a share of none's step.
    res.metrics["recompute_time_share"] = median(rebuild[i]) / base_s;
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

void bench_policies(Runner& runner) {
  for (const Setup& s : policy_setups(runner.quick())) policies_on(runner, s);
}

// GEMM FLOPs one forward of a module's rebuild costs per token, summed over
// the layers (0: rebuilt by memory-bound passes, or by nothing).
double recompute_flops_per_token(const Setup& s, const std::string& module) {
  const nn::ModelConfig& m = s.model;
  const auto d = static_cast<double>(m.d_model);
  const double q = static_cast<double>(m.n_heads * m.resolved_head_dim());
  const double kv = static_cast<double>(m.n_kv_heads * m.resolved_head_dim());
  double flops = 0;
  for (int64_t i = 0; i < m.n_layers; ++i) {
    if (module == "attn_core") {
      flops += 4 * q * nn::layer_attended_pairs(m, i, s.seq) / static_cast<double>(s.seq);
    } else if (module == "attn_q" || module == "attn_residual") {
      flops += 2 * d * q;
    } else if (module == "attn_kv") {
      flops += 4 * d * kv;
    }
  }
  return flops;
}

// Each module alone against none: the activation bytes it saves (measured
// by the allocator), the GEMM FLOPs its rebuild costs (counted from the
// shapes) and the time it adds (median over alternating rounds), so the
// modules can be ranked by bytes saved per FLOP recomputed.
void modules_on(Runner& runner, const Setup& s) {
  const int64_t layers = s.model.n_layers;
  std::vector<nn::RecomputePolicy> policies = {nn::make_recompute_policy("none", {}, layers)};
  for (const std::string& m : nn::recompute_module_names())
    policies.push_back(nn::make_recompute_policy("custom", {m}, layers));
  Harness h(s, nn::Precision::bf16(), runner.threads());
  const auto [secs, rebuild, last] = alternate(h, policies, runner.quick() ? 1 : 3);
  const double tokens = static_cast<double>(s.batch * s.seq);
  // The MFU numerator's step FLOPs (causal attention counted twice, as PaLM does).
  const double train_flops = nn::model_flops_per_token(s.model, s.moe, s.seq) * tokens;
  for (size_t i = 1; i < policies.size(); ++i) {
    const std::string& module = nn::recompute_module_names()[i - 1];
    const double saved =
        static_cast<double>(last[0].activation_peak - last[i].activation_peak) / 1e6;
    const double flops = recompute_flops_per_token(s, module) * tokens;
    Result res;
    res.name = "memory/modules-s" + std::to_string(s.seq) + "/" + module;
    res.labels["seconds_per_round"] = rounds_label(secs[i]);
    res.metrics["activation_saved_mb"] = saved;
    res.metrics["recompute_gflop"] = flops / 1e9;
    res.metrics["recompute_share_of_step_flops"] = flops / train_flops;
    res.metrics["saved_mb_per_gflop"] = flops > 0 ? saved / (flops / 1e9) : -1;
    res.metrics["time_vs_none"] = median(secs[i]) / median(secs[0]);
    res.metrics["recompute_time_share"] = median(rebuild[i]) / median(secs[0]);
    res.metrics["saved_mb_per_recompute_second"] =
        median(rebuild[i]) > 0 ? saved / median(rebuild[i]) : -1;
    runner.record(res);
  }
}

void bench_modules(Runner& runner) {
  for (const Setup& s : policy_setups(runner.quick())) modules_on(runner, s);
}

// The recompute frontier: modules added one at a time in the order of their
// measured activation bytes saved per FLOP recomputed (the ones rebuilt by
// memory-bound passes or by nothing first, by bytes saved; then the GEMM
// rebuilds by bytes per FLOP), each prefix timed against none in
// alternating rounds: what each further byte saved costs in step time.
void frontier_on(Runner& runner, const Setup& s) {
  const int64_t layers = s.model.n_layers;
  const std::vector<std::string>& names = nn::recompute_module_names();
  Harness h(s, nn::Precision::bf16(), runner.threads());
  const nn::RecomputePolicy none;
  h.step(none);
  const int64_t base = h.step(none).activation_peak;
  struct Ranked {
    std::string module;
    double saved, flops;
  };
  std::vector<Ranked> ranked;
  for (const std::string& m : names) {
    const int64_t peak = h.step(nn::make_recompute_policy("custom", {m}, layers)).activation_peak;
    ranked.push_back({m, static_cast<double>(base - peak), recompute_flops_per_token(s, m)});
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    if ((a.flops == 0) != (b.flops == 0)) return a.flops == 0;
    if (a.flops == 0) return a.saved > b.saved;
    return a.saved / a.flops > b.saved / b.flops;
  });
  std::vector<nn::RecomputePolicy> sets = {none};
  std::vector<std::string> chosen;
  for (const Ranked& r : ranked) {
    chosen.push_back(r.module);
    sets.push_back(nn::make_recompute_policy("custom", chosen, layers));
  }
  const auto [secs, rebuild, last] = alternate(h, sets, runner.quick() ? 1 : 7);
  const double tokens = static_cast<double>(s.batch * s.seq);
  const double step_flops = nn::model_flops_per_token(s.model, s.moe, s.seq) * tokens;
  double flops = 0;
  for (size_t i = 1; i < sets.size(); ++i) {
    flops += ranked[i - 1].flops * tokens;
    Result res;
    res.name = "memory/frontier-s" + std::to_string(s.seq) + "/+" + ranked[i - 1].module;
    res.labels["seconds_per_round"] = rounds_label(secs[i]);
    res.metrics["activation_peak_mb"] = static_cast<double>(last[i].activation_peak) / 1e6;
    res.metrics["activation_reduction_vs_none"] =
        static_cast<double>(last[0].activation_peak) / static_cast<double>(last[i].activation_peak);
    res.metrics["recompute_share_of_step_flops"] = flops / step_flops;
    res.metrics["recompute_time_share"] = median(rebuild[i]) / median(secs[0]);
    res.metrics["time_vs_none"] = median(secs[i]) / median(secs[0]);
    res.metrics["paired_time_vs_none"] = paired_ratio(secs[i], secs[0]);
    res.metrics["min_time_vs_none"] = *std::min_element(secs[i].begin(), secs[i].end()) /
                                      *std::min_element(secs[0].begin(), secs[0].end());
    runner.record(res);
  }
}

void bench_frontier(Runner& runner) {
  for (const Setup& s : policy_setups(runner.quick())) frontier_on(runner, s);
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
MOETRON_BENCH("memory_modules", bench_modules);
MOETRON_BENCH("memory_frontier", bench_frontier);
MOETRON_BENCH("memory_precision", bench_precision);
MOETRON_BENCH("memory_sqrt", bench_sqrt_scaling);

}  // namespace moetron::bench
