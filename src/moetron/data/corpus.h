// `moetron prepare-data`: text in, tokenised corpus out. Reads a text file or
// a folder of text files (fortune files split on "%" lines into documents,
// other files into paragraphs), trains a tokenizer unless one is given,
// tokenises once, splits documents into train and validation by a hash of
// their content, and publishes DIR atomically:
//   DIR/tokenizer.model, DIR/train.bin, DIR/val.bin (int32 little-endian ids,
//   documents separated by EOS), DIR/manifest.json (counts, checksums).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moetron::data {

struct PrepareOptions {
  std::string input;            // file or directory
  std::string out_dir;          // must not exist yet
  std::string tokenizer_model;  // empty: train one
  int64_t vocab_size = 4096;
  double val_fraction = 0.05;
  int num_threads = 1;
};

struct PrepareReport {
  int64_t files = 0, documents = 0, train_tokens = 0, val_tokens = 0, vocab_size = 0;
  int64_t bytes = 0;
};

// Documents of one text file (see above). Binary files (NUL bytes) are skipped.
std::vector<std::string> read_documents(const std::string& path, int64_t* files_read = nullptr);

PrepareReport prepare_data(const PrepareOptions& opts);

}  // namespace moetron::data
