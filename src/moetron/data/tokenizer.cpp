#include "moetron/data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "moetron/core/error.h"

namespace moetron::data {

namespace {
constexpr const char* kNewlinePiece = "<n>";
// SentencePiece trains on lines and skips those longer than its
// --max_sentence_length (passed below); longer documents (whole files) are
// given to it in pieces of whole lines of at most kTrainingPieceBytes.
constexpr size_t kMaxSentenceBytes = 65536;
constexpr size_t kTrainingPieceBytes = 16384;

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (true) {
    const size_t next = s.find(from, pos);
    if (next == std::string::npos) break;
    out.append(s, pos, next - pos);
    out += to;
    pos = next + from.size();
  }
  out.append(s, pos, std::string::npos);
  return out;
}
// Writes `doc` as one training line, or, when escaped it would exceed
// kMaxSentenceBytes, as several lines cut at its newlines (a piece's
// newlines stay escaped; the <n> piece is user-defined, never merged, so
// the cuts change no merge).
void write_training_lines(std::ostream& out, const std::string& doc) {
  const std::string escaped = escape_newlines(doc);
  if (escaped.size() <= kMaxSentenceBytes) {
    out << escaped << "\n";
    return;
  }
  std::string piece;
  size_t pos = 0;
  while (pos < doc.size()) {
    size_t end = doc.find('\n', pos);
    end = end == std::string::npos ? doc.size() : end + 1;
    if (!piece.empty() && piece.size() + (end - pos) > kTrainingPieceBytes) {
      out << escape_newlines(piece) << "\n";
      piece.clear();
    }
    piece.append(doc, pos, end - pos);
    pos = end;
  }
  if (!piece.empty()) out << escape_newlines(piece) << "\n";
}

}  // namespace

std::string escape_newlines(const std::string& text) {
  return replace_all(text, "\n", kNewlinePiece);
}
std::string unescape_newlines(const std::string& text) {
  return replace_all(text, kNewlinePiece, "\n");
}

Tokenizer::Tokenizer(const std::string& model_path)
    : path_(model_path), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  MOETRON_CHECK(std::filesystem::exists(model_path), "tokenizer model '", model_path,
                "' does not exist");
  const auto status = sp_->Load(model_path);
  MOETRON_CHECK(status.ok(), "cannot load tokenizer model '", model_path, "': ", status.ToString());
}

Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(escape_newlines(text), &ids);
  MOETRON_CHECK(status.ok(), "tokenizer '", path_, "': encode failed: ", status.ToString());
  return {ids.begin(), ids.end()};
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::vector<int> v;
  v.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < sp_->GetPieceSize() && id != sp_->eos_id() && id != sp_->bos_id())
      v.push_back(id);
  }
  std::string text;
  const auto status = sp_->Decode(v, &text);
  MOETRON_CHECK(status.ok(), "tokenizer '", path_, "': decode failed: ", status.ToString());
  return unescape_newlines(text);
}

int64_t Tokenizer::vocab_size() const {
  return sp_->GetPieceSize();
}
int32_t Tokenizer::eos_id() const {
  return sp_->eos_id();
}
int32_t Tokenizer::bos_id() const {
  return sp_->bos_id();
}

namespace {

// The training lines, from memory: SentencePiece then records no input path
// in the model, so the same corpus gives the same bytes wherever it is trained.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string>& lines) : lines_(lines) {}
  bool done() const override { return i_ >= lines_.size(); }
  void Next() override { ++i_; }
  const std::string& value() const override { return lines_[i_]; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& lines_;
  size_t i_ = 0;
};

std::vector<std::string> training_lines(const std::vector<std::string>& documents) {
  std::ostringstream text;
  for (const auto& d : documents) write_training_lines(text, d);
  std::vector<std::string> lines;
  std::istringstream in(text.str());
  for (std::string line; std::getline(in, line);) lines.push_back(std::move(line));
  return lines;
}

}  // namespace

void train_tokenizer(const std::vector<std::string>& documents, const std::string& model_prefix,
                     int64_t vocab_size, int num_threads) {
  MOETRON_CHECK(!documents.empty(), "cannot train a tokenizer on an empty corpus");
  const std::vector<std::string> lines = training_lines(documents);
  // Every character gets a piece when the vocabulary has room; a small one
  // (its 256 byte pieces come first) covers fewer, the rare rest spelled in
  // bytes (byte fallback), instead of failing with "Vocabulary size is
  // smaller than required_chars".
  sentencepiece::util::Status status;
  std::string model;
  for (const double coverage :
       {1.0, 0.9995, 0.999, 0.995, 0.99, 0.98}) {  // 0.98: SentencePiece's least
    const std::string args =
        str_cat("--vocab_size=", vocab_size, " --model_type=bpe --character_coverage=", coverage,
                " --byte_fallback=true",
                " --normalization_rule_name=identity --remove_extra_whitespaces=false",
                " --split_digits=true --user_defined_symbols=", kNewlinePiece,
                " --max_sentence_length=", kMaxSentenceBytes, " --num_threads=", num_threads,
                " --minloglevel=2 --unk_id=0 --bos_id=1 --eos_id=2 --pad_id=-1");
    LineIterator it(lines);
    model.clear();
    status = sentencepiece::SentencePieceTrainer::Train(args, &it, &model);
    if (status.ok() || status.ToString().find("required_chars") == std::string::npos) {
      if (status.ok() && coverage < 1.0) {
        std::cerr << "notice: a vocabulary of " << vocab_size
                  << " cannot give every character of the corpus a piece: the rarest "
                  << 100.0 * (1.0 - coverage) << "% of characters are spelled in bytes\n";
      }
      break;
    }
  }
  MOETRON_CHECK(status.ok(), "tokenizer training failed: ", status.ToString(),
                status.ToString().find("required_chars") == std::string::npos
                    ? ""
                    : " (even with 2% of the characters spelled in bytes: give a larger "
                      "--vocab-size / model.vocab_size)");
  const std::string path = model_prefix + ".model";
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(model.data(), static_cast<std::streamsize>(model.size()));
  MOETRON_CHECK(f.good(), "cannot write '", path, "'");
}

}  // namespace moetron::data
