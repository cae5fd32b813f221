// The language model with media prefixes (nn/media_fusion.h), gated
// cross-attention layers (nn/cross_attention.h) or both, and per-task
// losses (nn/multimodal_batch.h): whole-model gradients, encoders and gates
// included, against finite differences; a text-only batch through a model
// with encoders (and closed cross-attention gates) equals the plain model;
// recompute; the parameter inventory.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/nn/media_fusion.h"
#include "moetron/nn/parameter_inventory.h"
#include "moetron/nn/recompute.h"
#include "moetron/nn/transformer.h"
#include "moetron/optim/optimizer.h"
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
  m.init_std = 0.3;
  return m;
}

MoeConfig tiny_moe() {
  MoeConfig e;
  e.num_experts = 4;
  e.top_k = 2;
  e.expert_hidden = 6;
  e.first_dense_layers = 1;
  e.aux_loss_coef = 0.05;
  e.z_loss_coef = 0.01;
  return e;
}

MultimodalModelConfig tiny_media() {
  MultimodalModelConfig c;
  c.enabled = true;
  for (EncoderTransformerConfig* t : {&c.vision.transformer, &c.audio.transformer}) {
    t->d_model = 6;
    t->n_layers = 1;
    t->n_heads = 2;
    t->ffn_hidden = 7;
    t->init_std = 0.3;
  }
  c.vision.patch = 2;
  c.vision.max_rows = 2;
  c.vision.max_cols = 3;
  c.audio.n_mels = 4;
  return c;
}

void fill_tokens(const Tensor& t, uint32_t seed, int64_t vocab) {
  PhiloxStream rng(seed, "tokens");
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % vocab);
}

// Rows: 0 an image (task 1, 4 x 6 pixels: 6 tokens), 1 an audio clip (task 2,
// 5 frames: 3 tokens), 2 text (task 0). Media positions have no target.
struct Batch {
  Tensor in, tgt;
  std::shared_ptr<MultimodalBatch> mm;
};

Batch media_batch(DType dtype) {
  Batch b;
  b.in = Tensor::empty({3, 8}, DType::i32);
  b.tgt = Tensor::empty({3, 8}, DType::i32);
  fill_tokens(b.in, 1, 11);
  fill_tokens(b.tgt, 2, 11);
  b.mm = std::make_shared<MultimodalBatch>();
  MultimodalBatch& mm = *b.mm;
  mm.row_task = {1, 2, 0};
  mm.task_grad_scale = {0.2, 0.5, 0.3};
  mm.media.push_back({Modality::image, test::random_tensor({1, 3, 4, 6}, dtype, "image"), {0}});
  mm.media.push_back({Modality::audio, test::random_tensor({1, 5, 4}, dtype, "audio"), {1}});
  for (int64_t j = 0; j < 6; ++j) b.tgt.data<int32_t>()[j] = -1;
  for (int64_t j = 0; j < 3; ++j) b.tgt.data<int32_t>()[8 + j] = -1;
  return b;
}

double weighted_loss(kernels::Context& ctx, Transformer& model, const Batch& b) {
  const LossStats st = model.forward_backward(ctx, b.in, b.tgt, 0.0, 1.0, false);
  double loss = st.aux_loss + st.z_loss;
  for (size_t i = 0; i < st.task_ce_sum.size(); ++i)
    loss += b.mm->task_grad_scale[i] * st.task_ce_sum[i];
  return loss;
}

TEST(MultimodalTransformer, ReferenceGradientsMatchFiniteDifferences) {
  kernels::Context ref(kernels::Backend::reference);
  Transformer model(tiny_model(), tiny_moe(), Precision::fp64());
  model.enable_media(tiny_media());
  model.initialize(3);
  const Batch b = media_batch(DType::f64);
  model.set_multimodal(b.mm);
  model.params().zero_grads();
  model.forward_backward(ref, b.in, b.tgt, 0.0, 1.0, true);
  int encoder_params = 0;
  for (const auto& p : model.params().all()) {
    SCOPED_TRACE(p->name);
    encoder_params += p->name.rfind("vision.", 0) == 0 || p->name.rfind("audio.", 0) == 0;
    EXPECT_TRUE(test::finite_difference_check([&] { return weighted_loss(ref, model, b); },
                                              p->value, p->grad, 1e-6, 2e-5));
  }
  EXPECT_GT(encoder_params, 10);
}

