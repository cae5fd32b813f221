// Retrieval accuracy (train/retrieval_eval.h): the argmax count on
// hand-built logits, and the whole path on the tiny model: a retrieval
// corpus trained on through data.path, its checkpoint scored.
#include "moetron/train/retrieval_eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "moetron/ckpt/checkpoint.h"
#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"
#include "moetron/data/retrieval.h"
#include "moetron/train/generate.h"
#include "moetron/train/trainer.h"
#include "util/tiny_corpus.h"

namespace moetron::train {
namespace {

template <typename T>
Tensor logits_of(const std::vector<std::vector<T>>& rows, DType dtype) {
  Tensor t = Tensor::empty(
      {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows[0].size())}, dtype);
  for (size_t r = 0; r < rows.size(); ++r)
    std::copy(rows[r].begin(), rows[r].end(), t.data<T>() + r * rows[r].size());
  return t;
}

TEST(RetrievalEval, ScoresTheArgmaxOfHandBuiltLogits) {
  // Argmax per row: 2, 0, 4, 1 (a tie between 1 and 3: the first counts).
  const std::vector<std::vector<float>> rows = {{0.1f, 0.2f, 3.0f, -1.0f, 0.0f},
                                                {5.0f, 1.0f, 1.0f, 1.0f, 1.0f},
                                                {0.0f, 0.0f, 0.0f, 0.0f, 0.5f},
                                                {0.0f, 2.0f, 0.0f, 2.0f, 0.0f}};
  const Tensor f32 = logits_of(rows, DType::f32);
  RetrievalScore s = score_argmax(f32, {2, 0, 3, 1});
  EXPECT_EQ(s.correct, 3);
  EXPECT_EQ(s.keys, 4);
  EXPECT_DOUBLE_EQ(s.accuracy(), 0.75);
  EXPECT_EQ(score_argmax(f32, {2, 0, 4, 1}).correct, 4);
  EXPECT_EQ(score_argmax(f32, {0, 1, 0, 3}).correct, 0);  // the tie's second index loses
  std::vector<std::vector<double>> rows64;
  for (const auto& r : rows) rows64.emplace_back(r.begin(), r.end());
  EXPECT_EQ(score_argmax(logits_of(rows64, DType::f64), {2, 1, 4, 1}).correct, 3);
  EXPECT_THROW(score_argmax(f32, {1, 2, 3}), Error);  // one expected id per row
}

// A retrieval corpus for the tiny model (vocabulary 320, max_seq_len 32).
std::string tiny_retrieval_corpus() {
  static const std::string dir = [] {
    data::RetrievalOptions o;
    o.out_dir = test::tiny_corpus_root() + "/retrieval";
    o.seq_len = 24;
    o.examples = 200;
    o.vocab_size = 320;
    o.key_len = 3;
    o.key_within = 8;
    o.key_vocab = 8;
    o.val_fraction = 0.1;
    data::prepare_retrieval(o);
    return o.out_dir;
  }();
  return dir;
}

TEST(RetrievalEval, TheTrainerTrainsOnARetrievalCorpusAndItsCheckpointIsScored) {
  const std::string run = test::tiny_corpus_root() + "/runs/retrieval";
  remove_tree(run);
  const Config cfg =
      test::tiny_train_config({"data.path=" + tiny_retrieval_corpus(), "train.seq_len=24",
                               "train.steps=4", "checkpoint.every=4", "train.eval_every=4"});
  Trainer t(cfg, run, false);
  const TrainResult r = t.run();
  ASSERT_EQ(r.steps_done, 4);
  EXPECT_TRUE(std::isfinite(r.val_loss));

  kernels::Context ctx(kernels::Backend::cpu);
  LoadedModel lm = load_model(ckpt::resolve_checkpoint_dir(run));
  const RetrievalScore s = evaluate_retrieval(ctx, *lm.model, tiny_retrieval_corpus(), 8);
  EXPECT_EQ(s.examples, 20);
  EXPECT_EQ(s.keys, 60);
  EXPECT_GE(s.accuracy(), 0.0);
  EXPECT_LE(s.accuracy(), 1.0);
  EXPECT_DOUBLE_EQ(s.chance, 1.0 / 8);
  EXPECT_EQ(evaluate_retrieval(ctx, *lm.model, tiny_retrieval_corpus(), 3, 5).examples, 5);
  // A text corpus is not a retrieval corpus.
  EXPECT_THROW(evaluate_retrieval(ctx, *lm.model, test::tiny_corpus_root() + "/prepared", 8),
               Error);
}

TEST(RetrievalEval, LossOnAnswersCountsOnlyTheKeyTargets) {
  // Each example's loss is over its key_len = 3 answers: the step's token
  // count is 3 per row, and the first step's loss is near ln(vocab) (the
  // untrained model's answer logits are near uniform); without the option
  // every target of the row counts.
  const auto run_with = [](const std::string& name, const std::vector<std::string>& extra) {
    const std::string run = test::tiny_corpus_root() + "/runs/" + name;
    remove_tree(run);
    std::vector<std::string> sets = {"data.path=" + tiny_retrieval_corpus(),
                                     "train.seq_len=24",
                                     "train.steps=2",
                                     "train.micro_batch=2",
                                     "train.grad_accum=2",
                                     "train.eval_every=2"};
    sets.insert(sets.end(), extra.begin(), extra.end());
    Trainer t(test::tiny_train_config(sets), run, false);
    return t.run();
  };
  const TrainResult answers = run_with("retrieval_answers", {"data.loss_on_answers=true"});
  ASSERT_EQ(answers.history.size(), 2u);
  EXPECT_EQ(answers.history[0].tokens, 2 * 2 * 3);
  EXPECT_NEAR(answers.first_loss, std::log(320.0), 1.0);
  EXPECT_TRUE(std::isfinite(answers.val_loss));
  const TrainResult all = run_with("retrieval_all", {});
  EXPECT_EQ(all.history[0].tokens, 2 * 2 * 24);
  EXPECT_NE(all.first_loss, answers.first_loss);
}

TEST(RetrievalEval, LossOnAnswersRefusesATextCorpusNamingTheKey) {
  const std::string run = test::tiny_corpus_root() + "/runs/retrieval_text_answers";
  remove_tree(run);
  const Config cfg = test::tiny_train_config({"data.loss_on_answers=true", "train.steps=1"});
  try {
    Trainer t(cfg, run, false);
    t.run();
    FAIL() << "trained on answers of a text corpus";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("data.loss_on_answers"), std::string::npos) << e.what();
  }
}

TEST(RetrievalEval, TheTrainerRefusesAnotherSeqLenNamingIt) {
  const std::string run = test::tiny_corpus_root() + "/runs/retrieval_seq";
  remove_tree(run);
  const Config cfg = test::tiny_train_config(
      {"data.path=" + tiny_retrieval_corpus(), "train.seq_len=16", "train.steps=1"});
  try {
    Trainer t(cfg, run, false);
    t.run();
    FAIL() << "trained seq_len 16 on examples of 24";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train.seq_len = 24"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moetron::train
