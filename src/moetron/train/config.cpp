#include "moetron/train/config.h"

#include "moetron/optim/optimizer.h"

#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <sstream>
#include <variant>

#include "moetron/core/error.h"
#include "moetron/nn/recompute.h"
#include "moetron/parallel/training_plan.h"
#include "moetron/planner/memory_model.h"
#include "moetron/train/config_fields.h"

namespace moetron::train {

namespace {

// The model's keys: [model], [attention], [moe], [optim], [data].
std::vector<Field> model_fields() {
  return {
      field("model.vocab_size", &Config::model, &ModelConfig::vocab_size),
      field("model.d_model", &Config::model, &ModelConfig::d_model),
      field("model.n_layers", &Config::model, &ModelConfig::n_layers),
      field("model.n_heads", &Config::model, &ModelConfig::n_heads),
      field("model.n_kv_heads", &Config::model, &ModelConfig::n_kv_heads),
      field("model.head_dim", &Config::model, &ModelConfig::head_dim),
      field("model.ffn_hidden", &Config::model, &ModelConfig::ffn_hidden),
      field("model.max_seq_len", &Config::model, &ModelConfig::max_seq_len),
      field("model.norm_eps", &Config::model, &ModelConfig::norm_eps),
      field("model.rope_theta", &Config::model, &ModelConfig::rope_theta),
      field("model.tie_embeddings", &Config::model, &ModelConfig::tie_embeddings),
      field("model.init_std", &Config::model, &ModelConfig::init_std),
      field("attention.window", &Config::model, &ModelConfig::attention_window),
      field("attention.global_tokens", &Config::model, &ModelConfig::attention_global_tokens),
      field("attention.layer_pattern", &Config::model, &ModelConfig::attention_layer_pattern),
      field("moe.num_experts", &Config::moe, &MoeConfig::num_experts),
      field("moe.top_k", &Config::moe, &MoeConfig::top_k),
      field("moe.expert_hidden", &Config::moe, &MoeConfig::expert_hidden),
      field("moe.every", &Config::moe, &MoeConfig::every),
      field("moe.first_dense_layers", &Config::moe, &MoeConfig::first_dense_layers),
      field("moe.shared_experts", &Config::moe, &MoeConfig::shared_experts),
      field("moe.shared_expert_hidden", &Config::moe, &MoeConfig::shared_expert_hidden),
      field("moe.router_score", &Config::moe, &MoeConfig::router_score),
      field("moe.renormalize", &Config::moe, &MoeConfig::renormalize),
      field("moe.aux_loss_coef", &Config::moe, &MoeConfig::aux_loss_coef),
      field("moe.z_loss_coef", &Config::moe, &MoeConfig::z_loss_coef),
      field("moe.bias_update_rate", &Config::moe, &MoeConfig::bias_update_rate),
      field("moe.capacity_factor", &Config::moe, &MoeConfig::capacity_factor),
      field("optim.name", &Config::optim, &OptimConfig::name),
      field("optim.lr", &Config::optim, &OptimConfig::lr),
      field("optim.min_lr_ratio", &Config::optim, &OptimConfig::min_lr_ratio),
      field("optim.warmup_steps", &Config::optim, &OptimConfig::warmup_steps),
      field("optim.weight_decay", &Config::optim, &OptimConfig::weight_decay),
      field("optim.beta1", &Config::optim, &OptimConfig::beta1),
      field("optim.beta2", &Config::optim, &OptimConfig::beta2),
      field("optim.eps", &Config::optim, &OptimConfig::eps),
      field("optim.grad_clip", &Config::optim, &OptimConfig::grad_clip),
      field("optim.muon_momentum", &Config::optim, &OptimConfig::muon_momentum),
      field("optim.muon_nesterov", &Config::optim, &OptimConfig::muon_nesterov),
      field("optim.muon_ns_steps", &Config::optim, &OptimConfig::muon_ns_steps),
      field("optim.muon_distribution", &Config::optim, &OptimConfig::muon_distribution),
      field("optim.adamw_params", &Config::optim, &OptimConfig::adamw_params),
      field("optim.no_decay_params", &Config::optim, &OptimConfig::no_decay_params),
      field("optim.moment_dtype", &Config::optim, &OptimConfig::moment_dtype),
      field("optim.master_dtype", &Config::optim, &OptimConfig::master_dtype),
      field("optim.second_moment", &Config::optim, &OptimConfig::second_moment),
      field("data.path", &Config::data, &DataConfig::path),
      field("data.val_fraction", &Config::data, &DataConfig::val_fraction),
      field("data.source", &Config::data, &DataConfig::source),
      field("data.document_mask", &Config::data, &DataConfig::document_mask),
      field("data.loss_on_answers", &Config::data, &DataConfig::loss_on_answers),
  };
}

// The run's keys: [train], [recompute], [checkpoint], [parallel], [monitor].
std::vector<Field> run_fields() {
  return {
      field("train.seq_len", &Config::train, &TrainingConfig::seq_len),
      field("train.micro_batch", &Config::train, &TrainingConfig::micro_batch),
      field("train.seq_chunk", &Config::train, &TrainingConfig::seq_chunk),
      field("train.grad_accum", &Config::train, &TrainingConfig::grad_accum),
      field("train.global_batch", &Config::train, &TrainingConfig::global_batch),
      field("train.steps", &Config::train, &TrainingConfig::steps),
      field("train.seed", &Config::train, &TrainingConfig::seed),
      field("train.init_from", &Config::train, &TrainingConfig::init_from),
      field("train.precision", &Config::train, &TrainingConfig::precision),
      field("train.grad_dtype", &Config::train, &TrainingConfig::grad_dtype),
      field("train.loss_scale_init", &Config::train, &TrainingConfig::loss_scale_init),
      field("train.loss_scale_window", &Config::train, &TrainingConfig::loss_scale_window),
      field("train.log_every", &Config::train, &TrainingConfig::log_every),
      field("train.eval_every", &Config::train, &TrainingConfig::eval_every),
      field("train.eval_batches", &Config::train, &TrainingConfig::eval_batches),
      field("train.nan_policy", &Config::train, &TrainingConfig::nan_policy),
      field("train.max_skipped_steps", &Config::train, &TrainingConfig::max_skipped_steps),
      field("train.max_skipped_fraction", &Config::train, &TrainingConfig::max_skipped_fraction),
      field("train.loss_spike_factor", &Config::train, &TrainingConfig::loss_spike_factor),
      field("train.threads", &Config::train, &TrainingConfig::threads),
      field("train.memory_budget", &Config::train, &TrainingConfig::memory_budget),
      field("recompute.policy", &Config::recompute, &RecomputeConfig::policy),
      field("recompute.modules", &Config::recompute, &RecomputeConfig::modules),
      field("recompute.segment", &Config::recompute, &RecomputeConfig::segment),
      field("checkpoint.every", &Config::checkpoint, &CheckpointConfig::every),
      field("checkpoint.keep", &Config::checkpoint, &CheckpointConfig::keep),
      field("checkpoint.snapshot_every", &Config::checkpoint, &CheckpointConfig::snapshot_every),
      field("checkpoint.snapshot_dir", &Config::checkpoint, &CheckpointConfig::snapshot_dir),
      field("checkpoint.snapshot_copy", &Config::checkpoint, &CheckpointConfig::snapshot_copy),
      field("checkpoint.async", &Config::checkpoint, &CheckpointConfig::async),
      field("parallel.zero", &Config::parallel, &ParallelConfig::zero),
      field("parallel.overlap", &Config::parallel, &ParallelConfig::overlap),
      field("parallel.overlap_param_gather", &Config::parallel,
            &ParallelConfig::overlap_param_gather),
      field("parallel.bucket_mb", &Config::parallel, &ParallelConfig::bucket_mb),
      field("parallel.compression", &Config::parallel, &ParallelConfig::compression),
      field("parallel.compression_block", &Config::parallel, &ParallelConfig::compression_block),
      field("parallel.topk_ratio", &Config::parallel, &ParallelConfig::topk_ratio),
      field("parallel.compression_warmup", &Config::parallel, &ParallelConfig::compression_warmup),
      field("parallel.compression_keep", &Config::parallel, &ParallelConfig::compression_keep),
      field("parallel.compression_start", &Config::parallel, &ParallelConfig::compression_start),
      field("parallel.compression_start_tolerance", &Config::parallel,
            &ParallelConfig::compression_start_tolerance),
      field("parallel.freeze_variance", &Config::parallel, &ParallelConfig::freeze_variance),
      field("parallel.compression_space", &Config::parallel, &ParallelConfig::compression_space),
      field("parallel.ep", &Config::parallel, &ParallelConfig::ep),
      field("parallel.tp", &Config::parallel, &ParallelConfig::tp),
      field("parallel.sequence_parallel", &Config::parallel, &ParallelConfig::sequence_parallel),
      field("parallel.tp_2d", &Config::parallel, &ParallelConfig::tp_2d),
      field("parallel.pp", &Config::parallel, &ParallelConfig::pp),
      field("parallel.vpp", &Config::parallel, &ParallelConfig::vpp),
      field("parallel.schedule", &Config::parallel, &ParallelConfig::schedule),
      field("parallel.stage_balance", &Config::parallel, &ParallelConfig::stage_balance),
      field("parallel.microbatches", &Config::parallel, &ParallelConfig::microbatches),
      field("parallel.cp", &Config::parallel, &ParallelConfig::cp),
      field("parallel.cp_comm", &Config::parallel, &ParallelConfig::cp_comm),
      field("parallel.auto", &Config::parallel, &ParallelConfig::auto_layout),
      field("parallel.auto_device", &Config::parallel, &ParallelConfig::auto_device),
      field("monitor.enabled", &Config::monitor, &MonitorConfig::enabled),
      field("monitor.serve", &Config::monitor, &MonitorConfig::serve),
      field("monitor.host", &Config::monitor, &MonitorConfig::host),
      field("monitor.port", &Config::monitor, &MonitorConfig::port),
      field("monitor.required", &Config::monitor, &MonitorConfig::required),
      field("monitor.layer_stats_every", &Config::monitor, &MonitorConfig::layer_stats_every),
      field("monitor.update_stats", &Config::monitor, &MonitorConfig::update_stats),
      field("monitor.energy", &Config::monitor, &MonitorConfig::energy),
      field("monitor.straggler_margin", &Config::monitor, &MonitorConfig::straggler_margin),
      field("monitor.straggler_intervals", &Config::monitor, &MonitorConfig::straggler_intervals),
  };
}

const std::vector<Field>& fields() {
  static const std::vector<Field> table = [] {
    std::vector<Field> all = model_fields();
    for (Field& f : run_fields()) all.push_back(std::move(f));
    for (Field& f : multimodal_fields()) all.push_back(std::move(f));
    return all;
  }();
  return table;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] =
          std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1] ? 1 : 0)});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string section_of(const std::string& key) {
  const size_t dot = key.find('.');
  return dot == std::string::npos ? "" : key.substr(0, dot);
}

