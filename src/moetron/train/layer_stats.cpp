#include "moetron/train/layer_stats.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "moetron/kernels/elementwise.h"
#include "moetron/nn/parameter_inventory.h"

namespace moetron::train {

std::pair<std::string, std::string> layer_group_of(const std::string& param_name) {
  static const std::string layers = "model.layers.";
  std::string name = param_name;
  const auto strip_suffix = [](std::string& s) {
    for (const char* tail : {".weight", ".bias"}) {
      const std::string t = tail;
      if (s.size() > t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0) {
        s.erase(s.size() - t.size());
      }
    }
  };
  strip_suffix(name);
  if (name.rfind(layers, 0) != 0) {
    if (name.find("embed") != std::string::npos) return {"embed", "embed_tokens"};
    const size_t dot = name.rfind('.');
    return {"head", dot == std::string::npos ? name : name.substr(dot + 1)};
  }
  name.erase(0, layers.size());
  const size_t dot = name.find('.');
  const std::string layer = name.substr(0, dot);
  std::string group = dot == std::string::npos ? "" : name.substr(dot + 1);
  // "block_sparse_moe.experts.5.w1" -> "experts.w1": one group for all experts.
  const size_t ex = group.find("experts.");
  if (ex != std::string::npos && group.find("shared_experts") == std::string::npos) {
    const size_t idx = ex + 8;
    const size_t next = group.find('.', idx);
    group = "experts." + (next == std::string::npos ? "" : group.substr(next + 1));
  } else if (group.rfind("block_sparse_moe.", 0) == 0) {
    group.erase(0, 17);
  }
  return {layer, group};
}

LayerStatistics::LayerStatistics(const nn::ModelConfig& model, const nn::MoeConfig& moe,
                                 const parallel::RankCoords& at)
    : n_layers_(model.n_layers), at_(at) {
  // Every parameter of the one-rank model, whatever this rank holds.
  const nn::ParamInventory inv = nn::parameter_inventory(
      model, moe, nn::Precision::fp32(), nn::ExpertParallel{}, nn::TensorParallel{}, {});
  for (const nn::ParamInfo& p : inv.params) {
    const auto key = layer_group_of(p.name);
    if (std::find(groups_.begin(), groups_.end(), key) == groups_.end()) groups_.push_back(key);
  }
}

bool LayerStatistics::counts_here(const nn::Parameter& p) const {
  // One holder of each element: the first replica over dp x cp (experts: over
  // their expert-data-parallel replicas), the primary tp holder of a shard,
  // tp rank 0 of what every tp rank holds whole.
  if (p.kind == nn::ParallelKind::expert) return at_.edp == 0;
  if (at_.dp != 0 || at_.cp != 0) return false;
  return p.sharded() ? p.shard.primary : at_.tp == 0;
}

void LayerStatistics::keep_parameters(const nn::ParameterSet& params) {
  before_.clear();
  for (const auto& p : params.all()) {
    // measure() reads the copy of a parameter it counts here only: under dp
    // the other replicas keep nothing (224 MiB a rank on bench-moe).
    if (!counts_here(*p)) {
      before_.emplace_back();
      continue;
    }
    Tensor copy = Tensor::empty(p->value.shape(), p->value.dtype(), MemTag::workspace);
    copy.copy_from(p->value);
    before_.push_back(std::move(copy));
  }
}

std::vector<GroupNorms> LayerStatistics::measure(
    kernels::Context& ctx, const nn::ParameterSet& params, double grad_scale,
    comm::Communicator& world, const std::function<bool(const nn::Parameter&)>& zero_held) {
  std::map<std::pair<std::string, std::string>, size_t> index;
  for (size_t i = 0; i < groups_.size(); ++i) index[groups_[i]] = i;
  // Per group: grad squares, param squares, update squares, ZeRO-held count.
  const auto n = static_cast<int64_t>(groups_.size());
  Tensor sums = Tensor::zeros({n, 4}, DType::f64, MemTag::comm);
  double* s = sums.data<double>();
  const bool updates = before_.size() == params.all().size();
  for (size_t k = 0; k < params.all().size(); ++k) {
    const nn::Parameter& p = *params.all()[k];
    const auto it = index.find(layer_group_of(p.name));
    if (it == index.end() || !counts_here(p)) continue;
    double* row = s + 4 * it->second;
    if (zero_held && zero_held(p)) {
      row[3] += 1;
    } else {
      row[0] += kernels::sum_squares(ctx, p.grad);
    }
    row[1] += kernels::sum_squares(ctx, p.value);
    // One read of each copy, no difference tensor: an axpy into the bf16
    // copy and a second pass cost ~9x this on bench-moe (bench/RESULTS.md).
    if (updates) row[2] += kernels::sum_squared_difference(ctx, before_[k], p.value);
  }
  before_.clear();
  if (world.size() > 1) world.allreduce(sums, comm::ReduceOp::sum);
  std::vector<GroupNorms> out;
  for (size_t i = 0; i < groups_.size(); ++i) {
    const double* row = s + 4 * i;
    GroupNorms g;
    g.layer = groups_[i].first;
    g.group = groups_[i].second;
    g.grad = std::sqrt(row[0]) * std::fabs(grad_scale);
    g.param = std::sqrt(row[1]);
    g.update = std::sqrt(row[2]);
    g.has_grad = row[3] == 0;
    g.has_update = updates;
    out.push_back(std::move(g));
  }
  return out;
}

std::vector<double> LayerStatistics::activation_rms(const nn::Transformer& model,
                                                    bool sequence_parallel,
                                                    comm::Communicator& world) {
  // Every dp rank saw different tokens; tp ranks the same ones, unless
  // sequence parallelism gave each a slice.
  const bool counts = sequence_parallel || at_.tp == 0;
  Tensor sums = Tensor::zeros({n_layers_, 2}, DType::f64, MemTag::comm);
  double* s = sums.data<double>();
  for (const auto& b : model.blocks()) {
    const auto [sq, count] = b->take_activation_sums();
    if (!counts || b->index() >= n_layers_) continue;
    s[2 * b->index()] += sq;
    s[2 * b->index() + 1] += static_cast<double>(count);
  }
  if (world.size() > 1) world.allreduce(sums, comm::ReduceOp::sum);
  std::vector<double> rms(static_cast<size_t>(n_layers_), NAN);
  for (int64_t l = 0; l < n_layers_; ++l) {
    if (s[2 * l + 1] > 0) rms[static_cast<size_t>(l)] = std::sqrt(s[2 * l] / s[2 * l + 1]);
  }
  return rms;
}

}  // namespace moetron::train