TEST(MultimodalTransformer, TaskSumsAddUpToTheTotals) {
  kernels::Context cpu(kernels::Backend::cpu);
  Transformer model(tiny_model(), tiny_moe(), Precision::fp32());
  model.enable_media(tiny_media());
  model.initialize(5);
  const Batch b = media_batch(DType::f32);
  model.set_multimodal(b.mm);
  const LossStats st = model.forward_backward(cpu, b.in, b.tgt, 0.0, 1.0, false);
  ASSERT_EQ(st.task_ce_sum.size(), 3u);
  EXPECT_EQ(st.task_tokens[0], 8);      // the text row
  EXPECT_EQ(st.task_tokens[1], 8 - 6);  // the image row after its 6 media positions
  EXPECT_EQ(st.task_tokens[2], 8 - 3);
  EXPECT_EQ(st.tokens, 8 + 2 + 5);
  EXPECT_NEAR(st.task_ce_sum[0] + st.task_ce_sum[1] + st.task_ce_sum[2], st.ce_sum, 1e-4);
}

TEST(MultimodalTransformer, ATextBatchThroughAModelWithEncodersEqualsThePlainModel) {
  kernels::Context cpu(kernels::Backend::cpu);
  Transformer plain(tiny_model(), tiny_moe(), Precision::fp32());
  Transformer with(tiny_model(), tiny_moe(), Precision::fp32());
  with.enable_media(tiny_media());
  plain.initialize(7);
  with.initialize(7);
  Tensor in = Tensor::empty({2, 8}, DType::i32), tgt = Tensor::empty({2, 8}, DType::i32);
  fill_tokens(in, 3, 11);
  fill_tokens(tgt, 4, 11);
  plain.params().zero_grads();
  with.params().zero_grads();
  const LossStats a = plain.forward_backward(cpu, in, tgt, 0.1, 1.0, true);
  const LossStats b = with.forward_backward(cpu, in, tgt, 0.1, 1.0, true);
  EXPECT_EQ(a.ce_sum, b.ce_sum);
  for (const auto& p : plain.params().all()) {
    SCOPED_TRACE(p->name);
    EXPECT_TRUE(test::all_close(with.params().get(p->name).grad, p->grad, {0, 0}));
  }
  // The encoders' gradients stay zero.
  for (const Parameter* p : with.media()->parameters())
    EXPECT_EQ(test::to_doubles(p->grad), std::vector<double>(p->grad.numel(), 0.0)) << p->name;
}

TEST(MultimodalTransformer, BadBatchesAreErrors) {
  kernels::Context cpu(kernels::Backend::cpu);
  Transformer model(tiny_model(), tiny_moe(), Precision::fp32());
  model.initialize(1);
  Batch b = media_batch(DType::f32);
  model.set_multimodal(b.mm);
  EXPECT_NE(test::error_of([&] {
              model.forward_backward(cpu, b.in, b.tgt, 0, 1, false);
            }).find("without encoders"),
            std::string::npos);
  Transformer with(tiny_model(), tiny_moe(), Precision::fp32());
  with.enable_media(tiny_media());
  with.initialize(1);
  b.mm->media[0].rows = {5};
  with.set_multimodal(b.mm);
  EXPECT_NE(test::error_of([&] {
              with.forward_backward(cpu, b.in, b.tgt, 0, 1, false);
            }).find("media row 5"),
            std::string::npos);
}

TEST(MultimodalTransformer, TheInventoryDescribesTheEncodersAsBuilt) {
  for (const Precision prec : {Precision::fp32(), Precision::bf16()}) {
    Transformer model(tiny_model(), tiny_moe(), prec);
    const MultimodalModelConfig media = tiny_media();
    model.enable_media(media);
    const ParamInventory inv = parameter_inventory(tiny_model(), tiny_moe(), prec, {},
                                                   no_tensor_parallel(), PipelinePlace{}, &media);
    EXPECT_EQ(first_difference(describe_parameters(model.params()), inv.params), "");
    // A later pipeline stage holds no encoder.
    PipelinePlace later;
    later.chunks = {{1, 2}};
    later.embedding = false;
    Transformer stage(tiny_model(), tiny_moe(), prec, {}, {}, later);
    stage.enable_media(media);
    EXPECT_FALSE(stage.has_media());
    EXPECT_EQ(first_difference(describe_parameters(stage.params()),
                               parameter_inventory(tiny_model(), tiny_moe(), prec, {},
                                                   no_tensor_parallel(), later, &media)
                                   .params),
              "");
  }
}

}  // namespace
}  // namespace moetron::nn