std::string nearest_key(const std::string& key) {
  // A key in a known section ("model.foo") gets a key of that section.
  const std::string section = section_of(key);
  const bool known_section = std::any_of(fields().begin(), fields().end(), [&](const Field& f) {
    return !section.empty() && section_of(f.key) == section;
  });
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& f : fields()) {
    if (known_section && section_of(f.key) != section) continue;
    // Compare against the full key and against the leaf name, so "d_modle"
    // and "model.d_modle" both find "model.d_model".
    const std::string full = f.key;
    const std::string leaf = full.substr(full.find('.') + 1);
    const size_t d = std::min(edit_distance(key, full), edit_distance(key, leaf));
    if (d < best_d) {
      best_d = d;
      best = full;
    }
  }
  return best;
}

const Field& find_field(const std::string& key, const std::string& origin) {
  for (const auto& f : fields()) {
    if (key == f.key) return f;
  }
  MOETRON_FAIL(origin, ": unknown config key '", key, "' (did you mean '", nearest_key(key), "'?)");
}

// String keys that hold a comma-separated list also accept a TOML array of strings.
bool is_list_key(const std::string& key) {
  return key == "recompute.modules" || key == "optim.adamw_params" ||
         key == "optim.no_decay_params";
}

std::string join_string_array(const toml::array& a, const std::string& key,
                              const std::string& origin) {
  std::string out;
  for (const auto& item : a) {
    if (!item.is_string())
      MOETRON_FAIL(origin, ": config key '", key, "' needs an array of strings");
    out += (out.empty() ? "" : ",") + item.as_string()->get();
  }
  return out;
}

