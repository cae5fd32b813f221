// Long sequences (family "long_sequence", opt-in: `--filter long_sequence`):
// one bench-moe training step (forward + backward + AdamW step, bf16 compute
// with fp32 master weights, micro-batch 1) at sequence lengths S, in three
// attention modes:
//   full            full causal attention on every layer
//   hybrid          sliding window (--long-window, 1024) on five layers of six,
//                   one global layer in six (--long-pattern, "LLLLLG", Gemma 3), 16 global tokens
//   hybrid_chunked  hybrid, run C (--long-chunk) positions at a time
//                   (Transformer::set_sequence_chunk) under recompute full, so
//                   activations scale with C rather than S
// Each point reports the median step time, time per token, tokens/s, the
// allocator's measured peak beside the memory model's prediction, and the
// process's peak RSS. A point is skipped (and reported so) when its
// predicted peak exceeds --long-max-gb or when its time, extrapolated from
// the mode's last measured point, exceeds --long-max-seconds.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_moe_widths.h"
#include "bench_util.h"
#include "moetron/core/allocator.h"
#include "moetron/core/error.h"
#include "moetron/core/rng.h"
#include "moetron/kernels/matmul.h"
#include "moetron/nn/flops.h"
#include "moetron/nn/transformer.h"
#include "moetron/optim/optimizer.h"
#include "moetron/planner/memory_model.h"

namespace moetron::bench {
namespace {

using clock_type = std::chrono::steady_clock;

struct Mode {
  std::string name;
  bool hybrid = false, chunked = false;
};

Mode parse_mode(const std::string& name) {
  MOETRON_CHECK(name == "full" || name == "hybrid" || name == "hybrid_chunked",
                "--long-modes: unknown mode '", name, "' (full, hybrid, hybrid_chunked)");
  return {name, name != "full", name == "hybrid_chunked"};
}

// configs/bench-moe.toml's widths at sequence length `seq`.
struct Setup {
  nn::ModelConfig model;
  nn::MoeConfig moe;
  nn::RecomputePolicy recompute;  // none, as bench-moe trains; full when chunked
  int64_t seq = 0, chunk = 0;     // chunk 0: whole sequence
};

Setup setup_of(const Mode& mode, int64_t seq, const LongSequenceOptions& o) {
  Setup s;
  set_bench_moe_widths(s.model, s.moe, seq);
  s.seq = seq;
  if (mode.hybrid) {
    s.model.attention_window = o.window;
    s.model.attention_global_tokens = 16;
    s.model.attention_layer_pattern = o.pattern;
  }
  if (mode.chunked) {
    s.recompute = nn::make_recompute_policy("full", {}, s.model.n_layers);
    // A chunk as long as the sequence is no chunking (the model and the memory model agree).
    s.chunk = o.chunk < seq ? o.chunk : 0;
  }
  return s;
}

planner::MemoryInputs memory_inputs(const Setup& s, int threads) {
  planner::MemoryInputs in;
  in.model = s.model;
  in.moe = s.moe;
  in.precision = nn::Precision::bf16();
  in.recompute = s.recompute;
  in.micro_batch = 1;
  in.seq_len = s.seq;
  in.seq_chunk = s.chunk;
  in.threads = threads;
  in.matrix_grad = in.precision.matrix_grad();
  in.widened_bf16_gemm = kernels::cpu_widens_bf16_matmul();
  return in;  // ce_chunk_tokens: 1024 here and in nn::Transformer
}

// Peak RSS since the last reset: Linux's VmHWM, which writing "5" to
// /proc/self/clear_refs resets, so each point sees its own high-water mark.
bool reset_rss_peak() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return static_cast<bool>(f);
}

double rss_peak_mb() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1e3;  // kB
  }
  return 0;
}

struct Measured {
  std::vector<double> seconds;  // the timed steps
  int64_t total_peak = 0, activation_peak = 0;
  double rss_mb = 0;
  bool rss_reset = false;
};

