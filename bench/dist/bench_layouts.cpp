// Composed layouts on 8 ranks (issue 5): a shortened bench-moe under each of
// dp2 tp2 pp2, ep4 dp8, pp2 ep2 tp2 (dp2) and tp2 ep2 dp4 with sequence
// parallelism. Per step and rank: the time split into compute, blocking tp
// and ep collectives, the exposed dp gradient wait and the pipeline wait
// (bubble + transfers); and the bytes each axis's communicator counted next
// to the analytic count of what that layout must move:
//   tp  per micro-batch: attention 4 f A per layer (two all-reduces, or
//       all-gather + reduce-scatter pairs under sp), dense FFN 4 f A, MoE
//       2 f A without sp (its slices all-gathered forward and backward),
//       embedding 2 f A, head 2 f A + 24 f bytes per token (the
//       vocab-parallel max and sums); A = T D bytes, f = (tp - 1) / tp;
//   ep  per MoE layer and micro-batch 4 T/tp k (ep-1)/ep rows of D (uniform
//       routing) plus the (ep-1)(E+1) 8-byte count all-gather;
//   pp  per micro-batch and chunk one activation forward (unless last) and
//       one gradient backward (unless first), [T (/tp under sp), D];
//   dp  ring all-reduce 2 (n-1)/n of the fp32 gradients over each
//       reducer's n ranks (dense over dp, partial-over-tp over the stage,
//       experts over their replicas).
// Measured between the gradients of consecutive steps (no evaluation, no
// checkpoint inside the window).
#include <algorithm>
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

int64_t bytes_of(comm::Communicator* c) {
  return c ? c->total_stats().bytes_sent : 0;
}
double seconds_of(comm::Communicator* c) {
  return c ? c->total_stats().seconds : 0;
}

struct Snapshot {
  double tp_b = 0, ep_b = 0, pp_b = 0, dp_b = 0, tp_s = 0, ep_s = 0;
};

Snapshot snap(train::Trainer& t) {
  Snapshot s;
  s.tp_b = static_cast<double>(bytes_of(t.tensor_comm()));
  s.ep_b = static_cast<double>(bytes_of(t.expert_comm()));
  s.pp_b = static_cast<double>(bytes_of(t.pipeline_comm()));
  for (comm::Communicator* c : t.gradient_comms()) s.dp_b += static_cast<double>(bytes_of(c));
  s.tp_s = seconds_of(t.tensor_comm());
  s.ep_s = seconds_of(t.expert_comm());
  return s;
}

struct Formula {
  double tp = 0, ep = 0, pp = 0, dp = 0;
};

