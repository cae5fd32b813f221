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
#include <unordered_map>
#include <unordered_set>

#include "moetron/ckpt/checkpoint.h"
#include "moetron/ckpt/persist.h"
#include "moetron/ckpt/snapshot.h"
#include "moetron/ckpt/writer_balance.h"
#include "moetron/core/manifest.h"
#include "moetron/core/staged_dir.h"
#include "moetron/core/threading.h"
#include "moetron/data/corpus.h"
#include "moetron/kernels/elementwise.h"
#include "moetron/kernels/matmul.h"
#include "moetron/nn/flops.h"
#include "moetron/optim/split_optimizer.h"
#include "moetron/optim/zero_optimizer.h"
#include "moetron/train/fault_injection.h"
#include "moetron/train/memory_report.h"
#include "moetron/train/resume_check.h"
#include "moetron/train/stage_costs.h"

namespace moetron::train {

namespace fs = std::filesystem;
using clock_type = std::chrono::steady_clock;

Trainer::Trainer(Config cfg, std::string run_dir, const ResumeOptions& resume,
                 std::shared_ptr<comm::Communicator> world)
    : cfg_(std::move(cfg)),
      run_dir_(std::move(run_dir)),
      world_(std::move(world)),
      guard_({cfg_.train.max_skipped_steps, cfg_.train.max_skipped_fraction,
              cfg_.train.loss_spike_factor}) {
  if (!world_) world_ = comm::make_local_communicator();
  if (!resume.resume) refuse_existing_run();  // before anything is built or written
  std::string notice;
  prec_ = resolve_precision(cfg_.train, &notice);
  if (!notice.empty()) std::cerr << "notice: " << notice << "\n";
  fp16_ = prec_.compute == DType::f16;
  scaler_ = optim::LossScaler(cfg_.train.loss_scale_init, cfg_.train.loss_scale_window);
  ctx_ = std::make_unique<kernels::Context>(kernels::Backend::cpu,
                                            static_cast<int>(cfg_.train.threads));
  open_corpus();
  make_plan_for_world();
  build_communicators();
  build_model();
  build_reducers();
  build_optimizer();
  balance_checkpoint_writers();
  if (!cfg_.train.init_from.empty()) load_initial_weights();
  fs::create_directories(run_dir_);
  if (is_root()) {
    for (const auto& d : ckpt::remove_dead_staging_dirs(run_dir_))
      std::cerr << "notice: removed '" << d << "', left by a save that did not finish\n";
  }
  monitor_ = std::make_unique<TrainerMonitor>(cfg_, run_dir_, *world_, at());
  setup_snapshots(resume.resume);
  if (resume.resume) resume_from_latest(resume);
}

void Trainer::refuse_existing_run() const {
  const std::vector<std::string> found = existing_run_files(run_dir_);
  if (found.empty()) return;
  std::string list;
  for (const auto& f : found) list.append(list.empty() ? "" : ", ").append(f);
  MOETRON_FAIL("run directory '", run_dir_, "' already holds a run (", list,
               "); continue it with --resume, or train into a new --out");
}

void Trainer::prepare_corpus_on_first_use() {
  // Rank 0 decides and prepares; the others wait for its verdict (0:
  // nothing to do, 1: prepared, -1: it failed), so no rank looks at a
  // half-written corpus.
  Tensor ok = Tensor::empty({1}, DType::i32, MemTag::comm);
  ok.data<int32_t>()[0] = is_root() && !fs::exists(cfg_.data.path) ? 1 : 0;
  std::string error;
  if (ok.data<int32_t>()[0] == 1) {
    data::PrepareOptions o;
    o.input = cfg_.data.source;
    o.out_dir = cfg_.data.path;
    o.vocab_size = cfg_.model.vocab_size;
    o.val_fraction = cfg_.data.val_fraction;
    std::cerr << "data.path '" << o.out_dir << "' does not exist yet: preparing it from "
              << "data.source '" << o.input << "' (vocabulary " << o.vocab_size << "), once ..."
              << std::endl;
    try {
      const data::PrepareReport r = data::prepare_data(o);
      std::cerr << "prepared " << o.out_dir << ": " << r.documents << " documents, "
                << r.train_tokens << " train + " << r.val_tokens << " validation tokens"
                << std::endl;
    } catch (const Error& e) {
      error = e.what();
      ok.data<int32_t>()[0] = -1;
    }
  }
  world_->broadcast(ok, 0);
  if (!error.empty()) MOETRON_FAIL("preparing data.path from data.source failed: ", error);
  MOETRON_CHECK(ok.data<int32_t>()[0] >= 0, "rank 0 could not prepare data.path '", cfg_.data.path,
                "' (see its error)");
}

void Trainer::open_corpus() {
  if (cfg_.multimodal.model.enabled) return open_multimodal_corpus();
  const std::string data_dir = cfg_.data.path;
  if (!cfg_.data.source.empty()) prepare_corpus_on_first_use();
  MOETRON_CHECK(fs::exists(data_dir + "/manifest.json"), "data.path '", data_dir,
                "' is not a prepared corpus (no manifest.json); run `moetron prepare-data` first",
                " (or set data.source to a text file or folder to prepare it from)");
  const nlohmann::json info = verify_manifest(data_dir, "corpus");
  const int64_t corpus_vocab = info.at("vocab_size").get<int64_t>();
  MOETRON_CHECK(corpus_vocab <= cfg_.model.vocab_size, "corpus '", data_dir,
                "' has a vocabulary of ", corpus_vocab, " but model.vocab_size is ",
                cfg_.model.vocab_size);
  // A corpus of fixed-length examples (prepare-data --task retrieval) is
  // read one whole example per window; evaluate() then steps through the
  // validation examples on their boundaries too.
  const int64_t example_tokens = info.value("example_tokens", int64_t{0});
  MOETRON_CHECK(example_tokens == 0 || example_tokens == cfg_.train.seq_len + 1, "corpus '",
                data_dir, "' holds examples of ", example_tokens, " tokens (",
                info.value("task", ""), " task of seq_len ", example_tokens - 1,
                "): set train.seq_len = ", example_tokens - 1, ", not ", cfg_.train.seq_len);
  if (cfg_.data.document_mask) {
    MOETRON_CHECK(info.contains("eos_id"), "data.document_mask needs the corpus's end-of-document ",
                  "token, but '", data_dir, "/manifest.json' has no eos_id");
    document_separator_ = info.at("eos_id").get<int32_t>();
  }
  if (cfg_.data.loss_on_answers) {
    MOETRON_CHECK(
        example_tokens > 0 && info.contains("answer_tokens"),
        "data.loss_on_answers needs a task corpus whose manifest names its answer_tokens ",
        "(prepare-data --task retrieval), but '", data_dir, "/manifest.json' has none");
    answer_tokens_ = info.at("answer_tokens").get<int64_t>();
    MOETRON_CHECK(answer_tokens_ >= 1 && answer_tokens_ <= cfg_.train.seq_len, "corpus '", data_dir,
                  "' names answer_tokens = ", answer_tokens_,
                  ", outside [1, train.seq_len = ", cfg_.train.seq_len, "]");
  }
  train_tokens_ = std::make_unique<data::TokenFile>(data_dir + "/train.bin", cfg_.model.vocab_size);
  val_tokens_ = std::make_unique<data::TokenFile>(data_dir + "/val.bin", cfg_.model.vocab_size);
  sampler_ =
      std::make_unique<data::WindowSampler>(*train_tokens_, cfg_.train.seq_len + 1, cfg_.train.seed,
                                            std::max<int64_t>(example_tokens, 1));
}

void Trainer::make_plan_for_world() {
  plan_ = std::make_unique<parallel::TrainingPlan>(make_plan(cfg_, prec_, world_->size()));
  const parallel::PlanSettings& s = plan_->settings();
  if (s.pp > 1 && s.vpp == 1 && s.stage_balance == parallel::StageBalance::measured) {
    // Every rank times the probes and splits by the mean (collective).
    measured_ = std::make_unique<MeasuredStageCosts>(measure_stage_costs(cfg_, prec_, *world_));
    plan_ = std::make_unique<parallel::TrainingPlan>(
        make_plan(cfg_, prec_, world_->size(), parallel::balanced_stages(measured_->costs, s.pp)));
  }
  if (s.pp > 1 && s.vpp == 1 && is_root()) {
    std::cout << "pipeline: " << s.pp << " stages of "
              << describe_stages(plan_->stages(), measured_.get()) << "\n";
  }
  rank_ = plan_->rank_plan(world_->rank());
  acc_ = plan_->accumulation();
}

void Trainer::build_communicators() {
  using comm::Axis;
  // Collective: every rank builds the same groups in the same order.
  dense_mesh_ = std::make_unique<comm::ProcessMesh>(*world_, plan_->dense_mesh());
  if (plan_->has_group(parallel::Group::tp)) tp_comm_ = &dense_mesh_->axis(Axis::tp);
  if (plan_->has_group(parallel::Group::pp)) pp_comm_ = &dense_mesh_->axis(Axis::pp);
  if (plan_->has_group(parallel::Group::cp)) cp_comm_ = &dense_mesh_->axis(Axis::cp);
  // (of one rank when pp = world)
  stage_comm_ = &dense_mesh_->group({Axis::tp, Axis::cp, Axis::dp});
  if (plan_->has_group(parallel::Group::stage))
    balance_comm_ = dense_mesh_->make_group({Axis::tp, Axis::cp, Axis::dp});
  if (plan_->has_group(parallel::Group::ep)) {
    expert_mesh_ = std::make_unique<comm::ProcessMesh>(*world_, plan_->expert_mesh());
    ep_comm_ = &expert_mesh_->axis(Axis::ep);
  }
  for (const parallel::ReducerPlan& r : rank_.reducers) {
    switch (r.over) {
      case parallel::Group::expert_dp:
        expert_grad_comm_ = expert_mesh_->make_group({Axis::dp});
        break;
      case parallel::Group::stage:
        partial_grad_comm_ = dense_mesh_->make_group({Axis::tp, Axis::cp, Axis::dp});
        break;
      case parallel::Group::dp:  // the ranks holding the same dense weights: dp x cp
        grad_comm_ = dense_mesh_->make_group({Axis::cp, Axis::dp});
        break;
      default:
        MOETRON_FAIL("a reducer over the ", parallel::name_of(r.over), " group");
    }
  }
}

comm::Communicator* Trainer::group_comm(parallel::Group g) {
  switch (g) {
    case parallel::Group::tp:
      return tp_comm_;
    case parallel::Group::dp:
      return grad_comm_.get();
    case parallel::Group::pp:
      return pp_comm_;
    case parallel::Group::stage:
      return plan_->has_group(g) ? stage_comm_ : nullptr;
    case parallel::Group::ep:
      return ep_comm_;
    case parallel::Group::expert_dp:
      return expert_grad_comm_.get();
    case parallel::Group::cp:
      return cp_comm_;
  }
  return nullptr;
}

void Trainer::build_model() {
  const parallel::PlanSettings& s = plan_->settings();
  const nn::TensorParallel tpar = parallel::module_tensor_parallel(s, at().tp);
  model_ = std::make_unique<nn::Transformer>(cfg_.model, cfg_.moe, prec_,
                                             nn::ExpertParallel{s.ep, at().ep}, tpar, rank_.place);
  if (cfg_.multimodal.model.enabled) model_->enable_media(cfg_.multimodal.model);
  // The plan's buckets and the memory model read the predicted inventory:
  // it must be exactly what was built.
  const std::string diff =
      nn::first_difference(nn::describe_parameters(model_->params()), rank_.inventory.params);
  MOETRON_CHECK(diff.empty(), "rank ", world_->rank(),
                ": the model built differs from its plan: ", diff);
  if (tp_comm_) model_->set_tensor_group(tp_comm_);
  if (cp_comm_) model_->set_context_group(cp_comm_, cfg_.parallel.cp_comm == "all_to_all");
  if (pp_comm_) pipeline_ = std::make_unique<PipelineRunner>(*model_, *pp_comm_, s.schedule, s.vpp);
  model_->initialize(cfg_.train.seed);
  model_->set_recompute(recompute_policy(cfg_));
  model_->set_document_separator(document_separator_);
  if (cfg_.train.seq_chunk < cfg_.train.seq_len) model_->set_sequence_chunk(cfg_.train.seq_chunk);
  // Every rank of a stage holds a distinct token shard for the MoE layers (tp folded in).
  if (balance_comm_) model_->set_balance_group(balance_comm_.get());
  if (ep_comm_) model_->set_expert_group(ep_comm_);
}

void Trainer::build_reducers() {
  const nn::ParameterSet& params = model_->params();
  for (const parallel::ReducerPlan& r : rank_.reducers) {
    std::vector<parallel::BucketSpec> buckets = parallel::bind_buckets(r.buckets, params);
    // What this reducer carries: exactly its planned slots (an empty plan carries nothing).
    auto carried = std::make_shared<std::unordered_set<const nn::Parameter*>>();
    for (const auto& b : buckets) {
      for (const auto& slot : b.slots) carried->insert(slot.param);
    }
    const auto carries = [carried](const nn::Parameter& p) { return carried->count(&p) > 0; };
    comm::Communicator* c = r.carries == parallel::GradGroup::expert    ? expert_grad_comm_.get()
                            : r.carries == parallel::GradGroup::partial ? partial_grad_comm_.get()
                                                                        : grad_comm_.get();
    auto reducer = std::make_unique<parallel::GradReducer>(model_->params(), *c, r.options,
                                                           std::move(buckets), carries);
    (r.carries == parallel::GradGroup::expert    ? expert_reducer_
     : r.carries == parallel::GradGroup::partial ? partial_reducer_
                                                 : reducer_) = std::move(reducer);
  }
  if (rank_.reducers.empty()) return;
  const ParallelConfig& pc = cfg_.parallel;
  if (pc.compression != "none" && pc.compression_start == "auto") {
    compression_start_ = std::make_unique<CompressionStart>(
        CompressionStartOptions{cfg_.optim.beta2, pc.compression_start_tolerance,
                                pc.compression_warmup, cfg_.optim.warmup_steps});
  }
  // Each gradient goes to the reducer its plan names, as soon as backward completes it.
  auto route = std::make_shared<std::unordered_map<const nn::Parameter*, parallel::GradReducer*>>();
  for_each_reducer([&](parallel::GradReducer& r) {
    for (const auto& b : r.buckets()) {
      for (const auto& slot : b.slots) (*route)[slot.param] = &r;
    }
  });
  model_->on_grad_ready = [this, route](nn::Parameter& p) {
    const auto it = route->find(&p);
    if (it != route->end()) it->second->grad_ready(*ctx_, p);
  };
}

void Trainer::build_optimizer() {
  const parallel::PlanSettings& s = plan_->settings();
  const optim::OptimizerOptions oo = optimizer_options(cfg_, s);
  if (!s.zero) {
    auto opt = std::make_unique<optim::Optimizer>(model_->params(), oo);
    opt->set_tensor_parallel(&model_->parameter_parallel());
    opt_ = std::move(opt);
    return;
  }
  // ZeRO-1 over each group holding parameters identically: the dense ones
  // (tp blocks, and what every tp rank holds whole) over dp, the
  // tp-partial ones over the stage; experts under ep are updated whole.
  const bool replicated_ns = s.muon_distribution == parallel::MuonDistribution::replicated;
  std::vector<optim::SplitOptimizer::Part> parts;
  for (parallel::GradReducer* r : {reducer_.get(), partial_reducer_.get()}) {
    if (!r) continue;
    auto zero = std::make_unique<optim::ZeroOptimizer>(model_->params(), oo, *r, replicated_ns);
    if (r == reducer_.get())
      zero->set_tensor_parallel(&model_->parameter_parallel());  // the partial group spans tp
    zero->set_overlap_param_gather(s.overlap_param_gather);
    zero_parts_.push_back(zero.get());
    parts.push_back({std::move(zero), false});
  }
  model_->before_use = [this](nn::Parameter& p) {
    for (optim::ZeroOptimizer* z : zero_parts_) z->wait_for(p);
  };
  if (s.ep > 1) {
    const auto is_expert = [](const nn::Parameter& p) {
      return p.kind == nn::ParallelKind::expert;
    };
    parts.push_back({std::make_unique<optim::Optimizer>(model_->params(), oo, is_expert), true});
  }
  if (parts.size() == 1) {
    opt_ = std::move(parts.front().opt);
  } else {
    opt_ = std::make_unique<optim::SplitOptimizer>(std::move(parts));
  }
}

void Trainer::load_initial_weights() {
  std::string dir;
  try {
    dir = ckpt::resolve_checkpoint_dir(cfg_.train.init_from);
    ckpt::load_weights(dir, *model_, opt_.get());
  } catch (const Error& e) {
    MOETRON_FAIL("train.init_from = '", cfg_.train.init_from, "': ", e.what());
  }
  if (is_root()) std::cerr << "initial weights from " << dir << "\n";
}

std::string Trainer::pick_checkpoint(const ResumeOptions& ro) {
  std::vector<std::string> warnings, skipped;
  std::optional<std::string> dir = ckpt::latest_checkpoint(run_dir_, &warnings, &skipped);
  // An in-memory snapshot newer than the disk's newest checkpoint wins.
  if (auto snap = newer_snapshot(dir ? ckpt::checkpoint_step(*dir) : -1)) dir = snap;
  if (!dir && skipped.empty()) {
    std::cerr << "starting a new run in '" << run_dir_ << "' (no checkpoint there yet)\n";
    return "";
  }
  if (!dir && !ro.fresh_if_all_corrupt) {
    std::string list;
    for (const auto& w : warnings) list += "\n  " + w;
    MOETRON_FAIL("--resume: every checkpoint in '", run_dir_,
                 "' is damaged (nothing was moved):", list,
                 "\nrepair or remove them, or pass --allow-fresh-start to set them aside ",
                 "and train from step 0");
  }
  if (dir) {
    // The model this run builds must be the checkpoint's (or the change allowed).
    const Config saved = load_config(*dir + "/moetron.toml");
    check_resume_config(saved, cfg_, ro.allow_config_change, *dir);
  }
  for (const auto& w : warnings) std::cerr << "warning: " << w << "\n";
  for (const auto& bad : skipped) {
    std::cerr << "warning: moved the damaged checkpoint to '" << ckpt::quarantine_checkpoint(bad)
              << "'\n";
  }
  if (!dir) {
    std::cerr << "notice: --allow-fresh-start: no usable checkpoint in '" << run_dir_
              << "'; starting from step 0\n";
    return "";
  }
  return *dir;
}

void Trainer::resume_from_latest(const ResumeOptions& ro) {
  // Rank 0 picks (and quarantines) for everyone, so ranks never race on
  // renaming a damaged checkpoint and all resume from the same directory;
  // "!" + its error when it refused (the job's error).
  std::string dir;
  if (is_root()) {
    try {
      dir = pick_checkpoint(ro);
    } catch (const Error& e) {
      dir = std::string("!") + e.what();
    }
  }
  comm::broadcast_string(*world_, dir);
  if (dir.starts_with("!")) {
    MOETRON_CHECK(!is_root(), dir.substr(1));
    MOETRON_FAIL("rank 0 refused to resume from '", run_dir_, "' (see its error)");
  }
  if (dir.empty()) return;
  const auto t0 = std::chrono::steady_clock::now();
  // Residuals come back as saved only into the layout that saved them;
  // after a resize of dp they are folded onto the new ranks.
  const bool same_layout = saved_layout_matches(dir);
  const nlohmann::json st =
      ckpt::load_checkpoint(dir, *model_, opt_.get(), feedback_slices(false, same_layout));
  if (!same_layout) fold_residuals(dir);
  load_modality_allocation();
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  start_step_ = st.at("step").get<int64_t>();
  const bool from_snapshot = snapshots_ && dir.starts_with(snapshots_->root());
  if (monitor_->enabled() && is_root()) {
    const int64_t bytes = directory_bytes(dir);
    monitor_->metrics().record_checkpoint_load(load_s, bytes);
    monitor_->event(start_step_, "resume", "resumed from " + dir,
                    {{"path", dir},
                     {"source", from_snapshot ? "snapshot" : "checkpoint"},
                     {"seconds", load_s},
                     {"bytes", bytes}});
  }
  skipped_ = st.value("skipped_steps", int64_t{0});
  if (balancer_ && st.contains("multitask")) balancer_->from_json(st.at("multitask"));
  restore_compression(st);
  if (st.contains("loss_scale")) {
    scaler_.restore(st.at("loss_scale").get<double>(),
                    st.at("loss_scale_clean_steps").get<int64_t>(),
                    st.at("overflow_steps").get<int64_t>());
  }
  if (is_root()) {
    std::cerr << "resumed from " << (from_snapshot ? "the in-memory snapshot " : "") << dir
              << " at step " << start_step_ << "\n";
  }
}

Trainer::~Trainer() = default;

double Trainer::flops_per_token() const {
  return nn::model_flops_per_token(cfg_.model, cfg_.moe, cfg_.train.seq_len);
}

double Trainer::evaluate() {
  if (batcher_) return evaluate_multimodal();
  const int64_t s = cfg_.train.seq_len, b = cfg_.train.micro_batch;
  const int64_t span = val_tokens_->size() - (s + 1);
  MOETRON_CHECK(span >= 0, "validation split has ", val_tokens_->size(),
                " tokens, fewer than one window of ", s + 1);
  // Batch j is global: rows [j * mb * dp, (j + 1) * mb * dp) of the
  // validation windows, rank r taking mb of them, so every dp (with the
  // global batch fixed) sees the same windows, and every rank runs the same
  // forwards (the expert-parallel exchange is collective).
  Tensor sums = Tensor::zeros({2}, DType::f64, MemTag::comm);
  Tensor inputs = Tensor::empty({b, s}, DType::i32), targets = Tensor::empty({b, s}, DType::i32);
  for (int64_t batch = 0; batch < cfg_.train.eval_batches; ++batch) {
    for (int64_t r = 0; r < b; ++r) {
      const int64_t j = (batch * plan_->dp() + at().dp) * b + r;
      const int64_t start = span > 0 ? (j * (s + 1)) % span : 0;
      const int32_t* w = val_tokens_->data() + start;
      std::copy(w, w + s, inputs.data<int32_t>() + r * s);
      std::copy(w + 1, w + s + 1, targets.data<int32_t>() + r * s);
      keep_only_answers(targets.data<int32_t>() + r * s);
    }
    const nn::LossStats st = pipeline_
                                 ? pipeline_->forward_only(*ctx_, inputs, targets)
                                 : model_->forward_backward(*ctx_, inputs, targets, 0, 0, false);
    // The ranks of a tp group (a 2-D grid's row) computed the same losses
    // (only the last stage any).
    if (!first_of_tp_row()) continue;
    sums.data<double>()[0] += st.ce_sum;
    sums.data<double>()[1] += static_cast<double>(st.tokens);
  }
  world_->allreduce(sums, comm::ReduceOp::sum);
  return sums.data<double>()[0] / std::max(sums.data<double>()[1], 1.0);
}

void Trainer::save_checkpoint(int64_t step) {
  ckpt::SaveRequest req = checkpoint_request(step);
  req.before_write = [rank = world_->rank(), step](const std::string& dir) {
    maybe_fail_write(rank, step, dir, FailurePoint::persist);
    maybe_inject_failure(rank, step, FailurePoint::persist);
  };
  const auto t0 = clock_type::now();
  ckpt::save_checkpoint(req, *model_, *opt_);
  const double seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  if (monitor_->enabled() && is_root()) {
    const std::string dir = ckpt::checkpoint_dir(run_dir_, step);
    const int64_t bytes = directory_bytes(dir);
    monitor_->metrics().record_checkpoint_save(seconds, bytes);
    monitor_->event(step, "checkpoint", "saved " + dir,
                    {{"path", dir}, {"seconds", seconds}, {"bytes", bytes}});
  }
}

std::vector<std::pair<std::string, const comm::Communicator*>> Trainer::named_comms() const {
  std::vector<std::pair<std::string, const comm::Communicator*>> out = {
      {"world", world_.get()},
      {"tp", tp_comm_},
      // A 2-D grid's rows and columns (split from tp inside the model).
      {"tp_row", model_ ? model_->grid_row_comm() : nullptr},
      {"tp_column", model_ ? model_->grid_column_comm() : nullptr},
      {"ep", ep_comm_},
      {"pp", pp_comm_},
      {"stage", stage_comm_},
      {"moe_balance", balance_comm_.get()},
      {"dp", grad_comm_.get()},
      {"dp_partial", partial_grad_comm_.get()},
      {"expert_dp", expert_grad_comm_.get()}};
  std::erase_if(out, [](const auto& e) { return e.second == nullptr; });
  return out;
}

void Trainer::balance_checkpoint_writers() {
  // A sharded optimizer (ZeRO-1) has every rank write its own chunks, and
  // the first rank what is stored once beside them (its duplicates, held
  // by other tp ranks, are never written): nothing to spread.
  if (opt_->sharded()) return;
  // Replicated parameters over the stage's ranks; tp blocks over the dp x cp
  // replicas of the block (each list is the same on every rank it spans).
  std::vector<std::pair<std::string, int64_t>> replicated, blocks;
  for (const auto& p : model_->params().all()) {
    if (ep() > 1 && p->kind == nn::ParallelKind::expert) continue;
    (p->sharded() ? blocks : replicated).emplace_back(p->name, p->value.numel());
  }
  writer_of_ = ckpt::balance_writers(replicated, static_cast<int>(plan_->stage_size()));
  const auto of_blocks =
      ckpt::balance_writers(blocks, static_cast<int>(plan_->dp() * plan_->settings().cp));
  writer_of_.insert(of_blocks.begin(), of_blocks.end());
}

bool Trainer::writes_checkpoint_tensor(const std::string& name) const {
  // Each expert by the first ep group (ranks 0 .. ep-1), the one rank there
  // that holds it; each tp block by one dp (and cp) replica (its primary: a
  // kv head replicated over tp ranks by the first of them); a replicated
  // tensor by one rank of the stage. The replicas share the writing
  // (ckpt/writer_balance.h). Under pp the same per stage. `name` is a
  // parameter's, or a piece of its optimizer state's ("<parameter>.exp_avg").
  const nn::ParameterSet& params = model_->params();
  const nn::Parameter* p = params.find(name);
  if (!p && name.rfind('.') != std::string::npos) p = params.find(name.substr(0, name.rfind('.')));
  if (p && ep() > 1 && p->kind == nn::ParallelKind::expert) return at().stage_rank < ep();
  const auto w = p ? writer_of_.find(p->name) : writer_of_.end();
  const int writer = w == writer_of_.end() ? 0 : w->second;
  if (p && p->sharded())
    return p->shard.primary && at().dp * plan_->settings().cp + at().cp == writer;
  return at().stage_rank == writer;
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

}  // namespace moetron::train
