// The memory model against the allocator: for combinations of recompute
// policy, precision, optimizer and micro-batch size, one real training step
// (forward, backward, optimizer) is measured by the allocator's per-tag peaks
// and compared with the prediction. Parameters, gradients and optimizer
// state must be exact; activations and the total peak within 10%.
#include "moetron/planner/memory_model.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdio>

#include "moetron/core/rng.h"
#include "moetron/kernels/matmul.h"
#include "moetron/nn/transformer.h"
#include "moetron/optim/optimizer.h"

namespace moetron::planner {
namespace {

struct Case {
  const char* name;
  const char* policy;
  std::vector<std::string> modules;
  nn::Precision prec;
  int64_t micro_batch;
  int64_t grad_accum = 1;
  const char* optimizer = "adamw";
  double capacity_factor = 0;
  DType moments = DType::f32;  // optim.moment_dtype
  int64_t seq_chunk = 0;       // train.seq_chunk
  DType masters = DType::f32;  // optim.master_dtype
  bool factored = false;       // optim.second_moment = "factored"
};

// train.grad_dtype = bf16: the hidden matrices' gradients in bf16.
nn::Precision bf16_grads() {
  nn::Precision p = nn::Precision::bf16();
  p.bf16_matrix_grads = true;
  return p;
}

MemoryInputs inputs_of(const Case& c) {
  MemoryInputs in;
  in.model.vocab_size = 512;
  in.model.d_model = 64;
  in.model.n_layers = 5;
  in.model.n_heads = 4;
  in.model.n_kv_heads = 2;
  in.model.ffn_hidden = 128;
  in.model.max_seq_len = 128;
  in.moe.num_experts = 4;
  in.moe.top_k = 2;
  in.moe.expert_hidden = 96;
  in.moe.first_dense_layers = 1;
  in.moe.shared_experts = 1;
  in.moe.shared_expert_hidden = 64;
  in.moe.capacity_factor = c.capacity_factor;
  in.precision = c.prec;
  in.optimizer = c.optimizer;
  in.recompute = nn::make_recompute_policy(c.policy, c.modules, in.model.n_layers);
  in.micro_batch = c.micro_batch;
  in.seq_len = 96;
  in.grad_accum = c.grad_accum;
  in.seq_chunk = c.seq_chunk;
  in.ce_chunk_tokens = 128;
  in.matrix_grad = c.prec.matrix_grad();
  in.moment_dtype = c.moments;
  in.master_dtype = c.masters;
  in.factored_second_moment = c.factored;
  in.widened_bf16_gemm = kernels::cpu_widens_bf16_matmul();
  return in;
}

struct Measured {
  MemStats peak;
};

// One training step measured from a clean allocator: per-tag peaks above
// what was held before.
MemStats measure(const MemoryInputs& in) {
  Allocator& alloc = cpu_allocator();
  alloc.release_cached();
  const MemStats before = alloc.stats();
  alloc.reset_peaks();
  {
    kernels::Context ctx(kernels::Backend::cpu, static_cast<int>(in.threads));
    nn::Transformer model(in.model, in.moe, in.precision);
    model.initialize(7);
    model.set_recompute(in.recompute);
    model.ce_chunk_tokens = in.ce_chunk_tokens;
    model.set_sequence_chunk(in.seq_chunk);
    optim::OptimizerOptions oo;
    oo.name = in.optimizer;
    oo.moment_dtype = in.moment_dtype;
    oo.master_dtype = in.master_dtype;
    oo.factored_second_moment = in.factored_second_moment;
    oo.schedule = {1e-3, 0.1, 0, 10};
    optim::Optimizer opt(model.params(), oo);
    std::vector<Tensor> ins, tgts;
    PhiloxStream rng(9, "tokens");
    for (int64_t m = 0; m < in.grad_accum; ++m) {
      ins.push_back(Tensor::empty({in.micro_batch, in.seq_len}, DType::i32));
      tgts.push_back(Tensor::empty({in.micro_batch, in.seq_len}, DType::i32));
      for (int64_t i = 0; i < in.micro_batch * in.seq_len; ++i) {
        ins.back().data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % in.model.vocab_size);
        tgts.back().data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % in.model.vocab_size);
      }
    }
    model.params().zero_grads();
    const double tokens = static_cast<double>(in.micro_batch * in.seq_len * in.grad_accum);
    for (int64_t m = 0; m < in.grad_accum; ++m) {
      model.forward_backward(ctx, ins[static_cast<size_t>(m)], tgts[static_cast<size_t>(m)],
                             1.0 / tokens, 1.0 / static_cast<double>(in.grad_accum), true);
    }
    opt.step(ctx, 1);
  }
  MemStats s = alloc.stats();
  for (int t = 0; t < kNumMemTags; ++t)
    s.peak[static_cast<size_t>(t)] -= before.current[static_cast<size_t>(t)];
  s.total_peak -= before.total_current;
  return s;
}

