#include "moetron/train/media_inputs.h"

#include <algorithm>

#include "moetron/core/error.h"

namespace moetron::train {

MediaInput normalise_image(std::span<const uint8_t> pixels, int64_t height, int64_t width,
                           int64_t src_channels, int64_t channels) {
  MOETRON_CHECK(height > 0 && width > 0 && src_channels > 0 && channels > 0 &&
                    static_cast<int64_t>(pixels.size()) == height * width * src_channels,
                "an image of ", pixels.size(), " bytes is not ", height, " x ", width, " x ",
                src_channels);
  MediaInput in;
  in.modality = nn::Modality::image;
  in.shape = {channels, height, width};
  in.values.resize(static_cast<size_t>(channels * height * width));
  for (int64_t ch = 0; ch < channels; ++ch) {
    const int64_t src_ch = src_channels == 1 ? 0 : std::min(ch, src_channels - 1);
    for (int64_t y = 0; y < height; ++y)
      for (int64_t x = 0; x < width; ++x) {
        const uint8_t v = pixels[static_cast<size_t>((y * width + x) * src_channels + src_ch)];
        in.values[static_cast<size_t>((ch * height + y) * width + x)] = v / 127.5f - 1.0f;
      }
  }
  return in;
}

MediaInput normalise_log_mel(std::span<const float> features, int64_t n_frames, int64_t n_mels,
                             int64_t frames) {
  MOETRON_CHECK(n_mels > 0 && frames > 0 && n_frames >= 0 &&
                    static_cast<int64_t>(features.size()) == n_frames * n_mels,
                "log-mel features of ", features.size(), " values are not ", n_frames, " x ",
                n_mels);
  const float top = features.empty() ? 0.0f : *std::max_element(features.begin(), features.end());
  const float floor = top - 8.0f;
  MediaInput in;
  in.modality = nn::Modality::audio;
  in.shape = {frames, n_mels, 0};
  in.values.assign(static_cast<size_t>(frames * n_mels), (floor + 4.0f) / 4.0f);
  const int64_t kept = std::min(frames, n_frames);
  for (int64_t i = 0; i < kept * n_mels; ++i)
    in.values[static_cast<size_t>(i)] =
        (std::max(features[static_cast<size_t>(i)], floor) + 4.0f) / 4.0f;
  return in;
}

MediaInput media_input(const data::Record& r, const nn::MultimodalModelConfig& model,
                       int64_t audio_frames) {
  if (r.modality == data::Modality::image)
    return normalise_image(r.image, r.height, r.width, r.channels, model.vision.channels);
  MOETRON_CHECK(r.n_mels == model.audio.n_mels, "the corpus's audio has ", r.n_mels,
                " mel bins but audio.n_mels = ", model.audio.n_mels);
  return normalise_log_mel(r.features, r.frames, r.n_mels, audio_frames);
}

const char* task_prompt_text(data::Task t) {
  switch (t) {
    case data::Task::caption:
      return "Caption:";
    case data::Task::ocr:
      return "Text in the image:";
    case data::Task::asr:
      return "Transcript:";
    case data::Task::text:
      break;
  }
  return "";
}

}  // namespace moetron::train
