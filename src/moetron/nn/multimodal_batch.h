// What a multimodal micro-batch adds to its token ids and targets
// (train/multimodal_batches.h builds it; nn::Transformer consumes it).
//
// Prefix fusion (LLaVA): item i of a media group is encoded and projected
// into the language model's width, and its tokens replace the embeddings of
// positions [0, tokens) of row rows[i]; those positions carry a placeholder
// id and no target. Rows are grouped by task (contiguous runs), and each
// task's token losses get their own gradient scale: the step's loss is
//   sum_task w_task * (mean cross-entropy over the task's target tokens)
// so task_grad_scale[task] = w_task / (the task's target tokens in the step).
#pragma once

#include <cstdint>
#include <vector>

#include "moetron/core/tensor.h"

namespace moetron::nn {

// Token modalities (modality-aware routing reads them per token).
enum class Modality : int32_t { text = 0, image = 1, audio = 2 };
inline constexpr int64_t kNumModalities = 3;

// Items of one modality with one input shape: one encoder call.
struct MediaGroup {
  Modality modality = Modality::image;
  // image: f32 [n, C, H, W] (normalised); audio: f32 [n, frames, n_mels]
  Tensor input;
  std::vector<int64_t> rows;  // the batch row of each item (prefix of that row)
};

struct MultimodalBatch {
  std::vector<MediaGroup> media;
  // Task of each row (index into the run's task list), rows of one task
  // contiguous; empty: one task, the caller's grad_scale.
  std::vector<int32_t> row_task;
  // Per task: the gradient scale of its token losses (loss scale and the
  // multitask weight included). Used instead of the forward's grad_scale.
  std::vector<double> task_grad_scale;
  // i32 [B * S]: the modality of every position (media tokens their
  // modality, text 0), for modality-aware routing; undefined: all text.
  Tensor token_modality;
  int64_t num_tasks() const { return static_cast<int64_t>(task_grad_scale.size()); }
};

}  // namespace moetron::nn
