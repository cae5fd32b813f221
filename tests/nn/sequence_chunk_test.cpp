// Chunked sequences (train.seq_chunk): the model run C positions at a time,
// forward through the chunks then backward in reverse, gives the unchunked
// loss and every gradient, for C dividing S and not, under every recompute
// policy, with hybrid attention and packed documents; and under recompute
// full it holds fewer activation bytes than the whole sequence does.
#include <gtest/gtest.h>

#include "moetron/core/allocator.h"
#include "moetron/core/rng.h"
#include "moetron/nn/recompute.h"
#include "moetron/nn/transformer.h"
#include "util/test_util.h"

namespace moetron::nn {
namespace {

// Three layers: local (window 5, two global tokens), full, local; GQA.
ModelConfig chunk_model(int64_t seq) {
  ModelConfig m;
  m.vocab_size = 23;
  m.d_model = 16;
  m.n_layers = 3;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.ffn_hidden = 20;
  m.max_seq_len = seq;
  m.init_std = 0.2;
  m.attention_window = 5;
  m.attention_global_tokens = 2;
  m.attention_layer_pattern = "LG";
  return m;
}

// The load-balancing loss is a product of two batch means: chunking (like
// micro-batching) changes it, so it is off here; the z-loss, a mean over
// tokens, is exact under chunking and stays on.
MoeConfig chunk_moe() {
  MoeConfig e;
  e.num_experts = 4;
  e.top_k = 2;
  e.expert_hidden = 12;
  e.first_dense_layers = 1;
  e.aux_loss_coef = 0;
  e.z_loss_coef = 0.01;
  return e;
}

void fill(const Tensor& t, uint32_t seed, int64_t vocab) {
  PhiloxStream rng(seed, "tokens");
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u32() % vocab);
}

struct Result {
  LossStats loss;
  std::vector<Tensor> grads;
  int64_t activation_peak = 0;
};

struct Case {
  kernels::Backend backend = kernels::Backend::cpu;
  Precision prec = Precision::fp32();
  int64_t batch = 2, seq = 29, chunk = 0;
  std::string policy = "none";
  int32_t separator = -1;
};

Result run(const Case& c) {
  kernels::Context ctx(c.backend);
  const ModelConfig m = chunk_model(c.seq);
  Transformer model(m, chunk_moe(), c.prec);
  model.initialize(17);
  model.set_recompute(make_recompute_policy(c.policy, {}, m.n_layers));
  model.set_document_separator(c.separator);
  model.set_sequence_chunk(c.chunk);
  Tensor in = Tensor::empty({c.batch, c.seq}, DType::i32);
  Tensor tgt = Tensor::empty({c.batch, c.seq}, DType::i32);
  fill(in, 3, m.vocab_size);
  fill(tgt, 4, m.vocab_size);
  tgt.data<int32_t>()[5] = -1;  // a position without a target
  model.params().zero_grads();
  Allocator& alloc = cpu_allocator();
  alloc.reset_peaks();
  const int64_t before = alloc.current(MemTag::activations);
  Result r;
  // Two micro-batches: the chunks' gradients accumulate with the step's.
  const double scale = 1.0 / static_cast<double>(2 * c.batch * c.seq - 2);
  for (int mb = 0; mb < 2; ++mb) {
    const LossStats st = model.forward_backward(ctx, in, tgt, scale, 0.5, true);
    r.loss.ce_sum += st.ce_sum;
    r.loss.tokens += st.tokens;
    r.loss.z_loss += st.z_loss;
  }
  r.activation_peak = alloc.peak(MemTag::activations) - before;
  EXPECT_EQ(alloc.current(MemTag::activations), before) << "activations left behind";
  for (const auto& p : model.params().all()) r.grads.push_back(p->grad.clone());
  return r;
}

void expect_same(const Result& chunked, const Result& whole, double tol) {
  EXPECT_EQ(chunked.loss.tokens, whole.loss.tokens);
  EXPECT_NEAR(chunked.loss.ce_sum, whole.loss.ce_sum, tol * whole.loss.ce_sum);
  EXPECT_NEAR(chunked.loss.z_loss, whole.loss.z_loss, tol * whole.loss.z_loss);
  ASSERT_EQ(chunked.grads.size(), whole.grads.size());
  for (size_t i = 0; i < whole.grads.size(); ++i)
    EXPECT_TRUE(test::normalized_close(chunked.grads[i], whole.grads[i], tol)) << "parameter " << i;
}

TEST(SequenceChunk, ChunkedEqualsWholeSequenceOnTheCpuKernels) {
  // 29 positions: chunks of 10 (10, 10, 9), 8 (8, 8, 8, 5) and 29 / 4 rounded
  // up; the window (5) crosses every chunk boundary.
  for (const std::string policy : {"none", "selective", "full"}) {
    Case whole;
    whole.policy = policy;
    const Result expected = run(whole);
    for (const int64_t chunk : {10, 8, 1}) {
      SCOPED_TRACE(testing::Message() << "policy " << policy << ", chunk " << chunk);
      Case c = whole;
      c.chunk = chunk;
      expect_same(run(c), expected, 1e-5);
    }
  }
}

TEST(SequenceChunk, ChunksThatDivideTheSequenceAndPackedDocumentsMatchInDoublePrecision) {
  for (const int32_t separator : {-1, 0, 1}) {
    Case whole;
    whole.backend = kernels::Backend::reference;
    whole.prec = Precision::fp64();
    whole.seq = 24;
    whole.separator = separator;
    const Result expected = run(whole);
    for (const int64_t chunk : {6, 12, 7}) {
      SCOPED_TRACE(testing::Message() << "separator " << separator << ", chunk " << chunk);
      Case c = whole;
      c.chunk = chunk;
      expect_same(run(c), expected, 1e-12);
    }
  }
}

TEST(SequenceChunk, Bf16ChunksStayCloseToTheWholeSequence) {
  // bf16 activations round differently per chunk boundary only where the
  // cache's f32 dK/dV sums meet the chunk's bf16 ones: close, not equal.
  Case whole;
  whole.prec = Precision::bf16();
  const Result expected = run(whole);
  Case c = whole;
  c.chunk = 8;
  expect_same(run(c), expected, 3e-2);
}

TEST(SequenceChunk, RecomputeFullHoldsActivationsOfAChunkNotTheSequence) {
  Case whole;
  whole.batch = 1;
  whole.seq = 256;
  whole.policy = "full";
  const int64_t full = run(whole).activation_peak;
  Case c = whole;
  c.chunk = 32;
  const int64_t chunked = run(c).activation_peak;
  EXPECT_LT(chunked, full / 2) << "chunked " << chunked << " bytes, whole " << full;
}

TEST(SequenceChunk, ASettingThatCannotWorkIsRefusedByName) {
  Transformer model(chunk_model(8), chunk_moe(), Precision::fp32());
  EXPECT_THROW(model.set_sequence_chunk(-1), Error);
  PipelinePlace stage;
  stage.chunks = {{0, 2}};
  stage.head = false;
  Transformer first(chunk_model(8), chunk_moe(), Precision::fp32(), {}, {}, stage);
  try {
    first.set_sequence_chunk(4);
    FAIL() << "a pipeline stage took train.seq_chunk";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.seq_chunk"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moetron::nn
