// The language model with media prefixes (nn/media_fusion.h) and per-task
// losses (nn/multimodal_batch.h): whole-model gradients, encoders included,
// against finite differences; a text-only batch through a model with
// encoders equals the plain model.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/nn/media_fusion.h"
#include "moetron/nn/parameter_inventory.h"
#include "moetron/nn/transformer.h"
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