// Builds the model and its optimizer from a clean allocator (so the peak
// covers parameters, gradients, optimizer state and the step, as the memory
// model's total does) and runs warmup + reps training steps.
Measured run_point(const Setup& s, int threads, int warmup, int reps) {
  Allocator& alloc = cpu_allocator();
  alloc.release_cached();
  Measured m;
  m.rss_reset = reset_rss_peak();
  const MemStats before = alloc.stats();
  alloc.reset_peaks();
  {
    kernels::Context ctx(kernels::Backend::cpu, threads);
    nn::Transformer model(s.model, s.moe, nn::Precision::bf16());
    model.initialize(1);
    model.set_recompute(s.recompute);
    model.set_sequence_chunk(s.chunk);
    optim::OptimizerOptions oo;
    oo.schedule = {1e-3, 0.1, 0, 100};
    optim::Optimizer opt(model.params(), oo);
    Tensor in = Tensor::empty({1, s.seq}, DType::i32), tgt = Tensor::empty({1, s.seq}, DType::i32);
    PhiloxStream rng(3, "tokens");
    for (int64_t i = 0; i < s.seq; ++i) {
      in.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % s.model.vocab_size);
      tgt.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % s.model.vocab_size);
    }
    for (int64_t step = 1; step <= warmup + reps; ++step) {
      const auto t0 = clock_type::now();
      model.params().zero_grads();
      model.forward_backward(ctx, in, tgt, 1.0 / static_cast<double>(s.seq), 1.0, true);
      opt.step(ctx, step);
      const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
      if (step > warmup) m.seconds.push_back(secs);
    }
  }
  m.total_peak = alloc.total_peak() - before.total_current;
  m.activation_peak =
      alloc.peak(MemTag::activations) - before.current[static_cast<size_t>(MemTag::activations)];
  m.rss_mb = rss_peak_mb();
  return m;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The mode's last measured point, for the time guard.
struct Last {
  int64_t seq = 0;
  double seconds = 0;
};

// Step time at `seq` extrapolated from `last`: full attention grows as S^2
// (an upper bound: the GEMMs grow as S); the hybrid modes by model FLOPs,
// linear in S except for the one global layer in six, whose quadratic share
// a plain linear extrapolation would miss at 128K.
double predicted_step_seconds(const Mode& mode, const Setup& s, const Last& last) {
  const double r = static_cast<double>(s.seq) / static_cast<double>(last.seq);
  if (!mode.hybrid) return last.seconds * r * r;
  const double f = nn::model_flops_per_token(s.model, s.moe, s.seq) * static_cast<double>(s.seq);
  const double f0 =
      nn::model_flops_per_token(s.model, s.moe, last.seq) * static_cast<double>(last.seq);
  return last.seconds * std::max(r, f / f0);
}

std::string describe_point(const Mode& mode, const Setup& s) {
  std::ostringstream os;
  os << "long_sequence/bench-moe/" << mode.name << "/s" << s.seq;
  return os.str();
}

void print_header() {
  std::printf("%-15s %7s %6s %5s %10s %9s %10s %10s %10s %6s %9s  %s\n", "mode", "seq", "chunk",
              "reps", "s/step", "us/token", "tokens/s", "peak_MB", "pred_MB", "ratio", "rss_MB",
              "note");
}

void print_line(const Mode& mode, const Setup& s, const Result& r, const std::string& note) {
  // A metric the point does not have (a skipped point's timings) prints as "-".
  auto cell = [&](const char* k, int digits) {
    const auto it = r.metrics.find(k);
    if (it == r.metrics.end()) return std::string("-");
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.*f", digits, it->second);
    return std::string(buf);
  };
  const auto reps = r.labels.find("repeats");
  std::printf("%-15s %7lld %6lld %5s %10s %9s %10s %10s %10s %6s %9s  %s\n", mode.name.c_str(),
              static_cast<long long>(s.seq), static_cast<long long>(s.chunk),
              reps == r.labels.end() ? "-" : reps->second.c_str(), cell("seconds", 3).c_str(),
              cell("us_per_token", 2).c_str(), cell("tokens_per_s", 1).c_str(),
              cell("peak_mb", 1).c_str(), cell("predicted_peak_mb", 1).c_str(),
              cell("predicted_over_measured", 3).c_str(), cell("rss_peak_mb", 1).c_str(),
              note.c_str());
  std::fflush(stdout);
}

