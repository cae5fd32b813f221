// What monitoring costs per step, timed in-process on bench-moe (issue 20):
// a short run with every monitoring option on fills the registry as
// training does, then each code path that monitoring adds to a step is
// timed on its own on rank 0, many times (median, min, max of wall and of
// process CPU time), and its CPU time set against the CPU time of the run's
// median step period. Far less noisy than the step-time difference of
// separate runs (bench/monitor_overhead.py), which a 0.5% effect drowns in
// on a shared machine.
//
//   mpirun -np 2 build/bench/moetron_bench_monitor_cost --data DIR [--steps 5]
//       [--repeats 30] [--serve 1] [--json FILE]
//
// The pieces, in the order a step runs them (what Trainer::run and
// Trainer::record_metrics call; the list is repeated here because those are
// private):
//   activation_tracking  each block's output sum of squares in the forward
//                        (layer-statistics steps only)
//   layer_stats          TrainerMonitor::before_step + after_update: the
//                        parameter copy (monitor.update_stats), gradient,
//                        parameter and update norms, two world all-reduces
//   registry_updates     rank 0: the step record, communicator counters,
//                        memory, process, every MoE layer's loads and biases
//   rank_gather          the per-rank times' all-gather (collective) and
//                        rank 0's straggler table
//   series_json          rank 0: the registry snapshot as metrics.jsonl's
//                        "series" object (and the server's copy when serving)
//   series_write         rank 0: writing the line with "series" minus writing
//                        it without (what an unmonitored run writes anyway)
// "on" is the sum without the layer-statistics pieces, "all" the sum of all.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>

#include "moetron/comm/communicator.h"
#include "moetron/comm/mpi_communicator.h"
#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"
#include "moetron/kernels/elementwise.h"
#include "moetron/monitor/json_series.h"
#include "moetron/train/trainer.h"

