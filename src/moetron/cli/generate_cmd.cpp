#include "moetron/cli/generate_cmd.h"

#include <iostream>

#include "moetron/ckpt/checkpoint.h"
#include "moetron/core/error.h"
#include "moetron/data/multimodal_format.h"
#include "moetron/data/tokenizer.h"
#include "moetron/train/media_inputs.h"
#include "moetron/train/multimodal_generate.h"

namespace moetron::cli {

namespace {

// CLI11's NonNegativeNumber prints its range up to DBL_MAX ("not in range
// 0.000000 to 17976931348623157...") at a user who typed -1: say it plainly.
CLI::Validator non_negative() {
  return CLI::Validator(
      [](const std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "'" + text + "' is not a number";
        if (!(v >= 0)) return "must be 0 or more, got " + text;
        return {};
      },
      "NUMBER >= 0");
}

bool wants_media(const GenerateCommand& o) {
  return !o.image.empty() || !o.audio.empty() || !o.record.empty();
}

// The corpus a multimodal checkpoint was trained on (its tokenizer, mel
// options and records): --data, else the run's multimodal.data.
std::string corpus_dir(const GenerateCommand& o, const train::Config& cfg) {
  return o.data.empty() ? cfg.multimodal.data : o.data;
}

// --task, or what the media imply; errors name the flag.
data::Task media_task(const GenerateCommand& o) {
  MOETRON_CHECK(o.image.empty() + o.audio.empty() + o.record.empty() == 2,
                "give one of --image, --audio and --record");
  if (!o.record.empty()) {
    MOETRON_CHECK(!o.task.empty(), "--record needs --task caption|ocr|asr");
  }
  const std::string name = !o.task.empty() ? o.task : !o.audio.empty() ? "asr" : "caption";
  MOETRON_CHECK(name == "caption" || name == "ocr" || name == "asr",
                "--task must be caption, ocr or asr, got '", name, "'");
  const data::Task t = data::parse_task(name);
  if (!o.image.empty())
    MOETRON_CHECK(t != data::Task::asr, "--task asr transcribes --audio, not --image");
  if (!o.audio.empty())
    MOETRON_CHECK(t == data::Task::asr, "--audio is transcribed (--task asr), not --task ", name);
  return t;
}

// --record SPLIT:INDEX of `task` in the corpus; prints its reference text on stderr.
train::MediaInput record_input(const std::string& spec, data::Task task, const std::string& dir,
                               const train::Config& cfg) {
  const size_t colon = spec.find(':');
  MOETRON_CHECK(colon != std::string::npos, "--record must be SPLIT:INDEX (e.g. heldout:0), got '",
                spec, "'");
  const data::Split split = data::parse_split(spec.substr(0, colon));
  int64_t index = -1;
  try {
    index = std::stoll(spec.substr(colon + 1));
  } catch (const std::exception&) {
    MOETRON_FAIL("--record '", spec, "': the index is not a number");
  }
  const auto ds = data::MultimodalDataset::open(dir);
  const int64_t n = ds.size(task, split);
  MOETRON_CHECK(index >= 0 && index < n, "--record '", spec, "': corpus '", dir, "' has ", n, " ",
                data::split_name(split), " records of task '", data::task_name(task), "'");
  const data::Record r = ds.record(task, split, index);
  std::cerr << "reference: " << r.text << "\n";
  return train::media_input(r, cfg.multimodal.model, cfg.multimodal.audio_frames);
}

int run_media_generate(const GenerateCommand& o, const std::string& ckpt_dir) {
  const data::Task task = media_task(o);
  kernels::Context ctx(kernels::Backend::cpu);
  train::LoadedModel lm = train::load_model(ckpt_dir);
  const train::Config& cfg = lm.cfg;
  const char* flag = !o.image.empty() ? "--image" : !o.audio.empty() ? "--audio" : "--record";
  MOETRON_CHECK(cfg.multimodal.model.enabled, "checkpoint '", ckpt_dir,
                "' is a text-only model (multimodal.enabled = false): ", flag,
                " needs a multimodal checkpoint");
  const std::string dir = corpus_dir(o, cfg);
  const data::Tokenizer tok(o.tokenizer.empty() ? dir + "/text/tokenizer.model" : o.tokenizer);
  train::MediaInput in;
  if (!o.image.empty()) {
    in = train::read_image_input(o.image, cfg.multimodal.model);
  } else if (!o.audio.empty()) {
    const auto mel = train::corpus_log_mel_options(dir, cfg.multimodal.model.audio.n_mels);
    in = train::read_audio_input(o.audio, mel, cfg.multimodal.audio_frames);
  } else {
    in = record_input(o.record, task, dir, cfg);
  }
  std::vector<int32_t> prompt = tok.encode(train::task_prompt_text(task));
  const std::vector<int32_t> extra =
      o.prompt.empty() ? std::vector<int32_t>{} : tok.encode(o.prompt);
  prompt.insert(prompt.end(), extra.begin(), extra.end());
  train::SampleOptions so = o.sample;
  so.stop_id = tok.eos_id();
  if (o.temperature == nullptr || o.temperature->count() == 0) so.temperature = 0;  // greedy
  const auto out = train::generate_from_media(ctx, *lm.model, {in}, prompt, so, 1);
  // Decoding the --prompt and the continuation together keeps their spacing.
  std::vector<int32_t> text = extra;
  text.insert(text.end(), out[0].begin(), out[0].end());
  std::cout << tok.decode(text) << "\n";
  return 0;
}

}  // namespace

CLI::App* add_generate_command(CLI::App& app, GenerateCommand& o) {
  auto* gen = app.add_subcommand(
      "generate", "sample text from a checkpoint, or caption / transcribe an image or audio");
  gen->add_option("--checkpoint", o.checkpoint,
                  "checkpoint (RUN/checkpoints/step-N) or run directory (its newest checkpoint)")
      ->required();
  gen->add_option("--prompt", o.prompt,
                  "text to continue (with --image / --audio: text after the task prompt)");
  gen->add_option("--tokenizer", o.tokenizer,
                  "tokenizer .model (default: the run's data.path, or a multimodal run's "
                  "multimodal.data/text)");
  gen->add_option("--image", o.image, "multimodal: a PNG to caption (or read, --task ocr)");
  gen->add_option("--audio", o.audio, "multimodal: a 16-bit PCM mono WAV to transcribe");
  gen->add_option("--record", o.record,
                  "multimodal: SPLIT:INDEX, a record of --task in --data (its reference text "
                  "goes to stderr)");
  gen->add_option("--task", o.task,
                  "multimodal: caption | ocr (--image, default caption) | asr (--audio)");
  gen->add_option("--data", o.data,
                  "multimodal corpus (default: the run's multimodal.data): tokenizer, mel "
                  "options, --record");
  gen->add_option("--max-new-tokens", o.sample.max_new_tokens, "tokens to generate")
      ->check(non_negative());
  o.temperature = gen->add_option("--temperature", o.sample.temperature,
                                  "sampling temperature (0: greedy; --image / --audio / --record "
                                  "decode greedily unless it is given)")
                      ->check(non_negative());
  gen->add_option("--top-k", o.sample.top_k, "sample among the k most likely tokens (0: all)")
      ->check(non_negative());
  gen->add_option("--seed", o.sample.seed, "sampling seed");
  return gen;
}

int run_generate_command(const GenerateCommand& o) {
  const std::string ckpt_dir = ckpt::resolve_checkpoint_dir(o.checkpoint);
  if (wants_media(o)) return run_media_generate(o, ckpt_dir);
  MOETRON_CHECK(!o.prompt.empty(), "--prompt is required (or --image, --audio or --record with ",
                "a multimodal checkpoint)");
  MOETRON_CHECK(o.task.empty(), "--task needs --image, --audio or --record");
  kernels::Context ctx(kernels::Backend::cpu);
  train::LoadedModel lm = train::load_model(ckpt_dir);
  const std::string tok_path = !o.tokenizer.empty() ? o.tokenizer
                               : lm.cfg.multimodal.model.enabled
                                   ? corpus_dir(o, lm.cfg) + "/text/tokenizer.model"
                                   : lm.cfg.data.path + "/tokenizer.model";
  data::Tokenizer tok(tok_path);
  train::SampleOptions so = o.sample;
  so.stop_id = tok.eos_id();
  std::vector<int32_t> ids = tok.encode(o.prompt);
  if (ids.empty()) ids.push_back(tok.eos_id());
  const auto out = train::sample_tokens(ctx, *lm.model, ids, so);
  // Decoding prompt and continuation together keeps the spacing between them.
  std::vector<int32_t> all = ids;
  all.insert(all.end(), out.begin(), out.end());
  std::cout << tok.decode(all) << "\n";
  return 0;
}

}  // namespace moetron::cli