namespace moetron::nn {
namespace {

// Cross-attention fusion: `fusion` with a layer before blocks i % every == every - 1.
MultimodalModelConfig fused(const std::string& fusion, int64_t every) {
  MultimodalModelConfig c = tiny_media();
  c.fusion = fusion;
  c.cross_attention_every = every;
  return c;
}

// Opens every cross-attention gate (they start at 0, which would stop the
// encoders' gradient through the layers).
void open_gates(Transformer& model) {
  double v = 0.6;
  for (const auto& p : model.params().all()) {
    if (p->name.find(".cross_attn.") != std::string::npos && p->value.numel() == 1) {
      p->value.fill(v);
      v = -v * 0.8;
    }
  }
}

int count_named(Transformer& model, const std::string& part) {
  int n = 0;
  for (const auto& p : model.params().all()) n += p->name.find(part) != std::string::npos;
  return n;
}

// Copies every parameter `to` shares (by name) with `from`.
void copy_shared(Transformer& from, Transformer& to) {
  for (const auto& p : from.params().all()) {
    if (Parameter* q = to.params().find(p->name)) q->value.copy_from(p->value);
  }
}

TEST(CrossAttentionFusion, ReferenceGradientsMatchFiniteDifferences) {
  // "both" with a layer before every block (the tokens' gradient sums two
  // layers and the prefix rows); "cross_attention" before block 1 only,
  // over rows without placeholders (the media rows' targets all count).
  for (const auto& [fusion, every] :
       std::vector<std::pair<std::string, int64_t>>{{"both", 1}, {"cross_attention", 2}}) {
    SCOPED_TRACE(fusion);
    kernels::Context ref(kernels::Backend::reference);
    Transformer model(tiny_model(), tiny_moe(), Precision::fp64());
    model.enable_media(fused(fusion, every));
    model.initialize(3);
    open_gates(model);
    Batch b = media_batch(DType::f64);
    if (fusion == "cross_attention") fill_tokens(b.tgt, 2, 11);
    model.set_multimodal(b.mm);
    model.params().zero_grads();
    model.forward_backward(ref, b.in, b.tgt, 0.0, 1.0, true);
    EXPECT_EQ(count_named(model, ".cross_attn.attn_gate"), fusion == "both" ? 2 : 1);
    EXPECT_EQ(count_named(model, "layers.0.cross_attn."), fusion == "both" ? 11 : 0);
    for (const auto& p : model.params().all()) {
      SCOPED_TRACE(p->name);
      EXPECT_TRUE(test::finite_difference_check([&] { return weighted_loss(ref, model, b); },
                                                p->value, p->grad, 1e-6, 2e-5));
    }
    // The encoders learn through the cross-attention layers.
    for (const Parameter* p : model.media()->parameters()) {
      const std::vector<double> g = test::to_doubles(p->grad);
      EXPECT_TRUE(std::any_of(g.begin(), g.end(), [](double v) { return v != 0.0; })) << p->name;
    }
  }
}

TEST(CrossAttentionFusion, ClosedGatesLeaveTheLanguageModelUnchanged) {
  // Gates at 0 (their initial value): a text batch gives exactly the plain
  // model's losses and gradients, and a media batch under "both" exactly
  // those of prefix fusion alone; the gates still get gradients.
  kernels::Context cpu(kernels::Backend::cpu);
  Transformer plain(tiny_model(), tiny_moe(), Precision::fp32());
  Transformer prefix(tiny_model(), tiny_moe(), Precision::fp32());
  Transformer both(tiny_model(), tiny_moe(), Precision::fp32());
  prefix.enable_media(tiny_media());
  both.enable_media(fused("both", 1));
  both.initialize(7);
  copy_shared(both, plain);
  copy_shared(both, prefix);
  Tensor in = Tensor::empty({2, 8}, DType::i32), tgt = Tensor::empty({2, 8}, DType::i32);
  fill_tokens(in, 3, 11);
  fill_tokens(tgt, 4, 11);
  for (Transformer* m : {&plain, &both}) m->params().zero_grads();
  const LossStats a = plain.forward_backward(cpu, in, tgt, 0.1, 1.0, true);
  const LossStats c = both.forward_backward(cpu, in, tgt, 0.1, 1.0, true);
  EXPECT_EQ(a.ce_sum, c.ce_sum);
  EXPECT_EQ(a.aux_loss, c.aux_loss);
  for (const auto& p : plain.params().all()) {
    SCOPED_TRACE(p->name);
    EXPECT_TRUE(test::all_close(both.params().get(p->name).grad, p->grad, {0, 0}));
  }
  EXPECT_GT(
      std::abs(test::element(both.params().get("model.layers.1.cross_attn.mlp_gate").grad, 0)),
      0.0);
  const Batch b = media_batch(DType::f32);
  prefix.set_multimodal(b.mm);
  both.set_multimodal(b.mm);
  for (Transformer* m : {&prefix, &both}) m->params().zero_grads();
  const LossStats p = prefix.forward_backward(cpu, b.in, b.tgt, 0.0, 1.0, true);
  const LossStats q = both.forward_backward(cpu, b.in, b.tgt, 0.0, 1.0, true);
  EXPECT_EQ(p.task_ce_sum, q.task_ce_sum);
  for (const auto& par : prefix.params().all()) {
    SCOPED_TRACE(par->name);
    EXPECT_TRUE(test::all_close(both.params().get(par->name).grad, par->grad, {0, 0}));
  }
  EXPECT_GT(
      std::abs(test::element(both.params().get("model.layers.0.cross_attn.attn_gate").grad, 0)),
      0.0);
}

TEST(CrossAttentionFusion, RecomputeGivesTheSameGradients) {
  // Checkpointed blocks run their cross-attention layer again in backward.
  kernels::Context cpu(kernels::Backend::cpu);
  const Batch b = media_batch(DType::f32);
  std::vector<std::vector<double>> grads;
  // selective drops the expert outputs too (moe_out): the router's gradient
  // is then another rounding of the same sums, compared to 1e-5 below.
  std::vector<std::string> exact_modules = recompute_module_names();
  std::erase(exact_modules, "moe_out");
  for (const char* policy : {"none", "full", "custom", "selective"}) {
    SCOPED_TRACE(policy);
    Transformer model(tiny_model(), tiny_moe(), Precision::fp32());
    model.enable_media(fused("both", 1));
    model.initialize(9);
    open_gates(model);
    model.set_recompute(make_recompute_policy(
        policy, std::string(policy) == "custom" ? exact_modules : std::vector<std::string>{}, 2));
    model.set_multimodal(b.mm);
    model.params().zero_grads();
    model.forward_backward(cpu, b.in, b.tgt, 0.0, 1.0, true);
    std::vector<double> g;
    for (const auto& p : model.params().all()) {
      const std::vector<double> v = test::to_doubles(p->grad);
      g.insert(g.end(), v.begin(), v.end());
    }
    grads.push_back(std::move(g));
  }
  EXPECT_EQ(grads[1], grads[0]);
  EXPECT_EQ(grads[2], grads[0]);
  double err = 0, scale = 0;
  for (size_t i = 0; i < grads[0].size(); ++i) {
    err = std::max(err, std::abs(grads[3][i] - grads[0][i]));
    scale = std::max(scale, std::abs(grads[0][i]));
  }
  EXPECT_LE(err, 1e-5 * scale);
}

TEST(CrossAttentionFusion, MicroBatchesInFlightGiveTheSequentialGradients) {
  // The pipeline path (one chunk): two micro-batches' forwards before their
  // backwards (each block swaps its cross-attention layer's state, each
  // micro-batch keeps its media tokens) == forward_backward one by one.
  kernels::Context cpu(kernels::Backend::cpu);
  Batch b0 = media_batch(DType::f32), b1 = media_batch(DType::f32);
  fill_tokens(b1.in, 5, 11);
  b1.mm->media[0].input = test::random_tensor({1, 3, 4, 6}, DType::f32, "image 2");
  std::vector<std::vector<double>> grads;
  for (const bool in_flight : {false, true}) {
    Transformer model(tiny_model(), tiny_moe(), Precision::fp32());
    model.enable_media(fused("both", 1));
    model.initialize(11);
    open_gates(model);
    model.params().zero_grads();
    if (!in_flight) {
      for (const Batch* b : {&b0, &b1}) {
        model.set_multimodal(b->mm);
        model.forward_backward(cpu, b->in, b->tgt, 0.0, 0.5, true);
      }
    } else {
      const std::vector<const Batch*> mbs = {&b0, &b1};
      for (int64_t mb = 0; mb < 2; ++mb) {
        Transformer::ChunkStep at;
        at.mb = mb;
        at.batch = 3;
        at.seq = 8;
        at.loss_weight = 0.5;
        at.backward = true;
        at.ids = mbs[static_cast<size_t>(mb)]->in;
        at.multimodal = mbs[static_cast<size_t>(mb)]->mm;
        LossStats st;
        model.chunk_forward(cpu, at, at.ids, mbs[static_cast<size_t>(mb)]->tgt, st);
      }
      for (int64_t mb = 1; mb >= 0; --mb) model.chunk_backward(cpu, 0, mb, Tensor(), mb == 0);
    }
    std::vector<double> g;
    for (const auto& p : model.params().all()) {
      const std::vector<double> v = test::to_doubles(p->grad);
      g.insert(g.end(), v.begin(), v.end());
    }
    grads.push_back(std::move(g));
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i)
    ASSERT_NEAR(grads[1][i], grads[0][i], 1e-5 + 1e-4 * std::abs(grads[0][i])) << "element " << i;
}

TEST(CrossAttentionFusion, TheInventoryDescribesTheLayersAsBuilt) {
  for (const Precision prec : {Precision::fp32(), Precision::bf16()}) {
    for (const auto& [fusion, every] : std::vector<std::pair<std::string, int64_t>>{
             {"cross_attention", 1}, {"both", 2}, {"both", 3}}) {
      SCOPED_TRACE(fusion + " every " + std::to_string(every));
      const MultimodalModelConfig media = fused(fusion, every);
      Transformer model(tiny_model(), tiny_moe(), prec);
      model.enable_media(media);
      const ParamInventory inv = parameter_inventory(tiny_model(), tiny_moe(), prec, {},
                                                     no_tensor_parallel(), PipelinePlace{}, &media);
      EXPECT_EQ(first_difference(describe_parameters(model.params()), inv.params), "");
    }
  }
}

TEST(CrossAttentionFusion, TheGatesAreNeitherDecayedNorMuonUpdated) {
  Transformer model(tiny_model(), tiny_moe(), Precision::fp32());
  model.enable_media(fused("cross_attention", 1));
  optim::OptimizerOptions muon;
  muon.name = "muon";
  int gates = 0;
  for (const auto& p : model.params().all()) {
    if (p->name.find(".cross_attn.") == std::string::npos) continue;
    SCOPED_TRACE(p->name);
    const bool gate = p->name.ends_with("_gate");
    gates += gate;
    if (gate) {
      EXPECT_FALSE(optim::rule_decays(muon, *p));
      EXPECT_FALSE(optim::rule_uses_muon(muon, *p));
    }
    if (p->name.ends_with("q_proj.weight")) {
      EXPECT_TRUE(optim::rule_uses_muon(muon, *p));
    }
  }
  EXPECT_EQ(gates, 4);
}

TEST(CrossAttentionFusion, PipelineAndSequenceParallelismAreRefused) {
  PipelinePlace later;
  later.chunks = {{1, 2}};
  later.embedding = false;
  Transformer stage(tiny_model(), tiny_moe(), Precision::fp32(), {}, {}, later);
  EXPECT_NE(test::error_of([&] {
              stage.enable_media(fused("both", 1));
            }).find("with pipeline parallelism are not supported yet"),
            std::string::npos);
  TensorParallel sp;
  sp.size = 2;
  sp.sequence_parallel = true;
  ModelConfig even = tiny_model();
  even.vocab_size = 12;
  Transformer sliced(even, tiny_moe(), Precision::fp32(), {}, sp);
  EXPECT_NE(test::error_of([&] {
              sliced.enable_media(fused("cross_attention", 1));
            }).find("with sequence parallelism are not supported yet"),
            std::string::npos);
}

}  // namespace
}  // namespace moetron::nn
