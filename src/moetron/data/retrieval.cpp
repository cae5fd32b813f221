#include "moetron/data/retrieval.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "moetron/core/error.h"
#include "moetron/core/manifest.h"
#include "moetron/core/rng.h"
#include "moetron/core/staged_dir.h"

namespace moetron::data {

namespace {

constexpr int32_t kFirstFreeId = 3;  // after EOS, KEY and QUERY

int64_t val_examples(const RetrievalOptions& o) {
  return std::max<int64_t>(1, std::llround(static_cast<double>(o.examples) * o.val_fraction));
}

void write_ids(const std::string& path, const std::vector<int32_t>& ids) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  // int32 little-endian on disk, as corpus.cpp writes (a little-endian build).
  f.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
  f.flush();
  MOETRON_CHECK(f.good(), "cannot write '", path, "'");
}

}  // namespace

void validate_retrieval(const RetrievalOptions& o) {
  MOETRON_CHECK(!o.out_dir.empty(), "--out is required");
  MOETRON_CHECK(o.key_len >= 1, "--key-len must be >= 1, got ", o.key_len);
  MOETRON_CHECK(o.key_within >= o.key_len + 1, "--key-within ", o.key_within,
                " cannot hold KEY and a key of ", o.key_len,
                " tokens (--key-len): it must be >= ", o.key_len + 1);
  MOETRON_CHECK(o.seq_len >= o.key_within + o.key_len, "--seq-len ", o.seq_len,
                " is too small: KEY and the key (in the first ", o.key_within,
                " positions, --key-within) and QUERY with the key again (", o.key_len + 1,
                " tokens, --key-len ", o.key_len, ") need --seq-len >= ", o.key_within + o.key_len);
  MOETRON_CHECK(o.key_vocab >= 2, "--key-vocab must be >= 2, got ", o.key_vocab);
  MOETRON_CHECK(o.vocab_size > kFirstFreeId + o.key_vocab, "--vocab-size ", o.vocab_size,
                " leaves no filler tokens beside the ", kFirstFreeId, " special ids and ",
                o.key_vocab, " key tokens (--key-vocab): it must be > ",
                kFirstFreeId + o.key_vocab);
  MOETRON_CHECK(o.val_fraction > 0 && o.val_fraction < 1, "--val-fraction must be in (0, 1), got ",
                o.val_fraction);
  MOETRON_CHECK(o.examples >= 2 && o.examples > val_examples(o), "--examples ", o.examples,
                " leaves no training examples beside ", val_examples(o),
                " validation examples (--val-fraction ", o.val_fraction, ")");
}

RetrievalVocab retrieval_vocab(const RetrievalOptions& o) {
  RetrievalVocab v;
  v.key_first = kFirstFreeId;
  v.key_count = o.key_vocab;
  v.filler_first = static_cast<int32_t>(kFirstFreeId + o.key_vocab);
  v.filler_count = o.vocab_size - v.filler_first;
  return v;
}

std::vector<int32_t> retrieval_example(const RetrievalOptions& o, uint64_t index) {
  const RetrievalVocab v = retrieval_vocab(o);
  PhiloxStream rng(o.seed, "data.retrieval");
  rng.set_position(index << 32);
  const auto draw = [&rng](int64_t n) { return static_cast<int64_t>(rng.next_u32() % n); };
  std::vector<int32_t> ex(static_cast<size_t>(o.seq_len + 1));
  for (auto& id : ex) id = static_cast<int32_t>(v.filler_first + draw(v.filler_count));
  const int64_t k = o.key_len;
  const int64_t key_at = draw(o.key_within - k);  // KEY's position; the key follows it
  const int64_t query_at = o.seq_len - k;
  ex[static_cast<size_t>(key_at)] = v.key_marker;
  ex[static_cast<size_t>(query_at)] = v.query_marker;
  for (int64_t j = 1; j <= k; ++j) {
    const auto id = static_cast<int32_t>(v.key_first + draw(v.key_count));
    ex[static_cast<size_t>(key_at + j)] = id;
    ex[static_cast<size_t>(query_at + j)] = id;
  }
  return ex;
}

RetrievalReport prepare_retrieval(const RetrievalOptions& o) {
  validate_retrieval(o);
  RetrievalReport rep;
  rep.val_examples = val_examples(o);
  rep.train_examples = o.examples - rep.val_examples;
  rep.vocab_size = o.vocab_size;
  StagedDir staged(o.out_dir);
  std::vector<int32_t> train, val;
  for (int64_t i = 0; i < o.examples; ++i) {
    const auto ex = retrieval_example(o, static_cast<uint64_t>(i));
    auto& dst = i < rep.train_examples ? train : val;
    dst.insert(dst.end(), ex.begin(), ex.end());
  }
  write_ids(staged.file("train.bin"), train);
  write_ids(staged.file("val.bin"), val);
  rep.train_tokens = static_cast<int64_t>(train.size());
  rep.val_tokens = static_cast<int64_t>(val.size());
  const RetrievalVocab v = retrieval_vocab(o);
  const nlohmann::json state = {
      {"format", "moetron-tokens/1"},
      {"dtype", "i32"},
      {"task", "retrieval"},
      {"vocab_size", rep.vocab_size},
      {"eos_id", v.eos},
      {"key_id", v.key_marker},
      {"query_id", v.query_marker},
      {"key_vocab", {{"first", v.key_first}, {"count", v.key_count}}},
      {"filler_vocab", {{"first", v.filler_first}, {"count", v.filler_count}}},
      {"seq_len", o.seq_len},
      {"example_tokens", o.seq_len + 1},
      {"key_len", o.key_len},
      {"answer_tokens", o.key_len},  // the last key_len targets: data.loss_on_answers
      {"key_within", o.key_within},
      {"min_key_query_distance", o.seq_len - o.key_within},
      {"seed", o.seed},
      {"documents", o.examples},
      {"train_examples", rep.train_examples},
      {"val_examples", rep.val_examples},
      {"train_tokens", rep.train_tokens},
      {"val_tokens", rep.val_tokens},
      {"val_fraction", o.val_fraction}};
  write_manifest(staged.staging_path(), {"train.bin", "val.bin"}, state);
  staged.commit();
  return rep;
}

}  // namespace moetron::data
