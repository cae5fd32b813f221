// Multimodal micro-batches for the trainer, from a corpus written by
// `moetron prepare-data --multimodal` (data/multimodal_format.h).
//
// Sample i of a split is a pure function of (seed, i), like the text
// sampler's windows: its task is drawn by the configured proportions
// (multimodal.mix), then a record of that task (or, for the text task, a
// window of the text corpus). So a dp rank builds its own rows without the
// others, and a resumed run draws the same samples.
//
// A row of a media task is
//   [N media placeholders] [task prompt] [target tokens] [eos] [eos padding]
// where the N placeholders' embeddings are replaced by the encoder's tokens
// (nn/media_fusion.h) and only the target tokens and the eos are predicted.
// With multimodal.fusion = "cross_attention" N is 0: the media reach the
// language model through its cross-attention layers only.
// A target too long for the row is cut (counted in truncated()).
//
// Media are normalised by train/media_inputs.h (shared with generation):
// pixels to [-1, 1] (a grey image repeated over the encoder's channels);
// log-mel features as Whisper does (floored at their maximum - 8, then
// (x + 4) / 4), cut or padded with the floor to multimodal.audio_frames frames.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moetron/core/rng.h"
#include "moetron/data/multimodal_format.h"
#include "moetron/data/token_dataset.h"
#include "moetron/nn/multimodal_batch.h"
#include "moetron/nn/multimodal_config.h"

namespace moetron::train {

// The run's tasks and their sampling shares. Task i of a MultimodalBatch
// (row_task, task_grad_scale) is tasks[i].
struct TaskMix {
  std::vector<data::Task> tasks;
  std::vector<double> values;  // as written
  std::vector<double> shares;  // values / their sum
};
// "text:1,caption:2,asr:1" -> the tasks in that order with their values
// (a task without one: 1); errors name `key`.
TaskMix parse_task_mix(const std::string& spec, const std::string& key);
std::vector<std::string> task_names(const TaskMix& mix);

class MultimodalBatcher {
 public:
  MultimodalBatcher(const std::string& data_dir, const nn::MultimodalModelConfig& model,
                    TaskMix mix, int64_t seq_len, int64_t audio_frames, uint64_t seed);
  ~MultimodalBatcher();

  // Rows `indices` (global sample indices of `split`) into inputs and
  // targets (i32 [B, S], B = indices.size()), rows ordered by task (then
  // by index); returns their media, tasks and token modalities
  // (task_grad_scale sized to the tasks, zero: the caller sets it).
  std::shared_ptr<nn::MultimodalBatch> build(data::Split split,
                                             const std::vector<uint64_t>& indices,
                                             const Tensor& inputs, const Tensor& targets) const;
  // The task sample `index` of `split` draws (an index into the mix).
  int32_t task_of(uint64_t index) const;
  const TaskMix& mix() const { return mix_; }
  int64_t num_tasks() const { return static_cast<int64_t>(mix_.tasks.size()); }
  const data::MultimodalDataset& dataset() const { return *dataset_; }
  // Targets cut because their row was full, since construction.
  int64_t truncated() const { return truncated_; }
  // The prompt a task's rows carry after the media (token ids).
  const std::vector<int32_t>& prompt(data::Task t) const;
  int32_t eos_id() const { return eos_; }

 private:
  struct Row;
  std::unique_ptr<data::MultimodalDataset> dataset_;
  std::unique_ptr<data::TokenFile> text_train_, text_val_;
  std::unique_ptr<data::WindowSampler> text_train_windows_, text_val_windows_;
  nn::MultimodalModelConfig model_;
  TaskMix mix_;
  int64_t seq_ = 0, audio_frames_ = 0;
  int32_t eos_ = 0;
  PhiloxKey task_key_, record_key_;
  std::vector<std::vector<int32_t>> prompts_;  // by data::Task
  mutable std::atomic<int64_t> truncated_{0};
  Row make_row(data::Split split, uint64_t index) const;
  void fill_media_row(const data::Record& r, Row& row) const;
  // Media positions the row starts with: its media tokens under prefix fusion, else 0.
  int64_t placeholders(const Row& row) const;
};

}  // namespace moetron::train
