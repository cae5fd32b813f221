#include "moetron/train/retrieval_eval.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "moetron/core/error.h"
#include "moetron/core/manifest.h"
#include "moetron/data/token_dataset.h"

namespace moetron::train {

namespace {

template <typename T>
int64_t count_argmax_hits(const T* logits, int64_t rows, int64_t vocab,
                          const std::vector<int32_t>& expected) {
  int64_t hits = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* row = logits + r * vocab;
    const int64_t best = std::max_element(row, row + vocab) - row;  // first of equal maxima
    hits += best == expected[static_cast<size_t>(r)];
  }
  return hits;
}

// The retrieval fields of a corpus manifest, checked.
struct RetrievalLayout {
  int64_t seq_len = 0, key_len = 0, vocab_size = 0, key_count = 0;
  int32_t query_id = 0;
};

RetrievalLayout read_layout(const std::string& data_dir) {
  const nlohmann::json info = verify_manifest(data_dir, "corpus");
  MOETRON_CHECK(info.value("task", "") == "retrieval", "corpus '", data_dir,
                "' is not a retrieval corpus (write one with `moetron prepare-data --task ",
                "retrieval`)");
  RetrievalLayout l;
  l.seq_len = info.at("example_tokens").get<int64_t>() - 1;
  l.key_len = info.at("key_len").get<int64_t>();
  l.vocab_size = info.at("vocab_size").get<int64_t>();
  l.key_count = info.at("key_vocab").at("count").get<int64_t>();
  l.query_id = info.at("query_id").get<int32_t>();
  return l;
}

}  // namespace

RetrievalScore score_argmax(const Tensor& logits, const std::vector<int32_t>& expected) {
  MOETRON_CHECK(logits.rank() == 2 && logits.dim(0) == static_cast<int64_t>(expected.size()),
                "logits ", logits.str(), " do not match ", expected.size(), " expected ids");
  RetrievalScore s;
  s.keys = logits.dim(0);
  if (logits.dtype() == DType::f32) {
    s.correct = count_argmax_hits(logits.data<float>(), logits.dim(0), logits.dim(1), expected);
  } else {
    MOETRON_CHECK(logits.dtype() == DType::f64, "logits must be f32 or f64, got ", logits.str());
    s.correct = count_argmax_hits(logits.data<double>(), logits.dim(0), logits.dim(1), expected);
  }
  return s;
}

RetrievalScore evaluate_retrieval(kernels::Context& ctx, nn::Transformer& model,
                                  const std::string& data_dir, int64_t batch,
                                  int64_t max_examples) {
  MOETRON_CHECK(batch >= 1, "--batch must be >= 1, got ", batch);
  const RetrievalLayout l = read_layout(data_dir);
  const nn::ModelConfig& mc = model.config();
  MOETRON_CHECK(l.vocab_size <= mc.vocab_size, "corpus '", data_dir, "' has a vocabulary of ",
                l.vocab_size, " but the model's is ", mc.vocab_size);
  MOETRON_CHECK(l.seq_len <= mc.max_seq_len, "corpus '", data_dir, "' has examples of seq_len ",
                l.seq_len, " but the model's max_seq_len is ", mc.max_seq_len);
  const data::TokenFile val(data_dir + "/val.bin", mc.vocab_size);
  const int64_t len = l.seq_len + 1, k = l.key_len;
  int64_t rows = val.size() / len;
  if (max_examples > 0) rows = std::min(rows, max_examples);
  MOETRON_CHECK(rows > 0, "corpus '", data_dir, "' has no validation examples");
  RetrievalScore total;
  total.chance = 1.0 / static_cast<double>(l.key_count);
  for (int64_t r0 = 0; r0 < rows; r0 += batch) {
    const int64_t b = std::min(batch, rows - r0);
    Tensor inputs = Tensor::empty({b, l.seq_len}, DType::i32);
    std::vector<int32_t> keys;
    for (int64_t r = 0; r < b; ++r) {
      const int32_t* ex = val.data() + (r0 + r) * len;
      MOETRON_CHECK(ex[l.seq_len - k] == l.query_id, "corpus '", data_dir, "': example ", r0 + r,
                    " has no QUERY at position ", l.seq_len - k);
      std::copy(ex, ex + l.seq_len, inputs.data<int32_t>() + r * l.seq_len);
      keys.insert(keys.end(), ex + l.seq_len - k + 1, ex + len);  // the last k targets
    }
    const RetrievalScore s = score_argmax(model.last_logits(ctx, inputs, k), keys);
    total.correct += s.correct;
    total.keys += s.keys;
    total.examples += b;
  }
  return total;
}

}  // namespace moetron::train
