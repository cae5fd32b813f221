// The state a checkpoint keeps beside the optimizer's: router selection
// biases and gradient compression's error-feedback residuals, and how the
// residuals follow an elastic resize (ckpt/folded_state.h); and when
// compression starts (train/compression_start.h), kept in trainer.json.
#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "moetron/ckpt/folded_state.h"
#include "moetron/ckpt/rank_files.h"
#include "moetron/kernels/elementwise.h"
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

void Trainer::start_compression(int64_t first, const nlohmann::json* restored_scales) {
  compression_started_at_ = first;
  for_each_reducer([&](parallel::GradReducer& r) { r.compress_from(first); });
  if (cfg_.parallel.freeze_variance) opt_->freeze_variance(first - 1);
  if (cfg_.parallel.compression_space == "preconditioned") {
    build_preconditioners(restored_scales ? *restored_scales : nlohmann::json::object(),
                          /*fresh=*/restored_scales == nullptr);
  }
}

namespace {

constexpr const char* kSecondMoment = ".exp_avg_sq";
// The floor of a preconditioner's d, as a share of its tensor's mean
// (parallel/grad_reducer.h, floor_denominators): a gradient arriving where v
// had decayed to nearly nothing enters the encoding at most about
// 1 / kDenominatorFloor times a typical value of its tensor (and, with the
// variance frozen, moves its coordinate by at most that many typical updates).
constexpr double kDenominatorFloor = 0.1;

// dst = src, converted when their dtypes differ.
void copy_converted(kernels::Context& ctx, const Tensor& src, const Tensor& dst) {
  if (src.dtype() == dst.dtype()) {
    dst.copy_from(src);
  } else {
    kernels::convert(ctx, src, dst);
  }
}

}  // namespace

void Trainer::load_denominators(int64_t v_step, const std::unordered_map<std::string, float>& saved,
                                bool collective) {
  // AdamW's denominator as its kernel computes it from v after step v_step
  // (kernels/adamw.h), in f32 whatever v is stored in.
  const double bc2 = 1.0 - std::pow(cfg_.optim.beta2, static_cast<double>(v_step));
  const auto eps = static_cast<float>(cfg_.optim.eps);
  // A live AdamW update is at most 1 / sqrt(1 - beta2) per coordinate (v
  // takes in (1 - beta2) g^2 first); each rank's share is held to that.
  const auto clamp = static_cast<float>(1.0 / std::sqrt(1.0 - cfg_.optim.beta2));
  for_each_reducer([clamp](parallel::GradReducer& r) { r.begin_preconditioner(clamp); });
  for (const optim::StateSlice& sl : opt_->state_slices()) {
    if (!sl.name.ends_with(kSecondMoment)) continue;
    const Tensor d = Tensor::empty({sl.values.numel()}, DType::f32, MemTag::workspace);
    copy_converted(*ctx_, sl.values, d);
    float* x = d.data<float>();
    for (int64_t i = 0; i < d.numel(); ++i)
      x[i] = static_cast<float>(std::sqrt(static_cast<double>(x[i]) / bc2)) + eps;
    const std::string param = sl.name.substr(0, sl.name.size() - std::strlen(kSecondMoment));
    for_each_reducer([&](parallel::GradReducer& r) { r.set_denominator(param, sl.offset, d); });
  }
  for_each_reducer([&](parallel::GradReducer& r) { r.finish_preconditioner(saved, collective); });
}

void Trainer::build_preconditioners(const nlohmann::json& saved_scales, bool fresh) {
  std::unordered_map<std::string, float> saved;
  for (const auto& [name, value] : saved_scales.items()) saved[name] = value.get<float>();
  const int64_t v_step = compression_started_at_ - 1;
  load_denominators(v_step, saved, true);
  const bool frozen = cfg_.parallel.freeze_variance;
  // A live v is refreshed at every step; a frozen one comes from the
  // checkpoint already floored on resume.
  if (frozen && !fresh) return;
  for_each_reducer([](parallel::GradReducer& r) { r.floor_denominators(kDenominatorFloor); });
  if (!frozen) return;
  // At the start itself: store the floored denominators back as the frozen
  // v (so the optimizer divides by the same), and rebuild from that v
  // exactly as a resume will.
  const double bc2 = 1.0 - std::pow(cfg_.optim.beta2, static_cast<double>(v_step));
  const auto eps = static_cast<double>(static_cast<float>(cfg_.optim.eps));
  for (const optim::StateSlice& sl : opt_->state_slices()) {
    if (!sl.name.ends_with(kSecondMoment)) continue;
    const std::string param = sl.name.substr(0, sl.name.size() - std::strlen(kSecondMoment));
    const Tensor d = Tensor::empty({sl.values.numel()}, DType::f32, MemTag::workspace);
    bool found = false;
    for_each_reducer(
        [&](parallel::GradReducer& r) { found |= r.get_denominator(param, sl.offset, d); });
    if (!found) continue;  // not reduced over dp (no reducer carries it)
    float* v = d.data<float>();
    for (int64_t i = 0; i < d.numel(); ++i) {
      const double root = std::max(0.0, static_cast<double>(v[i]) - eps);
      v[i] = static_cast<float>(root * root * bc2);
    }
    copy_converted(*ctx_, d, sl.values);
  }
  for (const auto& [name, value] : tensor_scales()) saved[name] = value;
  load_denominators(v_step, saved, true);
}

void Trainer::refresh_preconditioners(int64_t step) {
  if (cfg_.parallel.compression_space != "preconditioned" || cfg_.parallel.freeze_variance ||
      compression_started_at_ == 0 || step <= compression_started_at_)
    return;
  load_denominators(step - 1, tensor_scales(), false);
  for_each_reducer([](parallel::GradReducer& r) { r.floor_denominators(kDenominatorFloor); });
}

std::unordered_map<std::string, float> Trainer::tensor_scales() {
  std::unordered_map<std::string, float> out;
  for_each_reducer([&](parallel::GradReducer& r) { out.merge(r.tensor_scales()); });
  return out;
}

nlohmann::json Trainer::compression_state() {
  nlohmann::json st = {{"started_at", compression_started_at_},
                       {"rule", compression_start_->to_json()}};
  if (cfg_.parallel.compression_space == "preconditioned" && compression_started_at_ > 0) {
    nlohmann::json scales = nlohmann::json::object();
    for (const auto& [name, value] : tensor_scales()) scales[name] = value;
    st["tensor_scales"] = std::move(scales);
  }
  return st;
}

void Trainer::restore_compression(const nlohmann::json& st) {
  if (!compression_start_ || !st.contains("compression")) return;
  const nlohmann::json& c = st.at("compression");
  compression_start_->from_json(c.at("rule"));
  const auto first = c.at("started_at").get<int64_t>();
  const nlohmann::json scales = c.value("tensor_scales", nlohmann::json::object());
  if (first > 0) start_compression(first, &scales);
}

}  // namespace moetron::train
