#include "util/layout_runs.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "moetron/core/rng.h"
#include "moetron/core/staged_dir.h"
#include "moetron/data/corpus.h"
#include "util/mpi_test_main.h"

namespace moetron::test {

namespace fs = std::filesystem;

const std::string& layout_job_dir(const std::string& prefix) {
  static std::map<std::string, std::string> dirs;
  auto it = dirs.find(prefix);
  if (it != dirs.end()) return it->second;
  comm::Communicator& world = mpi_world();
  Tensor pid = Tensor::empty({1}, DType::i64);
  pid.data<int64_t>()[0] = ::getpid();
  world.broadcast(pid, 0);
  const std::string root =
      (fs::temp_directory_path() / (prefix + std::to_string(pid.data<int64_t>()[0]))).string();
  if (world.rank() == 0) {
    remove_tree(root);
    fs::create_directories(root + "/text");
    const char* words[] = {"blue", "owl",   "sings", "under", "quiet", "stars", "near",   "the",
                           "old",  "river", "bank",  "of",    "a",     "late",  "summer", "night"};
    std::ofstream f(root + "/text/lines");
    PhiloxStream rng(11, "ep-corpus");
    for (int d = 0; d < 500; ++d) {
      const int a = static_cast<int>(rng.next_u32() % 16),
                b = static_cast<int>(rng.next_u32() % 16);
      for (int l = 0; l < 3; ++l)
        f << words[a] << " " << words[b] << " " << words[(a * b + 5) % 16] << ".\n";
      f << "%\n";
    }
    f.close();
    data::PrepareOptions o;
    o.input = root + "/text";
    o.out_dir = root + "/prepared";
    o.vocab_size = 300;
    o.val_fraction = 0.1;
    data::prepare_data(o);
  }
  world.barrier();
  return dirs[prefix] = root;
}

std::string layout_run_dir(const std::string& job, const std::string& name, bool local) {
  comm::Communicator& world = mpi_world();
  const std::string d =
      job + "/runs/" + name + (local ? "-rank" + std::to_string(world.rank()) : "");
  if (local || world.rank() == 0) remove_tree(d);
  world.barrier();
  return d;
}

double rel_diff(double a, double b) {
  return std::fabs(a - b) / std::max(std::fabs(b), 1e-30);
}

void expect_same_losses(const train::TrainResult& got, const train::TrainResult& want, size_t from,
                        double tol, const std::string& what, bool aux) {
  ASSERT_EQ(got.history.size() + from, want.history.size()) << what;
  for (size_t i = 0; i < got.history.size(); ++i) {
    const auto& g = got.history[i];
    const auto& w = want.history[from + i];
    EXPECT_LE(rel_diff(g.loss, w.loss), tol)
        << what << " step " << from + i + 1 << ": " << g.loss << " vs " << w.loss;
    if (aux) {
      EXPECT_LE(std::fabs(g.aux_loss - w.aux_loss), tol * std::fabs(w.aux_loss) + 1e-12)
          << what << " aux loss, step " << from + i + 1;
    }
  }
}

std::map<std::string, std::vector<float>> grads_of(train::Trainer& t) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& p : t.model().params().all()) {
    const float* g = p->grad.data<float>();
    out[p->name].assign(g, g + p->grad.numel());
  }
  return out;
}

Reference run_reference(const train::Config& cfg, const std::string& run_dir) {
  Reference ref;
  train::Trainer t(cfg, run_dir, false);
  t.before_update = [&](int64_t step) {
    if (step == 1) ref.first_grads = grads_of(t);
  };
  ref.result = t.run();
  return ref;
}

train::Config layout_config(const std::string& job, int64_t rows, int64_t microbatches,
                            const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {"data.path=" + job + "/prepared",
                                   "train.steps=10",
                                   "train.micro_batch=" + std::to_string(rows),
                                   "train.grad_accum=" + std::to_string(microbatches),
                                   "moe.bias_update_rate=0.001",
                                   "parallel.bucket_mb=0.02",
                                   "train.threads=1",
                                   "train.eval_batches=3"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return train::load_config(MOETRON_SOURCE_DIR "/configs/tiny.toml", sets);
}

void expect_same_grads(train::Trainer& t, const std::map<std::string, std::vector<float>>& got,
                       const Reference& ref, const std::string& what) {
  for (const auto& p : t.model().params().all()) {
    const std::vector<float>& g = got.at(p->name);
    const std::vector<float> want = block_of(*p, ref.first_grads.at(p->name));
    ASSERT_EQ(g.size(), want.size()) << what << " " << p->name;
    EXPECT_LE(rel_norm_diff(g, want), 1e-5) << what << " " << p->name;
  }
}

void expect_run_matches(train::Trainer& t, const Reference& ref, const std::string& what,
                        bool aux) {
  std::map<std::string, std::vector<float>> grads;
  t.before_update = [&](int64_t step) {
    if (step == 1) grads = grads_of(t);
  };
  const train::TrainResult r = t.run();
  expect_same_losses(r, ref.result, 0, 1e-5, what, aux);
  EXPECT_LE(rel_diff(r.val_loss, ref.result.val_loss), 1e-5) << what;
  expect_same_grads(t, grads, ref, what);
}

const Reference& cached_reference(const std::string& key, const std::function<Reference()>& run) {
  static std::map<std::string, Reference> cache;
  const auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  return cache[key] = run();
}

std::vector<float> block_of(const nn::Parameter& p, const std::vector<float>& full) {
  if (!p.sharded()) return full;
  const int64_t rows = p.value.dim(0), cols = p.value.numel() / rows;
  const int64_t full_cols = p.shard.full.numel() / p.shard.full[0];
  std::vector<float> out;
  for (int64_t r = 0; r < rows; ++r) {
    const auto* row = full.data() + (p.shard.row0 + r) * full_cols + p.shard.col0;
    out.insert(out.end(), row, row + cols);
  }
  return out;
}

double rel_norm_diff(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    diff += (got[i] - want[i]) * static_cast<double>(got[i] - want[i]);
    norm += want[i] * static_cast<double>(want[i]);
  }
  return got.size() == want.size() ? std::sqrt(diff / std::max(norm, 1e-300)) : INFINITY;
}

std::string copy_step5(const std::string& job, const std::string& from, const std::string& name) {
  const std::string dir = layout_run_dir(job, name);
  if (mpi_world().rank() == 0) {
    fs::create_directories(dir + "/checkpoints");
    fs::copy(from + "/checkpoints/step-5", dir + "/checkpoints/step-5",
             fs::copy_options::recursive);
  }
  mpi_world().barrier();
  return dir;
}

}  // namespace moetron::test