void set_from_node(Value v, const toml::node& node, const std::string& key,
                   const std::string& origin) {
  const auto type_error = [&](const char* want) {
    MOETRON_FAIL(origin, ": config key '", key, "' needs ", want);
  };
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) {
          if (!node.is_boolean()) type_error("true or false");
          *p = node.as_boolean()->get();
        } else if constexpr (std::is_same_v<T, std::string>) {
          if (node.is_array() && is_list_key(key)) {
            *p = join_string_array(*node.as_array(), key, origin);
            return;
          }
          if (!node.is_string())
            type_error(is_list_key(key) ? "a string or an array of strings" : "a string");
          *p = node.as_string()->get();
        } else if constexpr (std::is_same_v<T, double>) {
          if (node.is_integer()) {
            *p = static_cast<double>(node.as_integer()->get());
          } else if (node.is_floating_point()) {
            *p = node.as_floating_point()->get();
          } else {
            type_error("a number");
          }
        } else {
          if (!node.is_integer()) type_error("an integer");
          const int64_t x = node.as_integer()->get();
          if constexpr (std::is_same_v<T, uint64_t>) {
            if (x < 0) type_error("a non-negative integer");
            *p = static_cast<uint64_t>(x);
          } else {
            *p = x;
          }
        }
      },
      v);
}

void apply_table(Config& cfg, const toml::table& table, const std::string& prefix,
                 const std::string& origin) {
  for (const auto& [k, node] : table) {
    const std::string key =
        prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const auto* sub = node.as_table()) {
      apply_table(cfg, *sub, key, origin);
      continue;
    }
    set_from_node(find_field(key, origin).bind(cfg), node, key, origin);
  }
}

void check_rule(bool ok, const char* key, const std::string& rule) {
  if (!ok) MOETRON_FAIL("invalid config: '", key, "': ", rule);
}

}  // namespace

void resolve_tp_grid(Config& cfg) {
  ParallelConfig& p = cfg.parallel;
  if (p.tp_2d.empty()) {
    p.tp_rows = 1;
    return;
  }
  int64_t rows = 0, cols = 0;
  char sep = 0;
  std::istringstream in(p.tp_2d);
  in >> rows >> sep >> cols;
  check_rule(in && (sep == 'x' || sep == 'X') && in.peek() == EOF, "parallel.tp_2d",
             str_cat("must be \"RxC\" (grid rows x columns, e.g. \"2x2\"), got \"", p.tp_2d, "\""));
  check_rule(rows >= 2 && cols >= 2, "parallel.tp_2d",
             str_cat("a 2-D grid needs at least 2 rows and 2 columns, got \"", p.tp_2d,
                     "\" (use parallel.tp for 1-D tensor parallelism)"));
  check_rule(p.tp == 1 || p.tp == rows * cols, "parallel.tp",
             str_cat("= ", p.tp, " disagrees with parallel.tp_2d = \"", p.tp_2d, "\" (",
                     rows * cols, " ranks): leave parallel.tp out"));
  p.tp = rows * cols;
  p.tp_rows = rows;
  p.sequence_parallel = true;  // the grid's rows run sequence-parallel tp
}

std::vector<std::string> split_list(const std::string& list) {
  return optim::split_patterns(list);
}

nn::RecomputePolicy recompute_policy(const Config& cfg) {
  return nn::make_recompute_policy(cfg.recompute.policy, split_list(cfg.recompute.modules),
                                   cfg.model.n_layers, cfg.recompute.segment);
}

std::vector<std::string> config_keys() {
  std::vector<std::string> keys;
  for (const auto& f : fields()) keys.emplace_back(f.key);
  return keys;
}

