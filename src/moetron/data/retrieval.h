// `moetron prepare-data --task retrieval`: a synthetic long-context probe.
// Every example is seq_len + 1 token ids (one training window: the model
// reads the first seq_len and predicts the last seq_len):
//
//   filler ... KEY k1 .. kK filler ... filler QUERY k1 .. kK
//   ^ KEY within the first key_within positions     ^ position seq_len - K
//
// so the last K targets are the key, seen only far back (at least
// seq_len - key_within positions before the query; beyond a sliding
// attention window when key_within + window < seq_len). Key tokens and
// filler tokens come from disjoint ranges of the vocabulary; everything is
// drawn from Philox(seed, "data.retrieval") at counter example << 32, so
// example i is a pure function of (options, i).
//
// The corpus is written like a text corpus (DIR/train.bin, DIR/val.bin of
// int32 ids, DIR/manifest.json), without a tokenizer: the manifest holds
// "task": "retrieval", the special ids, both vocabulary ranges and
// "example_tokens" = seq_len + 1, which makes the trainer cut its windows
// at example boundaries (data/token_dataset.h), and "answer_tokens" = K,
// the targets data.loss_on_answers trains on (the filler is unpredictable
// noise that otherwise makes up all but K of every example's targets).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moetron::data {

struct RetrievalOptions {
  std::string out_dir;      // must not exist yet
  int64_t seq_len = 0;      // model positions per example (= train.seq_len)
  int64_t examples = 1024;  // train + validation
  uint64_t seed = 1;
  int64_t vocab_size = 4096;
  int64_t key_len = 4;      // K
  int64_t key_within = 64;  // KEY and the key lie in the first key_within positions
  int64_t key_vocab = 64;   // distinct key tokens; the rest of the vocabulary is filler
  double val_fraction = 0.05;
};

// The ids of a retrieval corpus: 0 EOS (never written: the examples have a
// fixed length), 1 KEY, 2 QUERY, then the key range, then the filler range.
struct RetrievalVocab {
  int32_t eos = 0, key_marker = 1, query_marker = 2;
  int32_t key_first = 3;
  int64_t key_count = 0;
  int32_t filler_first = 0;
  int64_t filler_count = 0;
};

// Throws naming the option (--seq-len, --key-len, ...) when the options
// cannot make an example; nothing is written before this passes.
void validate_retrieval(const RetrievalOptions& opts);
RetrievalVocab retrieval_vocab(const RetrievalOptions& opts);

// Example `index`: seq_len + 1 ids.
std::vector<int32_t> retrieval_example(const RetrievalOptions& opts, uint64_t index);

struct RetrievalReport {
  int64_t train_examples = 0, val_examples = 0, train_tokens = 0, val_tokens = 0;
  int64_t vocab_size = 0;
};

// Examples [0, train) into train.bin, [train, examples) into val.bin (val =
// max(1, round(examples * val_fraction))), published atomically.
RetrievalReport prepare_retrieval(const RetrievalOptions& opts);

}  // namespace moetron::data
