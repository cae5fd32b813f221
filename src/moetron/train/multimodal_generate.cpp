#include "moetron/train/multimodal_generate.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>

#include "moetron/core/error.h"
#include "moetron/data/image_io.h"
#include "moetron/data/resample.h"
#include "moetron/data/wav_io.h"
#include "moetron/nn/media_fusion.h"

namespace moetron::train {

namespace {

// The model's multimodal batch is cleared however decoding ends, so a later
// text forward does not see stale media.
struct MultimodalReset {
  nn::Transformer& model;
  ~MultimodalReset() { model.set_multimodal(nullptr); }
};

// The media positions a row starts with, as in training
// (MultimodalBatcher): the item's tokens under prefix fusion, none when the
// media reach the model through cross-attention alone.
int64_t media_placeholders(const nn::Transformer& model, const MediaInput& in) {
  const int64_t tokens =
      in.modality == nn::Modality::image
          ? model.media()->tokens_per_item(in.modality, in.shape[1], in.shape[2])
          : model.media()->tokens_per_item(in.modality, in.shape[0], in.shape[1]);
  return model.media()->prefix() ? tokens : 0;
}

// The items [first, first + rows) as one media group over batch rows 0 ... rows-1.
nn::MediaGroup media_group(const std::vector<MediaInput>& items, size_t first, int64_t rows) {
  const MediaInput& in = items[first];
  nn::MediaGroup g;
  g.modality = in.modality;
  g.input = in.modality == nn::Modality::image
                ? Tensor::empty({rows, in.shape[0], in.shape[1], in.shape[2]}, DType::f32)
                : Tensor::empty({rows, in.shape[0], in.shape[1]}, DType::f32);
  const auto item = static_cast<int64_t>(in.values.size());
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<float>& v = items[first + static_cast<size_t>(r)].values;
    std::copy(v.begin(), v.end(), g.input.data<float>() + r * item);
    g.rows.push_back(r);
  }
  return g;
}

struct DecodeRows {
  std::vector<int32_t> head;  // placeholders + prompt, shared by every row
  int64_t media_tokens = 0;   // placeholders at the start of each row
  int32_t placeholder = 0;
};

// Decodes the rows of items [first, first + rows) together; appends each
// row's new tokens to out[first + r].
void decode_rows(kernels::Context& ctx, nn::Transformer& model,
                 const std::vector<MediaInput>& items, size_t first, int64_t rows,
                 const DecodeRows& d, const SampleOptions& opts, PhiloxStream& rng,
                 std::vector<std::vector<int32_t>>& out) {
  auto mm = std::make_shared<nn::MultimodalBatch>();
  mm->media.push_back(media_group(items, first, rows));
  mm->row_task.assign(static_cast<size_t>(rows), 0);
  mm->task_grad_scale = {0.0};
  std::vector<std::vector<int32_t>> seq(static_cast<size_t>(rows), d.head);
  std::vector<bool> done(static_cast<size_t>(rows), false);
  const int64_t ctx_len = model.config().max_seq_len;
  const auto modality = static_cast<int32_t>(items[first].modality);
  for (int64_t step = 0; step < opts.max_new_tokens; ++step) {
    const auto len = static_cast<int64_t>(seq[0].size());
    if (len > ctx_len) break;  // every position is an input the model has seen
    Tensor inputs = Tensor::empty({rows, len}, DType::i32);
    mm->token_modality = Tensor::zeros({rows * len}, DType::i32);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(seq[static_cast<size_t>(r)].begin(), seq[static_cast<size_t>(r)].end(),
                inputs.data<int32_t>() + r * len);
      std::fill_n(mm->token_modality.data<int32_t>() + r * len, d.media_tokens, modality);
    }
    model.set_multimodal(mm);
    const Tensor logits = model.last_logits(ctx, inputs);
    const int64_t v = logits.dim(1);
    bool all_done = true;
    for (int64_t r = 0; r < rows; ++r) {
      const auto ri = static_cast<size_t>(r);
      int32_t next = d.placeholder;
      if (!done[ri]) {
        next = pick_token(logits.data<float>() + r * v, v, opts, rng);
        if (next == opts.stop_id)
          done[ri] = true;
        else
          out[first + ri].push_back(next);
      }
      seq[ri].push_back(next);
      all_done = all_done && done[ri];
    }
    if (all_done) break;
  }
}

}  // namespace