double rel(int64_t predicted, int64_t measured) {
  return static_cast<double>(predicted - measured) /
         static_cast<double>(std::max<int64_t>(measured, 1));
}

TEST(MemoryModel, PredictsTheAllocatorsPeakWithinTenPercent) {
  const std::vector<Case> cases = {
      {"none fp32 mb2", "none", {}, nn::Precision::fp32(), 2},
      {"none bf16 mb4", "none", {}, nn::Precision::bf16(), 4},
      {"selective bf16 mb2", "selective", {}, nn::Precision::bf16(), 2},
      {"selective fp32 mb2 capacity 1.25",
       "selective",
       {},
       nn::Precision::fp32(),
       2,
       1,
       "adamw",
       1.25},
      {"full bf16 mb4", "full", {}, nn::Precision::bf16(), 4},
      {"full fp32 mb1 accum 3", "full", {}, nn::Precision::fp32(), 1, 3},
      {"sqrt fp32 mb2", "sqrt", {}, nn::Precision::fp32(), 2},
      {"sqrt bf16 mb3 muon", "sqrt", {}, nn::Precision::bf16(), 3, 1, "muon"},
      {"custom norm+moe_act bf16 mb2", "custom", {"norm", "moe_act"}, nn::Precision::bf16(), 2},
      // The projections and the residual rebuilt, the expert outputs not kept;
      // then the residual rebuilt through a dropped core, q, k, v and input.
      {"custom attn_q+kv+residual+moe_out bf16",
       "custom",
       {"attn_q", "attn_kv", "attn_residual", "moe_out"},
       nn::Precision::bf16(),
       2},
      {"custom core+q+kv+residual+norm fp32",
       "custom",
       {"attn_core", "attn_q", "attn_kv", "attn_residual", "norm"},
       nn::Precision::fp32(),
       2},
      {"none bf16 grads mb2", "none", {}, bf16_grads(), 2},
      {"selective bf16 moments mb2",
       "selective",
       {},
       nn::Precision::bf16(),
       2,
       1,
       "adamw",
       0,
       DType::bf16},
      {"full bf16 grads+moments mb2 accum 2",
       "full",
       {},
       bf16_grads(),
       2,
       2,
       "adamw",
       0,
       DType::bf16},
      {"sqrt bf16 grads+moments mb2 muon", "sqrt", {}, bf16_grads(), 2, 1, "muon", 0, DType::bf16},
      // Chunked sequences: 96 positions in chunks of 32, and of 40 (40, 40, 16).
      {"none fp32 mb2 chunk 32",
       "none",
       {},
       nn::Precision::fp32(),
       2,
       1,
       "adamw",
       0,
       DType::f32,
       32},
      {"full bf16 mb2 chunk 40",
       "full",
       {},
       nn::Precision::bf16(),
       2,
       1,
       "adamw",
       0,
       DType::f32,
       40},
      {"selective bf16 mb1 accum 2 chunk 24",
       "selective",
       {},
       nn::Precision::bf16(),
       1,
       2,
       "adamw",
       0,
       DType::f32,
       24},
      // bf16 masters: the bf16 working copies are their own masters.
      {"none bf16 grads+moments+masters mb2",
       "none",
       {},
       bf16_grads(),
       2,
       1,
       "adamw",
       0,
       DType::bf16,
       0,
       DType::bf16},
      {"selective bf16 int8 moments+masters mb2",
       "selective",
       {},
       nn::Precision::bf16(),
       2,
       1,
       "adamw",
       0,
       DType::u8,
       0,
       DType::bf16},
      {"full fp32 int8 moments mb2 muon",
       "full",
       {},
       nn::Precision::fp32(),
       2,
       1,
       "muon",
       0,
       DType::u8},
      {"full bf16 int8 factored moments+masters mb2",
       "full",
       {},
       bf16_grads(),
       2,
       1,
       "adamw",
       0,
       DType::u8,
       0,
       DType::bf16,
       true},
      {"sqrt bf16 masters mb2 muon",
       "sqrt",
       {},
       nn::Precision::bf16(),
       2,
       1,
       "muon",
       0,
       DType::f32,
       0,
       DType::bf16},
  };
  std::printf("%-34s %12s %12s %7s %12s %12s %7s %10s %10s\n", "case", "act pred", "act meas",
              "err", "total pred", "total meas", "err", "ws pred", "ws meas");
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    MemoryInputs in = inputs_of(c);
    in.threads = omp_get_max_threads();
    const MemoryEstimate est = estimate_memory(in);
    const MemStats got = measure(in);
    for (MemTag t : {MemTag::params, MemTag::grads, MemTag::optimizer}) {
      EXPECT_EQ(est.peak_of(t), got.peak[static_cast<size_t>(t)]) << mem_tag_name(t);
    }
    const int64_t act = got.peak[static_cast<size_t>(MemTag::activations)];
    const int64_t ws = got.peak[static_cast<size_t>(MemTag::workspace)];
    EXPECT_LE(std::abs(rel(est.peak_of(MemTag::activations), act)), 0.10);
    EXPECT_LE(std::abs(rel(est.total_peak, got.total_peak)), 0.10);
    std::printf("%-34s %12lld %12lld %+6.1f%% %12lld %12lld %+6.1f%% %10lld %10lld\n", c.name,
                static_cast<long long>(est.peak_of(MemTag::activations)),
                static_cast<long long>(act), 100 * rel(est.peak_of(MemTag::activations), act),
                static_cast<long long>(est.total_peak), static_cast<long long>(got.total_peak),
                100 * rel(est.total_peak, got.total_peak),
                static_cast<long long>(est.peak_of(MemTag::workspace)), static_cast<long long>(ws));
  }
}

