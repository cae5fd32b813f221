#include "moetron/data/corpus.h"

#include <xxhash.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "moetron/core/error.h"
#include "moetron/core/manifest.h"
#include "moetron/core/staged_dir.h"
#include "moetron/data/text_file.h"
#include "moetron/data/tokenizer.h"

namespace moetron::data {

namespace fs = std::filesystem;

namespace {

bool looks_like_text(const std::string& s) {
  return s.find('\0') == std::string::npos;
}

std::string trim_trailing_newlines(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

void split_file(const std::string& text, std::vector<std::string>& docs) {
  const bool fortune = text.find("\n%\n") != std::string::npos || text.rfind("%\n", 0) == 0;
  std::istringstream in(text);
  std::string line, cur;
  auto flush = [&] {
    cur = trim_trailing_newlines(cur);
    if (cur.find_first_not_of(" \t\n\r") != std::string::npos) docs.push_back(cur);
    cur.clear();
  };
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const bool boundary =
        fortune ? line == "%" : line.find_first_not_of(" \t") == std::string::npos;
    if (boundary) {
      flush();
    } else {
      cur += line;
      cur += '\n';
    }
  }
  flush();
}

// A whole file as one document: trailing newlines and blank files dropped, as
// for split documents.
void whole_file(const std::string& text, std::vector<std::string>& docs) {
  std::string doc = trim_trailing_newlines(text);
  if (doc.find_first_not_of(" \t\n\r") != std::string::npos) docs.push_back(std::move(doc));
}

void write_ids(const std::string& path, const std::vector<int32_t>& ids) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  // int32 little-endian on disk; this is a little-endian build (x86-64, aarch64).
  f.write(reinterpret_cast<const char*>(ids.data()), static_cast<std::streamsize>(ids.size() * 4));
  f.flush();
  MOETRON_CHECK(f.good(), "cannot write '", path, "'");
}

// Puts the documents of `docs` into train and val (each followed by EOS) by a
// hash of their content, stable when files are added or reordered. When the
// hash leaves one side empty (a few long documents), the document of
// smallest hash goes to validation, or the largest to training.
void split_and_encode(const std::vector<std::string>& docs, const Tokenizer& tok,
                      double val_fraction, std::vector<int32_t>& train, std::vector<int32_t>& val,
                      DocumentLengths& lengths) {
  const auto threshold = static_cast<uint64_t>(val_fraction * 18446744073709551615.0);
  std::vector<uint64_t> hashes(docs.size());
  size_t in_val = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    hashes[i] = XXH64(docs[i].data(), docs[i].size(), 0);
    in_val += hashes[i] < threshold;
  }
  uint64_t cut = threshold;
  if (docs.size() >= 2 && in_val == 0) cut = *std::min_element(hashes.begin(), hashes.end()) + 1;
  if (docs.size() >= 2 && in_val == docs.size())
    cut = *std::max_element(hashes.begin(), hashes.end());
  for (size_t i = 0; i < docs.size(); ++i) {
    auto& dst = hashes[i] < cut ? val : train;
    const auto ids = tok.encode(docs[i]);
    dst.insert(dst.end(), ids.begin(), ids.end());
    dst.push_back(tok.eos_id());
    ++lengths.count;
    lengths.total += static_cast<int64_t>(ids.size());
    lengths.max = std::max(lengths.max, static_cast<int64_t>(ids.size()));
  }
}

}  // namespace

DocumentMode parse_document_mode(const std::string& name) {
  if (name == "auto") return DocumentMode::split;
  if (name == "whole-file") return DocumentMode::whole_file;
  MOETRON_FAIL("--documents must be 'auto' (fortune files split on % lines, other files on blank ",
               "lines) or 'whole-file' (each file one document), got '", name, "'");
}

const char* document_mode_name(DocumentMode mode) {
  return mode == DocumentMode::whole_file ? "whole-file" : "auto";
}

std::vector<std::string> read_documents(const std::string& path, int64_t* files_read,
                                        DocumentMode mode) {
  MOETRON_CHECK(fs::exists(path), "corpus path '", path, "' does not exist");
  std::vector<std::string> files;
  if (fs::is_directory(path)) {
    for (const auto& e : fs::recursive_directory_iterator(path)) {
      if (e.is_symlink() || !e.is_regular_file()) continue;  // fortune's .u8 links duplicate files
      if (e.path().extension() == ".dat") continue;          // fortune's binary indexes
      files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());  // directory order is not deterministic
  } else {
    files.push_back(path);
  }
  std::vector<std::string> docs;
  int64_t n = 0;
  for (const auto& f : files) {
    const std::string text = read_text_file(f);
    if (!looks_like_text(text)) continue;
    if (mode == DocumentMode::whole_file) {
      whole_file(text, docs);
    } else {
      split_file(text, docs);
    }
    ++n;
  }
  if (files_read) *files_read = n;
  MOETRON_CHECK(!docs.empty(), "corpus path '", path, "' holds no text documents");
  return docs;
}

PrepareReport prepare_data(const PrepareOptions& opts) {
  MOETRON_CHECK(opts.val_fraction > 0 && opts.val_fraction < 1, "--val-fraction must be in (0, 1)");
  PrepareReport rep;
  const std::vector<std::string> docs = read_documents(opts.input, &rep.files, opts.documents);
  rep.documents = static_cast<int64_t>(docs.size());
  StagedDir staged(opts.out_dir);
  const std::string model_path = staged.file("tokenizer.model");
  if (opts.tokenizer_model.empty()) {
    train_tokenizer(docs, staged.file("tokenizer"), opts.vocab_size, opts.num_threads);
    fs::remove(staged.file("tokenizer.vocab"));
  } else {
    MOETRON_CHECK(fs::exists(opts.tokenizer_model), "tokenizer model '", opts.tokenizer_model,
                  "' does not exist");
    fs::copy_file(opts.tokenizer_model, model_path);
  }
  Tokenizer tok(model_path);
  rep.vocab_size = tok.vocab_size();
  for (const auto& d : docs) rep.bytes += static_cast<int64_t>(d.size());
  std::vector<int32_t> train, val;
  split_and_encode(docs, tok, opts.val_fraction, train, val, rep.lengths);
  MOETRON_CHECK(!train.empty() && !val.empty(), "corpus '", opts.input,
                "' is too small to split into train and validation sets");
  write_ids(staged.file("train.bin"), train);
  write_ids(staged.file("val.bin"), val);
  rep.train_tokens = static_cast<int64_t>(train.size());
  rep.val_tokens = static_cast<int64_t>(val.size());
  nlohmann::json state = {
      {"format", "moetron-tokens/1"},
      {"dtype", "i32"},
      {"vocab_size", rep.vocab_size},
      {"eos_id", tok.eos_id()},
      {"documents", rep.documents},
      {"train_tokens", rep.train_tokens},
      {"val_tokens", rep.val_tokens},
      {"source", opts.input},
      {"val_fraction", opts.val_fraction},
      {"document_mode", document_mode_name(opts.documents)},
      {"document_tokens",
       {{"count", rep.lengths.count}, {"mean", rep.lengths.mean()}, {"max", rep.lengths.max}}}};
  write_manifest(staged.staging_path(), {"tokenizer.model", "train.bin", "val.bin"}, state);
  staged.commit();
  return rep;
}

}  // namespace moetron::data
