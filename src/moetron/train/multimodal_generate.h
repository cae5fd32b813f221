// Generation from an image or a clip of speech with a multimodal checkpoint
// (`moetron generate --image F.png | --audio F.wav`, and the task metrics of
// train/multimodal_eval.h). A row is laid out as in training
// (train/multimodal_batches.h):
//   [N media placeholders] [task prompt] [extra prompt tokens] [generated ...]
// (N = 0 under multimodal.fusion = "cross_attention": the media reach the
// model through its cross-attention layers only) and decoded token by token
// from the last position's logits until eos, the token budget, or the
// model's max_seq_len. Media are read and normalised exactly as the
// trainer's records were (train/media_inputs.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moetron/data/log_mel.h"
#include "moetron/kernels/context.h"
#include "moetron/nn/transformer.h"
#include "moetron/train/generate.h"
#include "moetron/train/media_inputs.h"

namespace moetron::train {

// A PNG as the vision encoder's input (read as RGB for a 3-channel encoder,
// grey for a 1-channel one). Throws naming the file when it cannot be read or
// its size does not split into the encoder's patches.
MediaInput read_image_input(const std::string& png_path, const nn::MultimodalModelConfig& model);

// A 16-bit PCM mono WAV as the audio encoder's input: resampled to
// mel.sample_rate when it differs, log-mel features (data/log_mel.h), then
// normalised and cut or padded to `audio_frames`. Throws naming the file.
MediaInput read_audio_input(const std::string& wav_path, const data::LogMelOptions& mel,
                            int64_t audio_frames);

// The log-mel options the corpus in `data_dir` was made with (its
// manifest's asr entry); when it has none or cannot be read, the defaults
// with `n_mels` (the config's audio.n_mels).
data::LogMelOptions corpus_log_mel_options(const std::string& data_dir, int64_t n_mels);

// Decodes a continuation for every item (all of one modality and shape: one
// encoder call per step), `batch` rows at a time, each row
// [item's placeholders] [prompt]. Returns the new tokens of each item, eos
// (opts.stop_id) excluded. The model must have its encoders (a multimodal
// checkpoint); its multimodal batch is cleared on return.
std::vector<std::vector<int32_t>> generate_from_media(kernels::Context& ctx, nn::Transformer& model,
                                                      const std::vector<MediaInput>& items,
                                                      const std::vector<int32_t>& prompt,
                                                      const SampleOptions& opts,
                                                      int64_t batch = 16);

}  // namespace moetron::train
