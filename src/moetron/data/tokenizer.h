// A SentencePiece tokenizer (Debian's libsentencepiece). Newlines matter in
// the text we train on (poems, code, fortunes), but SentencePiece treats a
// line as a sentence; so text is stored with "\n" mapped to the reserved
// piece "<n>" and mapped back on decode.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace moetron::data {

class Tokenizer {
 public:
  explicit Tokenizer(const std::string& model_path);  // throws naming the path
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  int64_t vocab_size() const;
  int32_t eos_id() const;
  int32_t bos_id() const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

// Trains a BPE model on `documents` (one document per entry) and writes
// `model_prefix`.model and .vocab. Deterministic for the same input.
void train_tokenizer(const std::vector<std::string>& documents, const std::string& model_prefix,
                     int64_t vocab_size, int num_threads = 1);

// The newline escape shared by training and encoding.
std::string escape_newlines(const std::string& text);
std::string unescape_newlines(const std::string& text);

}  // namespace moetron::data
