// 2-D against 1-D tensor parallelism on 4 ranks (issue 22): a shortened
// bench-moe, MoE and dense (every layer a SwiGLU FFN), under tp 4 with
// sequence parallelism, a 2 x 2 grid (parallel.tp_2d) and tp 2 x dp 2 with
// sequence parallelism. Per step and rank: the step time, the bytes each tp
// communicator counted (the grid's rows and columns apart) next to the
// analytic count, the stored parameter bytes and the allocator's peak:
//   1-D tp over n ranks with sp, per micro-batch: attention and a dense FFN
//       4 f A each per layer, embedding 2 f A, head 2 f A + 24 f bytes per
//       token, A = T D bytes of the tp group's tokens, f = (n - 1) / n
//       (the MoE folds tp into token shards under sp: nothing);
//   the grid's rows: the same over C ranks on the row's T / R tokens;
//   the grid's columns: every grid-split matrix (q, k, v, o, a dense layer's
//       gate-up and down, embedding, head) all-gathered as its row's block G
//       before each use and its gradient reduce-scattered after backward,
//       (R - 1) / R of G each: per micro-batch a block's value twice
//       (forward, backward) and its gradient once; the embedding's and
//       head's value once (the head's forward and backward are one pass;
//       the embedding's backward needs no value) and gradient once.
// Measured between the gradients of consecutive steps.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "moetron/comm/mpi_communicator.h"
#include "moetron/core/staged_dir.h"
#include "moetron/train/trainer.h"

