// `moetron generate`: text sampled from a checkpoint after --prompt, or
// (a multimodal checkpoint) the text for an image (--image F.png: caption,
// or --task ocr), a clip of speech (--audio F.wav: its transcript), or a
// corpus record (--record SPLIT:INDEX of --task), decoded by
// train/multimodal_generate.h. Prints the text.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "moetron/train/generate.h"

namespace moetron::cli {

struct GenerateCommand {
  std::string checkpoint, prompt, tokenizer;
  std::string image, audio, record, task, data;
  train::SampleOptions sample;
  const CLI::Option* temperature = nullptr;  // given on the command line?
};

CLI::App* add_generate_command(CLI::App& app, GenerateCommand& opts);
int run_generate_command(const GenerateCommand& opts);

}  // namespace moetron::cli
