// [multimodal], [vision], [audio] and [multitask]: their keys and rules.
#include <algorithm>
#include <string>
#include <vector>

#include "moetron/core/error.h"
#include "moetron/train/config_fields.h"
#include "moetron/train/multimodal_batches.h"

namespace moetron::train {

namespace {

template <typename Get>
Field bound(const char* key, Get get) {
  return {key, [get](Config& c) -> Value { return get(c); }};
}

void check(bool ok, const char* key, const std::string& rule) {
  if (!ok) MOETRON_FAIL("invalid config: '", key, "': ", rule);
}

void validate_encoder(const nn::EncoderTransformerConfig& e, const std::string& section) {
  const std::string d = section + ".d_model";
  check(e.d_model > 0 && e.n_heads > 0 && e.d_model % e.n_heads == 0, d.c_str(),
        "must be > 0 and a multiple of " + section + ".n_heads");
  check(e.n_layers >= 0, (section + ".n_layers").c_str(), "must be >= 0");
  check(e.ffn_hidden > 0, (section + ".ffn_hidden").c_str(), "must be > 0");
}

}  // namespace

std::vector<Field> multimodal_fields() {
  using C = Config;
  return {
      bound("multimodal.enabled", [](C& c) { return &c.multimodal.model.enabled; }),
      bound("multimodal.fusion", [](C& c) { return &c.multimodal.model.fusion; }),
      bound("multimodal.cross_attention_every",
            [](C& c) { return &c.multimodal.model.cross_attention_every; }),
      bound("multimodal.data", [](C& c) { return &c.multimodal.data; }),
      bound("multimodal.mix", [](C& c) { return &c.multimodal.mix; }),
      bound("multimodal.audio_frames", [](C& c) { return &c.multimodal.audio_frames; }),
      bound("vision.d_model", [](C& c) { return &c.multimodal.model.vision.transformer.d_model; }),
      bound("vision.n_layers",
            [](C& c) { return &c.multimodal.model.vision.transformer.n_layers; }),
      bound("vision.n_heads", [](C& c) { return &c.multimodal.model.vision.transformer.n_heads; }),
      bound("vision.ffn_hidden",
            [](C& c) { return &c.multimodal.model.vision.transformer.ffn_hidden; }),
      bound("vision.channels", [](C& c) { return &c.multimodal.model.vision.channels; }),
      bound("vision.patch", [](C& c) { return &c.multimodal.model.vision.patch; }),
      bound("vision.max_rows", [](C& c) { return &c.multimodal.model.vision.max_rows; }),
      bound("vision.max_cols", [](C& c) { return &c.multimodal.model.vision.max_cols; }),
      bound("audio.d_model", [](C& c) { return &c.multimodal.model.audio.transformer.d_model; }),
      bound("audio.n_layers", [](C& c) { return &c.multimodal.model.audio.transformer.n_layers; }),
      bound("audio.n_heads", [](C& c) { return &c.multimodal.model.audio.transformer.n_heads; }),
      bound("audio.ffn_hidden",
            [](C& c) { return &c.multimodal.model.audio.transformer.ffn_hidden; }),
      bound("audio.n_mels", [](C& c) { return &c.multimodal.model.audio.n_mels; }),
      bound("audio.conv_kernel", [](C& c) { return &c.multimodal.model.audio.conv_kernel; }),
      bound("audio.conv1_stride", [](C& c) { return &c.multimodal.model.audio.conv1_stride; }),
      bound("audio.conv2_stride", [](C& c) { return &c.multimodal.model.audio.conv2_stride; }),
      field("moe.modality_routing", &C::moe, &MoeConfig::modality_routing),
      field("moe.num_modalities", &C::moe, &MoeConfig::num_modalities),
      field("moe.modality_experts", &C::moe, &MoeConfig::modality_experts),
      field("moe.modality_local_entropy_coef", &C::moe, &MoeConfig::modality_local_entropy_coef),
      field("moe.modality_global_entropy_coef", &C::moe, &MoeConfig::modality_global_entropy_coef),
      field("moe.modality_global_entropy_threshold", &C::moe,
            &MoeConfig::modality_global_entropy_threshold),
      field("moe.modality_realloc_every", &C::moe, &MoeConfig::modality_realloc_every),
      field("moe.modality_realloc_hysteresis", &C::moe, &MoeConfig::modality_realloc_hysteresis),
      field("moe.modality_min_experts", &C::moe, &MoeConfig::modality_min_experts),
      bound("multitask.balance", [](C& c) { return &c.multitask.balance; }),
      bound("multitask.weights", [](C& c) { return &c.multitask.weights; }),
      bound("multitask.gradnorm_alpha", [](C& c) { return &c.multitask.gradnorm_alpha; }),
      bound("multitask.gradnorm_lr", [](C& c) { return &c.multitask.gradnorm_lr; }),
      bound("multitask.dwa_temperature", [](C& c) { return &c.multitask.dwa_temperature; }),
      bound("multitask.uncertainty_lr", [](C& c) { return &c.multitask.uncertainty_lr; }),
  };
}

namespace {

void validate_modality_routing(const MoeConfig& e) {
  const std::vector<std::string> modes = {"shared", "prior", "partitioned"};
  check(std::find(modes.begin(), modes.end(), e.modality_routing) != modes.end(),
        "moe.modality_routing",
        "must be shared, prior or partitioned, got '" + e.modality_routing + "'");
  check(e.num_modalities >= 1, "moe.num_modalities", "must be >= 1 (text, image, audio: 3)");
  check(e.modality_local_entropy_coef >= 0 && e.modality_global_entropy_coef >= 0,
        "moe.modality_local_entropy_coef",
        "the entropy coefficients (local and global) must be >= 0");
  check(e.modality_realloc_every >= 0, "moe.modality_realloc_every", "must be >= 0 (0: off)");
  check(e.modality_min_experts >= 1, "moe.modality_min_experts", "must be >= 1");
}

}  // namespace

void validate_multimodal(const Config& c) {
  validate_modality_routing(c.moe);
  const MultimodalConfig& m = c.multimodal;
  const MultitaskConfig& t = c.multitask;
  const std::vector<std::string> methods = {"fixed", "uncertainty", "gradnorm", "dwa"};
  check(std::find(methods.begin(), methods.end(), t.balance) != methods.end(), "multitask.balance",
        "must be fixed, uncertainty, gradnorm or dwa, got '" + t.balance + "'");
  check(t.gradnorm_alpha >= 0, "multitask.gradnorm_alpha", "must be >= 0");
  check(t.gradnorm_lr > 0, "multitask.gradnorm_lr", "must be > 0");
  check(t.dwa_temperature > 0, "multitask.dwa_temperature", "must be > 0");
  check(t.uncertainty_lr > 0 && t.uncertainty_lr < 2, "multitask.uncertainty_lr",
        "must be in (0, 2)");
  if (!m.model.enabled) return;
  const TaskMix mix = parse_task_mix(m.mix, "multimodal.mix");
  const std::vector<std::string> names = task_names(mix);
  const TaskMix weights =
      parse_task_mix(t.weights.empty() ? m.mix : t.weights, "multitask.weights");
  for (const std::string& w : task_names(weights))
    check(std::find(names.begin(), names.end(), w) != names.end(), "multitask.weights",
          "names task '" + w + "', which multimodal.mix does not train");
  const std::vector<std::string> fusions = {"prefix", "cross_attention", "both"};
  check(std::find(fusions.begin(), fusions.end(), m.model.fusion) != fusions.end(),
        "multimodal.fusion",
        "must be prefix, cross_attention or both, got '" + m.model.fusion + "'");
  check(m.model.cross_attention_every >= 1, "multimodal.cross_attention_every",
        "must be >= 1 (a cross-attention layer before blocks i with i % k == k - 1)");
  if (m.model.cross_attention()) {
    check(c.parallel.tp == 1 || !c.parallel.sequence_parallel, "parallel.sequence_parallel",
          "must be false with multimodal.fusion = \"" + m.model.fusion +
              "\" (gated cross-attention under sequence parallelism is not supported yet)");
    check(c.parallel.pp == 1, "parallel.pp",
          "must be 1 with multimodal.fusion = \"" + m.model.fusion +
              "\" (the cross-attention layers read the encoders' tokens, which live on the "
              "first pipeline stage)");
  }
  check(m.audio_frames > 0, "multimodal.audio_frames", "must be > 0");
  validate_encoder(m.model.vision.transformer, "vision");
  validate_encoder(m.model.audio.transformer, "audio");
  const nn::VisionConfig& v = m.model.vision;
  check(v.patch > 0 && v.channels > 0 && v.max_rows > 0 && v.max_cols > 0, "vision.patch",
        "vision.patch, channels, max_rows and max_cols must be > 0");
  const nn::AudioConfig& a = m.model.audio;
  check(a.n_mels > 0, "audio.n_mels", "must be > 0");
  check(a.conv_kernel > 0 && a.conv_kernel % 2 == 1, "audio.conv_kernel", "must be odd and > 0");
  check(a.conv1_stride > 0 && a.conv2_stride > 0, "audio.conv1_stride",
        "audio.conv1_stride and conv2_stride must be > 0");
  check(c.parallel.cp == 1, "parallel.cp",
        "must be 1 with multimodal.enabled (media prefixes under context parallelism are not "
        "supported yet)");
  check(c.moe.num_modalities >= nn::kNumModalities || c.moe.modality_routing == "shared",
        "moe.num_modalities", "must be >= 3 (text, image, audio) with modality routing");
  check(c.train.seq_chunk == 0, "train.seq_chunk",
        "must be 0 with multimodal.enabled (chunked media prefixes are not supported yet)");
}

}  // namespace moetron::train