void apply_override(Config& cfg, const std::string& assignment) {
  const auto eq = assignment.find('=');
  MOETRON_CHECK(eq != std::string::npos && eq > 0, "--set '", assignment,
                "' must have the form key=value");
  const std::string key = assignment.substr(0, eq);
  std::string value = assignment.substr(eq + 1);
  const Field& f = find_field(key, "--set");
  Value v = f.bind(cfg);
  // Strings may be given bare (--set train.precision=bf16): quote them for TOML.
  if (std::holds_alternative<std::string*>(v) && (value.empty() || value.front() != '"')) {
    std::string quoted = "\"";
    for (char c : value) {
      if (c == '"' || c == '\\') quoted += '\\';
      quoted += c;
    }
    value = quoted + "\"";
  }
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + value);
  } catch (const toml::parse_error& e) {
    MOETRON_FAIL("--set ", key, ": cannot parse value '", value, "': ", e.description());
  }
  set_from_node(v, *parsed.get("v"), key, "--set");
}

Config parse_config(const std::string& toml_text, const std::string& origin,
                    const std::vector<std::string>& overrides) {
  Config cfg;
  toml::table table;
  try {
    table = toml::parse(toml_text, origin);
  } catch (const toml::parse_error& e) {
    MOETRON_FAIL(origin, ":", e.source().begin.line, ": TOML syntax error: ", e.description());
  }
  apply_table(cfg, table, "", origin);
  for (const auto& o : overrides) apply_override(cfg, o);
  resolve_tp_grid(cfg);
  validate(cfg);
  return cfg;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  MOETRON_CHECK(!std::filesystem::is_directory(path), "config '", path,
                "' is a directory; give a TOML file, e.g. configs/demo.toml");
  MOETRON_CHECK(std::filesystem::exists(path), "config file '", path, "' does not exist");
  toml::table table;
  try {
    table = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    if (src.begin.line == 0)
      MOETRON_FAIL("cannot read config file '", path, "': ", e.description());
    MOETRON_FAIL(path, ":", src.begin.line, ": TOML syntax error: ", e.description());
  }
  // An empty file would train the built-in defaults: almost surely not what was meant.
  MOETRON_CHECK(!table.empty(), "config file '", path,
                "' is empty (no settings); give a TOML file such as configs/demo.toml");
  Config cfg;
  apply_table(cfg, table, "", path);
  for (const auto& o : overrides) apply_override(cfg, o);
  resolve_tp_grid(cfg);
  validate(cfg);
  return cfg;
}

