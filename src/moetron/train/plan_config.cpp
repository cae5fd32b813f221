#include "moetron/train/plan_config.h"

#include "moetron/parallel/grad_compressor.h"

namespace moetron::train {

nn::Precision resolve_precision(const TrainingConfig& train, std::string* notice) {
  const std::string& precision = train.precision;
  if (precision == "fp32") return nn::Precision::fp32();
  if (precision == "bf16") {
    nn::Precision p = nn::Precision::bf16();
    p.bf16_matrix_grads =
        parallel::parse_storage_dtype(train.grad_dtype, "train.grad_dtype") == DType::bf16;
    return p;
  }
  if (precision == "fp16") {
    __builtin_cpu_init();
    if (notice && !__builtin_cpu_supports("avx512fp16")) {
      *notice =
          "this CPU has no fp16 arithmetic: fp16 tensors are stored in fp16 and computed in fp32";
    }
    return nn::Precision::fp16();
  }
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512bf16")) return nn::Precision::bf16();
  if (notice) *notice = "this CPU has no AVX512-BF16: training in fp32";
  return nn::Precision::fp32();
}

parallel::PlanSettings plan_settings(const Config& cfg, const nn::Precision& prec) {
  const ParallelConfig& p = cfg.parallel;
  parallel::PlanSettings s;
  s.model = cfg.model;
  s.moe = cfg.moe;
  s.media = cfg.multimodal.model;
  s.precision = prec;
  s.tp = p.tp;
  s.ep = p.ep;
  s.pp = p.pp;
  s.vpp = p.vpp;
  s.cp = p.cp;
  s.sequence_parallel = p.sequence_parallel;
  s.tp_rows = p.tp_rows;
  s.zero = p.zero;
  s.schedule = parallel::parse_schedule(p.schedule);
  s.stage_balance = parallel::parse_stage_balance(p.stage_balance);
  s.micro_batch = cfg.train.micro_batch;
  s.seq_len = cfg.train.seq_len;
  s.grad_accum = cfg.train.grad_accum;
  s.global_batch = cfg.train.global_batch;
  s.microbatches = p.microbatches;
  s.optimizer = parallel::parse_optimizer(cfg.optim.name);
  s.muon_distribution = parallel::parse_muon_distribution(cfg.optim.muon_distribution);
  s.adamw_patterns = optim::split_patterns(cfg.optim.adamw_params);
  s.moment_dtype = parallel::parse_moment_dtype(cfg.optim.moment_dtype, "optim.moment_dtype");
  s.master_dtype = parallel::parse_storage_dtype(cfg.optim.master_dtype, "optim.master_dtype");
  s.factored_second_moment = cfg.optim.second_moment == "factored";
  s.reducer.bucket_bytes = static_cast<int64_t>(p.bucket_mb * 1048576.0);
  s.reducer.overlap = p.overlap;
  s.reducer.compress.kind = parallel::parse_compress_kind(p.compression);
  s.reducer.compress.block = p.compression_block;
  s.reducer.compress.topk_ratio = p.topk_ratio;
  s.reducer.compress.keep = p.compression_keep;
  s.reducer.warmup_steps = p.compression_warmup;
  s.reducer.start_on_request = p.compression_start == "auto";
  s.reducer.preconditioned = p.compression != "none" && p.compression_space == "preconditioned";
  s.overlap_param_gather = p.overlap_param_gather;
  return s;
}

parallel::TrainingPlan make_plan(const Config& cfg, const nn::Precision& prec, int world_size,
                                 std::vector<parallel::LayerRange> stages) {
  return parallel::TrainingPlan(plan_settings(cfg, prec), world_size, std::move(stages));
}

optim::OptimizerOptions optimizer_options(const Config& cfg, const parallel::PlanSettings& s) {
  const OptimConfig& o = cfg.optim;
  optim::OptimizerOptions oo;
  oo.name = parallel::name_of(s.optimizer);
  oo.weight_decay = o.weight_decay;
  oo.beta1 = o.beta1;
  oo.beta2 = o.beta2;
  oo.eps = o.eps;
  oo.grad_clip = o.grad_clip;
  oo.muon_momentum = o.muon_momentum;
  oo.muon_nesterov = o.muon_nesterov;
  oo.muon_ns_steps = static_cast<int>(o.muon_ns_steps);
  oo.moment_dtype = s.moment_dtype;
  oo.master_dtype = s.master_dtype;
  oo.factored_second_moment = s.factored_second_moment;
  oo.rounding_seed = cfg.train.seed;
  oo.adamw_patterns = s.adamw_patterns;
  oo.no_decay_patterns = optim::split_patterns(o.no_decay_params);
  oo.schedule = {o.lr, o.min_lr_ratio, o.warmup_steps, cfg.train.steps};
  // A fixed warm-up freezes the variance with it; "auto" freezes it when the
  // trainer starts compression (and on resume from trainer.json).
  const ParallelConfig& p = cfg.parallel;
  if (p.freeze_variance && p.compression != "none" && p.compression_start == "steps")
    oo.variance_frozen_at = p.compression_warmup;
  return oo;
}

}  // namespace moetron::train
