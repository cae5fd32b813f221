// `moetron prepare-data`: text in, tokenised corpus out. Reads a text file or
// a folder of text files (gzip files decompressed; by default fortune files
// split on "%" lines into documents and other files into paragraphs, with
// DocumentMode::whole_file each file one document), trains a tokenizer unless one is given,
// tokenises once, splits documents into train and validation by a hash of
// their content, and publishes DIR atomically:
//   DIR/tokenizer.model, DIR/train.bin, DIR/val.bin (int32 little-endian ids,
//   documents separated by EOS), DIR/manifest.json (counts, document
//   lengths in tokens, checksums).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moetron::data {

// How a file is cut into documents (`--documents`).
enum class DocumentMode {
  split,       // "auto": fortune files on "%" lines, other files on blank lines
  whole_file,  // "whole-file": every file is one document (long-context data)
};
// "auto" / "whole-file"; throws naming --documents and the allowed values.
DocumentMode parse_document_mode(const std::string& name);
const char* document_mode_name(DocumentMode mode);

struct PrepareOptions {
  std::string input;            // file or directory
  std::string out_dir;          // must not exist yet
  std::string tokenizer_model;  // empty: train one
  int64_t vocab_size = 4096;
  double val_fraction = 0.05;
  int num_threads = 1;
  DocumentMode documents = DocumentMode::split;
};

// Tokens per document (its EOS not counted), over train and validation.
struct DocumentLengths {
  int64_t count = 0, max = 0, total = 0;
  double mean() const {
    return count ? static_cast<double>(total) / static_cast<double>(count) : 0;
  }
};

struct PrepareReport {
  int64_t files = 0, documents = 0, train_tokens = 0, val_tokens = 0, vocab_size = 0;
  int64_t bytes = 0;
  DocumentLengths lengths;
};

// Documents of a text file or of every file under a folder (see above).
// Binary files (NUL bytes) are skipped.
std::vector<std::string> read_documents(const std::string& path, int64_t* files_read = nullptr,
                                        DocumentMode mode = DocumentMode::split);

PrepareReport prepare_data(const PrepareOptions& opts);

}  // namespace moetron::data
