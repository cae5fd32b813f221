#include "moetron/train/generate.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "moetron/ckpt/checkpoint.h"
#include "moetron/core/rng.h"
#include "moetron/data/token_dataset.h"

namespace moetron::train {

LoadedModel load_model(const std::string& checkpoint_dir) {
  MOETRON_CHECK(std::filesystem::is_directory(checkpoint_dir), "checkpoint '", checkpoint_dir,
                "' does not exist");
  LoadedModel lm;
  lm.cfg = load_config(checkpoint_dir + "/moetron.toml");
  lm.model = std::make_unique<nn::Transformer>(lm.cfg.model, lm.cfg.moe, nn::Precision::fp32());
  // The encoders' parameters join the list the checkpoint is read into.
  if (lm.cfg.multimodal.model.enabled) lm.model->enable_media(lm.cfg.multimodal.model);
  ckpt::load_checkpoint(checkpoint_dir, *lm.model, nullptr);
  return lm;
}

void check_sample_options(const SampleOptions& opts) {
  MOETRON_CHECK(std::isfinite(opts.temperature) && opts.temperature >= 0, "--temperature must be ",
                ">= 0 (0: greedy), got ", opts.temperature);
  MOETRON_CHECK(opts.top_k >= 0, "--top-k must be >= 0 (0: every token), got ", opts.top_k);
  MOETRON_CHECK(opts.max_new_tokens >= 0, "--max-new-tokens must be >= 0, got ",
                opts.max_new_tokens);
}

int32_t pick_token(const float* logits, int64_t v, const SampleOptions& opts, PhiloxStream& rng) {
  std::vector<std::pair<float, int32_t>> cand(static_cast<size_t>(v));
  for (int64_t j = 0; j < v; ++j)
    cand[static_cast<size_t>(j)] = {logits[j], static_cast<int32_t>(j)};
  const auto k = static_cast<size_t>(std::clamp<int64_t>(opts.top_k > 0 ? opts.top_k : v, 1, v));
  std::partial_sort(cand.begin(), cand.begin() + static_cast<std::ptrdiff_t>(k), cand.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  if (opts.temperature <= 0) return cand[0].second;
  std::vector<double> p(k);
  double sum = 0;
  for (size_t j = 0; j < k; ++j)
    sum += p[j] = std::exp((cand[j].first - cand[0].first) / opts.temperature);
  double u = rng.next_uniform() * sum;
  for (size_t j = 0; j + 1 < k; ++j) {
    u -= p[j];
    if (u <= 0) return cand[j].second;
  }
  return cand[k - 1].second;
}

std::vector<int32_t> sample_tokens(kernels::Context& ctx, nn::Transformer& model,
                                   const std::vector<int32_t>& prompt, const SampleOptions& opts) {
  MOETRON_CHECK(!prompt.empty(), "generation needs a non-empty prompt");
  check_sample_options(opts);
  std::vector<int32_t> seq = prompt, out;
  PhiloxStream rng(opts.seed, "generate");
  const int64_t ctx_len = model.config().max_seq_len;
  for (int64_t i = 0; i < opts.max_new_tokens; ++i) {
    const int64_t n = std::min<int64_t>(static_cast<int64_t>(seq.size()), ctx_len);
    Tensor inputs = Tensor::empty({1, n}, DType::i32);
    std::copy(seq.end() - n, seq.end(), inputs.data<int32_t>());
    const Tensor logits = model.last_logits(ctx, inputs);
    const int32_t next = pick_token(logits.data<float>(), logits.dim(1), opts, rng);
    if (next == opts.stop_id) break;
    seq.push_back(next);
    out.push_back(next);
  }
  return out;
}

EvalResult evaluate_tokens(kernels::Context& ctx, nn::Transformer& model,
                           const std::string& tokens_path, int64_t seq_len, int64_t batch,
                           int64_t max_rows) {
  data::TokenFile file(tokens_path, model.config().vocab_size);
  int64_t rows = file.size() / (seq_len + 1);
  MOETRON_CHECK(rows > 0, "token file '", tokens_path, "' has ", file.size(),
                " tokens, fewer than one row of ", seq_len + 1);
  if (max_rows > 0) rows = std::min(rows, max_rows);
  EvalResult res;
  double ce = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += batch) {
    const int64_t b = std::min(batch, rows - r0);
    Tensor inputs = Tensor::empty({b, seq_len}, DType::i32),
           targets = Tensor::empty({b, seq_len}, DType::i32);
    for (int64_t r = 0; r < b; ++r) {
      const int32_t* w = file.data() + (r0 + r) * (seq_len + 1);
      std::copy(w, w + seq_len, inputs.data<int32_t>() + r * seq_len);
      std::copy(w + 1, w + seq_len + 1, targets.data<int32_t>() + r * seq_len);
    }
    const nn::LossStats st = model.forward_backward(ctx, inputs, targets, 0, 0, false);
    ce += st.ce_sum;
    res.tokens += st.tokens;
  }
  res.loss = ce / static_cast<double>(res.tokens);
  return res;
}

}  // namespace moetron::train
