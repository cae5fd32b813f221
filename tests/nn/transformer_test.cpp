// Whole-model gradient checks: the fp64 reference model against finite
// differences (balancing losses included), the CPU fp32 model against the
// reference, and micro-batch accumulation against one batch.
#include "moetron/nn/transformer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/kernels/elementwise.h"
#include "util/test_util.h"

namespace moetron::nn {
namespace {

ModelConfig tiny_model() {
  ModelConfig m;
  m.vocab_size = 11;
  m.d_model = 8;
  m.n_layers = 2;
  m.n_heads = 2;
  m.n_kv_heads = 1;
  m.ffn_hidden = 10;
  m.max_seq_len = 8;
  m.init_std = 0.3;  // large enough that every gradient is well above FD noise
  return m;
}

MoeConfig tiny_moe() {
  MoeConfig e;
  e.num_experts = 4;
  e.top_k = 2;
  e.expert_hidden = 6;
  e.first_dense_layers = 1;
  e.shared_experts = 1;
  e.shared_expert_hidden = 5;
  e.aux_loss_coef = 0.05;
  e.z_loss_coef = 0.01;
  return e;
}

void fill_tokens(const Tensor& t, uint32_t seed, int64_t vocab) {
  PhiloxStream rng(seed, "tokens");
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % vocab);
}

double total_loss(kernels::Context& ctx, Transformer& model, const Tensor& in, const Tensor& tgt,
                  double scale) {
  const LossStats st = model.forward_backward(ctx, in, tgt, scale, 1.0, false);
  return scale * st.ce_sum + st.aux_loss + st.z_loss;
}

TEST(Transformer, ReferenceGradientsMatchFiniteDifferences) {
  for (const char* score : {"softmax", "sigmoid"}) {
    kernels::Context ref(kernels::Backend::reference);
    MoeConfig moe = tiny_moe();
    moe.router_score = score;
    Transformer model(tiny_model(), moe, Precision::fp64());
    model.initialize(3);
    Tensor in = Tensor::empty({2, 5}, DType::i32), tgt = Tensor::empty({2, 5}, DType::i32);
    fill_tokens(in, 1, 11);
    fill_tokens(tgt, 2, 11);
    tgt.data<int32_t>()[3] = -1;  // an ignored target
    const double scale = 1.0 / 9.0;
    model.params().zero_grads();
    model.forward_backward(ref, in, tgt, scale, 1.0, true);
    for (const auto& p : model.params().all()) {
      SCOPED_TRACE(p->name + " (" + score + ")");
      EXPECT_TRUE(test::finite_difference_check(
          [&] { return total_loss(ref, model, in, tgt, scale); }, p->value, p->grad, 1e-6, 2e-5));
    }
  }
}

TEST(Transformer, TiedEmbeddingGradientMatchesFiniteDifferences) {
  // One matrix serves as embedding and LM head: both uses add into its gradient.
  kernels::Context ref(kernels::Backend::reference);
  ModelConfig m = tiny_model();
  m.tie_embeddings = true;
  Transformer model(m, tiny_moe(), Precision::fp64());
  model.initialize(4);
  EXPECT_THROW(model.params().get("lm_head.weight"), Error);
  Tensor in = Tensor::empty({2, 5}, DType::i32), tgt = Tensor::empty({2, 5}, DType::i32);
  fill_tokens(in, 7, 11);
  fill_tokens(tgt, 8, 11);
  model.params().zero_grads();
  model.forward_backward(ref, in, tgt, 0.1, 1.0, true);
  Parameter& e = model.params().get("model.embed_tokens.weight");
  EXPECT_TRUE(test::finite_difference_check([&] { return total_loss(ref, model, in, tgt, 0.1); },
                                            e.value, e.grad, 1e-6, 2e-5));
}

// A hybrid model: layer 0 local (window 3, two global tokens), layer 1 full.
ModelConfig hybrid_model() {
  ModelConfig m = tiny_model();
  m.attention_window = 3;
  m.attention_global_tokens = 2;
  m.attention_layer_pattern = "LG";
  return m;
}

TEST(Transformer, HybridAttentionGradientsMatchFiniteDifferences) {
  // Through a local and a global layer, on sequences longer than the window.
  kernels::Context ref(kernels::Backend::reference);
  Transformer model(hybrid_model(), tiny_moe(), Precision::fp64());
  model.initialize(6);
  Tensor in = Tensor::empty({2, 7}, DType::i32), tgt = Tensor::empty({2, 7}, DType::i32);
  fill_tokens(in, 11, 11);
  fill_tokens(tgt, 12, 11);
  model.params().zero_grads();
  model.forward_backward(ref, in, tgt, 1.0 / 14, 1.0, true);
  for (const auto& p : model.params().all()) {
    SCOPED_TRACE(p->name);
    EXPECT_TRUE(test::finite_difference_check(
        [&] { return total_loss(ref, model, in, tgt, 1.0 / 14); }, p->value, p->grad, 1e-6, 2e-5));
  }
}

// The last position's logits of a one-layer model on `tokens`, with token 0
// replaced by `first`.
std::vector<double> last_logits_with_first(Transformer& model, std::vector<int32_t> tokens,
                                           int32_t first) {
  kernels::Context ref(kernels::Backend::reference);
  tokens[0] = first;
  Tensor in = Tensor::empty({1, static_cast<int64_t>(tokens.size())}, DType::i32);
  std::copy(tokens.begin(), tokens.end(), in.data<int32_t>());
  const Tensor logits = model.last_logits(ref, in);
  return {logits.data<double>(), logits.data<double>() + logits.numel()};
}

TEST(Transformer, ALocalLayerSeesOnlyItsWindowAndTheGlobalTokens) {
  // One layer, window 3, 8 tokens: the last position sees positions 5..7,
  // so token 0 cannot change its logits, unless it is a global token or the
  // layer is full causal.
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8};
  const auto changes_last = [&](int64_t window, int64_t global) {
    ModelConfig m = tiny_model();
    m.n_layers = 1;
    m.attention_window = window;
    m.attention_global_tokens = global;
    MoeConfig dense;
    dense.num_experts = 0;
    Transformer model(m, dense, Precision::fp64());
    model.initialize(7);
    return last_logits_with_first(model, tokens, 1) != last_logits_with_first(model, tokens, 9);
  };
  EXPECT_FALSE(changes_last(3, 0));
  EXPECT_TRUE(changes_last(3, 1));
  EXPECT_TRUE(changes_last(8, 0));  // the window reaches position 0
  EXPECT_TRUE(changes_last(0, 0));  // full causal
}

