#include "moetron/train/stage_costs.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "moetron/core/rng.h"
#include "moetron/nn/transformer.h"

namespace moetron::train {
namespace {

using clock_type = std::chrono::steady_clock;

// Median seconds of forward + backward of one micro-batch through a model
// holding layer `layer` only (with the embedding and/or the head).
double time_probe(const Config& cfg, const nn::Precision& prec, int64_t layer, bool embedding,
                  bool head, int repeats) {
  nn::PipelinePlace place;
  place.chunks = {{layer, layer + 1}};
  place.embedding = embedding;
  place.head = head;
  nn::Transformer model(cfg.model, cfg.moe, prec, {}, {}, place);
  model.initialize(cfg.train.seed);
  kernels::Context ctx(kernels::Backend::cpu, static_cast<int>(cfg.train.threads));
  const int64_t b = cfg.train.micro_batch, s = cfg.train.seq_len, t = b * s, d = cfg.model.d_model;
  Tensor tokens = Tensor::empty({b, s}, DType::i32), targets = Tensor::empty({b, s}, DType::i32);
  for (int64_t i = 0; i < t; ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>((i * 7919) % cfg.model.vocab_size);
    targets.data<int32_t>()[i] = static_cast<int32_t>((i * 7919 + 1) % cfg.model.vocab_size);
  }
  Tensor hidden = Tensor::empty({t, d}, prec.compute, MemTag::activations);
  Tensor d_out = Tensor::empty({t, d}, prec.compute, MemTag::activations);
  fill_normal(hidden, cfg.train.seed, "stage_probe.hidden", 0.0f, 1.0f);
  fill_normal(d_out, cfg.train.seed, "stage_probe.d_out", 0.0f, 1e-3f);
  std::vector<double> times;
  for (int r = 0; r <= repeats; ++r) {  // the first is a warm-up (primitives, pools)
    model.params().zero_grads();
    nn::LossStats st;
    const auto t0 = clock_type::now();
    const nn::Transformer::ChunkStep at{.batch = b,
                                        .seq = s,
                                        .grad_scale = 1.0 / static_cast<double>(t),
                                        .loss_weight = 1.0,
                                        .backward = true,
                                        .ids = tokens};
    (void)model.chunk_forward(ctx, at, embedding ? tokens : hidden, targets, st);
    (void)model.chunk_backward(ctx, 0, 0, head ? Tensor() : d_out, true);
    if (r > 0) times.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

MeasuredStageCosts measure_stage_costs(const Config& cfg, const nn::Precision& prec,
                                       comm::Communicator& world, int repeats) {
  MOETRON_CHECK(repeats >= 1, "stage cost probes need at least one timed repeat");
  const int64_t L = cfg.model.n_layers;
  int64_t dense = -1, moe = -1;
  for (int64_t i = 0; i < L; ++i) {
    int64_t& first = nn::layer_is_moe(cfg.moe, i) ? moe : dense;
    if (first < 0) first = i;
  }
  // [dense layer, MoE layer, embedding + layer 0, layer L-1 + head] on this rank.
  Tensor t = Tensor::zeros({4}, DType::f64, MemTag::comm);
  double* v = t.data<double>();
  if (dense >= 0) v[0] = time_probe(cfg, prec, dense, false, false, repeats);
  if (moe >= 0) v[1] = time_probe(cfg, prec, moe, false, false, repeats);
  v[2] = time_probe(cfg, prec, 0, true, false, repeats);
  v[3] = time_probe(cfg, prec, L - 1, false, true, repeats);
  if (world.size() > 1) world.allreduce(t, comm::ReduceOp::sum);
  for (int i = 0; i < 4; ++i) v[i] /= world.size();
  MeasuredStageCosts m;
  m.dense_layer = v[0];
  m.moe_layer = v[1];
  const auto layer_cost = [&](int64_t i) { return nn::layer_is_moe(cfg.moe, i) ? v[1] : v[0]; };
  for (int64_t i = 0; i < L; ++i) m.costs.layers.push_back(layer_cost(i));
  // What the embedding and the head add to their layer's probe (noise can
  // make a tiny difference negative).
  m.costs.embedding = std::max(0.0, v[2] - layer_cost(0));
  m.costs.head = std::max(0.0, v[3] - layer_cost(L - 1));
  return m;
}

std::string describe_stages(const std::vector<std::pair<int64_t, int64_t>>& stages,
                            const MeasuredStageCosts* measured) {
  std::string s = "layers";
  for (const auto& [a, b] : stages) s += str_cat(" [", a, ", ", b, ")");
  if (!measured) return s + " (balanced by FLOPs, the head on the last)";
  char buf[64];
  std::string parts;
  const auto add = [&](const char* what, double seconds) {
    std::snprintf(buf, sizeof(buf), "%s%s %.1f ms", parts.empty() ? "" : ", ", what, 1e3 * seconds);
    parts += buf;
  };
  if (measured->dense_layer > 0) add("dense layer", measured->dense_layer);
  if (measured->moe_layer > 0) add("MoE layer", measured->moe_layer);
  add("embedding", measured->costs.embedding);
  add("head and loss", measured->costs.head);
  return s + " (balanced by measured costs per micro-batch: " + parts + ")";
}

}  // namespace moetron::train
