// Typed training configuration: structs with defaults, read from TOML,
// overridden by `--set key=value`, validated with messages that name the key
// and the rule. Every key is listed once in config.cpp's field table, so an
// unknown key is an error that names the nearest valid one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moetron/nn/model_config.h"
#include "moetron/nn/multimodal_config.h"
#include "moetron/nn/recompute.h"

namespace moetron::train {

using nn::ModelConfig;
using nn::MoeConfig;

struct OptimConfig {
  std::string name = "adamw";  // adamw | muon (Muon for 2-D hidden matrices, AdamW for the rest)
  double lr = 3e-3;
  double min_lr_ratio = 0.1;  // cosine decays to lr * min_lr_ratio
  int64_t warmup_steps = 20;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // global norm; 0 disables
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  int64_t muon_ns_steps = 5;
  // Under parallel.zero: "owner" (FlexMuon: each matrix's momentum and
  // Newton-Schulz on one rank, cost-balanced), "gather" (every rank holding
  // part of a matrix gathers its update and orthogonalises it: Moonlight's
  // distributed Muon) or "replicated" (every rank orthogonalises every
  // matrix); the last two are kept for comparison.
  std::string muon_distribution = "owner";
  // Parameter groups by name, comma-separated globs (e.g. "*.o_proj.weight"):
  std::string adamw_params = "";     // kept on AdamW under optim.name = "muon"
  std::string no_decay_params = "";  // no weight decay (1-D parameters never decay)
  // Storage of AdamW's moments and Muon's momentum: "fp32" or "bf16" (half
  // their bytes; computed in fp32, stored rounded to nearest even).
  std::string moment_dtype = "fp32";
  // AdamW's second moment of each matrix: "full", or "factored" into row and
  // column averages as in Adafactor (rows + cols values; needs
  // moment_dtype = "int8": the smallest optimizer state, 1 byte per value).
  std::string second_moment = "full";
  // Master weights of the bf16 parameters: "fp32" (a separate fp32 copy) or
  // "bf16" (the bf16 working copy is the master, updated in fp32 and stored
  // with stochastic rounding: 4 bytes per parameter less; needs
  // train.precision = "bf16", not parallel.zero).
  std::string master_dtype = "fp32";
};

struct DataConfig {
  std::string path = "data/demo";  // a directory written by `moetron prepare-data`
  double val_fraction = 0.02;
  // Text to prepare `path` from on first use when it does not exist yet
  // (a file or folder, e.g. "/usr/share/games/fortunes"; the vocabulary is
  // model.vocab_size). Empty: `path` must already be prepared.
  std::string source;
  // Packed documents stay apart: positions restart after each end-of-document
  // token and no token attends across one (the corpus manifest's eos_id).
  bool document_mask = false;
  // Only the answer tokens count in the loss (targets elsewhere are ignored):
  // the last `answer_tokens` targets of every example of a task corpus
  // (prepare-data --task retrieval writes the count in its manifest).
  bool loss_on_answers = false;
};

struct TrainingConfig {
  int64_t seq_len = 256;
  // A new run starts from these weights (a checkpoint, or a run directory:
  // its newest checkpoint) instead of random ones, with a fresh optimizer,
  // schedule and data order: fine-tuning, or the next stage of a
  // progressive-length curriculum. A --resume that finds a checkpoint of its
  // own continues from that instead.
  std::string init_from;
  // Chunked sequences (nn/transformer_chunked.cpp): each micro-batch goes
  // through the model seq_chunk positions at a time, bounding activations
  // by the chunk (attention keeps the whole sequence's keys and values).
  // 0 (or >= seq_len): whole sequences.
  int64_t seq_chunk = 0;
  int64_t micro_batch = 8;
  int64_t grad_accum = 1;
  // Rows (sequences) per optimizer step over all data-parallel ranks; 0:
  // micro_batch * grad_accum * dp. When set, grad_accum is derived from it
  // (global_batch / (micro_batch * dp)), so a run keeps its batch on any dp.
  int64_t global_batch = 0;
  int64_t steps = 200;
  uint64_t seed = 1234;
  std::string precision = "auto";  // auto | bf16 | fp16 | fp32
  // Gradients of the hidden matrices (attention, dense and expert FFNs):
  // "fp32", or "bf16" (needs precision = "bf16"; embeddings, head, norms and
  // router keep fp32 gradients).
  std::string grad_dtype = "fp32";
  double loss_scale_init = 65536.0;  // fp16: initial dynamic loss scale (2^16)
  int64_t loss_scale_window = 2000;  // fp16: clean steps before the scale doubles
  int64_t log_every = 10;
  int64_t eval_every = 50;
  int64_t eval_batches = 4;         // global batches of micro_batch * dp windows
  std::string nan_policy = "skip";  // skip | stop
  // A diverged run stops with an error (train/divergence_guard.h): after
  // max_skipped_steps consecutive skipped steps, or when more than
  // max_skipped_fraction of the last 20 steps were skipped (0 disables
  // either); a finite loss above loss_spike_factor x its recent mean is
  // flagged (a warning, counted in metrics.jsonl).
  int64_t max_skipped_steps = 10;
  double max_skipped_fraction = 0.5;
  double loss_spike_factor = 4.0;
  int64_t threads = 0;  // 0: all cores
  // Memory the run may use per rank ("auto": the machine's available memory;
  // else e.g. "24GiB"): the trainer reports the largest micro-batch that fits.
  std::string memory_budget = "auto";
};

// Activation recomputation (nn/recompute.h).
struct RecomputeConfig {
  std::string policy = "none";  // none | selective | full | sqrt | custom
  // custom: the module outputs to drop, a TOML array of strings or a
  // comma-separated string: attn_core, moe_act, norm, moe_dispatch.
  std::string modules = "";
  int64_t segment = 0;  // sqrt: blocks per segment; 0: ceil(sqrt(L))
};

// How the job's ranks split the work: pp stages, each of dp x tp ranks
// (ep groups cut from them); dp = ranks / (pp tp).
struct ParallelConfig {
  // ZeRO-1: optimizer state sharded over the ranks holding each parameter
  // identically (optim/zero_optimizer.h): dense state over dp, the
  // tp-partial router and shared experts over dp x tp; experts under ep whole.
  bool zero = false;
  bool overlap = true;  // start each gradient bucket's reduction during backward
  // ZeRO-1: the updated parameters' all-gather runs into the next forward,
  // each bucket completed just before its first use.
  bool overlap_param_gather = true;
  double bucket_mb = 16.0;  // fp32 gradient megabytes (2^20 B) per bucket
  // Gradient compression with error feedback (parallel/grad_compressor.h):
  std::string compression = "none";  // none | int8 | int4 | sign | topk | sparse_sign
  int64_t compression_block = 256;   // values per scale (int8, int4, sign, sparse_sign)
  double topk_ratio = 0.01;          // share of values kept (topk)
  double compression_keep = 0.75;    // share of blocks sent per step (sparse_sign)
  int64_t compression_warmup = 0;    // first steps reduced uncompressed (at least)
  // "steps": compression starts after compression_warmup steps; "auto": once
  // the gradients' second moment has settled (train/compression_start.h).
  std::string compression_start = "steps";
  double compression_start_tolerance = 0.1;  // "auto": relative change allowed over its window
  // AdamW's second moment frozen when compression starts (1-bit Adam), so
  // the update is linear in the error-fed-back gradients.
  bool freeze_variance = false;
  // "gradient": the error-fed-back gradients are encoded as they are;
  // "preconditioned": divided first by AdamW's denominator (one scale per
  // tensor without a second moment), so the encoding's error is
  // bounded in the update's units (parallel/grad_reducer.h). Needs
  // compression_start = "auto"; with a live v (no freeze_variance) the
  // scales follow v at every step, so not with ZeRO-1 (v sharded).
  std::string compression_space = "gradient";
  // Expert parallelism (nn/moe_dispatch.cpp): the dp ranks are cut into
  // groups of ep consecutive ranks, each group holding every routed expert
  // once; expert gradients are reduced over the dp / ep ranks holding the
  // same experts. 1: every rank holds every expert.
  int64_t ep = 1;
  // Tensor parallelism (nn/tensor_parallel.h): tp consecutive ranks share each
  // micro-batch, attention heads, the dense FFN and the vocabulary split
  // over them; dp = ranks / tp. The MoE layers fold tp into their token
  // shards, so ep divides dp * tp (the number of ranks).
  int64_t tp = 1;
  bool sequence_parallel = false;  // norms and residuals on token slices (needs tp > 1)
  // 2-D tensor parallelism (nn/tensor_parallel_2d.h): "RxC" arranges tp =
  // R x C ranks as a grid whose R rows split each micro-batch's rows and run
  // 1-D tp with sequence parallelism over C ranks, every tp-sharded matrix
  // split again over the R ranks of a column. Setting it sets tp = R x C
  // and sequence_parallel (tp_rows: R). "": 1-D.
  std::string tp_2d;
  int64_t tp_rows = 1;  // resolved from tp_2d when the config is loaded
  // Pipeline parallelism (parallel/pipeline_schedule.h): pp stages balanced by
  // cost (equal layer counts per chunk when interleaved), outermost in the rank order (rank = stage
  // * ranks / pp + position in the stage); each stage's ranks run dp x tp x ep as above. vpp > 1:
  // each rank holds vpp chunks (interleaved 1F1B).
  int64_t pp = 1;
  int64_t vpp = 1;
  std::string schedule = "1f1b";  // 1f1b | gpipe
  // What balances the stages: "flops" (the estimate, the same on every
  // machine) or "measured" (each kind of layer, the embedding and the head
  // timed on this machine before training: train/stage_costs.h).
  std::string stage_balance = "flops";
  // Micro-batches per step per dp rank; 0: derived (train.global_batch /
  // (micro_batch * dp), else train.grad_accum). Set, it must agree with them.
  int64_t microbatches = 0;
  int64_t cp = 1;  // context parallelism: ranks splitting each sequence
  // How cp attention exchanges: "ring" (K/V blocks around the cp ranks) or
  // "all_to_all" (Ulysses: the whole sequence for 1/cp of the heads).
  std::string cp_comm = "ring";
  // The planner chooses tp, pp, vpp, ep, cp, ZeRO-1, train.micro_batch and
  // recompute.policy for the job's world size (train/auto_layout.h),
  // overriding what the config says of them; train.global_batch must be set.
  bool auto_layout = false;  // the key is parallel.auto
  // The hardware profile it plans with: configs/hardware/<name>.toml, or a
  // path to a .toml file.
  std::string auto_device = "this-machine";
};

struct CheckpointConfig {
  int64_t every = 0;  // 0: only at the end
  int64_t keep = 2;   // complete checkpoints kept
  // In-memory snapshots (ckpt/snapshot.h) every N steps, on tmpfs under
  // snapshot_dir: a crashed job resumes from the newest without the disk.
  // -1: every step when a snapshot costs < 3% of a step, else the smallest
  // interval that keeps it under 3% (the median of snapshots 3 to 5, written
  // into dropped steps' files as every later one is); 0: never.
  int64_t snapshot_every = -1;
  std::string snapshot_dir = "/dev/shm/moetron";
  // Where each rank keeps a copy of another rank's part, so losing one
  // machine's memory still leaves every part: "other_host" (the nearest rank
  // in ring order on another machine; none when the job has one machine,
  // where a copy would die with the original), "always" (the next rank,
  // wherever it is), "off".
  std::string snapshot_copy = "other_host";
  // With snapshots: checkpoint.every's saves copy the snapshot to disk in a
  // background thread (the step waits only for the snapshot).
  bool async = true;
};

// Monitoring (monitor/ and train/training_metrics.h): the metrics registry
// behind metrics.jsonl's "series" and events.jsonl, and rank 0's HTTP server
// for Prometheus and the live dashboard.
struct MonitorConfig {
  bool enabled = true;             // the registry and its series in metrics.jsonl
  bool serve = false;              // rank 0 serves /metrics (Prometheus) and the dashboard at /
  std::string host = "127.0.0.1";  // the address the server binds
  int64_t port = 9464;             // 0: any free port (printed and written to RUN_DIR/monitor.url)
  bool required = true;            // false: a server that cannot start is a warning, not an error
  // Per-layer gradient, parameter and update norms and activation RMS every
  // N steps (0: never): a world all-reduce and a pass over the parameters.
  int64_t layer_stats_every = 10;
  // Update norms need the parameters before the update: a copy of this
  // rank's parameters on the statistics steps (off by default: it costs memory).
  bool update_stats = false;
  // Rank 0 reads its machine's energy counters (RAPL, NVML) each step:
  // moetron_energy_joules_total, moetron_power_watts, energy per token.
  bool energy = true;
  double straggler_margin = 0.15;   // a rank this much slower than the median (busy time)...
  int64_t straggler_intervals = 3;  // ...for this many steps in a row is named a straggler
};

// Multimodal training (issue 21): [multimodal] with the encoders' shapes in
// [vision] and [audio] (nn/multimodal_config.h); the batches are
// train/multimodal_batches.h's.
struct MultimodalConfig {
  nn::MultimodalModelConfig model;       // multimodal.enabled, multimodal.fusion, [vision], [audio]
  std::string data = "data/multimodal";  // `moetron prepare-data --multimodal --out DIR`
  // Tasks and their shares of the samples: "task:share,..." over text,
  // caption, ocr, asr.
  std::string mix = "text:1,caption:1,ocr:1,asr:1";
  int64_t audio_frames = 200;  // clips cut or padded to this many log-mel frames (10 ms each)
};

// Multi-task loss balancing (train/multitask_balance.h) over multimodal.mix's tasks.
struct MultitaskConfig {
  std::string balance = "fixed";  // fixed | uncertainty | gradnorm | dwa
  // Fixed weights (gradnorm's start), "task:weight,..."; tasks not named weigh 1.
  std::string weights = "";
  double gradnorm_alpha = 1.5;
  double gradnorm_lr = 0.025;
  double dwa_temperature = 2.0;
  double uncertainty_lr = 0.01;
};

struct Config {
  ModelConfig model;
  MoeConfig moe;
  OptimConfig optim;
  DataConfig data;
  TrainingConfig train;
  RecomputeConfig recompute;
  CheckpointConfig checkpoint;
  ParallelConfig parallel;
  MonitorConfig monitor;
  MultimodalConfig multimodal;
  MultitaskConfig multitask;
};

// Micro-batches per step on each of `dp` ranks; throws naming train.global_batch
// when it does not split evenly.
int64_t accumulation_steps(const Config& cfg, int64_t dp);

// Parses a TOML file, applies `overrides` ("key=value", e.g. "model.d_model=256"),
// validates. Errors name the file, the key and the rule.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same from TOML text (`origin` names it in errors).
Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides = {});
void apply_override(Config& cfg, const std::string& assignment);
// parallel.tp_2d = "RxC" -> parallel.tp = R x C, tp_rows = R and sequence
// parallelism on (load_config and parse_config call it before validate).
// Throws naming the key when the grid is malformed, smaller than 2 x 2, or
// disagrees with a parallel.tp other than 1.
void resolve_tp_grid(Config& cfg);
// Throws moetron::Error naming the first key that breaks a rule.
void validate(const Config& cfg);
// The full configuration as TOML (every key, defaults included): saved into
// checkpoints so a run can be reproduced.
std::string to_toml(const Config& cfg);
// "a, b,c" -> {"a", "b", "c"} (empty entries dropped): the list-valued string keys.
std::vector<std::string> split_list(const std::string& list);
// The recompute policy the config asks for (validated).
nn::RecomputePolicy recompute_policy(const Config& cfg);
// All valid keys, "section.name".
std::vector<std::string> config_keys();
// One key's value as TOML writes it (e.g. "4", "\"softmax\"", "0.01");
// throws naming the key when there is no such key (with the nearest one;
// `origin` says where the key came from).
std::string config_value(const Config& cfg, const std::string& key,
                         const std::string& origin = "config");

}  // namespace moetron::train