TEST(Transformer, CpuHybridAttentionMatchesReference) {
  // Sequences over several 64-key tiles, so the CPU kernel skips tiles
  // outside the window and masks the boundary ones.
  kernels::Context ref(kernels::Backend::reference), cpu(kernels::Backend::cpu);
  ModelConfig m = hybrid_model();
  m.d_model = 32;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.max_seq_len = 160;
  m.init_std = 0.1;
  m.attention_window = 37;
  m.attention_global_tokens = 5;
  Transformer a(m, tiny_moe(), Precision::fp64()), b(m, tiny_moe(), Precision::fp32());
  a.initialize(8);
  b.initialize(8);
  Tensor in = Tensor::empty({2, 150}, DType::i32), tgt = Tensor::empty({2, 150}, DType::i32);
  fill_tokens(in, 13, m.vocab_size);
  fill_tokens(tgt, 14, m.vocab_size);
  a.params().zero_grads();
  b.params().zero_grads();
  const LossStats la = a.forward_backward(ref, in, tgt, 1.0 / 300, 1.0, true);
  const LossStats lb = b.forward_backward(cpu, in, tgt, 1.0 / 300, 1.0, true);
  EXPECT_NEAR(lb.ce_sum, la.ce_sum, 1e-5 * la.ce_sum);
  for (size_t i = 0; i < a.params().all().size(); ++i) {
    const auto& pa = a.params().all()[i];
    EXPECT_TRUE(test::normalized_close(b.params().all()[i]->grad, pa->grad, 1e-4)) << pa->name;
  }
}

