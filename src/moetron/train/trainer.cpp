#include "moetron/train/trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "moetron/ckpt/checkpoint.h"
#include "moetron/core/manifest.h"
#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/matmul.h"
#include "moetron/core/threading.h"
#include "moetron/nn/flops.h"
#include "moetron/optim/split_optimizer.h"
#include "moetron/optim/zero_optimizer.h"
#include "moetron/train/fault_injection.h"
#include "moetron/train/memory_report.h"
#include "moetron/train/stage_costs.h"

namespace moetron::train {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

nn::Precision resolve_precision(const TrainingConfig& train, std::string* notice) {
  const std::string& precision = train.precision;
  if (precision == "fp32") return nn::Precision::fp32();
  if (precision == "bf16") {
    nn::Precision p = nn::Precision::bf16();
    p.bf16_matrix_grads = train.grad_dtype == "bf16";  // the config allows it with bf16 only
    return p;
  }
  if (precision == "fp16") {
    __builtin_cpu_init();
    if (notice && !__builtin_cpu_supports("avx512fp16")) {
      *notice = "this CPU has no fp16 arithmetic: fp16 tensors are stored in fp16 and computed in fp32";
    }
    return nn::Precision::fp16();
  }
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512bf16")) return nn::Precision::bf16();
  if (notice) *notice = "this CPU has no AVX512-BF16: training in fp32";
  return nn::Precision::fp32();
}

Trainer::Trainer(Config cfg, std::string run_dir, bool resume, std::shared_ptr<comm::Communicator> world)
    : cfg_(std::move(cfg)), run_dir_(std::move(run_dir)), world_(std::move(world)) {
  if (!world_) world_ = comm::make_local_communicator();
  std::string notice;
  prec_ = resolve_precision(cfg_.train, &notice);
  if (!notice.empty()) std::cerr << "notice: " << notice << "\n";
  fp16_ = prec_.compute == DType::f16;
  scaler_ = optim::LossScaler(cfg_.train.loss_scale_init, cfg_.train.loss_scale_window);
  ctx_ = std::make_unique<kernels::Context>(kernels::Backend::cpu, static_cast<int>(cfg_.train.threads));

  const std::string data_dir = cfg_.data.path;
  MOETRON_CHECK(fs::exists(data_dir + "/manifest.json"), "data.path '", data_dir,
                "' is not a prepared corpus (no manifest.json); run `moetron prepare-data` first");
  const nlohmann::json info = verify_manifest(data_dir);
  const int64_t corpus_vocab = info.at("vocab_size").get<int64_t>();
  MOETRON_CHECK(corpus_vocab <= cfg_.model.vocab_size, "corpus '", data_dir, "' has a vocabulary of ",
                corpus_vocab, " but model.vocab_size is ", cfg_.model.vocab_size);
  train_tokens_ = std::make_unique<data::TokenFile>(data_dir + "/train.bin", cfg_.model.vocab_size);
  val_tokens_ = std::make_unique<data::TokenFile>(data_dir + "/val.bin", cfg_.model.vocab_size);
  sampler_ = std::make_unique<data::WindowSampler>(*train_tokens_, cfg_.train.seq_len + 1, cfg_.train.seed);

  ep_ = cfg_.parallel.ep;
  tp_ = cfg_.parallel.tp;
  pp_ = cfg_.parallel.pp;
  MOETRON_CHECK(world_->size() % pp_ == 0, "parallel.pp = ", pp_, " does not divide the ", world_->size(),
                " ranks of this job");
  const int64_t ranks = stage_size();  // per pipeline stage
  MOETRON_CHECK(ranks % tp_ == 0, "parallel.tp = ", tp_, " does not divide the ", ranks, " ranks of ",
                pp_ > 1 ? "a pipeline stage" : "this job");
  dp_ = ranks / tp_;
  MOETRON_CHECK(ranks % ep_ == 0, "parallel.ep = ", ep_, " does not divide the ", ranks, " ranks of ",
                pp_ > 1 ? "a pipeline stage" : "this job", " (ep groups are cut out of the dp x tp ranks)");
  nn::PipelinePlace place;
  if (pp_ > 1) {
    stage_comm_ = world_->split(static_cast<int>(pp_rank()), world_->rank());
    pp_comm_ = world_->split(static_cast<int>(stage_rank()), world_->rank());
    // One chunk per rank: stages balanced by FLOPs or by measured costs;
    // interleaved: virtual stage c * pp + p holds layers [j L / (pp v), (j + 1) L / (pp v)).
    if (cfg_.parallel.vpp == 1) {
      std::unique_ptr<MeasuredStageCosts> measured;
      if (cfg_.parallel.stage_balance == "measured") {
        measured = std::make_unique<MeasuredStageCosts>(measure_stage_costs(cfg_, prec_, *world_));
      }
      stages_ = measured ? parallel::balanced_stages(measured->costs, pp_)
                         : parallel::balanced_stages(cfg_.model, cfg_.moe, cfg_.train.seq_len, pp_);
      place.chunks = {stages_[static_cast<size_t>(pp_rank())]};
      if (world_->rank() == 0) std::cout << "pipeline: " << pp_ << " stages of " << describe_stages(stages_, measured.get()) << "\n";
    } else {
      place.chunks = parallel::stage_chunks(cfg_.model, cfg_.moe, cfg_.train.seq_len, pp_, cfg_.parallel.vpp, pp_rank());
    }
    place.embedding = pp_rank() == 0;
    place.head = pp_rank() == pp_ - 1;
  }
  model_ = std::make_unique<nn::Transformer>(
      cfg_.model, cfg_.moe, prec_, nn::ExpertParallel{ep_, stage_rank() % ep_},
      nn::TensorParallel{tp_, tp_rank(), cfg_.parallel.sequence_parallel, nullptr, nullptr}, place);
  if (tp_ > 1) {
    tp_comm_ = stage().split(static_cast<int>(dp_rank()), static_cast<int>(stage_rank()));
    model_->set_tensor_group(tp_comm_.get());
  }
  if (pp_ > 1) pipeline_ = std::make_unique<PipelineRunner>(*model_, *pp_comm_, cfg_.parallel.schedule, cfg_.parallel.vpp);
  model_->initialize(cfg_.train.seed);
  model_->set_recompute(recompute_policy(cfg_));
  optim::OptimizerOptions oo;
  oo.name = cfg_.optim.name;
  oo.weight_decay = cfg_.optim.weight_decay;
  oo.beta1 = cfg_.optim.beta1;
  oo.beta2 = cfg_.optim.beta2;
  oo.eps = cfg_.optim.eps;
  oo.grad_clip = cfg_.optim.grad_clip;
  oo.muon_momentum = cfg_.optim.muon_momentum;
  oo.muon_nesterov = cfg_.optim.muon_nesterov;
  oo.muon_ns_steps = static_cast<int>(cfg_.optim.muon_ns_steps);
  oo.moment_dtype = cfg_.optim.moment_dtype == "bf16" ? DType::bf16 : DType::f32;
  oo.adamw_patterns = optim::split_patterns(cfg_.optim.adamw_params);
  oo.no_decay_patterns = optim::split_patterns(cfg_.optim.no_decay_params);
  oo.schedule = {cfg_.optim.lr, cfg_.optim.min_lr_ratio, cfg_.optim.warmup_steps, cfg_.train.steps};
  const int64_t dp = dp_;
  acc_ = accumulation_steps(cfg_, dp);
  if (pp_ > 1) (void)parallel::pipeline_schedule(cfg_.parallel.schedule, pp_, pp_rank(), acc_, cfg_.parallel.vpp);  // its rules
  const int me = static_cast<int>(stage_rank());
  if (ranks > 1) {
    // Every rank of a stage holds a distinct token shard for the MoE layers (tp folded in).
    balance_comm_ = stage().split(0, me);
    model_->set_balance_group(balance_comm_.get());
  }
  if (ep_ > 1) {
    ep_comm_ = stage().split(me / static_cast<int>(ep_), me);
    model_->set_expert_group(ep_comm_.get());
    if (ranks / ep_ > 1) expert_grad_comm_ = stage().split(me % static_cast<int>(ep_), me);
  }
  // Which reducer carries a gradient: expert matrices over the ranks holding
  // the same experts (none when ep = ranks: the all-to-all brought every
  // token to its expert); gradients partial over tp over all ranks; the rest
  // (tp shards, and tensors every tp rank computed whole) over dp.
  const auto is_expert = [this](const nn::Parameter& p) { return ep_ > 1 && p.kind == nn::ParallelKind::expert; };
  const auto is_partial = [is_expert](const nn::Parameter& p) { return p.grad_partial_over_tp && !is_expert(p); };
  const auto is_dense = [is_expert, is_partial](const nn::Parameter& p) { return !is_expert(p) && !is_partial(p); };
  if (ranks > 1 || cfg_.parallel.zero) {  // (a stage of one rank reduces nothing)
    parallel::ReducerOptions ro;
    ro.bucket_bytes = static_cast<int64_t>(cfg_.parallel.bucket_mb * 1048576.0);
    ro.overlap = cfg_.parallel.overlap;
    ro.mode = cfg_.parallel.zero ? parallel::ReduceMode::reduce_scatter : parallel::ReduceMode::allreduce;
    ro.compress.kind = parallel::parse_compress_kind(cfg_.parallel.compression);
    ro.compress.block = cfg_.parallel.compression_block;
    ro.compress.topk_ratio = cfg_.parallel.topk_ratio;
    ro.warmup_steps = cfg_.parallel.compression_warmup;
    std::vector<parallel::BucketSpec> plan;  // empty: flat
    if (cfg_.parallel.zero && oo.name == "muon" && cfg_.optim.muon_distribution == "owner") {
      plan = parallel::owner_bucket_plan(model_->params(), static_cast<int>(dp), ro.bucket_bytes,
                                         [&oo](const nn::Parameter& p) { return optim::rule_uses_muon(oo, p); },
                                         is_dense);
    }
    if (expert_grad_comm_) {
      // Replicas of whole experts: all-reduced (ZeRO-1 shards only what every dp rank holds).
      parallel::ReducerOptions er = ro;
      er.mode = parallel::ReduceMode::allreduce;
      expert_reducer_ = std::make_unique<parallel::GradReducer>(model_->params(), *expert_grad_comm_, er,
                                                                std::vector<parallel::BucketSpec>{}, is_expert);
    }
    if (tp_ > 1) {
      // Under ZeRO-1 they are reduce-scattered over the stage, which shards their state (owner plan for FlexMuon).
      std::vector<parallel::BucketSpec> partial_plan;
      if (cfg_.parallel.zero && oo.name == "muon" && cfg_.optim.muon_distribution == "owner") {
        partial_plan = parallel::owner_bucket_plan(model_->params(), static_cast<int>(ranks), ro.bucket_bytes,
                                                   [&oo](const nn::Parameter& p) { return optim::rule_uses_muon(oo, p); },
                                                   is_partial);
      }
      partial_grad_comm_ = stage().split(0, me);
      partial_reducer_ = std::make_unique<parallel::GradReducer>(model_->params(), *partial_grad_comm_, ro,
                                                                 std::move(partial_plan), is_partial);
    }
    if (dp > 1 || cfg_.parallel.zero) {
      grad_comm_ = stage().split(static_cast<int>(tp_rank()), me);
      reducer_ = std::make_unique<parallel::GradReducer>(model_->params(), *grad_comm_, ro, std::move(plan),
                                                         is_dense);
    }
    model_->on_grad_ready = [this, is_expert, is_partial](nn::Parameter& p) {
      parallel::GradReducer* r = is_expert(p) ? expert_reducer_.get()
                                 : is_partial(p) ? partial_reducer_.get()
                                                 : reducer_.get();
      if (r) r->grad_ready(*ctx_, p);
    };
  }
  if (cfg_.parallel.zero) {
    // ZeRO-1 over each group holding parameters identically: the dense ones
    // (tp blocks, and what every tp rank holds whole) over dp, the
    // tp-partial ones over the stage; experts under ep are updated whole.
    const bool replicated_ns = cfg_.optim.muon_distribution == "replicated";
    std::vector<optim::SplitOptimizer::Part> parts;
    for (parallel::GradReducer* r : {reducer_.get(), partial_reducer_.get()}) {
      if (!r) continue;
      auto zero = std::make_unique<optim::ZeroOptimizer>(model_->params(), oo, *r, replicated_ns);
      if (r == reducer_.get()) zero->set_tensor_parallel(&model_->tensor_parallel());  // the partial group spans tp
      zero->set_overlap_param_gather(cfg_.parallel.overlap_param_gather);
      zero_parts_.push_back(zero.get());
      parts.push_back({std::move(zero), false});
    }
    model_->before_use = [this](nn::Parameter& p) {
      for (optim::ZeroOptimizer* z : zero_parts_) z->wait_for(p);
    };
    if (ep_ > 1) parts.push_back({std::make_unique<optim::Optimizer>(model_->params(), oo, is_expert), true});
    if (parts.size() == 1) {
      opt_ = std::move(parts.front().opt);
    } else {
      opt_ = std::make_unique<optim::SplitOptimizer>(std::move(parts));
    }
  } else {
    auto opt = std::make_unique<optim::Optimizer>(model_->params(), oo);
    opt->set_tensor_parallel(&model_->tensor_parallel());
    opt_ = std::move(opt);
  }

  fs::create_directories(run_dir_);
  if (resume) {
    // Rank 0 picks (and quarantines) for everyone, so ranks never race on
    // renaming a damaged checkpoint and all resume from the same step.
    Tensor chosen = Tensor::empty({1}, DType::i64, MemTag::comm);
    chosen.data<int64_t>()[0] = -1;
    if (is_root()) {
      std::vector<std::string> warnings, skipped;
      const auto dir = ckpt::latest_checkpoint(run_dir_, &warnings, &skipped);
      for (const auto& w : warnings) std::cerr << "warning: " << w << "\n";
      for (const auto& bad : skipped) {
        std::cerr << "warning: moved the damaged checkpoint to '" << ckpt::quarantine_checkpoint(bad) << "'\n";
      }
      if (dir) chosen.data<int64_t>()[0] = ckpt::checkpoint_step(*dir);
    }
    world_->broadcast(chosen, 0);
    const int64_t step = chosen.data<int64_t>()[0];
    if (step >= 0) {
      const std::string dir = ckpt::checkpoint_dir(run_dir_, step);
      const nlohmann::json st = ckpt::load_checkpoint(dir, *model_, opt_.get(), feedback_slices(false));
      start_step_ = st.at("step").get<int64_t>();
      skipped_ = st.value("skipped_steps", int64_t{0});
      if (st.contains("loss_scale")) {
        scaler_.restore(st.at("loss_scale").get<double>(), st.at("loss_scale_clean_steps").get<int64_t>(),
                        st.at("overflow_steps").get<int64_t>());
      }
      if (is_root()) std::cerr << "resumed from " << dir << " at step " << start_step_ << "\n";
    } else if (is_root()) {
      std::cerr << "notice: --resume found no complete checkpoint in '" << run_dir_
                << "'; starting from step 0\n";
    }
  }
  // Peak of the dtype we train in, measured now on this machine: the MFU
  // denominator. Its own context: a bf16 GEMM widened to fp32 (no native
  // bf16 matmul) grows the context's scratch to 8 MiB, which training's
  // context must not keep.
  kernels::Context probe(kernels::Backend::cpu, static_cast<int>(cfg_.train.threads));
  const int64_t n = 1024;
  Tensor a = Tensor::zeros({n, n}, prec_.compute, MemTag::workspace);
  Tensor b = Tensor::zeros({n, n}, prec_.compute, MemTag::workspace);
  Tensor c = Tensor::empty({n, n}, DType::f32, MemTag::workspace);
  a.fill(0.5);
  b.fill(0.25);
  double best = 1e30;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = clock_type::now();
    kernels::matmul(probe, a, b, c, {});
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  peak_flops_ = 2.0 * static_cast<double>(n * n * n) / best;
}

Trainer::~Trainer() = default;

double Trainer::flops_per_token() const {
  return nn::model_flops_per_token(cfg_.model, cfg_.moe, cfg_.train.seq_len);
}

double Trainer::evaluate() {
  const int64_t s = cfg_.train.seq_len, b = cfg_.train.micro_batch;
  const int64_t span = val_tokens_->size() - (s + 1);
  MOETRON_CHECK(span >= 0, "validation split has ", val_tokens_->size(), " tokens, fewer than one window of ",
                s + 1);
  // Batch j is global: rows [j * mb * dp, (j + 1) * mb * dp) of the
  // validation windows, rank r taking mb of them, so every dp (with the
  // global batch fixed) sees the same windows, and every rank runs the same
  // forwards (the expert-parallel exchange is collective).
  Tensor sums = Tensor::zeros({2}, DType::f64, MemTag::comm);
  Tensor inputs = Tensor::empty({b, s}, DType::i32), targets = Tensor::empty({b, s}, DType::i32);
  const int64_t dp = dp_;
  for (int64_t batch = 0; batch < cfg_.train.eval_batches; ++batch) {
    for (int64_t r = 0; r < b; ++r) {
      const int64_t j = (batch * dp + dp_rank()) * b + r;
      const int64_t start = span > 0 ? (j * (s + 1)) % span : 0;
      const int32_t* w = val_tokens_->data() + start;
      std::copy(w, w + s, inputs.data<int32_t>() + r * s);
      std::copy(w + 1, w + s + 1, targets.data<int32_t>() + r * s);
    }
    const nn::LossStats st = pipeline_ ? pipeline_->forward_only(*ctx_, inputs, targets)
                                       : model_->forward_backward(*ctx_, inputs, targets, 0, 0, false);
    if (tp_rank() > 0) continue;  // the tp ranks computed the same losses (only the last stage any)
    sums.data<double>()[0] += st.ce_sum;
    sums.data<double>()[1] += static_cast<double>(st.tokens);
  }
  world_->allreduce(sums, comm::ReduceOp::sum);
  return sums.data<double>()[0] / std::max(sums.data<double>()[1], 1.0);
}

std::vector<optim::StateSlice> Trainer::feedback_slices(bool saving) {
  std::vector<optim::StateSlice> out;
  // Router selection biases of this rank's layers: state.safetensors holds
  // rank 0's, which under pp is one stage's; here each stage's first rank
  // stores its own, and every rank loads its layers' from whichever file.
  if (!saving || stage_rank() == 0) {
    for (nn::MoeLayer* l : model_->moe_layers()) {
      const Tensor& b = l->bias();
      out.push_back({"router_bias." + l->prefix(), b.reshape({b.numel()}), 0, b.numel(), false});
    }
  }
  // Residuals belong to one rank of one layout: named by rank, optional on
  // load (a run resumed on another dp starts its error feedback from zero).
  if (reducer_) {
    for (auto& [name, t] : reducer_->residuals()) {
      out.push_back({"rank-" + std::to_string(world_->rank()) + "." + name, t, 0, t.numel(), false});
    }
  }
  if (expert_reducer_) {
    for (auto& [name, t] : expert_reducer_->residuals()) {
      out.push_back({"rank-" + std::to_string(world_->rank()) + ".experts." + name, t, 0, t.numel(), false});
    }
  }
  if (partial_reducer_) {
    for (auto& [name, t] : partial_reducer_->residuals()) {
      out.push_back({"rank-" + std::to_string(world_->rank()) + ".partial." + name, t, 0, t.numel(), false});
    }
  }
  return out;
}

void Trainer::log_line(const StepRecord& r) {
  const double remaining = static_cast<double>(cfg_.train.steps - r.step);
  const double tokens_per_step =
      static_cast<double>(cfg_.train.micro_batch * acc_ * dp_ * cfg_.train.seq_len);
  const double eta = r.tokens_per_s > 0 ? remaining * tokens_per_step / r.tokens_per_s : 0;
  char buf[256];
  std::snprintf(buf, sizeof(buf),
                "step %5lld/%lld | loss %.4f | lr %.2e | grad %.3f | %7.0f tok/s | MFU %5.1f%% | ETA %4.0fs%s",
                static_cast<long long>(r.step), static_cast<long long>(cfg_.train.steps), r.loss, r.lr,
                r.grad_norm, r.tokens_per_s, 100.0 * r.mfu, eta, r.skipped ? " | skipped" : "");
  if (::isatty(STDOUT_FILENO)) {
    std::cout << "\r" << buf << "\033[K" << std::flush;
    if (r.step == cfg_.train.steps) std::cout << "\n";
  } else {
    std::cout << buf << std::endl;
  }
}

void Trainer::save_checkpoint(int64_t step) {
  const nlohmann::json state = {{"step", step},
                                {"samples_drawn", static_cast<uint64_t>(step * cfg_.train.micro_batch * acc_ * dp_)},
                                {"dp", dp_},
                                {"tp", tp_},
                                {"ep", ep_},
                                {"pp", pp_},
                                {"skipped_steps", skipped_},
                                {"loss_scale", scaler_.scale()},
                                {"loss_scale_clean_steps", scaler_.clean_steps()},
                                {"overflow_steps", scaler_.overflow_steps()},
                                {"seed", cfg_.train.seed}};
  ckpt::save_checkpoint(run_dir_, step, *model_, *opt_, state, to_toml(cfg_), cfg_.checkpoint.keep, world_.get(),
                        feedback_slices(true), [this](const std::string& n) { return writes_checkpoint_tensor(n); });
}

bool Trainer::writes_checkpoint_tensor(const std::string& name) const {
  // Replicated tensors once, by rank 0; each expert by the first ep group
  // (ranks 0 .. ep-1), the one rank there that holds it; each tp block by its
  // rank of the first dp replica (once: a kv head replicated over tp ranks
  // by the first of them). Under pp the same per stage.
  const bool expert = ep_ > 1 && name.find(".block_sparse_moe.experts.") != std::string::npos;
  if (expert) return stage_rank() < ep_;
  if (tp_ > 1) {
    const nn::Parameter* p = model_->params().find(name);
    if (p && p->sharded()) return dp_rank() == 0 && p->shard.primary;
  }
  return stage_rank() == 0;
}

int64_t Trainer::gradient_bytes_sent() const {
  int64_t n = 0;
  if (grad_comm_) n += grad_comm_->total_stats().bytes_sent;
  if (expert_grad_comm_) n += expert_grad_comm_->total_stats().bytes_sent;
  if (partial_grad_comm_) n += partial_grad_comm_->total_stats().bytes_sent;
  return n;
}

void Trainer::for_each_reducer(const std::function<void(parallel::GradReducer&)>& fn) {
  if (reducer_) fn(*reducer_);
  if (expert_reducer_) fn(*expert_reducer_);
  if (partial_reducer_) fn(*partial_reducer_);
}

double Trainer::grad_norm(double grad_scale) {
  if (ep_ == 1 && tp_ == 1 && pp_ == 1) return opt_->grad_norm(*ctx_, grad_scale);
  // After reduction a gradient is the same on every rank holding it: count
  // each expert once over its ep group, each tp block once over tp, the
  // replicated rest locally.
  double replicated = 0;
  Tensor expert = Tensor::zeros({1}, DType::f64, MemTag::comm);
  Tensor sharded = Tensor::zeros({1}, DType::f64, MemTag::comm);
  // ZeRO-1: its gradients live reduced in its bucket chunks, each counted
  // once over its group.
  for (optim::ZeroOptimizer* z : zero_parts_) {
    const optim::ZeroOptimizer::GradSquares sq = z->grad_squares(*ctx_);  // collective over its group
    replicated += sq.replicated;
    sharded.data<double>()[0] += sq.blocks;
  }
  for (const auto& p : model_->params().all()) {
    if (std::any_of(zero_parts_.begin(), zero_parts_.end(), [&](optim::ZeroOptimizer* z) { return z->holds(*p); })) {
      continue;
    }
    const bool is_expert = ep_ > 1 && p->kind == nn::ParallelKind::expert;
    const double sq = kernels::sum_squares(*ctx_, p->grad);
    if (is_expert) {
      expert.data<double>()[0] += sq;
    } else if (p->sharded()) {
      if (p->shard.primary) sharded.data<double>()[0] += sq;
    } else {
      replicated += sq;
    }
  }
  if (ep_comm_) ep_comm_->allreduce(expert, comm::ReduceOp::sum);
  if (tp_comm_) tp_comm_->allreduce(sharded, comm::ReduceOp::sum);
  Tensor total = Tensor::empty({1}, DType::f64, MemTag::comm);
  total.data<double>()[0] = replicated + expert.data<double>()[0] + sharded.data<double>()[0];
  if (pp_comm_) pp_comm_->allreduce(total, comm::ReduceOp::sum);  // the stages' layers
  return std::sqrt(total.data<double>()[0]) * std::fabs(grad_scale);
}

void Trainer::fill_batches(int64_t step, std::vector<Tensor>& inputs, std::vector<Tensor>& targets,
                           std::vector<int64_t>& mb_tokens) {
  // Rows of the global batch, in order: micro-batch m of the step is rows
  // [m * mb * dp, (m + 1) * mb * dp), rank r taking mb of them. dp = 1 with
  // micro_batch = mb * dp reads exactly the same micro-batches.
  const int64_t s = cfg_.train.seq_len, mb = cfg_.train.micro_batch, dp = dp_;
  std::vector<int32_t> window(static_cast<size_t>(s + 1));
  Tensor counts = Tensor::zeros({acc_}, DType::i64, MemTag::comm);
  for (int64_t m = 0; m < acc_; ++m) {
    const auto mi = static_cast<size_t>(m);
    for (int64_t r = 0; r < mb; ++r) {
      const auto index = static_cast<uint64_t>((step - 1) * mb * acc_ * dp + m * mb * dp + dp_rank() * mb + r);
      sampler_->fill(index, window.data());
      std::copy(window.begin(), window.end() - 1, inputs[mi].data<int32_t>() + r * s);
      std::copy(window.begin() + 1, window.end(), targets[mi].data<int32_t>() + r * s);
    }
    const int32_t* tp = targets[mi].data<int32_t>();
    if (tp_rank() == 0 && pp_rank() == 0) {  // the tp ranks (and the stages) hold the same rows
      for (int64_t i = 0; i < mb * s; ++i) counts.data<int64_t>()[m] += tp[i] >= 0;
    }
  }
  // Normalisation is by the global batch's tokens: each micro-batch's count
  // summed over the dp ranks.
  if (world_->size() > 1) world_->allreduce(counts, comm::ReduceOp::sum);
  for (int64_t m = 0; m < acc_; ++m) mb_tokens[static_cast<size_t>(m)] = counts.data<int64_t>()[m];
}

void Trainer::reduce_expert_loads() {
  const auto layers = model_->moe_layers();
  if (stage().size() == 1 || layers.empty()) return;
  const auto e = static_cast<int64_t>(layers.front()->expert_load().size());
  Tensor loads = Tensor::empty({static_cast<int64_t>(layers.size()) * e}, DType::i64, MemTag::comm);
  for (size_t l = 0; l < layers.size(); ++l) {
    std::copy(layers[l]->expert_load().begin(), layers[l]->expert_load().end(),
              loads.data<int64_t>() + static_cast<int64_t>(l) * e);
  }
  stage().allreduce(loads, comm::ReduceOp::sum);
  for (size_t l = 0; l < layers.size(); ++l) {
    const int64_t* p = loads.data<int64_t>() + static_cast<int64_t>(l) * e;
    layers[l]->set_expert_load(std::vector<int64_t>(p, p + e));
  }
}

TrainResult Trainer::run() {
  TrainResult res;
  res.val_loss = NAN;
  const int64_t s = cfg_.train.seq_len, mb = cfg_.train.micro_batch, acc = acc_;
  std::ofstream metrics;
  if (is_root()) {
    metrics.open(run_dir_ + "/metrics.jsonl", std::ios::app);
    MOETRON_CHECK(metrics.good(), "cannot open '", run_dir_, "/metrics.jsonl' for writing");
  }
  std::vector<Tensor> inputs, targets;
  for (int64_t m = 0; m < acc; ++m) {
    inputs.push_back(Tensor::empty({mb, s}, DType::i32));
    targets.push_back(Tensor::empty({mb, s}, DType::i32));
  }
  const double fpt = flops_per_token();
  const double job_peak = peak_flops_ * static_cast<double>(world_->size());
  if (world_->rank() == 0) {
    // One prediction per pipeline stage (its first rank's: the ranks of a
    // stage differ only by the routing under ep).
    for (int64_t s = 0; s < pp_; ++s) {
      const int64_t r = s * stage_size();
      planner::Layout lay = layout_of(cfg_, world_->size(), r);
      lay.stages = stages_;  // the split this job uses (measured costs may differ from FLOPs)
      std::cout << memory_plan(cfg_, prec_, num_compute_threads(), static_cast<int>(r), lay)
                << std::flush;
    }
  }
  cpu_allocator().reset_peaks();
  for (int64_t step = start_step_ + 1; step <= cfg_.train.steps; ++step) {
    maybe_inject_failure(world_->rank(), step);
    const auto t0 = clock_type::now();
    const int64_t grad_bytes_before = gradient_bytes_sent();
    std::vector<int64_t> mb_tokens(static_cast<size_t>(acc), 0);
    fill_batches(step, inputs, targets, mb_tokens);
    int64_t step_tokens = 0;
    for (int64_t n : mb_tokens) step_tokens += n;
    model_->params().zero_grads();
    StepRecord rec;
    rec.step = step;
    // fp16: the loss (hence every gradient) is multiplied by the loss scale;
    // the optimizer divides it out.
    const double loss_scale = fp16_ ? scaler_.scale() : 1.0;
    // ce (the last stage's, once per tp group), dropped (every rank's
    // slots), aux and z loss (once per stage: equal on its ranks), over ranks.
    Tensor sums = Tensor::zeros({4}, DType::f64, MemTag::comm);
    double* sm = sums.data<double>();
    const auto add_stats = [&](const nn::LossStats& st, double share) {
      if (tp_rank() == 0) sm[0] += st.ce_sum;
      sm[1] += static_cast<double>(st.dropped);
      if (stage_rank() == 0) {
        sm[2] += st.aux_loss * share;
        sm[3] += st.z_loss * share;
      }
    };
    if (pipeline_) {
      std::vector<double> weights;
      for (int64_t n : mb_tokens) weights.push_back(static_cast<double>(n) / static_cast<double>(step_tokens) * loss_scale);
      const PipelineRunner::StepResult pr = pipeline_->train_step(
          *ctx_, inputs, targets, loss_scale / static_cast<double>(step_tokens), weights,
          [&] { for_each_reducer([&](parallel::GradReducer& r) { r.arm(step); }); });
      // The micro-batches' aux losses are already weighted by their shares (x loss scale).
      nn::LossStats st = pr.stats;
      st.aux_loss /= loss_scale;
      st.z_loss /= loss_scale;
      add_stats(st, 1.0);
      rec.pipeline_wait_s = pr.wait_s;
    } else {
      for (int64_t m = 0; m < acc; ++m) {
        const double share = static_cast<double>(mb_tokens[static_cast<size_t>(m)]) / static_cast<double>(step_tokens);
        if (m == acc - 1) for_each_reducer([&](parallel::GradReducer& r) { r.arm(step); });
        const nn::LossStats st = model_->forward_backward(*ctx_, inputs[static_cast<size_t>(m)],
                                                          targets[static_cast<size_t>(m)],
                                                          loss_scale / static_cast<double>(step_tokens),
                                                          share * loss_scale, true);
        add_stats(st, share);
      }
    }
    for_each_reducer([&](parallel::GradReducer& r) {
      r.finish(*ctx_);
      rec.comm_wait_s += r.last_wait_seconds();
    });
    if (world_->size() > 1) world_->allreduce(sums, comm::ReduceOp::sum);
    rec.aux_loss = sm[2];
    rec.z_loss = sm[3];
    rec.dropped = static_cast<int64_t>(sums.data<double>()[1]);
    rec.tokens = step_tokens;
    rec.loss = sums.data<double>()[0] / static_cast<double>(step_tokens);
    if (before_update) before_update(step);
    rec.grad_norm = grad_norm(1.0 / loss_scale);
    reduce_expert_loads();
    if (fp16_ && std::isfinite(rec.loss) && !std::isfinite(rec.grad_norm)) {
      // An fp16 overflow: expected now and then; skip, count, halve the scale.
      scaler_.update(false);
      rec.lr = opt_->options().schedule.at(step);
      rec.skipped = true;
      ++skipped_;
      for (nn::MoeLayer* l : model_->moe_layers()) l->reset_load();
    } else if (!std::isfinite(rec.loss) || !std::isfinite(rec.grad_norm)) {
      MOETRON_CHECK(cfg_.train.nan_policy == "skip", "non-finite loss or gradient at step ", step,
                    " (train.nan_policy = \"stop\")");
      rec.lr = opt_->options().schedule.at(step);
      rec.skipped = true;
      ++skipped_;
      for (nn::MoeLayer* l : model_->moe_layers()) l->reset_load();
    } else {
      if (fp16_) scaler_.update(true);
      const optim::StepInfo info = opt_->step(*ctx_, step, 1.0 / loss_scale, rec.grad_norm);
      rec.lr = info.lr;
    }
    if (res.history.empty()) res.first_step_memory = cpu_allocator().stats();  // before any evaluation
    const double secs = std::chrono::duration<double>(clock_type::now() - t0).count();
    rec.step_s = secs;
    rec.tokens_per_s = static_cast<double>(step_tokens) / secs;
    rec.mfu = rec.tokens_per_s * fpt / job_peak;
    nlohmann::json line = {{"step", step},         {"loss", rec.loss},       {"lr", rec.lr},
                           {"grad_norm", rec.grad_norm}, {"tokens_per_s", rec.tokens_per_s},
                           {"mfu", rec.mfu},       {"aux_loss", rec.aux_loss}, {"z_loss", rec.z_loss},
                           {"skipped", rec.skipped}, {"tokens", step_tokens},
                           {"dropped_slots", rec.dropped}, {"step_s", secs}};
    if (pipeline_) {
      line["pipeline_wait_s"] = rec.pipeline_wait_s;
      // Each stage's time not waiting on the pipeline (its first rank's):
      // how balanced the stages really are.
      Tensor busy = Tensor::zeros({pp_}, DType::f64, MemTag::comm);
      busy.data<double>()[pp_rank()] = secs - rec.pipeline_wait_s;
      pp_comm_->allreduce(busy, comm::ReduceOp::sum);
      line["stage_busy_s"] = std::vector<double>(busy.data<double>(), busy.data<double>() + pp_);
    }
    if (reducer_) {
      line["comm_wait_s"] = rec.comm_wait_s;
      line["grad_bytes_sent"] = gradient_bytes_sent() - grad_bytes_before;  // this rank, this step
    }
    rec.loss_scale = loss_scale;
    if (fp16_) line["loss_scale"] = loss_scale;
    nlohmann::json loads = nlohmann::json::array();
    for (nn::MoeLayer* l : model_->moe_layers()) {
      loads.push_back(l->expert_load());
      if (!rec.skipped) {
        if (cfg_.moe.bias_update_rate > 0) {
          l->update_bias(cfg_.moe.bias_update_rate);
        } else {
          l->reset_load();
        }
      }
    }
    line["expert_load"] = loads;
    const bool eval_now = cfg_.train.eval_every > 0 && step % cfg_.train.eval_every == 0;
    if (eval_now || step == cfg_.train.steps) {
      res.val_loss = evaluate();
      line["val_loss"] = res.val_loss;
    }
    if (is_root()) {
      metrics << line.dump() << "\n" << std::flush;
      if (step % cfg_.train.log_every == 0 || step == cfg_.train.steps || step == start_step_ + 1) log_line(rec);
      if (line.contains("val_loss") && !::isatty(STDOUT_FILENO)) {
        std::cout << "step " << step << " | validation loss " << res.val_loss << std::endl;
      }
    }
    if (cfg_.checkpoint.every > 0 && step % cfg_.checkpoint.every == 0 && step != cfg_.train.steps) save_checkpoint(step);
    if (res.history.empty() && world_->rank() == 0) {
      // On a terminal the progress line has no newline yet (it redraws in place).
      if (::isatty(STDOUT_FILENO) && step != cfg_.train.steps) std::cout << "\n";
      std::cout << memory_table({{"measured peak, step " + std::to_string(step), measured_peaks(cpu_allocator().stats())}})
                << std::flush;
    }
    if (res.history.empty()) res.first_loss = rec.loss;
    res.last_loss = rec.loss;
    res.history.push_back(rec);
    ++res.steps_done;
  }
  if (res.steps_done > 0) save_checkpoint(cfg_.train.steps);
  res.skipped_steps = skipped_;
  res.final_loss_scale = fp16_ ? scaler_.scale() : 1.0;
  return res;
}

}  // namespace moetron::train