namespace {

using namespace moetron;
using clock_type = std::chrono::steady_clock;

struct Options {
  std::string data = "data/bench", json_path;
  std::string config = MOETRON_SOURCE_DIR "/configs/bench-moe.toml";
  int64_t steps = 5, repeats = 30;
  bool serve = true;
};

struct Stats {
  double median = 0, min = 0, max = 0;
};

// Rank 0's median step period (seconds).
struct Period {
  double wall = 0, cpu = 0;
};

struct Piece {
  std::string name;
  bool layer_step_only = false;  // runs on layer-statistics steps only
  Stats wall, cpu;               // seconds
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

Stats stats_of(const std::vector<double>& v) {
  return {median(v), *std::min_element(v.begin(), v.end()), *std::max_element(v.begin(), v.end())};
}

// This process's CPU seconds, every thread's: on a shared machine a piece
// that loses its core meanwhile keeps its CPU time, not its wall time.
double cpu_now() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Rank 0's wall and CPU time of `fn` (every rank calls it: collective
// pieces need all of them), after one warm-up call, each call started
// together.
Piece time_piece(comm::Communicator& world, std::string name, bool layer_only, int64_t repeats,
                 const std::function<void()>& fn) {
  fn();
  std::vector<double> wall, cpu;
  for (int64_t i = 0; i < repeats; ++i) {
    world.barrier();
    const auto t0 = clock_type::now();
    const double c0 = cpu_now();
    fn();
    cpu.push_back(cpu_now() - c0);
    wall.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  return {std::move(name), layer_only, stats_of(wall), stats_of(cpu)};
}

// a - b, both statistics shifted by b's medians (a piece measured with and
// without the work it is about).
Piece minus(Piece a, const Piece& b, std::string name) {
  for (auto [x, y] : {std::pair(&a.wall, &b.wall), std::pair(&a.cpu, &b.cpu)}) {
    x->median -= y->median;
    x->min -= y->median;
    x->max -= y->median;
  }
  a.name = std::move(name);
  return a;
}

// The step line as metrics.jsonl has it, "series" and "time" left out: the
// last line the run wrote.
nlohmann::json base_line(const std::string& run_dir) {
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  MOETRON_CHECK(!last.empty(), "no metrics line in ", run_dir, "/metrics.jsonl");
  nlohmann::json j = nlohmann::json::parse(last);
  j.erase("series");
  j.erase("time");
  return j;
}

// What Trainer::record_metrics and record_router_metrics write on rank 0,
// less the rank exchange (timed apart).
void record_registry(train::Trainer& t, const train::StepRecord& rec) {
  train::TrainingMetrics& m = t.monitor().metrics();
  m.record_step(rec);
  for (const auto& [axis, c] : t.named_comms()) m.record_comm(axis, *c);
  m.record_memory(cpu_allocator().stats(), cpu_allocator().reserved());
  m.record_process();
  for (nn::MoeLayer* l : t.model().moe_layers()) {
    std::vector<double> bias;
    const Tensor& b = l->bias();
    if (t.config().moe.bias_update_rate > 0 && b.defined()) {
      for (int64_t e = 0; e < b.numel(); ++e) {
        bias.push_back(b.dtype() == DType::f64 ? b.data<double>()[e]
                                               : static_cast<double>(b.data<float>()[e]));
      }
    }
    m.record_moe_layer(train::layer_group_of(l->prefix() + "router").first, l->expert_load(), bias);
  }
}

// Appends `line` to `out` as Trainer::write_metrics does.
void write_line(std::ofstream& out, const nlohmann::json& line) {
  out << line.dump() << "\n" << std::flush;
}

std::vector<Piece> time_step_pieces(train::Trainer& t, const train::TrainResult& r,
                                    const std::string& run_dir, const Options& o) {
  comm::Communicator& world = t.world();
  train::TrainerMonitor& mon = t.monitor();
  const bool root = world.rank() == 0;
  const train::StepRecord rec = r.history.back();
  const int64_t step = rec.step;
  std::vector<Piece> out;
  // The forward's extra work on a statistics step: one sum of squares over
  // each block's output [tokens, D] per micro-batch (dp-only layout).
  const Tensor act = Tensor::zeros(
      {t.config().train.micro_batch * t.config().train.seq_len, t.config().model.d_model},
      t.model().precision().compute);
  const int64_t sums = t.model().num_blocks() * t.accumulation();
  double sink = 0;
  out.push_back(time_piece(world, "activation_tracking", true, o.repeats, [&] {
    for (int64_t i = 0; i < sums; ++i) sink += kernels::sum_squares(t.context(), act);
  }));
  const auto held_by_nobody = [](const nn::Parameter&) { return false; };
  out.push_back(time_piece(world, "layer_stats", true, std::max<int64_t>(5, o.repeats / 5), [&] {
    mon.before_step(step, t.model());
    mon.after_update(step, t.context(), t.model(), 1.0, held_by_nobody);
  }));
  out.push_back(time_piece(world, "registry_updates", false, o.repeats, [&] {
    if (root) record_registry(t, rec);
  }));
  out.push_back(
      time_piece(world, "rank_gather", false, o.repeats, [&] { mon.exchange_rank_times(rec); }));
  const nlohmann::json base = root ? base_line(run_dir) : nlohmann::json::object();
  nlohmann::json full = base;
  out.push_back(time_piece(world, "series_json", false, o.repeats, [&] {
    if (!root) return;
    full = base;
    mon.finish_line(full);
  }));
  std::ofstream file(run_dir + "/bench-lines.jsonl");
  const Piece with = time_piece(world, "write_with_series", false, o.repeats, [&] {
    if (root) write_line(file, full);
  });
  const Piece without = time_piece(world, "write_without_series", false, o.repeats, [&] {
    if (root) write_line(file, base);
  });
  out.push_back(minus(with, without, "series_write"));
  if (sink < 0) std::cerr << sink;  // keeps the sums from being optimised away
  return out;
}

// Where layer_stats goes, on rank 0 alone (no collective, nothing to wait
// for): the parameter copy, the gradient and parameter norms, and the update
// norm as the fused kernel takes it and as the code before it did (an axpy
// into the 16-bit copy, then a second pass for its sum of squares); then the
// registry's snapshot and its JSON.
std::vector<Piece> time_parts(train::Trainer& t, const Options& o) {
  comm::Communicator& world = t.world();
  const bool root = world.rank() == 0;
  const std::unique_ptr<comm::Communicator> alone = comm::make_local_communicator();
  train::LayerStatistics stats(t.config().model, t.config().moe, t.rank_plan().coords);
  const nn::ParameterSet& params = t.model().params();
  kernels::Context& ctx = t.context();
  std::vector<Tensor> copy;  // as keep_parameters keeps them
  for (const auto& p : params.all()) copy.push_back(p->value.clone());
  const auto held_by_nobody = [](const nn::Parameter&) { return false; };
  const int64_t few = std::max<int64_t>(5, o.repeats / 3);
  double sink = 0;
  std::vector<Piece> out;
  out.push_back(time_piece(world, "part:grad_and_param_norms", true, few, [&] {
    if (root) stats.measure(ctx, params, 1.0, *alone, held_by_nobody);
  }));
  out.push_back(time_piece(world, "part:keep_parameters", true, few, [&] {
    if (root) stats.keep_parameters(params);
  }));
  out.push_back(time_piece(world, "part:update_norm_fused", true, few, [&] {
    if (!root) return;
    for (size_t k = 0; k < copy.size(); ++k) {
      sink += kernels::sum_squared_difference(ctx, copy[k], params.all()[k]->value);
    }
  }));
  // The copies drift (each call subtracts the parameters again): the cost
  // does not depend on the values.
  out.push_back(time_piece(world, "part:update_norm_axpy", true, few, [&] {
    if (!root) return;
    for (size_t k = 0; k < copy.size(); ++k) {
      kernels::axpy(ctx, -1.0f, params.all()[k]->value, copy[k]);
      sink += kernels::sum_squares(ctx, copy[k]);
    }
  }));
  monitor::Registry& reg = t.monitor().registry();
  out.push_back(time_piece(world, "part:snapshot", false, o.repeats, [&] {
    if (root) reg.snapshot();
  }));
  out.push_back(time_piece(world, "part:json_series", false, o.repeats, [&] {
    if (root) monitor::json_series(reg.snapshot());
  }));
  if (sink < 0) std::cerr << sink;  // keeps the sums from being optimised away
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--data") {
      o.data = v;
    } else if (a == "--json") {
      o.json_path = v;
    } else if (a == "--steps") {
      o.steps = std::stoll(v);
    } else if (a == "--repeats") {
      o.repeats = std::stoll(v);
    } else if (a == "--serve") {
      o.serve = v != "0";
    } else if (a == "--config") {
      o.config = v;
    } else {
      MOETRON_FAIL("unknown option ", a);
    }
  }
  MOETRON_CHECK(o.steps >= 2 && o.repeats >= 3, "--steps must be >= 2 and --repeats >= 3");
  return o;
}

nlohmann::json stats_json(const Stats& s) {
  return {{"median", s.median}, {"min", s.min}, {"max", s.max}};
}

// The table and the JSON. The overhead is the pieces' median CPU time over
// the step period's median CPU time (on a shared core both stretch in wall
// time, CPU time does not): "on" every step, layer statistics every step
// ("all") or every 10th (monitor.layer_stats_every's default).
void report(const std::vector<Piece>& pieces, const Period& period, int world, int64_t series,
            const Options& o) {
  const double step_s = period.cpu;
  double on = 0, all = 0, on_wall = 0, all_wall = 0;
  for (const Piece& p : pieces) {
    if (p.name.rfind("part:", 0) == 0) continue;
    all += p.cpu.median;
    all_wall += p.wall.median;
    if (!p.layer_step_only) {
      on += p.cpu.median;
      on_wall += p.wall.median;
    }
  }
  const double every10 = on + (all - on) / 10;
  std::printf("bench-moe, %d rank(s), median step period %.4f s wall, %.4f s CPU; %lld series\n",
              world, period.wall, period.cpu, static_cast<long long>(series));
  std::printf("%-26s %9s %9s %9s %9s %9s\n", "piece (rank 0)", "wall ms", "cpu ms", "cpu min",
              "cpu max", "% step");
  nlohmann::json rows = nlohmann::json::array();
  for (const Piece& p : pieces) {
    std::printf("%-26s %9.3f %9.3f %9.3f %9.3f %8.3f%%\n", p.name.c_str(), 1e3 * p.wall.median,
                1e3 * p.cpu.median, 1e3 * p.cpu.min, 1e3 * p.cpu.max, 100 * p.cpu.median / step_s);
    rows.push_back({{"piece", p.name},
                    {"layer_step_only", p.layer_step_only},
                    {"wall_s", stats_json(p.wall)},
                    {"cpu_s", stats_json(p.cpu)}});
  }
  std::printf("%-26s %9.3f %9.3f %29.3f%%\n", "total: registry on", 1e3 * on_wall, 1e3 * on,
              100 * on / step_s);
  std::printf("%-26s %9s %9.3f %29.3f%%\n", "  + layer stats every 10", "", 1e3 * every10,
              100 * every10 / step_s);
  std::printf("%-26s %9.3f %9.3f %29.3f%%\n", "  + layer stats every step", 1e3 * all_wall,
              1e3 * all, 100 * all / step_s);
  const nlohmann::json res = {{"bench", "monitor_cost"},
                              {"ranks", world},
                              {"serve", o.serve},
                              {"step_period_wall_s", period.wall},
                              {"step_period_cpu_s", period.cpu},
                              {"series", series},
                              {"pieces", rows},
                              {"on_cpu_s", on},
                              {"all_cpu_s", all},
                              {"on_pct", 100 * on / step_s},
                              {"layer_stats_every_10_pct", 100 * every10 / step_s},
                              {"all_pct", 100 * all / step_s}};
  std::cout << res.dump() << "\n";
  if (!o.json_path.empty()) std::ofstream(o.json_path) << res.dump(2) << "\n";
}

int run(const Options& o, const std::shared_ptr<comm::Communicator>& world) {
  const std::string run_dir =
      std::filesystem::temp_directory_path().string() + "/moetron_bench_monitor_cost";
  if (world->rank() == 0) remove_tree(run_dir);
  world->barrier();
  const std::vector<std::string> sets = {
      "data.path=" + o.data,
      "train.steps=" + std::to_string(o.steps),
      "train.eval_batches=1",
      "train.threads=1",
      "monitor.layer_stats_every=1",
      "monitor.update_stats=true",
      std::string("monitor.serve=") + (o.serve ? "true" : "false"),
      "monitor.port=0",
      "checkpoint.snapshot_every=0"};  // a snapshot's step is not a monitored step
  const train::Config cfg = train::load_config(o.config, sets);
  train::Trainer t(cfg, run_dir, false, world);
  // A step's whole period, before-update to before-update: the step and
  // everything the loop does after it (its metrics, the line, the log).
  std::vector<std::pair<double, double>> marks;  // wall, CPU
  t.before_update = [&](int64_t) {
    marks.emplace_back(std::chrono::duration<double>(clock_type::now().time_since_epoch()).count(),
                       cpu_now());
  };
  const train::TrainResult r = t.run();
  t.before_update = nullptr;
  Period period;
  std::vector<double> wall, cpu;
  for (size_t i = 1; i < marks.size(); ++i) {
    wall.push_back(marks[i].first - marks[i - 1].first);
    cpu.push_back(marks[i].second - marks[i - 1].second);
  }
  period.wall = median(wall);
  period.cpu = median(cpu);
  std::vector<Piece> pieces = time_step_pieces(t, r, run_dir, o);
  const std::vector<Piece> parts = time_parts(t, o);
  pieces.insert(pieces.end(), parts.begin(), parts.end());
  t.monitor().finish();
  if (world->rank() == 0) {
    report(pieces, period, world->size(), t.monitor().registry().series_count(), o);
  }
  world->barrier();
  if (world->rank() == 0) remove_tree(run_dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::shared_ptr<comm::Communicator> world = comm::make_mpi_world();
  try {
    return run(parse(argc, argv), world);
  } catch (const Error& e) {
    std::cerr << "rank " << world->rank() << ": error: " << e.what() << "\n";
    return 1;
  }
}