TEST(Transformer, APackedBatchEqualsItsDocumentsRunOneByOne) {
  // Token 0 ends a document. Row 0: documents of 3, 4 and 2 tokens; row 1:
  // 1, 6 and 2. Routing without balancing losses is per token, so the summed
  // cross-entropy and every gradient must equal those of the nine documents
  // run as sequences of their own, under full and hybrid attention.
  const std::vector<std::vector<int32_t>> rows = {{5, 3, 0, 7, 2, 9, 0, 4, 6},
                                                  {0, 8, 1, 3, 10, 2, 0, 5, 1}};
  for (const bool hybrid : {false, true}) {
    SCOPED_TRACE(hybrid ? "hybrid" : "full");
    ModelConfig m = hybrid ? hybrid_model() : tiny_model();
    m.max_seq_len = 9;
    m.attention_window = hybrid ? 2 : 0;
    m.attention_global_tokens = hybrid ? 1 : 0;
    MoeConfig e = tiny_moe();
    e.aux_loss_coef = e.z_loss_coef = 0;
    kernels::Context ref(kernels::Backend::reference);
    Transformer packed(m, e, Precision::fp64()), alone(m, e, Precision::fp64());
    packed.initialize(9);
    alone.initialize(9);
    packed.set_document_separator(0);
    Tensor in = Tensor::empty({2, 9}, DType::i32), tgt = Tensor::empty({2, 9}, DType::i32);
    for (int64_t r = 0; r < 2; ++r)
      std::copy(rows[r].begin(), rows[r].end(), in[r].data<int32_t>());
    fill_tokens(tgt, 15, m.vocab_size);
    const double scale = 1.0 / 18;
    packed.params().zero_grads();
    const LossStats lp = packed.forward_backward(ref, in, tgt, scale, 1.0, true);
    alone.params().zero_grads();
    double ce = 0;
    for (int64_t r = 0; r < 2; ++r) {
      int64_t start = 0;
      for (int64_t p = 0; p < 9; ++p) {
        if (p + 1 < 9 && rows[r][p] != 0) continue;
        const int64_t n = p + 1 - start;
        Tensor di = Tensor::empty({1, n}, DType::i32), dt = Tensor::empty({1, n}, DType::i32);
        for (int64_t i = 0; i < n; ++i) {
          di.data<int32_t>()[i] = rows[r][start + i];
          dt.data<int32_t>()[i] = tgt.data<int32_t>()[r * 9 + start + i];
        }
        ce += alone.forward_backward(ref, di, dt, scale, 1.0, true).ce_sum;
        start = p + 1;
      }
    }
    EXPECT_NEAR(lp.ce_sum, ce, 1e-12 * ce);
    for (size_t i = 0; i < packed.params().all().size(); ++i) {
      const auto& pa = alone.params().all()[i];
      EXPECT_TRUE(test::normalized_close(packed.params().all()[i]->grad, pa->grad, 1e-12))
          << pa->name;
    }
  }
}

TEST(Transformer, CpuFp32GradientsMatchReference) {
  kernels::Context ref(kernels::Backend::reference), cpu(kernels::Backend::cpu);
  ModelConfig m = tiny_model();
  m.d_model = 32;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.max_seq_len = 16;
  m.init_std = 0.1;
  MoeConfig e = tiny_moe();
  e.expert_hidden = 24;
  Transformer a(m, e, Precision::fp64()), b(m, e, Precision::fp32());
  a.initialize(5);
  b.initialize(5);
  Tensor in = Tensor::empty({3, 13}, DType::i32), tgt = Tensor::empty({3, 13}, DType::i32);
  fill_tokens(in, 3, m.vocab_size);
  fill_tokens(tgt, 4, m.vocab_size);
  a.params().zero_grads();
  b.params().zero_grads();
  const LossStats la = a.forward_backward(ref, in, tgt, 1.0 / 39, 1.0, true);
  const LossStats lb = b.forward_backward(cpu, in, tgt, 1.0 / 39, 1.0, true);
  EXPECT_NEAR(lb.ce_sum, la.ce_sum, 1e-5 * la.ce_sum);
  EXPECT_NEAR(lb.aux_loss, la.aux_loss, 1e-5);
  EXPECT_NEAR(lb.z_loss, la.z_loss, 1e-6);
  for (size_t i = 0; i < a.params().all().size(); ++i) {
    const auto& pa = a.params().all()[i];
    const auto& pb = b.params().all()[i];
    ASSERT_EQ(pa->name, pb->name);
    // fp32 accumulation over a few hundred terms against fp64: ~1e-6 relative;
    // 1e-4 leaves room for the fp32 rounding of the parameters themselves.
    EXPECT_TRUE(test::normalized_close(pb->grad, pa->grad, 1e-4)) << pa->name;
  }
}