MediaInput read_image_input(const std::string& png_path, const nn::MultimodalModelConfig& model) {
  const nn::VisionConfig& v = model.vision;
  const data::Image img = data::read_png(png_path, v.channels == 1 ? 1 : 3);
  const bool fits = img.height % v.patch == 0 && img.width % v.patch == 0 &&
                    img.height / v.patch <= v.max_rows && img.width / v.patch <= v.max_cols;
  MOETRON_CHECK(fits, "image '", png_path, "' is ", img.height, " x ", img.width,
                " pixels; the vision encoder takes heights and widths that are multiples of ",
                v.patch, " (vision.patch) up to ", v.max_rows * v.patch, " x ",
                v.max_cols * v.patch, " (vision.max_rows, vision.max_cols)");
  return normalise_image(img.pixels, img.height, img.width, img.channels, v.channels);
}

MediaInput read_audio_input(const std::string& wav_path, const data::LogMelOptions& mel,
                            int64_t audio_frames) {
  data::Waveform wave = data::read_wav(wav_path);
  MOETRON_CHECK(!wave.samples.empty(), "audio '", wav_path, "' holds no samples");
  if (wave.sample_rate != mel.sample_rate)
    wave.samples = data::resample(wave.samples, wave.sample_rate, mel.sample_rate);
  const data::LogMel log_mel(mel);
  const std::vector<float> features = log_mel.compute(wave.samples);
  const int64_t frames = static_cast<int64_t>(features.size()) / mel.n_mels;
  return normalise_log_mel(features, frames, mel.n_mels, audio_frames);
}

data::LogMelOptions corpus_log_mel_options(const std::string& data_dir, int64_t n_mels) {
  data::LogMelOptions o;
  o.n_mels = n_mels;
  const std::string path = data_dir + "/manifest.json";
  if (data_dir.empty() || !std::filesystem::exists(path)) return o;
  std::ifstream f(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const std::exception& e) {
    MOETRON_FAIL("multimodal manifest '", path, "' is not valid JSON: ", e.what());
  }
  const nlohmann::json::json_pointer at("/state/tasks/asr/log_mel");
  if (!j.contains(at)) return o;
  try {
    const nlohmann::json& m = j.at(at);
    o.sample_rate = m.at("sample_rate").get<int>();
    o.win_length = m.at("win_length").get<int64_t>();
    o.hop_length = m.at("hop_length").get<int64_t>();
    o.n_fft = m.at("n_fft").get<int64_t>();
    o.n_mels = m.at("n_mels").get<int64_t>();
    o.f_min = m.at("f_min").get<double>();
    o.f_max = m.at("f_max").get<double>();
    o.whisper_scaling = m.at("whisper_scaling").get<bool>();
  } catch (const std::exception& e) {
    MOETRON_FAIL("multimodal manifest '", path, "': bad log_mel entry: ", e.what());
  }
  MOETRON_CHECK(o.n_mels == n_mels, "the corpus '", data_dir, "' has ", o.n_mels,
                " mel bins but the model's audio.n_mels is ", n_mels);
  return o;
}

std::vector<std::vector<int32_t>> generate_from_media(kernels::Context& ctx, nn::Transformer& model,
                                                      const std::vector<MediaInput>& items,
                                                      const std::vector<int32_t>& prompt,
                                                      const SampleOptions& opts, int64_t batch) {
  MOETRON_CHECK(model.has_media(), "the checkpoint has no image or audio encoder ",
                "(multimodal.enabled = false): it cannot read --image or --audio");
  check_sample_options(opts);
  MOETRON_CHECK(batch >= 1, "generation batch must be >= 1, got ", batch);
  std::vector<std::vector<int32_t>> out(items.size());
  if (items.empty()) return out;
  for (const MediaInput& in : items)
    MOETRON_CHECK(in.modality == items[0].modality && in.shape == items[0].shape &&
                      in.modality != nn::Modality::text,
                  "media decoded together must share one modality and shape");
  DecodeRows d;
  d.media_tokens = media_placeholders(model, items[0]);
  d.placeholder = opts.stop_id >= 0 ? opts.stop_id : 0;
  d.head.assign(static_cast<size_t>(d.media_tokens), d.placeholder);
  d.head.insert(d.head.end(), prompt.begin(), prompt.end());
  const int64_t ctx_len = model.config().max_seq_len;
  MOETRON_CHECK(static_cast<int64_t>(d.head.size()) <= ctx_len, "a row of ", d.media_tokens,
                " media tokens and a prompt of ", prompt.size(),
                " tokens does not fit model.max_seq_len = ", ctx_len);
  MultimodalReset reset{model};
  PhiloxStream rng(opts.seed, "generate");
  for (size_t first = 0; first < items.size(); first += static_cast<size_t>(batch)) {
    const int64_t rows = std::min<int64_t>(batch, static_cast<int64_t>(items.size() - first));
    decode_rows(ctx, model, items, first, rows, d, opts, rng, out);
  }
  return out;
}

}  // namespace moetron::train
