#include "moetron/cli/prepare_cmd.h"

#include <iomanip>
#include <iostream>

#include "moetron/core/error.h"

namespace moetron::cli {

namespace {

int run_text(const data::PrepareOptions& opts) {
  const data::PrepareReport r = data::prepare_data(opts);
  std::cout << "prepared " << opts.out_dir << ": " << r.files << " files, " << r.documents
            << " documents, " << r.bytes << " bytes -> " << r.train_tokens << " train + "
            << r.val_tokens << " validation tokens, vocabulary " << r.vocab_size << "\n";
  std::cout << "documents (" << data::document_mode_name(opts.documents) << "): " << r.lengths.count
            << ", tokens per document mean " << std::fixed << std::setprecision(1)
            << r.lengths.mean() << ", max " << r.lengths.max << "\n";
  return 0;
}

int run_retrieval(const data::RetrievalOptions& opts) {
  const data::RetrievalReport r = data::prepare_retrieval(opts);
  const data::RetrievalVocab v = data::retrieval_vocab(opts);
  std::cout << "prepared " << opts.out_dir << ": retrieval, " << r.train_examples << " train + "
            << r.val_examples << " validation examples of seq_len " << opts.seq_len
            << " (train with train.seq_len = " << opts.seq_len << "), vocabulary " << r.vocab_size
            << "\n"
            << "KEY " << v.key_marker << ", QUERY " << v.query_marker << ", key tokens ["
            << v.key_first << ", " << v.key_first + v.key_count << "), filler [" << v.filler_first
            << ", " << v.filler_first + v.filler_count << "); the " << opts.key_len
            << "-token key lies in the first " << opts.key_within << " positions, at least "
            << opts.seq_len - opts.key_within << " positions before it is asked for\n";
  return 0;
}

int run_multimodal(PrepareCommand& o) {
  MOETRON_CHECK(o.task == "text", "--multimodal writes its own tasks; drop --task ", o.task);
  MOETRON_CHECK(o.retrieval.seq_len == 0, "--seq-len is read only by --task retrieval");
  MOETRON_CHECK(o.documents == "auto", "--documents is not read by --multimodal");
  auto& m = o.mm;
  m.out_dir = o.text.out_dir;
  if (!o.text.input.empty()) m.input = o.text.input;
  m.tokenizer_model = o.text.tokenizer_model;
  m.vocab_size = o.text.vocab_size;
  m.text_val_fraction = o.text.val_fraction;
  m.seed = o.retrieval.seed;
  if (!o.task_records.empty()) m.task_records = data::parse_task_records(o.task_records);
  const data::MultimodalReport r = data::prepare_multimodal(m);
  std::cout << "prepared " << m.out_dir << ": multimodal, seed " << m.seed << ", vocabulary "
            << r.vocab_size << "\n"
            << std::fixed << std::setprecision(1) << "  text    " << r.text_train_tokens
            << " train + " << r.text_val_tokens << " validation tokens ("
            << r.seconds[static_cast<size_t>(data::Task::text)] << " s)\n";
  for (const data::Task t : {data::Task::caption, data::Task::ocr, data::Task::asr}) {
    const auto& n = r.records[static_cast<size_t>(t)];
    std::cout << "  " << std::left << std::setw(8) << data::task_name(t) << std::right << n[0]
              << " train, " << n[1] << " val";
    if (t == data::Task::caption) std::cout << ", " << n[2] << " heldout";
    std::cout << " (" << r.seconds[static_cast<size_t>(t)] << " s)\n";
  }
  std::cout << "  longest utterance " << r.max_frames << " log-mel frames of " << m.mel.n_mels
            << " mels\n";
  if (m.export_samples > 0) std::cout << "  samples in " << m.out_dir << "/samples\n";
  return 0;
}

}  // namespace

CLI::App* add_prepare_command(CLI::App& app, PrepareCommand& o) {
  auto* prep = app.add_subcommand(
      "prepare-data", "tokenise a text corpus for training, or write a synthetic task's corpus");
  prep->add_option("--task", o.task,
                   "text: tokenise --input; retrieval: synthetic key retrieval over --seq-len");
  prep->add_option("--input", o.text.input, "text file or folder of text files (.gz read too)");
  prep->add_option("--out", o.text.out_dir, "output directory (must not exist)")->required();
  prep->add_option("--documents", o.documents,
                   "auto: fortune files split on % lines, other files on blank lines; "
                   "whole-file: each file is one document (long documents)");
  prep->add_option("--tokenizer", o.text.tokenizer_model,
                   "existing SentencePiece .model (default: train one)");
  prep->add_option("--vocab-size", o.text.vocab_size,
                   "vocabulary size of a trained tokenizer (retrieval: of the synthetic ids)");
  prep->add_option("--val-fraction", o.text.val_fraction,
                   "share of documents (retrieval: examples) held out for validation");
  auto& r = o.retrieval;
  prep->add_option("--seq-len", r.seq_len, "retrieval: model positions per example");
  prep->add_option("--examples", r.examples, "retrieval: examples, train and validation");
  prep->add_option("--seed", r.seed, "retrieval, multimodal: seed of the examples");
  prep->add_option("--key-len", r.key_len, "retrieval: tokens in a key");
  prep->add_option("--key-within", r.key_within,
                   "retrieval: KEY and the key lie in the first this many positions");
  prep->add_option("--key-vocab", r.key_vocab,
                   "retrieval: distinct key tokens (the rest of the vocabulary is filler)");
  auto& m = o.mm;
  prep->add_flag("--multimodal", o.multimodal,
                 "the multimodal corpus: text plus scene captions, OCR and ASR (--input "
                 "defaults to /usr/share/games/fortunes; --seed seeds it)");
  prep->add_option("--per-task", m.per_task,
                   "multimodal: train records per task (val and heldout get a tenth)");
  prep->add_option("--task-records", o.task_records,
                   "multimodal: train records of some tasks instead of --per-task, e.g. "
                   "caption=20000,ocr=20000");
  prep->add_option("--n-mels", m.mel.n_mels, "multimodal: mel bands of the ASR features");
  prep->add_option("--export-samples", m.export_samples,
                   "multimodal: write the first K images (PNG) and utterances (WAV) of each "
                   "task under OUT/samples");
  prep->add_option("--records-per-shard", m.records_per_shard, "multimodal: records per shard");
  prep->add_option("--max-audio-seconds", m.max_audio_seconds,
                   "multimodal: longest utterance kept (longer ones are skipped)");
  prep->add_option("--scene-size", m.scene.size, "multimodal: caption images are N x N RGB");
  prep->add_option("--ocr-height", m.ocr.height, "multimodal: OCR image height");
  prep->add_option("--ocr-width", m.ocr.width, "multimodal: OCR image width");
  return prep;
}

int run_prepare_command(PrepareCommand o) {
  if (o.multimodal) return run_multimodal(o);
  if (o.task == "retrieval") {
    MOETRON_CHECK(o.text.input.empty(), "--input is not read by --task retrieval (its tokens are ",
                  "synthetic)");
    MOETRON_CHECK(o.text.tokenizer_model.empty(), "--tokenizer is not read by --task retrieval");
    MOETRON_CHECK(o.documents == "auto", "--documents is not read by --task retrieval");
    o.retrieval.out_dir = o.text.out_dir;
    o.retrieval.vocab_size = o.text.vocab_size;
    o.retrieval.val_fraction = o.text.val_fraction;
    return run_retrieval(o.retrieval);
  }
  MOETRON_CHECK(o.task == "text", "--task must be 'text' (tokenise --input) or 'retrieval' ",
                "(synthetic key retrieval), got '", o.task, "'");
  o.text.documents = data::parse_document_mode(o.documents);
  MOETRON_CHECK(o.retrieval.seq_len == 0, "--seq-len is read only by --task retrieval");
  MOETRON_CHECK(!o.text.input.empty(), "--input is required: the text file or folder to tokenise");
  return run_text(o.text);
}

}  // namespace moetron::cli