Formula formula(train::Trainer& t, const train::Config& cfg, int world) {
  const auto& pc = cfg.parallel;
  const nn::Transformer& m = t.model();
  const double es = m.precision().compute == DType::bf16 ? 2.0 : 4.0;
  const double T = static_cast<double>(cfg.train.micro_batch * cfg.train.seq_len),
               D = static_cast<double>(cfg.model.d_model);
  const double A = T * D * es, tp = static_cast<double>(pc.tp), f = (tp - 1) / tp;
  const double mb = static_cast<double>(t.accumulation());
  auto& model = const_cast<nn::Transformer&>(m);
  const double moe = static_cast<double>(model.moe_layers().size()),
               blocks = static_cast<double>(m.num_blocks());
  Formula out;
  if (pc.tp > 1) {
    double per_mb = blocks * 4 * f * A + (blocks - moe) * 4 * f * A +
                    (pc.sequence_parallel ? 0.0 : moe * 2 * f * A);
    if (m.holds_embedding()) per_mb += 2 * f * A;
    if (m.holds_head()) per_mb += 2 * f * A + 24 * f * T;
    out.tp = per_mb * mb;
  }
  if (pc.ep > 1) {
    const double ep = static_cast<double>(pc.ep);
    const double rows = T / tp * static_cast<double>(cfg.moe.top_k) * (ep - 1) / ep;
    out.ep = moe * mb *
             (4 * rows * D * es + (ep - 1) * static_cast<double>(cfg.moe.num_experts + 1) * 8);
  }
  if (pc.pp > 1) {
    const double rows = pc.sequence_parallel ? T / tp : T;
    const int64_t stages = pc.pp * pc.vpp,
                  me = world / pc.pp == 0 ? 0 : t.world().rank() / (world / pc.pp);
    for (int64_t c = 0; c < pc.vpp; ++c) {
      const int64_t j = c * pc.pp + me;
      out.pp += mb * rows * D * es * ((j < stages - 1 ? 1 : 0) + (j > 0 ? 1 : 0));
    }
  }
  const double stage = static_cast<double>(world / pc.pp), dp = stage / tp;
  for (const auto& p : model.params().all()) {
    const double bytes = 4.0 * static_cast<double>(p->grad.numel());
    double n = dp;
    if (pc.ep > 1 && p->kind == nn::ParallelKind::expert) {
      n = stage / static_cast<double>(pc.ep);
    } else if (p->grad_partial_over_tp) {
      n = stage;
    }
    out.dp += 2 * (n - 1) / n * bytes;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = "data/demo", json_path, config = MOETRON_SOURCE_DIR "/configs/bench-moe.toml";
  int64_t steps = 4, layers = 4, seq = 128;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--data")
      data = argv[i + 1];
    else if (a == "--json")
      json_path = argv[i + 1];
    else if (a == "--steps")
      steps = std::stoll(argv[i + 1]);
    else if (a == "--layers")
      layers = std::stoll(argv[i + 1]);
    else if (a == "--seq")
      seq = std::stoll(argv[i + 1]);
    else if (a == "--config")
      config = argv[i + 1];
    else {
      std::cerr << "unknown option " << a << "\n";
      return 2;
    }
  }
  std::shared_ptr<comm::Communicator> world = comm::make_mpi_world();
  const int n = world->size();
  struct Case {
    std::string name;
    std::vector<std::string> sets;
  };
  const std::vector<Case> cases = {
      {"dp2 tp2 pp2", {"parallel.tp=2", "parallel.pp=2"}},
      {"ep4 dp8", {"parallel.ep=4"}},
      {"pp2 ep2 tp2 (dp2)", {"parallel.tp=2", "parallel.pp=2", "parallel.ep=2"}},
      {"tp2 ep2 dp4 sp", {"parallel.tp=2", "parallel.ep=2", "parallel.sequence_parallel=true"}},
  };
  try {
    MOETRON_CHECK(n == 8,
                  "moetron_bench_layouts runs the issue's 8-rank layouts: mpirun -np 8, got ", n,
                  " ranks");
    nlohmann::json out = nlohmann::json::array();
    for (const Case& c : cases) {
      const std::string run =
          std::filesystem::temp_directory_path().string() + "/moetron_bench_layouts";
      if (world->rank() == 0) remove_tree(run);
      world->barrier();
      std::vector<std::string> sets = {"data.path=" + data,
                                       "model.n_layers=" + std::to_string(layers),
                                       "model.max_seq_len=" + std::to_string(seq),
                                       "train.seq_len=" + std::to_string(seq),
                                       "train.steps=" + std::to_string(steps),
                                       "train.global_batch=8",
                                       "train.micro_batch=1",
                                       "train.threads=1",
                                       "train.log_every=1000",
                                       "train.eval_batches=1"};
      sets.insert(sets.end(), c.sets.begin(), c.sets.end());
      const train::Config cfg = train::load_config(config, sets);
      train::Trainer t(cfg, run, false, world);
      std::vector<Snapshot> at;
      t.before_update = [&](int64_t) { at.push_back(snap(t)); };
      const train::TrainResult r = t.run();
      const Formula fm = formula(t, cfg, n);
      // Steps 2..steps: gradients of step s-1 to those of step s.
      double k = 0, step = 0, tp_s = 0, ep_s = 0, dp_s = 0, pp_s = 0;
      Snapshot d;
      for (size_t i = 1; i < at.size(); ++i, ++k) {
        d.tp_b += at[i].tp_b - at[i - 1].tp_b;
        d.ep_b += at[i].ep_b - at[i - 1].ep_b;
        d.pp_b += at[i].pp_b - at[i - 1].pp_b;
        d.dp_b += at[i].dp_b - at[i - 1].dp_b;
        tp_s += at[i].tp_s - at[i - 1].tp_s;
        ep_s += at[i].ep_s - at[i - 1].ep_s;
        step += r.history[i].step_s;
        dp_s += r.history[i].comm_wait_s;
        pp_s += r.history[i].pipeline_wait_s;
      }
      // Per rank means over the ranks (each rank's own formula).
      Tensor v = Tensor::empty({14}, DType::f64);
      double* p = v.data<double>();
      const double vals[14] = {step / k,   tp_s / k,   ep_s / k,   dp_s / k,   pp_s / k,
                               d.tp_b / k, d.ep_b / k, d.pp_b / k, d.dp_b / k, fm.tp,
                               fm.ep,      fm.pp,      fm.dp,      0};
      std::copy(vals, vals + 14, p);
      world->allreduce(v, comm::ReduceOp::sum);
      for (int i = 0; i < 14; ++i) p[i] /= n;
      const double mib = 1048576.0;
      const auto ratio = [](double a, double b) { return b > 0 ? a / b : 0.0; };
      out.push_back({{"layout", c.name},
                     {"step_s", p[0]},
                     {"compute_s", p[0] - p[1] - p[2] - p[3] - p[4]},
                     {"tp_s", p[1]},
                     {"ep_s", p[2]},
                     {"dp_wait_s", p[3]},
                     {"pp_wait_s", p[4]},
                     {"tp_mib", p[5] / mib},
                     {"ep_mib", p[6] / mib},
                     {"pp_mib", p[7] / mib},
                     {"dp_mib", p[8] / mib},
                     {"tp_ratio", ratio(p[5], p[9])},
                     {"ep_ratio", ratio(p[6], p[10])},
                     {"pp_ratio", ratio(p[7], p[11])},
                     {"dp_ratio", ratio(p[8], p[12])}});
      if (world->rank() == 0) remove_tree(run);
    }
    if (world->rank() == 0) {
      std::printf("%-20s %7s %7s %6s %6s %6s %6s | %8s %8s %8s %8s | %6s %6s %6s %6s\n", "layout",
                  "step s", "compute", "tp s", "ep s", "dp s", "pp s", "tp MiB", "ep MiB", "pp MiB",
                  "dp MiB", "tp/f", "ep/f", "pp/f", "dp/f");
      for (const auto& e : out) {
        std::printf(
            "%-20s %7.3f %7.3f %6.3f %6.3f %6.3f %6.3f | %8.2f %8.2f %8.2f %8.2f | %6.3f %6.3f "
            "%6.3f %6.3f\n",
            e["layout"].get<std::string>().c_str(), e["step_s"].get<double>(),
            e["compute_s"].get<double>(), e["tp_s"].get<double>(), e["ep_s"].get<double>(),
            e["dp_wait_s"].get<double>(), e["pp_wait_s"].get<double>(), e["tp_mib"].get<double>(),
            e["ep_mib"].get<double>(), e["pp_mib"].get<double>(), e["dp_mib"].get<double>(),
            e["tp_ratio"].get<double>(), e["ep_ratio"].get<double>(), e["pp_ratio"].get<double>(),
            e["dp_ratio"].get<double>());
      }
      std::cout << out.dump() << "\n";
      if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
    }
  } catch (const Error& e) {
    std::cerr << "rank " << world->rank() << ": error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