namespace {

using namespace moetron;

double bytes_of(const comm::Communicator* c) {
  return c ? static_cast<double>(c->total_stats().bytes_sent) : 0.0;
}

struct Snapshot {
  double tp = 0, row = 0, column = 0, dp = 0;
};

Snapshot snap(train::Trainer& t) {
  Snapshot s;
  s.tp = bytes_of(t.tensor_comm());
  s.row = bytes_of(t.model().grid_row_comm());
  s.column = bytes_of(t.model().grid_column_comm());
  for (comm::Communicator* c : t.gradient_comms()) s.dp += bytes_of(c);
  return s;
}

// The rows' (or the 1-D group's) activation traffic per micro-batch.
double row_formula(const nn::Transformer& m, double tokens, double d, double n, double es) {
  if (n <= 1) return 0;
  auto& model = const_cast<nn::Transformer&>(m);
  const double f = (n - 1) / n, a = tokens * d * es;
  const double blocks = static_cast<double>(m.num_blocks());
  const double dense = blocks - static_cast<double>(model.moe_layers().size());
  return blocks * 4 * f * a + dense * 4 * f * a + 2 * f * a + 2 * f * a + 24 * f * tokens;
}

// The columns' weight traffic per micro-batch (see the header).
double column_formula(const nn::Transformer& m, double r, double es) {
  if (r <= 1) return 0;
  const double f = (r - 1) / r;
  double bytes = 0;
  for (const auto& p : const_cast<nn::Transformer&>(m).params().all()) {
    if (!p->sharded()) continue;
    const double g = static_cast<double>(p->value.numel()) * r;  // the row's gathered block
    const bool vocab = p->kind == nn::ParallelKind::vocab;
    const double grad_es = static_cast<double>(dtype_size(p->grad.dtype()));
    bytes += f * g * (es * (vocab ? 1 : 2) + grad_es);
  }
  return bytes;
}

struct Case {
  std::string name;
  std::vector<std::string> sets;
};

nlohmann::json run_case(const std::shared_ptr<comm::Communicator>& world, const Case& c,
                        const std::vector<std::string>& common, const std::string& config) {
  const std::string run = std::filesystem::temp_directory_path().string() + "/moetron_bench_tp2d";
  if (world->rank() == 0) remove_tree(run);
  world->barrier();
  std::vector<std::string> sets = common;
  sets.insert(sets.end(), c.sets.begin(), c.sets.end());
  const train::Config cfg = train::load_config(config, sets);
  train::Trainer t(cfg, run, false, world);
  std::vector<Snapshot> at;
  t.before_update = [&](int64_t) { at.push_back(snap(t)); };
  const train::TrainResult r = t.run();
  const nn::Transformer& m = t.model();
  const double es = m.precision().compute == DType::bf16 ? 2.0 : 4.0;
  const parallel::PlanSettings s = t.plan().settings();
  const double rows = static_cast<double>(s.tp_rows), cols = static_cast<double>(s.tp) / rows;
  const double tokens = static_cast<double>(cfg.train.micro_batch * cfg.train.seq_len) / rows;
  const double mb = static_cast<double>(t.accumulation());
  const double row_f =
      mb * row_formula(m, tokens, static_cast<double>(cfg.model.d_model), cols, es);
  const double col_f = mb * column_formula(m, rows, es);
  double k = 0, step = 0;
  Snapshot d;
  for (size_t i = 1; i < at.size(); ++i, ++k) {
    d.tp += at[i].tp - at[i - 1].tp;
    d.row += at[i].row - at[i - 1].row;
    d.column += at[i].column - at[i - 1].column;
    d.dp += at[i].dp - at[i - 1].dp;
    step += r.history[i].step_s;
  }
  double params = 0;
  for (const auto& p : const_cast<nn::Transformer&>(m).params().all())
    params += static_cast<double>(p->value.nbytes());
  // Means over the ranks.
  Tensor v = Tensor::empty({10}, DType::f64);
  double* p = v.data<double>();
  const double vals[10] = {step / k,
                           d.tp / k,
                           d.row / k,
                           d.column / k,
                           d.dp / k,
                           row_f,
                           col_f,
                           params,
                           static_cast<double>(r.first_step_memory.total_peak),
                           0};
  std::copy(vals, vals + 10, p);
  world->allreduce(v, comm::ReduceOp::sum);
  for (int i = 0; i < 10; ++i) p[i] /= world->size();
  if (world->rank() == 0) remove_tree(run);
  const double mib = 1048576.0;
  const bool grid = rows > 1;
  // 1-D: the tp group is the "row"; the grid: its rows and columns.
  const double row_b = grid ? p[2] : p[1];
  return {{"layout", c.name},
          {"step_s", p[0]},
          {"row_mib", row_b / mib},
          {"column_mib", p[3] / mib},
          {"dp_mib", p[4] / mib},
          {"row_ratio", p[5] > 0 ? row_b / p[5] : 0.0},
          {"column_ratio", p[6] > 0 ? p[3] / p[6] : 0.0},
          {"param_mib", p[7] / mib},
          {"peak_mib", p[8] / mib}};
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = "data/bench", json_path, config = MOETRON_SOURCE_DIR "/configs/bench-moe.toml";
  int64_t steps = 4, layers = 4, seq = 256, micro_batch = 4;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--data") {
      data = argv[i + 1];
    } else if (a == "--json") {
      json_path = argv[i + 1];
    } else if (a == "--steps") {
      steps = std::stoll(argv[i + 1]);
    } else if (a == "--layers") {
      layers = std::stoll(argv[i + 1]);
    } else if (a == "--seq") {
      seq = std::stoll(argv[i + 1]);
    } else if (a == "--micro-batch") {
      micro_batch = std::stoll(argv[i + 1]);
    } else {
      std::cerr << "unknown option " << a << "\n";
      return 2;
    }
  }
  std::shared_ptr<comm::Communicator> world = comm::make_mpi_world();
  const std::vector<Case> layouts = {
      {"tp4 sp", {"parallel.tp=4", "parallel.sequence_parallel=true"}},
      {"tp 2x2", {"parallel.tp_2d=2x2"}},
      {"tp2 dp2 sp", {"parallel.tp=2", "parallel.sequence_parallel=true"}},
  };
  try {
    MOETRON_CHECK(world->size() == 4,
                  "moetron_bench_tp_2d compares 4-rank layouts: mpirun -np 4, got ", world->size(),
                  " ranks");
    nlohmann::json out = nlohmann::json::array();
    for (const bool dense : {false, true}) {
      for (const Case& c : layouts) {
        std::vector<std::string> common = {"data.path=" + data,
                                           "model.n_layers=" + std::to_string(layers),
                                           "model.max_seq_len=" + std::to_string(seq),
                                           "train.seq_len=" + std::to_string(seq),
                                           "train.steps=" + std::to_string(steps),
                                           "train.global_batch=" + std::to_string(2 * micro_batch),
                                           "train.micro_batch=" + std::to_string(micro_batch),
                                           "train.threads=1",
                                           "train.log_every=1000",
                                           "train.eval_batches=1"};
        // tp2 dp2 splits the global batch over 2 replicas: half the rows each.
        if (c.name == "tp2 dp2 sp")
          common[6] = "train.micro_batch=" + std::to_string(micro_batch / 2);
        if (dense) common.push_back("moe.first_dense_layers=" + std::to_string(layers));
        nlohmann::json e = run_case(world, c, common, config);
        e["model"] = dense ? "dense" : "moe";
        out.push_back(e);
      }
    }
    if (world->rank() == 0) {
      std::printf("%-6s %-12s %7s | %9s %9s %8s | %6s %6s | %9s %9s\n", "model", "layout", "step s",
                  "row MiB", "col MiB", "dp MiB", "row/f", "col/f", "param MiB", "peak MiB");
      for (const auto& e : out) {
        std::printf("%-6s %-12s %7.3f | %9.2f %9.2f %8.2f | %6.3f %6.3f | %9.2f %9.2f\n",
                    e["model"].get<std::string>().c_str(), e["layout"].get<std::string>().c_str(),
                    e["step_s"].get<double>(), e["row_mib"].get<double>(),
                    e["column_mib"].get<double>(), e["dp_mib"].get<double>(),
                    e["row_ratio"].get<double>(), e["column_ratio"].get<double>(),
                    e["param_mib"].get<double>(), e["peak_mib"].get<double>());
      }
      if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    }
  } catch (const Error& e) {
    std::cerr << "rank " << world->rank() << ": error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
