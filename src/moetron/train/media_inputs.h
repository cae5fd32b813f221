// What a media row starts with, shared by training (train/multimodal_batches.h)
// and generation / task evaluation (train/multimodal_generate.h), so a PNG or
// WAV given to `moetron generate` reaches the encoders exactly as the
// corpus's records did in training:
//   images: pixels to [-1, 1] (v / 127.5 - 1), [C, H, W] with the encoder's
//     C channels (a grey image repeated over them, extra source channels
//     dropped);
//   audio: log-mel features as Whisper does (floored at their maximum - 8,
//     then (x + 4) / 4), cut or padded with the floor to `frames` frames;
//   the task prompt a task's rows carry after the media.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "moetron/data/multimodal_format.h"
#include "moetron/nn/multimodal_batch.h"
#include "moetron/nn/multimodal_config.h"

namespace moetron::train {

// One media item, normalised, ready to be an item of an nn::MediaGroup.
struct MediaInput {
  nn::Modality modality = nn::Modality::image;
  std::array<int64_t, 3> shape{};  // image C, H, W; audio frames, n_mels, 0
  std::vector<float> values;       // shape's product
};

// pixels: u8 [height, width, src_channels] row-major.
MediaInput normalise_image(std::span<const uint8_t> pixels, int64_t height, int64_t width,
                           int64_t src_channels, int64_t channels);
// features: f32 [n_frames, n_mels] row-major (data/log_mel.h's output).
MediaInput normalise_log_mel(std::span<const float> features, int64_t n_frames, int64_t n_mels,
                             int64_t frames);
// A corpus record's media (image or audio) for `model`'s encoders; throws
// when its mel bins differ from audio.n_mels.
MediaInput media_input(const data::Record& r, const nn::MultimodalModelConfig& model,
                       int64_t audio_frames);

// The text a task's rows carry after the media ("Caption:", ...); empty for
// the text task.
const char* task_prompt_text(data::Task t);

}  // namespace moetron::train
