// `moetron prepare-data`: a text corpus tokenised (data/corpus.h), its files
// split into documents or kept whole (--documents), or a synthetic
// key-retrieval corpus (--task retrieval, data/retrieval.h), or the
// multimodal corpus (--multimodal, data/multimodal_prepare.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "moetron/data/corpus.h"
#include "moetron/data/multimodal_prepare.h"
#include "moetron/data/retrieval.h"

namespace moetron::cli {

struct PrepareCommand {
  std::string task = "text";       // text | retrieval
  std::string documents = "auto";  // auto | whole-file (--task text)
  data::PrepareOptions text;
  data::RetrievalOptions retrieval;
  bool multimodal = false;  // --multimodal: caption, ocr and asr tasks beside the text
  data::MultimodalOptions mm;
  std::string task_records;  // --task-records "caption=N,..." (parsed into mm)
};

CLI::App* add_prepare_command(CLI::App& app, PrepareCommand& opts);
// Validates every option first (errors name the option): nothing is
// written for a bad command line.
int run_prepare_command(PrepareCommand opts);

}  // namespace moetron::cli