namespace {

void validate_attention_pattern(const ModelConfig& m) {
  check_rule(m.attention_window >= 0, "attention.window",
             "must be >= 0 (0: full causal attention in every layer)");
  check_rule(m.attention_global_tokens >= 0, "attention.global_tokens", "must be >= 0");
  const std::string& p = m.attention_layer_pattern;
  check_rule(p.find_first_not_of("LG") == std::string::npos, "attention.layer_pattern",
             str_cat("must be letters L (local) and G (global), got '", p, "'"));
  if (m.attention_window == 0) {
    check_rule(m.attention_global_tokens == 0, "attention.global_tokens",
               "needs attention.window > 0 (without a window every token is seen already)");
    check_rule(p.empty(), "attention.layer_pattern",
               "needs attention.window > 0 (it says which layers use the window)");
    return;
  }
  check_rule(p.find('L') != std::string::npos || p.empty(), "attention.layer_pattern",
             str_cat("has no local layer (L), so attention.window = ", m.attention_window,
                     " would be unused; set attention.window = 0 for full attention"));
  check_rule(m.attention_global_tokens < m.max_seq_len, "attention.global_tokens",
             str_cat("must be below model.max_seq_len = ", m.max_seq_len));
}

void validate_model(const Config& c) {
  const auto& m = c.model;
  check_rule(m.vocab_size > 0, "model.vocab_size", "must be positive");
  check_rule(m.d_model > 0, "model.d_model", "must be positive");
  check_rule(m.n_layers > 0, "model.n_layers", "must be positive");
  check_rule(m.n_heads > 0, "model.n_heads", "must be positive");
  check_rule(m.head_dim > 0 || m.d_model % m.n_heads == 0, "model.n_heads",
             str_cat("must divide model.d_model (", m.d_model, " % ", m.n_heads,
                     " != 0) unless model.head_dim is set"));
  check_rule(m.head_dim >= 0, "model.head_dim", "must be >= 0 (0 means d_model / n_heads)");
  check_rule(m.resolved_head_dim() % 2 == 0, "model.head_dim", "must be even (RoPE rotates pairs)");
  check_rule(m.n_kv_heads > 0 && m.n_heads % m.n_kv_heads == 0, "model.n_kv_heads",
             str_cat("must divide model.n_heads (", m.n_heads, " % ", m.n_kv_heads, " != 0)"));
  check_rule(m.ffn_hidden > 0, "model.ffn_hidden", "must be positive");
  check_rule(m.max_seq_len > 0, "model.max_seq_len", "must be positive");
  check_rule(m.norm_eps > 0, "model.norm_eps", "must be positive");
  check_rule(m.rope_theta > 0, "model.rope_theta", "must be positive");
  check_rule(m.init_std > 0, "model.init_std", "must be positive");
  validate_attention_pattern(m);
  const auto& e = c.moe;
  check_rule(e.num_experts >= 0, "moe.num_experts", "must be >= 0 (0: dense model)");
  if (e.num_experts > 0) {
    check_rule(e.top_k >= 1 && e.top_k <= e.num_experts, "moe.top_k",
               str_cat("must be in [1, moe.num_experts = ", e.num_experts, "], got ", e.top_k));
    check_rule(e.expert_hidden > 0, "moe.expert_hidden", "must be positive");
    check_rule(e.every >= 1, "moe.every", "must be >= 1");
  }
  check_rule(e.first_dense_layers >= 0 && e.first_dense_layers <= m.n_layers,
             "moe.first_dense_layers", "must be in [0, model.n_layers]");
  check_rule(e.shared_experts >= 0, "moe.shared_experts", "must be >= 0");
  check_rule(e.shared_expert_hidden >= 0, "moe.shared_expert_hidden", "must be >= 0");
  check_rule(e.router_score == "softmax" || e.router_score == "sigmoid", "moe.router_score",
             str_cat("must be \"softmax\" or \"sigmoid\", got \"", e.router_score, "\""));
  check_rule(e.aux_loss_coef >= 0, "moe.aux_loss_coef", "must be >= 0");
  check_rule(e.z_loss_coef >= 0, "moe.z_loss_coef", "must be >= 0");
  check_rule(e.bias_update_rate >= 0, "moe.bias_update_rate", "must be >= 0");
  check_rule(e.capacity_factor == 0 ||
                 e.capacity_factor >= 1.0 / static_cast<double>(std::max<int64_t>(e.top_k, 1)),
             "moe.capacity_factor", "must be 0 (dropless) or a positive factor, typically 1.25");
  check_rule(e.capacity_factor >= 0, "moe.capacity_factor", "must be >= 0");
}

void validate_optim(const Config& c) {
  const auto& o = c.optim;
  (void)parallel::parse_optimizer(o.name);
  check_rule(o.lr > 0, "optim.lr", "must be positive");
  check_rule(o.min_lr_ratio >= 0 && o.min_lr_ratio <= 1, "optim.min_lr_ratio", "must be in [0, 1]");
  check_rule(o.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0");
  check_rule(o.weight_decay >= 0, "optim.weight_decay", "must be >= 0");
  check_rule(o.beta1 >= 0 && o.beta1 < 1, "optim.beta1", "must be in [0, 1)");
  check_rule(o.beta2 >= 0 && o.beta2 < 1, "optim.beta2", "must be in [0, 1)");
  check_rule(o.eps > 0, "optim.eps", "must be positive");
  check_rule(o.grad_clip >= 0, "optim.grad_clip", "must be >= 0 (0 disables clipping)");
  check_rule(o.muon_momentum >= 0 && o.muon_momentum < 1, "optim.muon_momentum",
             "must be in [0, 1)");
  check_rule(o.muon_ns_steps >= 1, "optim.muon_ns_steps", "must be >= 1");
  (void)parallel::parse_muon_distribution(o.muon_distribution);
  check_rule(o.second_moment == "full" || o.second_moment == "factored", "optim.second_moment",
             str_cat("must be \"full\" or \"factored\", got \"", o.second_moment, "\""));
  check_rule(o.second_moment == "full" || o.moment_dtype == "int8", "optim.second_moment",
             "= factored is built for optim.moment_dtype = \"int8\"");
  if (parallel::parse_moment_dtype(o.moment_dtype, "optim.moment_dtype") == DType::u8) {
    const char* why = "= int8 keeps one scale per 256 values of this rank's whole tensors";
    check_rule(!c.parallel.zero, "optim.moment_dtype",
               str_cat(why, ": not with parallel.zero = true"));
    check_rule(c.parallel.tp == 1, "optim.moment_dtype",
               str_cat(why, ": not with parallel.tp > 1"));
    check_rule(c.parallel.compression_space != "preconditioned", "optim.moment_dtype",
               "= int8: parallel.compression_space = \"preconditioned\" reads AdamW's fp32/bf16 "
               "second moment");
  }
  if (parallel::parse_storage_dtype(o.master_dtype, "optim.master_dtype") == DType::bf16) {
    check_rule(c.train.precision == "bf16", "optim.master_dtype",
               str_cat("= bf16 needs train.precision = bf16, got \"", c.train.precision,
                       "\" (\"auto\" may resolve to fp32: set bf16 explicitly)"));
    check_rule(!c.parallel.zero, "optim.master_dtype",
               "= bf16 is not built for parallel.zero = true (ZeRO-1 keeps fp32 master chunks; "
               "it already divides them over dp)");
  }
  check_rule(c.data.val_fraction > 0 && c.data.val_fraction < 1, "data.val_fraction",
             "must be in (0, 1)");
}

// train.seq_chunk: one pipeline stage, and under tp every chunk's tokens
// split over the tp ranks like a micro-batch's.
void validate_seq_chunk(const Config& c) {
  const auto& t = c.train;
  check_rule(t.seq_chunk >= 0, "train.seq_chunk", "must be >= 0 (0: whole sequences)");
  if (t.seq_chunk == 0 || t.seq_chunk >= t.seq_len) return;
  check_rule(c.parallel.pp == 1, "train.seq_chunk",
             "needs parallel.pp = 1 (the chunks of a sequence run forward, then backward in "
             "reverse, through the whole model)");
  const int64_t last = t.seq_len - (t.seq_len - 1) / t.seq_chunk * t.seq_chunk;
  const int64_t tp = c.parallel.tp;
  check_rule(tp <= 1 || (t.micro_batch * t.seq_chunk % tp == 0 && t.micro_batch * last % tp == 0),
             "train.seq_chunk",
             str_cat("= ", t.seq_chunk, ": train.micro_batch times each chunk's positions (",
                     t.seq_chunk, ", the last ", last, ") must divide over parallel.tp = ", tp));
}

void validate_train(const Config& c) {
  const auto& m = c.model;
  const auto& t = c.train;
  check_rule(t.seq_len > 0 && t.seq_len <= m.max_seq_len, "train.seq_len",
             str_cat("must be in [1, model.max_seq_len = ", m.max_seq_len, "]"));
  check_rule(t.micro_batch > 0, "train.micro_batch", "must be positive");
  check_rule(t.grad_accum > 0, "train.grad_accum", "must be positive");
  check_rule(t.global_batch >= 0, "train.global_batch",
             "must be >= 0 (0: micro_batch * grad_accum * dp)");
  check_rule(t.global_batch == 0 || t.grad_accum == 1, "train.grad_accum",
             "must stay 1 when train.global_batch is set (the accumulation is derived from it)");
  check_rule(t.steps > 0, "train.steps", "must be positive");
  check_rule(t.precision == "auto" || t.precision == "bf16" || t.precision == "fp16" ||
                 t.precision == "fp32",
             "train.precision",
             str_cat("must be auto, bf16, fp16 or fp32, got \"", t.precision, "\""));
  const DType grad_dtype = parallel::parse_storage_dtype(t.grad_dtype, "train.grad_dtype");
  check_rule(grad_dtype == DType::f32 || t.precision == "bf16", "train.grad_dtype",
             str_cat("= bf16 needs train.precision = bf16, got \"", t.precision,
                     "\" (\"auto\" may resolve to fp32: set bf16 explicitly)"));
  check_rule(t.loss_scale_init > 0, "train.loss_scale_init", "must be positive");
  check_rule(t.loss_scale_window >= 1, "train.loss_scale_window", "must be >= 1");
  check_rule(t.log_every > 0, "train.log_every", "must be positive");
  check_rule(t.eval_every >= 0, "train.eval_every", "must be >= 0 (0: only at the end)");
  check_rule(t.eval_batches > 0, "train.eval_batches", "must be positive");
  check_rule(t.nan_policy == "skip" || t.nan_policy == "stop", "train.nan_policy",
             str_cat("must be \"skip\" or \"stop\", got \"", t.nan_policy, "\""));
  check_rule(t.max_skipped_steps >= 0, "train.max_skipped_steps", "must be >= 0 (0: no limit)");
  check_rule(t.max_skipped_fraction >= 0 && t.max_skipped_fraction <= 1,
             "train.max_skipped_fraction", "must be in [0, 1] (0: no limit)");
  check_rule(t.loss_spike_factor == 0 || t.loss_spike_factor > 1, "train.loss_spike_factor",
             "must be 0 (off) or > 1");
  check_rule(t.threads >= 0, "train.threads", "must be >= 0 (0: all cores)");
  if (t.memory_budget != "auto")
    planner::parse_bytes(t.memory_budget, "invalid config: 'train.memory_budget'");
  // Names the recompute key that breaks a rule.
  nn::make_recompute_policy(c.recompute.policy, split_list(c.recompute.modules), m.n_layers,
                            c.recompute.segment);
  check_rule(c.checkpoint.every >= 0, "checkpoint.every", "must be >= 0");
  check_rule(c.checkpoint.keep >= 1, "checkpoint.keep", "must be >= 1");
  check_rule(c.checkpoint.snapshot_every >= -1, "checkpoint.snapshot_every",
             "must be >= -1 (-1: automatic, 0: never)");
  check_rule(c.checkpoint.snapshot_every == 0 || !c.checkpoint.snapshot_dir.empty(),
             "checkpoint.snapshot_dir", "must not be empty while snapshots are on");
  const std::string& copy = c.checkpoint.snapshot_copy;
  check_rule(copy == "other_host" || copy == "always" || copy == "off", "checkpoint.snapshot_copy",
             str_cat("must be other_host, always or off, got \"", copy, "\""));
  const MonitorConfig& mon = c.monitor;
  check_rule(mon.port >= 0 && mon.port <= 65535, "monitor.port",
             "must be a TCP port in 0..65535 (0: any free port)");
  check_rule(!mon.host.empty(), "monitor.host", "must not be empty");
  check_rule(!mon.serve || mon.enabled, "monitor.serve", "needs monitor.enabled = true");
  check_rule(mon.layer_stats_every >= 0, "monitor.layer_stats_every", "must be >= 0 (0: never)");
  check_rule(mon.straggler_margin > 0, "monitor.straggler_margin", "must be positive");
  check_rule(mon.straggler_intervals >= 1, "monitor.straggler_intervals", "must be >= 1");
}

// Gradient compression's settings (parallel/grad_compressor.h,
// train/compression_start.h, parallel/grad_reducer.h).
void validate_compression(const ParallelConfig& p) {
  const auto& pc = p.compression;
  check_rule(pc == "none" || pc == "int8" || pc == "int4" || pc == "sign" || pc == "topk" ||
                 pc == "sparse_sign",
             "parallel.compression",
             str_cat("must be none, int8, int4, sign, topk or sparse_sign, got \"", pc, "\""));
  check_rule(p.compression_block > 0, "parallel.compression_block", "must be positive");
  check_rule(p.topk_ratio > 0 && p.topk_ratio <= 1, "parallel.topk_ratio", "must be in (0, 1]");
  check_rule(p.compression_warmup >= 0, "parallel.compression_warmup", "must be >= 0");
  check_rule(p.compression_keep > 0 && p.compression_keep <= 1, "parallel.compression_keep",
             "must be in (0, 1]");
  const auto& start = p.compression_start;
  check_rule(start == "steps" || start == "auto", "parallel.compression_start",
             str_cat("must be steps or auto, got \"", start, "\""));
  check_rule(p.compression_start_tolerance > 0, "parallel.compression_start_tolerance",
             "must be positive");
  // Frozen at step 0 the second moment would be all zeros.
  check_rule(!p.freeze_variance || pc == "none" || start == "auto" || p.compression_warmup >= 1,
             "parallel.freeze_variance",
             "needs an uncompressed warm-up to freeze the second moment after: "
             "parallel.compression_warmup >= 1 or parallel.compression_start = \"auto\"");
  const auto& space = p.compression_space;
  check_rule(space == "gradient" || space == "preconditioned", "parallel.compression_space",
             str_cat("must be gradient or preconditioned, got \"", space, "\""));
  // The preconditioner is built from AdamW's second moment when the
  // automatic start fires (and rebuilt from the saved state on resume).
  check_rule(space == "gradient" || pc == "none" || start == "auto", "parallel.compression_space",
             "\"preconditioned\" needs parallel.compression_start = \"auto\"");
  // A live v is read at every step: every rank must hold all of it.
  check_rule(space == "gradient" || pc == "none" || p.freeze_variance || !p.zero,
             "parallel.compression_space",
             "\"preconditioned\" with a live second moment (parallel.freeze_variance = false) "
             "needs it whole on every rank: not with parallel.zero = true");
}

// Rules that hold on any number of ranks (the plan checks the rest against
// the world size: parallel/training_plan.h).
// parallel.tp_2d (resolved: tp = R x C, tp_rows = R): what the grid's
// splits need (nn/tensor_parallel_2d.h), and what it does not combine with yet.
void validate_tp_grid(const Config& c) {
  const ModelConfig& m = c.model;
  const TrainingConfig& t = c.train;
  const ParallelConfig& p = c.parallel;
  const int64_t r = p.tp_rows, cols = p.tp / r, hd = m.resolved_head_dim();
  const std::string grid = str_cat("parallel.tp_2d = \"", p.tp_2d, "\"");
  const auto need = [&](bool ok, const std::string& what) {
    check_rule(ok, "parallel.tp_2d", str_cat(grid, ": ", what));
  };
  need(m.n_heads % cols == 0, str_cat(cols, " columns must divide model.n_heads = ", m.n_heads));
  need(m.n_kv_heads % cols == 0 || cols % m.n_kv_heads == 0,
       str_cat(cols, " columns must divide model.n_kv_heads = ", m.n_kv_heads,
               " or be a multiple of it"));
  const int64_t q_rows = m.n_heads / std::max<int64_t>(cols, 1) * hd;
  const int64_t kv_rows = std::max<int64_t>(m.n_kv_heads / std::max<int64_t>(cols, 1), 1) * hd;
  need(q_rows % r == 0 && kv_rows % r == 0 && m.d_model % r == 0,
       str_cat(r, " rows must divide each column's q rows (", q_rows, "), k/v rows (", kv_rows,
               ") and model.d_model = ", m.d_model));
  need(m.vocab_size % p.tp == 0 && m.ffn_hidden % p.tp == 0,
       str_cat(p.tp, " ranks must divide model.vocab_size = ", m.vocab_size,
               " and model.ffn_hidden = ", m.ffn_hidden));
  need(t.micro_batch % r == 0 && t.micro_batch / r * t.seq_len % cols == 0,
       str_cat("the ", r, " rows split train.micro_batch = ", t.micro_batch,
               " (it must divide), and each row's tokens split over the ", cols, " columns"));
  need(!c.multimodal.model.enabled, "not with multimodal.enabled yet");
}

void validate_parallel(const Config& c) {
  const auto& m = c.model;
  const auto& t = c.train;
  check_rule(c.parallel.bucket_mb > 0, "parallel.bucket_mb", "must be positive");
  validate_compression(c.parallel);
  check_rule(c.parallel.ep >= 1, "parallel.ep", "must be >= 1");
  check_rule(!c.parallel.auto_layout || c.train.global_batch > 0, "parallel.auto",
             "needs train.global_batch (sequences per step): the planner chooses the "
             "micro-batch and dp, so the batch cannot come from them");
  if (c.parallel.ep > 1) {
    check_rule(c.moe.num_experts > 0, "parallel.ep", "needs routed experts (moe.num_experts > 0)");
    check_rule(c.moe.num_experts % c.parallel.ep == 0, "parallel.ep",
               str_cat("must divide moe.num_experts = ", c.moe.num_experts,
                       " (each rank holds whole experts)"));
  }
  const int64_t tp = c.parallel.tp;
  check_rule(tp >= 1, "parallel.tp", "must be >= 1");
  if (c.parallel.tp_rows > 1) {
    validate_tp_grid(c);
  } else if (tp > 1) {
    check_rule(m.n_heads % tp == 0, "parallel.tp",
               str_cat("must divide model.n_heads = ", m.n_heads));
    check_rule(m.n_kv_heads % tp == 0 || tp % m.n_kv_heads == 0, "parallel.tp",
               str_cat("must divide model.n_kv_heads = ", m.n_kv_heads,
                       " or be a multiple of it (kv heads replicated)"));
    check_rule(m.vocab_size % tp == 0, "parallel.tp",
               str_cat("must divide model.vocab_size = ", m.vocab_size));
    check_rule(m.ffn_hidden % tp == 0, "parallel.tp",
               str_cat("must divide model.ffn_hidden = ", m.ffn_hidden));
    const int64_t rank_tokens = t.micro_batch * t.seq_len / std::max<int64_t>(c.parallel.cp, 1);
    check_rule(rank_tokens % tp == 0, "parallel.tp",
               str_cat("must divide the micro-batch's tokens on a cp rank, train.micro_batch * ",
                       "train.seq_len / parallel.cp = ", rank_tokens,
                       " (the MoE layers split them over tp)"));
  }
  check_rule(!c.parallel.sequence_parallel || tp > 1, "parallel.sequence_parallel",
             "needs parallel.tp > 1");
  const auto& pl = c.parallel;
  check_rule(pl.pp >= 1, "parallel.pp", "must be >= 1");
  validate_seq_chunk(c);
  check_rule(pl.cp >= 1, "parallel.cp", "must be >= 1");
  if (pl.cp > 1) {
    check_rule(t.seq_len % (2 * pl.cp) == 0, "parallel.cp",
               str_cat("2 * parallel.cp = ", 2 * pl.cp, " must divide train.seq_len = ", t.seq_len,
                       " (each cp rank holds two equal chunks of every sequence)"));
    check_rule(t.seq_chunk == 0 || t.seq_chunk >= t.seq_len, "parallel.cp",
               "does not combine with train.seq_chunk (chunked sequences): pick one");
  }
  check_rule(pl.cp_comm == "ring" || pl.cp_comm == "all_to_all", "parallel.cp_comm",
             str_cat("must be \"ring\" or \"all_to_all\", got \"", pl.cp_comm, "\""));
  if (pl.cp > 1 && pl.cp_comm == "all_to_all") {
    // The heads a rank holds: over tp, or over a 2-D grid's columns.
    const int64_t tp = std::max<int64_t>(pl.tp / std::max<int64_t>(pl.tp_rows, 1), 1);
    const int64_t heads = m.n_heads / tp, kv_heads = std::max<int64_t>(m.n_kv_heads / tp, 1);
    check_rule(
        heads % pl.cp == 0 && kv_heads % pl.cp == 0, "parallel.cp_comm",
        str_cat("\"all_to_all\" splits each tp rank's ", heads, " query and ", kv_heads,
                " kv heads over parallel.cp = ", pl.cp, ": both must divide (or use \"ring\")"));
  }
  check_rule(pl.vpp >= 1, "parallel.vpp", "must be >= 1");
  (void)parallel::parse_schedule(pl.schedule);
  check_rule(pl.microbatches >= 0, "parallel.microbatches",
             "must be >= 0 (0: derived from the batch)");
  check_rule(pl.vpp == 1 || pl.pp > 1, "parallel.vpp", "needs parallel.pp > 1");
  (void)parallel::parse_stage_balance(pl.stage_balance);
  if (pl.pp > 1) {
    check_rule(
        pl.vpp > 1 || m.n_layers >= pl.pp, "parallel.pp",
        str_cat("must not exceed model.n_layers = ", m.n_layers, " (each stage holds a layer)"));
    check_rule(pl.vpp == 1 || m.n_layers % (pl.pp * pl.vpp) == 0, "parallel.vpp",
               str_cat("parallel.pp * parallel.vpp = ", pl.pp * pl.vpp,
                       " must divide model.n_layers = ", m.n_layers,
                       " (interleaved chunks hold equal layer counts)"));
    check_rule(!m.tie_embeddings, "parallel.pp",
               "> 1 with model.tie_embeddings = true is not supported (embedding and head live on "
               "different stages)");
  }
}

}  // namespace

void validate(const Config& c) {
  validate_model(c);
  validate_optim(c);
  validate_train(c);
  validate_parallel(c);
  validate_multimodal(c);
}

int64_t accumulation_steps(const Config& cfg, int64_t dp) {
  parallel::PlanSettings batch;
  batch.micro_batch = cfg.train.micro_batch;
  batch.grad_accum = cfg.train.grad_accum;
  batch.global_batch = cfg.train.global_batch;
  batch.microbatches = cfg.parallel.microbatches;
  return parallel::accumulation_steps(batch, dp);
}

namespace {

std::string value_text(const Value& v) {
  std::ostringstream os;
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, bool>) {
          os << (*p ? "true" : "false");
        } else if constexpr (std::is_same_v<T, std::string>) {
          os << toml::value<std::string>(*p);
        } else if constexpr (std::is_same_v<T, double>) {
          std::ostringstream num;
          num.precision(17);
          num << *p;
          std::string s = num.str();
          if (s.find_first_of(".en") == std::string::npos) s += ".0";
          os << s;
        } else {
          os << *p;
        }
      },
      v);
  return os.str();
}

}  // namespace

std::string config_value(const Config& cfg, const std::string& key, const std::string& origin) {
  Config copy = cfg;
  return value_text(find_field(key, origin).bind(copy));
}

std::string to_toml(const Config& cfg) {
  Config copy = cfg;
  // Keys grouped by section in the order sections first appear: a section
  // whose fields are listed in two places (moe's modality keys) is written once.
  std::vector<std::pair<std::string, std::string>> sections;  // name, body
  for (const auto& f : fields()) {
    const std::string key = f.key;
    const std::string sec = key.substr(0, key.find('.'));
    auto it = std::find_if(sections.begin(), sections.end(),
                           [&](const auto& s) { return s.first == sec; });
    if (it == sections.end()) it = sections.insert(sections.end(), {sec, ""});
    it->second += key.substr(key.find('.') + 1) + " = " + value_text(f.bind(copy)) + "\n";
  }
  std::ostringstream os;
  for (size_t i = 0; i < sections.size(); ++i)
    os << (i ? "\n" : "") << "[" << sections[i].first << "]\n" << sections[i].second;
  return os.str();
}

}  // namespace moetron::train
