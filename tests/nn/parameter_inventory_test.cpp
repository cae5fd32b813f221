// The parameter inventory (predicted without allocating) against what the
// Transformer registers, field by field, on layouts that change it: tp
// (kv heads split and replicated), sequence parallelism, ep, pipeline
// chunks, tied embeddings, shared experts, bf16 gradients, and a dense model.
#include "moetron/nn/parameter_inventory.h"

#include <gtest/gtest.h>

#include "moetron/nn/transformer.h"

namespace moetron::nn {
namespace {

struct Case {
  const char* name;
  int64_t tp = 1, tp_rank = 0, ep = 1, ep_rank = 0;
  bool sp = false;
  PipelinePlace place = {};
  Precision prec = Precision::fp32();
  int64_t shared_experts = 0;
  int64_t num_experts = 4;
  bool tied = false;
};

ModelConfig model_of(const Case& c) {
  ModelConfig m;
  m.vocab_size = 64;
  m.d_model = 16;
  m.n_layers = 4;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 24;
  m.max_seq_len = 16;
  m.tie_embeddings = c.tied;
  return m;
}

MoeConfig moe_of(const Case& c) {
  MoeConfig e;
  e.num_experts = c.num_experts;
  e.top_k = c.num_experts > 0 ? 2 : 1;
  e.expert_hidden = 12;
  e.first_dense_layers = 1;
  e.shared_experts = c.shared_experts;
  e.shared_expert_hidden = 8;
  return e;
}

std::vector<Case> cases() {
  Precision bf16_grads = Precision::bf16();
  bf16_grads.bf16_matrix_grads = true;
  std::vector<Case> out = {
      {"one rank"},
      {"tp2 rank 1", 2, 1},
      {"tp4 rank 3 (kv heads replicated)", 4, 3},
      {"tp2 sp", 2, 0, 1, 0, true},
      {"ep2 rank 1", 1, 0, 2, 1},
      {"ep4 rank 2 tp2", 2, 1, 4, 2},
      {"shared experts tp2", 2, 1, 1, 0, false, {}, Precision::fp32(), 2},
      {"bf16 grads", 1, 0, 1, 0, false, {}, bf16_grads},
      {"dense model", 1, 0, 1, 0, false, {}, Precision::fp32(), 0, 0},
      {"tied embeddings", 1, 0, 1, 0, false, {}, Precision::fp32(), 0, 4, true},
  };
  Case first{"pipeline first stage"};
  first.place = {{{0, 2}}, true, false};
  Case middle{"pipeline interleaved chunks"};
  middle.place = {{{1, 2}, {3, 4}}, false, false};
  Case last{"pipeline last stage tp2 sp"};
  last.tp = 2;
  last.sp = true;
  last.place = {{{2, 4}}, false, true};
  out.insert(out.end(), {first, middle, last});
  return out;
}

TEST(ParameterInventory, EqualsWhatTheTransformerRegisters) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const ModelConfig m = model_of(c);
    const MoeConfig e = moe_of(c);
    TensorParallel tp{c.tp, c.tp_rank, c.sp, nullptr, nullptr};
    const Transformer model(m, e, c.prec, ExpertParallel{c.ep, c.ep_rank}, tp, c.place);
    const ParamInventory inv = parameter_inventory(m, e, c.prec, {c.ep, c.ep_rank}, tp, c.place);
    const std::vector<ParamInfo> built =
        describe_parameters(const_cast<Transformer&>(model).params());
    EXPECT_EQ(first_difference(inv.params, built), "");
    ASSERT_EQ(inv.params.size(), built.size());
    // Every byte the model allocated as parameters and gradients is in the buffers.
    int64_t values = 0, grads = 0;
    for (const auto& [n, dt] : inv.value_buffers)
      values += n * static_cast<int64_t>(dtype_size(dt));
    for (const auto& [n, dt] : inv.grad_buffers) grads += n * static_cast<int64_t>(dtype_size(dt));
    int64_t param_bytes = 0, grad_bytes = 0, routers = 0;
    for (const ParamInfo& p : built) {
      param_bytes += p.numel() * static_cast<int64_t>(dtype_size(p.value));
      grad_bytes += p.numel() * static_cast<int64_t>(dtype_size(p.grad));
      routers += p.name.find("block_sparse_moe.gate.weight") != std::string::npos;
    }
    // Beside the parameters: each MoE layer's fp32 selection bias.
    EXPECT_EQ(values, param_bytes + routers * c.num_experts * 4);
    EXPECT_EQ(grads, grad_bytes);
  }
}

TEST(ParameterInventory, NamesTheFirstDifference) {
  Case c{"tp2"};
  const ModelConfig m = model_of(c);
  const MoeConfig e = moe_of(c);
  TensorParallel tp{2, 0, false, nullptr, nullptr};
  std::vector<ParamInfo> a = parameter_inventory(m, e, Precision::fp32(), {}, tp, {}).params;
  std::vector<ParamInfo> b = a;
  b[3].shape = {4, 4};
  EXPECT_NE(first_difference(a, b).find("'" + a[3].name + "': shape"), std::string::npos)
      << first_difference(a, b);
  b = a;
  b[5].grad_partial_over_tp = !b[5].grad_partial_over_tp;
  EXPECT_NE(first_difference(a, b).find("grad_partial_over_tp"), std::string::npos);
  b = a;
  b[4].row0 += 1;
  EXPECT_NE(first_difference(a, b).find("shard"), std::string::npos);
  b = a;
  b.pop_back();
  EXPECT_NE(first_difference(a, b).find("parameters vs"), std::string::npos);
}

}  // namespace
}  // namespace moetron::nn
