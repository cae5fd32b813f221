// What the parallel-layout tests (expert, tensor and pipeline parallelism
// under mpirun) share: one small prepared corpus per job, run directories,
// the comparisons of a layout's run with the one-rank run, and checkpoint
// copies for resuming in another layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "moetron/train/trainer.h"
#include "util/test_util.h"

namespace moetron::test {

// /tmp/<prefix><rank 0's pid> holding prepared/ (a 300-token corpus of
// three-word lines); made by rank 0 once per job, the same path on every rank.
const std::string& layout_job_dir(const std::string& prefix);
// job/runs/name (per rank with `local`), emptied; collective.
std::string layout_run_dir(const std::string& job, const std::string& name, bool local = false);
double rel_diff(double a, double b);
// Losses (and, with aux, the balancing loss) of got equal want's from step `from` on.
void expect_same_losses(const train::TrainResult& got, const train::TrainResult& want, size_t from,
                        double tol, const std::string& what, bool aux = false);
std::map<std::string, std::vector<float>> grads_of(train::Trainer& t);
// This rank's block of a full tensor's values (the whole tensor if unsharded).
std::vector<float> block_of(const nn::Parameter& p, const std::vector<float>& full);
// ||got - want|| / ||want||.
double rel_norm_diff(const std::vector<float>& got, const std::vector<float>& want);
// A one-rank run of the layout tests' config: its result and the gradients
// of the first step, before the update.
struct Reference {
  train::TrainResult result;
  std::map<std::string, std::vector<float>> first_grads;
};
Reference run_reference(const train::Config& cfg, const std::string& run_dir);
// The layout tests' config: configs/tiny.toml (4 layers, 4 heads over 2 kv
// heads, 4 experts, 3 of the layers MoE) with aux loss, z-loss and
// aux-loss-free biases on, 10 steps of `microbatches` micro-batches of
// `rows` per dp rank, small gradient buckets, one thread; then `extra`.
train::Config layout_config(const std::string& job, int64_t rows, int64_t microbatches,
                            const std::vector<std::string>& extra);
// Every parameter's first-step gradient `got` (this rank's block, from
// grads_of) equals the reference's block within 1e-5 (relative norm).
void expect_same_grads(train::Trainer& t, const std::map<std::string, std::vector<float>>& got,
                       const Reference& ref, const std::string& what);
// Runs `t` and expects what one rank computed: its losses (and, with aux,
// the balancing losses) for every step, the validation loss and every
// first-step gradient, each within 1e-5.
void expect_run_matches(train::Trainer& t, const Reference& ref, const std::string& what,
                        bool aux = false);
// A one-rank reference, run on first use of `key` and kept for the process.
const Reference& cached_reference(const std::string& key, const std::function<Reference()>& run);
// Copies checkpoint step-5 of run `from` into a fresh run directory `name`; collective.
std::string copy_step5(const std::string& job, const std::string& from, const std::string& name);

}  // namespace moetron::test
