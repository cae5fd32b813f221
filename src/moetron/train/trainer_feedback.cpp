// The state a checkpoint keeps beside the optimizer's: router selection
// biases and gradient compression's error-feedback residuals, and how the
// residuals follow an elastic resize (ckpt/folded_state.h); and when
// compression starts (train/compression_start.h), kept in trainer.json.
#include <unistd.h>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "moetron/ckpt/folded_state.h"
#include "moetron/ckpt/rank_files.h"
#include "moetron/train/trainer.h"

namespace moetron::train {

namespace {

struct ReducerRole {
  parallel::GradReducer* reducer;
  const char* infix;  // names the reducer in the saved tensors
};

// A reducer's residual of one parameter, as a name stable across a resize
// of dp: the parameter, which reducer, and the coordinates that pick its
// reduction group among the stage's (tp for the dense one, ep for the
// experts'; the partial one spans the stage). The rank's index in that
// group is appended by folded_name.
std::string residual_base(const parallel::RankCoords& at, const ReducerRole& role,
                          const parallel::GradReducer::ResidualPiece& piece) {
  std::string base = piece.second_hop ? "ef2." : "ef.";
  base += role.infix;
  base += piece.param->name;
  base += "@pp" + std::to_string(at.pp);
  const std::string infix = role.infix;
  if (infix.empty()) base += ".tp" + std::to_string(at.tp);
  if (infix == "experts.") base += ".ep" + std::to_string(at.ep);
  return base;
}

}  // namespace

std::vector<optim::StateSlice> Trainer::feedback_slices(bool saving, bool residuals) {
  std::vector<optim::StateSlice> out;
  // Router selection biases of this rank's layers: state.safetensors holds
  // rank 0's, which under pp is one stage's; here each stage's first rank
  // stores its own, and every rank loads its layers' from whichever file.
  if (!saving || at().stage_rank == 0) {
    for (nn::MoeLayer* l : model_->moe_layers()) {
      const Tensor& b = l->bias();
      out.push_back({"router_bias." + l->prefix(), b.reshape({b.numel()}), 0, b.numel(), false});
    }
    // Partitioned modality routing's expert owners and allocation window
    // (nn/modality_routing.h), through buffers: saved from the layers here,
    // put back into them by load_modality_allocation after a load.
    if (cfg_.moe.modality_routing == "partitioned") {
      const auto layers = model_->moe_layers();
      allocation_buffers_.resize(layers.size());
      for (size_t i = 0; i < layers.size(); ++i) {
        const std::vector<double> state = layers[i]->allocation_state();
        Tensor& buf = allocation_buffers_[i];
        if (!buf.defined() || buf.numel() != static_cast<int64_t>(state.size()))
          buf = Tensor::zeros({static_cast<int64_t>(state.size())}, DType::f64, MemTag::comm);
        if (saving) std::copy(state.begin(), state.end(), buf.data<double>());
        out.push_back({"modality_allocation." + layers[i]->prefix(), buf, 0, buf.numel(), false});
      }
    }
  }
  if (!residuals) return out;
  // Optional on load: a checkpoint saved without compression has none.
  for (const ReducerRole role :
       {ReducerRole{reducer_.get(), ""}, ReducerRole{expert_reducer_.get(), "experts."},
        ReducerRole{partial_reducer_.get(), "partial."}}) {
    if (!role.reducer) continue;
    const int index = role.reducer->comm().rank();
    for (auto& piece : role.reducer->residual_pieces()) {
      out.push_back({ckpt::folded_name(residual_base(at(), role, piece), index), piece.values,
                     piece.offset, piece.param->value.numel(), false});
    }
  }
  return out;
}

void Trainer::load_modality_allocation() {
  const auto layers = model_->moe_layers();
  for (size_t i = 0; i < allocation_buffers_.size() && i < layers.size(); ++i) {
    const Tensor& b = allocation_buffers_[i];
    layers[i]->set_allocation_state({b.data<double>(), static_cast<size_t>(b.numel())});
  }
}

namespace {

nlohmann::json saved_trainer_state(const std::string& dir) {
  std::ifstream f(dir + "/" + ckpt::kTrainerFile);
  return nlohmann::json::parse(f);
}

// Whether the checkpoint's layout differs from `s` at most in dp.
bool same_but_dp(const nlohmann::json& st, const parallel::PlanSettings& s) {
  return st.value("tp", int64_t{1}) == s.tp && st.value("ep", int64_t{1}) == s.ep &&
         st.value("pp", int64_t{1}) == s.pp && st.value("cp", int64_t{1}) == s.cp;
}

}  // namespace

bool Trainer::saved_layout_matches(const std::string& dir) const {
  const nlohmann::json st = saved_trainer_state(dir);
  return st.value("dp", int64_t{0}) == plan_->dp() && same_but_dp(st, plan_->settings());
}

void Trainer::fold_residuals(const std::string& dir) {
  if (cfg_.parallel.compression == "none") return;
  const nlohmann::json st = saved_trainer_state(dir);
  if (!same_but_dp(st, plan_->settings())) {
    if (is_root())
      std::cerr << "notice: checkpoint '" << dir << "' was saved with another tp, ep, pp or cp; "
                << "gradient compression's error feedback starts from zero\n";
    return;
  }
  int64_t parts = 0;
  for (const ReducerRole role :
       {ReducerRole{reducer_.get(), ""}, ReducerRole{expert_reducer_.get(), "experts."},
        ReducerRole{partial_reducer_.get(), "partial."}}) {
    if (!role.reducer) continue;
    // Both hops' residuals are error still owed to the same sum, so the
    // second hop's (allreduce mode) folds into the first hop's of the rank
    // it lands on; the live second-hop residual restarts from zero.
    std::vector<ckpt::FoldTarget> targets;
    for (auto& piece : role.reducer->residual_pieces()) {
      if (piece.second_hop) continue;
      parallel::GradReducer::ResidualPiece second = piece;
      second.second_hop = true;
      targets.push_back(
          {{residual_base(at(), role, piece), residual_base(at(), role, second)}, piece.values});
    }
    parts +=
        ckpt::load_folded(dir, targets, role.reducer->comm().rank(), role.reducer->comm().size());
  }
  if (is_root())
    std::cerr << "resize: folded the error-feedback residuals of dp " << st.value("dp", int64_t{0})
              << " onto dp " << plan_->dp() << " (" << parts << " saved parts on rank 0)\n";
}

void Trainer::advance_compression(const StepRecord& rec, nlohmann::json& line) {
  if (!compression_start_ || compression_started_at_ > 0 || rec.skipped) return;
  if (!compression_start_->observe(rec.step, rec.grad_norm)) return;
  start_compression(rec.step + 1);
  line["compression_start"] = rec.step + 1;
  char msg[320];
  std::snprintf(msg, sizeof msg,
                "gradient compression (%s) starts at step %lld: the gradients' second moment "
                "changed by %.1f%% over the last %lld steps (parallel.compression_start_tolerance "
                "= %g)%s",
                cfg_.parallel.compression.c_str(), static_cast<long long>(rec.step + 1),
                100 * compression_start_->last_change(),
                static_cast<long long>(compression_start_->window()),
                cfg_.parallel.compression_start_tolerance,
                cfg_.parallel.freeze_variance ? "; AdamW's second moment is frozen" : "");
  if (is_root()) {
    if (::isatty(STDOUT_FILENO)) std::cout << "\n";
    std::cerr << msg << std::endl;
  }
  monitor_->event(rec.step, "compression_start", msg, {{"first_step", rec.step + 1}});
}

void Trainer::start_compression(int64_t first) {
  compression_started_at_ = first;
  for_each_reducer([&](parallel::GradReducer& r) { r.compress_from(first); });
  if (cfg_.parallel.freeze_variance) opt_->freeze_variance(first - 1);
}

nlohmann::json Trainer::compression_state() const {
  return {{"started_at", compression_started_at_}, {"rule", compression_start_->to_json()}};
}

void Trainer::restore_compression(const nlohmann::json& st) {
  if (!compression_start_ || !st.contains("compression")) return;
  const nlohmann::json& c = st.at("compression");
  compression_start_->from_json(c.at("rule"));
  const auto first = c.at("started_at").get<int64_t>();
  if (first > 0) start_compression(first);
}

}  // namespace moetron::train