TEST(MemoryModel, ZeroOneSplitsTheOptimizerStateOverDataParallelRanks) {
  MemoryInputs in = inputs_of({"", "none", {}, nn::Precision::bf16(), 2});
  const MemoryEstimate one = estimate_memory(in);
  EXPECT_EQ(one.peak_of(MemTag::comm), 0);  // one rank reduces nothing
  in.layout.dp = 4;
  const MemoryEstimate dp = estimate_memory(in);
  // Plain dp replicates everything and adds the reducer's fp32 buckets and
  // the all-reduce's send copies of them: two fp32 copies of every gradient
  // (each bucket padded to a multiple of 4).
  for (MemTag t :
       {MemTag::params, MemTag::grads, MemTag::optimizer, MemTag::activations, MemTag::workspace}) {
    EXPECT_EQ(dp.peak_of(t), one.peak_of(t)) << mem_tag_name(t);
  }
  EXPECT_GE(dp.peak_of(MemTag::comm), 8 * one.param_count);
  EXPECT_LE(dp.peak_of(MemTag::comm), 8 * one.param_count + 64 * 80);
  in.layout.zero1 = true;
  const MemoryEstimate z = estimate_memory(in);
  EXPECT_EQ(z.peak_of(MemTag::params), one.peak_of(MemTag::params));
  EXPECT_EQ(z.peak_of(MemTag::grads), one.peak_of(MemTag::grads));
  EXPECT_EQ(z.peak_of(MemTag::activations), one.peak_of(MemTag::activations));
  // ZeRO-1: fp32 master + 2 moments for every element, split 4 ways (to the
  // padding and 64-byte rounding of each bucket's chunk).
  EXPECT_NEAR(static_cast<double>(z.peak_of(MemTag::optimizer)),
              12.0 * static_cast<double>(one.param_count) / 4,
              0.01 * 12.0 * static_cast<double>(one.param_count) / 4);
  EXPECT_GT(one.peak_of(MemTag::optimizer), 8 * one.param_count);
  EXPECT_LE(one.peak_of(MemTag::optimizer), 12 * one.param_count + 64 * 3 * 200);
  in.layout.cp = 3;  // 2 * 3 chunks do not split a sequence of 32
  in.seq_len = 32;
  EXPECT_THROW(estimate_memory(in), Error);
}

TEST(MemoryModel, LargestFittingMicroBatchIsTheLastThatFits) {
  MemoryInputs in = inputs_of({"", "full", {}, nn::Precision::bf16(), 1});
  in.micro_batch = 8;
  const int64_t budget = estimate_memory(in).total_peak;
  EXPECT_EQ(largest_fitting_micro_batch(in, budget), 8);
  EXPECT_EQ(largest_fitting_micro_batch(in, budget - 1), 7);
  EXPECT_EQ(largest_fitting_micro_batch(in, 1000), 0);
}

TEST(MemoryModel, ParsesAndFormatsSizes) {
  EXPECT_EQ(parse_bytes("24GiB", "x"), int64_t{24} << 30);
  EXPECT_EQ(parse_bytes("512MB", "x"), 512000000);
  EXPECT_EQ(parse_bytes("1.5G", "x"), int64_t{3} << 29);
  EXPECT_EQ(parse_bytes("4096", "x"), 4096);
  EXPECT_THROW(parse_bytes("12 apples", "--memory-budget"), Error);
  EXPECT_THROW(parse_bytes("lots", "--memory-budget"), Error);
  EXPECT_EQ(format_bytes(3 << 20), "3.00 MiB");
  EXPECT_GT(available_memory_bytes(), 0);
}

}  // namespace
}  // namespace moetron::planner