// One point: predict, maybe skip, else measure; records its row. Returns
// the measured median step seconds (0 when skipped).
double bench_point(Runner& runner, const Mode& mode, const Setup& s, const Last& last) {
  const Options& o = runner.options();
  const planner::MemoryEstimate est = planner::estimate_memory(memory_inputs(s, runner.threads()));
  Result r;
  r.name = describe_point(mode, s);
  r.labels = {{"mode", mode.name},
              {"seq", std::to_string(s.seq)},
              {"micro_batch", "1"},
              {"chunk", std::to_string(s.chunk)},
              {"window", std::to_string(s.model.attention_window)},
              {"layer_pattern", s.model.attention_layer_pattern},
              {"recompute", nn::describe(s.recompute)},
              {"precision", "bf16 compute, fp32 master"},
              {"step", "forward+backward+adamw"}};
  r.metrics["predicted_peak_mb"] = static_cast<double>(est.total_peak) / 1e6;
  r.metrics["predicted_activation_mb"] =
      static_cast<double>(est.peak_of(MemTag::activations)) / 1e6;
  std::string skip;
  int reps = runner.quick() ? 1 : 3;
  if (static_cast<double>(est.total_peak) > o.long_seq.max_gb * 1e9) {
    char gb[32];  // decimal GB, the unit of --long-max-gb
    std::snprintf(gb, sizeof(gb), "%.2f", static_cast<double>(est.total_peak) / 1e9);
    skip = str_cat("predicted peak ", gb, " GB > --long-max-gb ", o.long_seq.max_gb);
  } else if (last.seq > 0) {
    const double t = predicted_step_seconds(mode, s, last);
    r.metrics["predicted_seconds"] = t;
    // Fewer timed repeats before giving up on the point.
    while (reps > 1 && (o.warmup + reps) * t > o.long_seq.max_seconds) --reps;
    if ((o.warmup + reps) * t > o.long_seq.max_seconds) {
      skip = str_cat("predicted ", static_cast<int64_t>(std::ceil((o.warmup + reps) * t)),
                     " s for ", o.warmup + reps, " steps > --long-max-seconds ",
                     o.long_seq.max_seconds, " (from S ", last.seq, ")");
    }
  }
  if (!skip.empty()) {
    r.labels["skipped"] = skip;
    print_line(mode, s, r, std::string("skipped: ").append(skip));
    runner.record(r);
    return 0;
  }
  Measured m;
  try {
    m = run_point(s, runner.threads(), o.warmup, reps);
  } catch (const Error& e) {
    // One failing point must not lose the rows of a long run: report it, go on.
    r.labels["error"] = e.what();
    print_line(mode, s, r, std::string("error: ").append(e.what()));
    runner.record(r);
    return 0;
  }
  const double secs = median(m.seconds);
  const auto tokens = static_cast<double>(s.seq);
  r.labels["repeats"] = std::to_string(reps);
  r.labels["warmup"] = std::to_string(o.warmup);
  r.metrics["seconds"] = secs;
  r.metrics["us_per_token"] = secs / tokens * 1e6;
  r.metrics["tokens_per_s"] = tokens / secs;
  r.metrics["model_gflops"] =
      tokens / secs * nn::model_flops_per_token(s.model, s.moe, s.seq) / 1e9;
  r.metrics["peak_mb"] = static_cast<double>(m.total_peak) / 1e6;
  r.metrics["activation_peak_mb"] = static_cast<double>(m.activation_peak) / 1e6;
  r.metrics["predicted_over_measured"] =
      static_cast<double>(est.total_peak) / static_cast<double>(m.total_peak);
  // Without the reset, VmHWM is the whole process's high-water mark.
  r.metrics["rss_peak_mb"] = m.rss_mb;
  r.labels["rss_peak"] = m.rss_reset ? "this point" : "process lifetime";
  print_line(mode, s, r, "");
  runner.record(r);
  return secs;
}

void bench_long_sequence(Runner& runner) {
  const Options& o = runner.options();
  MOETRON_CHECK(o.warmup >= 0, "--warmup must be >= 0, got ", o.warmup);
  MOETRON_CHECK(o.long_seq.chunk >= 1, "--long-chunk must be >= 1, got ", o.long_seq.chunk);
  MOETRON_CHECK(o.long_seq.window >= 1, "--long-window must be >= 1, got ", o.long_seq.window);
  std::vector<int64_t> seqs = o.long_seq.seqs;
  // Ascending, so each point's time guard extrapolates from a shorter one.
  std::sort(seqs.begin(), seqs.end());
  for (int64_t seq : seqs) {
    // The 16 global tokens must sit inside the sequence (attention.global_tokens < max_seq_len).
    MOETRON_CHECK(seq > 16, "--long-seqs: every length must be > 16, got ", seq);
  }
  std::vector<Mode> modes;  // all parsed first: a typo fails before hours of measuring
  for (const std::string& name : o.long_seq.modes) modes.push_back(parse_mode(name));
  std::printf("long_sequence: bench-moe, micro-batch 1, %d threads, warm-up %d\n", runner.threads(),
              o.warmup);
  print_header();
  for (const Mode& mode : modes) {
    Last last;
    for (int64_t seq : seqs) {
      const Setup s = setup_of(mode, seq, o.long_seq);
      const double secs = bench_point(runner, mode, s, last);
      if (secs > 0) last = {seq, secs};
    }
  }
}

}  // namespace

MOETRON_BENCH_OPT_IN("long_sequence", bench_long_sequence);

}  // namespace moetron::bench
