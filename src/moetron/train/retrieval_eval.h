// Retrieval accuracy on a key-retrieval corpus (data/retrieval.h): the share
// of key tokens a model predicts by argmax at the query positions, i.e.
// after QUERY and after each key token already given. `moetron eval --task
// retrieval` runs it on a checkpoint.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moetron/core/tensor.h"
#include "moetron/kernels/context.h"
#include "moetron/nn/transformer.h"

namespace moetron::train {

struct RetrievalScore {
  int64_t correct = 0;   // key tokens predicted
  int64_t keys = 0;      // key tokens scored
  int64_t examples = 0;  // sequences scored
  double chance = 0;     // accuracy of guessing among the key tokens (1 / key vocabulary)
  double accuracy() const {
    return keys ? static_cast<double>(correct) / static_cast<double>(keys) : 0;
  }
};

// Counts the rows r of `logits` (f32 or f64 [N, V]) whose argmax (the
// first on ties) is expected[r]; N == expected.size().
RetrievalScore score_argmax(const Tensor& logits, const std::vector<int32_t>& expected);

// The validation examples of the retrieval corpus `data_dir` (its val.bin;
// at most max_examples, 0: all) through `model`, `batch` at a time: the
// logits of each example's last key_len positions against its key. Throws
// naming the directory when it is not a retrieval corpus or the model
// cannot read its examples (vocabulary, max_seq_len).
RetrievalScore evaluate_retrieval(kernels::Context& ctx, nn::Transformer& model,
                                  const std::string& data_dir, int64_t batch,
                                  int64_t max_examples = 0);

}  // namespace moetron::train