TEST(Transformer, CpuFp16GradientsMatchReference) {
  // fp16 storage (11 significant bits, one rounding ~4.9e-4 relative) of
  // every activation and gradient along 4 layers: the gradients agree with
  // fp64 to ~1e-2 of their scale, the loss to a few 1e-3. Every expert is
  // chosen (top_k = E) so that no rounding can flip a discrete routing
  // choice, which would make one expert's gradient incomparable.
  kernels::Context ref(kernels::Backend::reference), cpu(kernels::Backend::cpu);
  ModelConfig m = tiny_model();
  m.d_model = 32;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.n_layers = 4;
  m.max_seq_len = 16;
  m.init_std = 0.1;
  MoeConfig e = tiny_moe();
  e.expert_hidden = 24;
  e.top_k = e.num_experts;
  Transformer a(m, e, Precision::fp64()), b(m, e, Precision::fp16());
  a.initialize(5);
  b.initialize(5);
  // Same starting weights: the fp64 model takes the fp16-rounded values.
  for (size_t i = 0; i < a.params().all().size(); ++i) {
    kernels::convert(ref, b.params().all()[i]->value, a.params().all()[i]->value);
  }
  Tensor in = Tensor::empty({3, 13}, DType::i32), tgt = Tensor::empty({3, 13}, DType::i32);
  fill_tokens(in, 3, m.vocab_size);
  fill_tokens(tgt, 4, m.vocab_size);
  a.params().zero_grads();
  b.params().zero_grads();
  const double scale = 1024.0 / 39;  // a loss scale keeps fp16 gradients out of the subnormals
  const LossStats la = a.forward_backward(ref, in, tgt, scale, 1024.0, true);
  const LossStats lb = b.forward_backward(cpu, in, tgt, scale, 1024.0, true);
  EXPECT_NEAR(lb.ce_sum, la.ce_sum, 3e-3 * la.ce_sum);
  double worst = 0;
  std::string worst_name;
  for (size_t i = 0; i < a.params().all().size(); ++i) {
    const double err =
        test::max_normalized_error(b.params().all()[i]->grad, a.params().all()[i]->grad);
    if (err > worst) {
      worst = err;
      worst_name = a.params().all()[i]->name;
    }
  }
  EXPECT_LT(worst, 1e-2) << worst_name;
  std::printf("fp16 vs fp64: worst normalised gradient error %.3g (%s)\n", worst,
              worst_name.c_str());
}

TEST(Transformer, AccumulatedMicroBatchesEqualOneBatch) {
  // Four micro-batches with different numbers of counted tokens, normalised
  // by the step's total, must give the gradient of one batch of all of them.
  // The balancing losses are per micro-batch statistics by definition (their
  // value depends on which tokens share a batch), so they are off here.
  kernels::Context cpu(kernels::Backend::cpu);
  ModelConfig m = tiny_model();
  m.d_model = 16;
  MoeConfig e = tiny_moe();
  e.aux_loss_coef = 0;
  e.z_loss_coef = 0;
  Transformer acc(m, e, Precision::fp32()), one(m, e, Precision::fp32());
  acc.initialize(9);
  one.initialize(9);
  const int64_t s = 6;
  Tensor all_in = Tensor::empty({8, s}, DType::i32), all_tgt = Tensor::empty({8, s}, DType::i32);
  fill_tokens(all_in, 5, m.vocab_size);
  fill_tokens(all_tgt, 6, m.vocab_size);
  // Micro-batch j (rows 2j, 2j+1) ignores j*2 targets: 12, 10, 8, 6 counted tokens.
  for (int j = 0; j < 4; ++j)
    for (int i = 0; i < 2 * j; ++i) all_tgt.data<int32_t>()[2 * j * s + i] = -1;
  const int64_t total = 12 + 10 + 8 + 6;
  acc.params().zero_grads();
  one.params().zero_grads();
  double ce_acc = 0;
  for (int j = 0; j < 4; ++j) {
    const LossStats st =
        acc.forward_backward(cpu, all_in.slice(2 * j, 2 * j + 2), all_tgt.slice(2 * j, 2 * j + 2),
                             1.0 / total, 0.0, true);
    ce_acc += st.ce_sum;
  }
  const LossStats st = one.forward_backward(cpu, all_in, all_tgt, 1.0 / total, 1.0, true);
  EXPECT_EQ(st.tokens, total);
  EXPECT_NEAR(ce_acc, st.ce_sum, 1e-6 * st.ce_sum);
  for (size_t i = 0; i < acc.params().all().size(); ++i) {
    EXPECT_TRUE(
        test::normalized_close(acc.params().all()[i]->grad, one.params().all()[i]->grad, 1e-6))
        << acc.params().all()[i]->name;
  }
}

TEST(Transformer, ParameterNamesFollowHuggingFaceMixtral) {
  Transformer model(tiny_model(), tiny_moe(), Precision::fp32());
  auto& ps = model.params();
  EXPECT_NO_THROW(ps.get("model.embed_tokens.weight"));
  EXPECT_NO_THROW(ps.get("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_NO_THROW(ps.get("model.layers.1.self_attn.k_proj.weight"));
  EXPECT_NO_THROW(ps.get("model.layers.1.block_sparse_moe.gate.weight"));
  EXPECT_EQ(ps.get("model.layers.1.block_sparse_moe.experts.3.w2.weight").value.shape(),
            Shape({8, 6}));
  EXPECT_EQ(ps.get("model.layers.1.block_sparse_moe.experts.0.w1.weight").value.shape(),
            Shape({6, 8}));
  EXPECT_EQ(ps.get("model.layers.1.self_attn.k_proj.weight").value.shape(), Shape({4, 8}));
  EXPECT_NO_THROW(ps.get("model.norm.weight"));
  EXPECT_NO_THROW(ps.get("lm_head.weight"));
}

}  // namespace
}  // namespace moetron::nn
