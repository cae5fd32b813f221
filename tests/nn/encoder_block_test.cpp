// Block options for encoders: non-causal attention lets a later token change
// an earlier token's output (causal does not), RoPE off, and the parameter
// names of encoder blocks and of the language model (unchanged).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "moetron/nn/block.h"
#include "moetron/nn/transformer.h"
#include "util/test_util.h"

namespace moetron::nn {
namespace {

ModelConfig tiny() {
  ModelConfig m;
  m.vocab_size = 11;
  m.d_model = 8;
  m.n_layers = 1;
  m.n_heads = 2;
  m.n_kv_heads = 2;
  m.ffn_hidden = 12;
  m.init_std = 0.3;
  return m;
}

MoeConfig dense() {
  MoeConfig e;
  e.num_experts = 0;
  return e;
}

// Row 0 of a block's output over 5 tokens, with the last token's input set to `last`.
std::vector<double> first_row_output(Block& blk, double last) {
  kernels::Context ref(kernels::Backend::reference);
  Tensor x = test::random_tensor({5, 8}, DType::f64, "x");
  for (int64_t j = 0; j < 8; ++j) x.data<double>()[4 * 8 + j] = last;
  Tensor pos = Tensor::empty({5}, DType::i32);
  for (int32_t i = 0; i < 5; ++i) pos.data<int32_t>()[i] = i;
  MoeStats unused;
  const Tensor y = blk.forward(ref, x, pos, 1, 5, 0.0, unused);
  blk.release();
  return {y.data<double>(), y.data<double>() + 8};
}

TEST(EncoderBlock, NonCausalAttentionLetsALaterTokenChangeAnEarlierOne) {
  for (const bool causal : {true, false}) {
    ParameterSet params;
    BlockOptions opt;
    opt.layers_prefix = "enc.layers.";
    opt.causal = causal;
    opt.rope = false;
    Block blk(tiny(), dense(), 0, Precision::fp64(), params, {}, nullptr, opt);
    params.initialize(5);
    EXPECT_EQ(blk.attention().mask().causal, causal);
    const bool changes = first_row_output(blk, 0.5) != first_row_output(blk, -0.7);
    EXPECT_EQ(changes, !causal) << (causal ? "causal" : "non-causal");
  }
}

TEST(EncoderBlock, WithoutRopeTheOutputIgnoresPositions) {
  // Non-causal, RoPE off: permuting the tokens permutes the outputs.
  ParameterSet params;
  BlockOptions opt;
  opt.causal = false;
  opt.rope = false;
  Block blk(tiny(), dense(), 0, Precision::fp64(), params, {}, nullptr, opt);
  params.initialize(6);
  kernels::Context ref(kernels::Backend::reference);
  const Tensor x = test::random_tensor({3, 8}, DType::f64, "x");
  Tensor swapped = x.clone();
  swapped[0].copy_from(x[2]);
  swapped[2].copy_from(x[0]);
  Tensor pos = Tensor::empty({3}, DType::i32);
  for (int32_t i = 0; i < 3; ++i) pos.data<int32_t>()[i] = i;
  MoeStats unused;
  const Tensor a = blk.forward(ref, x, pos, 1, 3, 0.0, unused).clone();
  const Tensor b = blk.forward(ref, swapped, pos, 1, 3, 0.0, unused);
  EXPECT_TRUE(test::all_close(b[0], a[2], {1e-12, 1e-12}));
  EXPECT_TRUE(test::all_close(b[2], a[0], {1e-12, 1e-12}));
  EXPECT_TRUE(test::all_close(b[1], a[1], {1e-12, 1e-12}));
}

std::vector<std::string> names(const ParameterSet& ps) {
  std::vector<std::string> v;
  for (const auto& p : ps.all()) v.push_back(p->name);
  return v;
}

TEST(EncoderBlock, ParameterNamesFollowThePrefixAndTheModelKeepsItsNames) {
  ModelConfig m = tiny();
  m.n_layers = 2;
  Transformer lm(m, dense(), Precision::fp32());
  const std::vector<std::string> expected = {"model.embed_tokens.weight",
                                             "model.layers.0.input_layernorm.weight",
                                             "model.layers.0.post_attention_layernorm.weight",
                                             "model.layers.0.self_attn.q_proj.weight",
                                             "model.layers.0.self_attn.k_proj.weight",
                                             "model.layers.0.self_attn.v_proj.weight",
                                             "model.layers.0.self_attn.o_proj.weight",
                                             "model.layers.0.mlp.gate_proj.weight",
                                             "model.layers.0.mlp.up_proj.weight",
                                             "model.layers.0.mlp.down_proj.weight"};
  const std::vector<std::string> got = names(lm.params());
  ASSERT_GE(got.size(), expected.size());
  EXPECT_EQ(std::vector<std::string>(got.begin(), got.begin() + 10), expected);
  EXPECT_NE(lm.params().find("model.layers.1.mlp.down_proj.weight"), nullptr);
  EXPECT_NE(lm.params().find("model.norm.weight"), nullptr);
  EXPECT_NE(lm.params().find("lm_head.weight"), nullptr);

  ParameterSet ps;
  BlockOptions opt;
  opt.layers_prefix = "vision.layers.";
  Block blk(tiny(), dense(), 3, Precision::fp32(), ps, {}, nullptr, opt);
  for (const std::string& n : names(ps)) EXPECT_EQ(n.rfind("vision.layers.3.", 0), 0u) << n;
  EXPECT_NE(ps.find("vision.layers.3.self_attn.q_proj.weight"), nullptr);
  EXPECT_NE(ps.find("vision.layers.3.mlp.down_proj.weight"), nullptr);
}

}  // namespace
}  // namespace moetron::nn
