// The planner's cost model and layout search: shipped hardware profiles load
// with a source for every number, bad profiles name the key and the file,
// each term of a step matches its formula on hand-checkable layouts, and
// the search returns the fastest fitting layout of its space.
#include "moetron/planner/cost_model.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "moetron/core/error.h"
#include "moetron/nn/flops.h"
#include "moetron/planner/layout_search.h"

namespace moetron::planner {
namespace {

namespace fs = std::filesystem;

const std::string kConfigs = MOETRON_SOURCE_DIR "/configs";

TEST(HardwareProfile, EveryShippedProfileLoadsWithASourceForEachNumber) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(kConfigs + "/hardware")) {
    const HardwareProfile p = load_hardware_profile(e.path().string());
    EXPECT_GT(p.peak_flops, 0) << e.path();
    EXPECT_GT(p.intra.bandwidth, 0) << e.path();
    for (const char* key :
         {"device.peak_tflops", "device.gemm_efficiency", "device.gemm_half_rows",
          "device.grouped_gemm_efficiency", "device.attention_efficiency", "device.memory_gib",
          "device.memory_tbps", "device.elementwise_tbps", "device.devices_per_node",
          "intra.bandwidth_gbps", "intra.latency_us", "inter.bandwidth_gbps", "inter.latency_us",
          "host.memory_gib", "host.memory_tbps", "host.pcie_gbps"}) {
      EXPECT_TRUE(p.sources.count(key) && !p.sources.at(key).empty())
          << e.path() << ": no source for " << key;
    }
    ++n;
  }
  EXPECT_GE(n, 5);  // h100, h200, a100, ascend-910b, this-machine
}

std::string write_profile(const std::string& name, const std::string& text) {
  const std::string path =
      (fs::temp_directory_path() / (name + std::to_string(::getpid()) + ".toml")).string();
  std::ofstream(path) << text;
  return path;
}

TEST(HardwareProfile, AnUnknownOrMissingKeyNamesTheKeyAndTheFile) {
  std::ifstream f(kConfigs + "/hardware/h200.toml");
  const std::string good((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::string typo = good;
  typo.replace(typo.find("memory_tbps"), 11, "memory_tbs");
  for (const auto& [text, key] : {std::pair{typo, std::string("device.memory_tbs")},
                                  std::pair{good + "\n[fabric]\nx = 1\n", std::string("fabric")}}) {
    const std::string path = write_profile("moetron_profile_", text);
    try {
      load_hardware_profile(path);
      ADD_FAILURE() << key << " accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(key), std::string::npos) << what;
      EXPECT_NE(what.find(path), std::string::npos) << what;
    }
    fs::remove(path);
  }
}

TEST(HardwareProfile, AWrittenProfileReadsBackAndTheFitsRecoverTheirModels) {
  // GEMM rate = 0.8 x peak x m / (m + 100), sampled: the fit finds ~100 rows
  // (the largest sample stands in for the large-GEMM rate).
  const double peak = 1e12;
  std::vector<std::pair<double, double>> gemm;
  for (double m : {25.0, 100.0, 400.0, 1e9}) gemm.emplace_back(m, 0.8 * peak * m / (m + 100));
  const GemmFit g = fit_gemm_rows(gemm, peak);
  EXPECT_NEAR(g.efficiency, 0.8, 1e-6);
  EXPECT_NEAR(g.half_rows, 100, 1e-3);
  // A 2-rank all-reduce: 2 x 5 us + bytes / 4 GB/s.
  std::vector<std::pair<double, double>> ar;
  for (double b : {65536.0, 1048576.0, 4194304.0}) ar.emplace_back(b, 1e-5 + b / 4e9);
  const Link l = fit_link(ar);
  EXPECT_NEAR(l.bandwidth, 4e9, 1);
  EXPECT_NEAR(l.latency, 5e-6, 1e-12);
  // Noise that makes a larger message faster: still a positive link.
  const Link noisy = fit_link({{8.0, 4e-5}, {65536.0, 3e-5}, {4194304.0, 1e-5}});
  EXPECT_NEAR(noisy.bandwidth, 4194304.0 / 1e-5, 1);
  EXPECT_GT(noisy.latency, 0);
  HardwareProfile p = load_hardware_profile(kConfigs + "/hardware/h200.toml");
  p.gemm_half_rows = g.half_rows;
  p.grouped_gemm_efficiency = 0.61;
  p.elementwise_bandwidth = 12.5e9;
  p.intra = l;
  const std::string path = write_profile("moetron_written_", "");
  write_hardware_profile(path, p);
  const HardwareProfile q = load_hardware_profile(path);
  EXPECT_NEAR(q.peak_flops, p.peak_flops, 1e-6 * p.peak_flops);
  EXPECT_NEAR(q.gemm_half_rows, p.gemm_half_rows, 1e-3);
  EXPECT_NEAR(q.grouped_gemm_efficiency, 0.61, 1e-6);
  EXPECT_NEAR(q.elementwise_bandwidth, 12.5e9, 1e3);
  EXPECT_NEAR(q.intra.bandwidth, l.bandwidth, 1e-3 * l.bandwidth);
  EXPECT_NEAR(q.intra.latency, l.latency, 1e-3 * l.latency);
  EXPECT_EQ(q.sources, p.sources);
  fs::remove(path);
}

// A dense model, and a profile whose GEMMs and attention run at one rate
// (no small-GEMM penalty), so the compute term is tokens x FLOPs / rate.
Workload dense_workload() {
  Workload w;
  w.model.vocab_size = 1000;
  w.model.d_model = 256;
  w.model.n_layers = 8;
  w.model.n_heads = 8;
  w.model.n_kv_heads = 8;
  w.model.ffn_hidden = 1024;
  w.moe.num_experts = 0;
  w.seq_len = 512;
  w.global_batch = 32;
  return w;
}

HardwareProfile flat_profile() {
  HardwareProfile hw;
  hw.name = "flat";
  hw.peak_flops = 1e14;
  hw.gemm_efficiency = hw.attention_efficiency = hw.grouped_gemm_efficiency = 0.5;
  hw.gemm_half_rows = 1e-12;
  hw.memory_bytes = 80.0 * (1 << 30);
  hw.memory_bandwidth = hw.elementwise_bandwidth = 2e12;
  hw.host_memory_bytes = 512.0 * (1 << 30);
  hw.host_memory_bandwidth = 1e11;
  hw.pcie_bandwidth = 5e10;
  hw.devices_per_node = 8;
  hw.intra = {1e11, 0};
  hw.inter = {1e10, 0};
  return hw;
}

TEST(CostModel, OneDeviceSpendsNothingOnCommunication) {
  const Workload w = dense_workload();
  const CostModel m(w, flat_profile());
  const StepCost c = m.predict(LayoutChoice{});
  // The MFU numerator counts attention's visible pairs twice (as PaLM);
  // the work done is half of that, 12 FLOPs per pair and head dimension.
  const double tokens = static_cast<double>(w.global_batch * w.seq_len);
  double attention = 0;
  for (int64_t i = 0; i < w.model.n_layers; ++i)
    attention += 12.0 * 256 * nn::layer_attended_pairs(w.model, i, w.seq_len) / 512;
  const double flops = nn::model_flops_per_token(w.model, w.moe, w.seq_len) - attention;
  EXPECT_NEAR(c.compute_s, tokens * flops / 5e13, 1e-9 * c.compute_s);
  EXPECT_EQ(c.tp_comm_s + c.ep_comm_s + c.cp_comm_s + c.dp_comm_s + c.pp_comm_s + c.bubble_s, 0);
  EXPECT_NEAR(c.optimizer_s, m.dense_params() * 30 / 2e12, 1e-12);
  EXPECT_GT(c.elementwise_s, 0);
  EXPECT_NEAR(c.step_s, c.compute_s + c.elementwise_s + c.optimizer_s, 1e-12);
  EXPECT_EQ(c.dominant(), "compute");
}

TEST(CostModel, EachAxisCostsWhatItsFormulaSays) {
  const Workload w = dense_workload();
  const CostModel m(w, flat_profile());
  const double one = m.predict(LayoutChoice{}).compute_s;
  // dp 4: a quarter of the compute; the fp32 gradients' ring all-reduce on the node.
  LayoutChoice dp;
  dp.dp = 4;
  const StepCost d = m.predict(dp);
  EXPECT_NEAR(d.compute_s, one / 4, 1e-9 * one);
  EXPECT_NEAR(d.dp_bytes, 2.0 * 3 / 4 * m.dense_params() * 4, 1);
  // tp 2: per micro-batch of mb x S x d bf16, attention and the dense FFN
  // of each layer one all-reduce forward and one backward each (all-gather
  // + reduce-scatter pairs under sp), the embedding and the head one each.
  LayoutChoice tp;
  tp.tp = 2;
  const StepCost t = m.predict(tp);
  const double act = 512.0 * 256 * 2, microbatches = 32;
  EXPECT_NEAR(t.tp_bytes, microbatches * (8 * 2 * 2 + 2) * (2.0 * 1 / 2) * act, 1);
  EXPECT_NEAR(t.tp_comm_s, t.tp_bytes / 1e11, 1e-12);
  // pp 4: the simulated schedule idles (pp - 1) / (vpp m + pp - 1) of the
  // time, so the bubble is (pp - 1) / (vpp m) of what the forwards and
  // backwards run (compute, elementwise work, exposed tp/ep/cp/pp traffic).
  LayoutChoice pp;
  pp.pp = 4;
  pp.vpp = 2;
  const StepCost p = m.predict(pp);
  const double pipelined =
      p.compute_s + p.elementwise_s + p.tp_comm_s + p.ep_comm_s + p.cp_comm_s + p.pp_comm_s;
  EXPECT_GT(p.pp_comm_s, 0);
  EXPECT_NEAR(pipelined_seconds(p), pipelined, 1e-12 * pipelined);
  EXPECT_NEAR(p.bubble_s, pipelined * 3 / (2 * microbatches), 1e-9 * p.compute_s);
  // Recompute full adds a forward: 4/3 of the compute.
  LayoutChoice full;
  full.recompute = "full";
  EXPECT_NEAR(m.predict(full).compute_s, one * 4 / 3, 1e-9 * one);
  // ZeRO-1 shards the fp32 master and moments over dp: less memory.
  LayoutChoice z = dp;
  z.zero1 = true;
  EXPECT_LT(m.predict(z).memory_bytes, d.memory_bytes);
}

// ZeRO-3 shards the weights and gradients too (less device memory, a
// gather and a reduce-scatter every micro-batch); offload moves the fp32
// masters, moments and gradients to the host (16 bytes a local parameter)
// and pays the update at the host's bandwidth plus PCIe both ways.
TEST(CostModel, ZeroThreeAndOffloadMoveWhatTheySay) {
  const CostModel m(dense_workload(), flat_profile());
  LayoutChoice z1;
  z1.dp = 4;
  z1.zero1 = true;
  LayoutChoice z3 = z1;
  z3.zero3 = true;
  const StepCost a = m.predict(z1), b = m.predict(z3);
  const double local = m.dense_params();  // tp = pp = 1: every parameter is local
  // bf16 weights and fp32 gradients: 6 bytes a parameter, 3/4 of them sharded
  // away, two of the 8 layers' weights gathered back.
  EXPECT_NEAR(a.memory_bytes - b.memory_bytes, 6 * local * 3 / 4 - 2 * 2 * local / 8,
              1e-6 * a.memory_bytes);
  const double microbatches = 32.0 / (4 * 1);
  EXPECT_NEAR(b.dp_bytes, microbatches * 2.0 * 3 / 4 * local * 4, 1);
  EXPECT_GT(b.dp_reduce_s, a.dp_reduce_s);
  LayoutChoice off = z1;
  off.offload = true;
  const StepCost c = m.predict(off);
  EXPECT_NEAR(c.host_bytes, 16 * local / 4, 1e-6 * c.host_bytes);
  EXPECT_NEAR(a.memory_bytes - c.memory_bytes, 12 * local / 4 + 2 * local, 1e-6 * a.memory_bytes);
  EXPECT_NEAR(c.optimizer_s, local / 4 * (30 / 1e11 + 6 / 5e10), 1e-9 * c.optimizer_s);
  HardwareProfile tiny_host = flat_profile();
  tiny_host.host_memory_bytes = c.host_bytes;  // under the 10% headroom
  EXPECT_TRUE(fits_memory(c, flat_profile()));
  EXPECT_FALSE(fits_memory(c, tiny_host));
  LayoutChoice bad = z3;
  bad.zero1 = false;
  EXPECT_NE(m.misfit(bad).find("zero3"), std::string::npos);
}

// 2-D tensor parallelism over a q x q grid: each tp-split GEMM receives
// 3 (q - 1) / q^2 of its activation and weight elements a micro-batch
// (forward, input and weight gradients); rows within a node, so a grid of
// 16 may span nodes where 1-D tp may not.
TEST(CostModel, TwoDimensionalTpMovesWhatSummaMoves) {
  const Workload w = dense_workload();  // d 256, 8 heads of 32, FFN 1024, 8 layers
  const CostModel m(w, flat_profile());
  LayoutChoice g;
  g.tp = 4;
  g.tp_2d = true;
  const StepCost c = m.predict(g);
  // What parallel.tp_2d moves (bench/dist/bench_tp_2d.cpp matches it to the
  // communicators' counters): along rows, sequence-parallel tp over q ranks
  // on a row's 256 tokens, 4 collectives of (q - 1) / q of them per module;
  // along columns each weight's row block (1/q) gathered twice in bf16 and
  // its fp32 gradient reduce-scattered, (q - 1) / q each; embedding and
  // head gathered once, with 4 row collectives between them.
  const double tokens = 512 / 2.0, d = 256, f = 1024, v = 1000, q = 2, microbatches = 32;
  const double rows = 2 * 4 * (q - 1) / q * tokens * d * 2;
  const double vocab_rows = 4 * (q - 1) / q * tokens * d * 2;
  const double weights = 4 * d * d + 2 * f * d + d * f;
  const double columns = (q - 1) / q * weights / q * (2 * 2 + 4);
  const double vocab = 2 * (q - 1) / q * v * d / q * (2 + 4);
  EXPECT_NEAR(c.tp_bytes, microbatches * (8 * (rows + columns) + vocab + vocab_rows),
              1e-9 * c.tp_bytes);
  EXPECT_NEAR(c.tp_weight_bytes, microbatches * (8 * columns + vocab), 1e-9 * c.tp_bytes);
  EXPECT_FALSE(g.beyond_runtime());  // the trainer runs it (parallel.tp_2d = "2x2")
  LayoutChoice with_cp = g;
  with_cp.cp = 2;
  EXPECT_FALSE(with_cp.beyond_runtime());
  // Not a square, a q that does not divide the heads, 1-D past a node: why not.
  LayoutChoice bad = g;
  bad.tp = 8;
  EXPECT_NE(m.misfit(bad).find("q x q"), std::string::npos);
  bad.tp = 16;
  EXPECT_EQ(m.misfit(bad), "");  // 4 x 4: rows of 4 in a node of 8
  bad.tp_2d = false;
  EXPECT_NE(m.misfit(bad).find("heads"), std::string::npos);  // 1-D: 16 does not divide 8 heads
  LayoutChoice wide;
  wide.tp = 8;
  HardwareProfile four = flat_profile();
  four.devices_per_node = 4;
  EXPECT_NE(CostModel(w, four).misfit(wide).find("fit in a node"), std::string::npos);
  EXPECT_EQ(grid_side(16), 4);
  EXPECT_EQ(grid_side(8), 0);
  EXPECT_EQ(parse_layout(g.str(), 4).str(), g.str());
}

TEST(CostModel, LayoutsThatDoNotDivideTheWorkloadSayWhy) {
  const CostModel m(dense_workload(), flat_profile());
  LayoutChoice l;
  l.tp = 3;
  EXPECT_NE(m.misfit(l).find("heads"), std::string::npos);
  l = {};
  l.pp = 3;
  EXPECT_NE(m.misfit(l).find("layers"), std::string::npos);
  l = {};
  l.ep = 2;
  EXPECT_NE(m.misfit(l).find("experts"), std::string::npos);
  l = {};
  l.dp = 64;
  EXPECT_NE(m.misfit(l).find("global batch"), std::string::npos);
  EXPECT_THROW(m.predict(l), Error);
}

// --fix: only layouts with the given degrees; a bad key or value is named.
TEST(LayoutSearch, FixedDegreesKeepTheSearchInsideThem) {
  Workload w = dense_workload();
  w.moe.num_experts = 8;
  w.moe.top_k = 2;
  w.moe.expert_hidden = 512;
  const CostModel m(w, flat_profile());
  SearchSpace space;
  space.allow = fixed_degrees("ep=1,pp=2,tp2d=0");
  const SearchResult r = search_layouts(m, 16, 50, space);
  ASSERT_FALSE(r.plans.empty());
  for (const RankedPlan& p : r.plans) {
    EXPECT_EQ(p.layout.ep, 1);
    EXPECT_EQ(p.layout.pp, 2);
    EXPECT_FALSE(p.layout.tp_2d);
  }
  EXPECT_GE(r.plans.front().cost.step_s, search_layouts(m, 16, 1).plans.front().cost.step_s);
  EXPECT_THROW(fixed_degrees("xp=2"), Error);
  EXPECT_THROW(fixed_degrees("tp=two"), Error);
  EXPECT_THROW(fixed_degrees("tp"), Error);
}

TEST(CostModel, ALayoutReadsBackWhatItWrites) {
  LayoutChoice l{16, 8, 4, 8, 2, 2, 4, "full", true, true, true, false, true};
  EXPECT_EQ(parse_layout(l.str(), l.world()).str(), l.str());
  EXPECT_EQ(parse_layout("tp=8,pp=8", 1024).dp, 16);
  const LayoutChoice z = parse_layout("tp=8,pp=8,zero3,offload", 1024);
  EXPECT_TRUE(z.zero1 && z.zero3 && z.offload && z.beyond_runtime());
  EXPECT_EQ(parse_layout(z.str(), 1024).str(), z.str());
  EXPECT_THROW(parse_layout("tp=8,pp=8,dp=3", 1024), Error);
  EXPECT_THROW(parse_layout("tq=8", 8), Error);
}

TEST(LayoutSearch, TheBestPlanIsTheFastestFittingLayoutOfTheSpace) {
  Workload w = dense_workload();
  w.moe.num_experts = 8;
  w.moe.top_k = 2;
  w.moe.expert_hidden = 512;
  HardwareProfile hw = flat_profile();
  hw.gemm_half_rows = 64;
  const CostModel m(w, hw);
  const SearchResult r = search_layouts(m, 16, 5);
  ASSERT_FALSE(r.plans.empty());
  EXPECT_LE(r.plans.size(), 5u);
  for (size_t i = 1; i < r.plans.size(); ++i)
    EXPECT_LE(r.plans[i - 1].cost.step_s, r.plans[i].cost.step_s);
  // Brute force over the same space: nothing faster fits.
  const SearchSpace space;
  double best = 1e300;
  for (int64_t tp : {1, 2, 4, 8, 16})
    for (int64_t cp : {1, 2, 4, 8, 16})
      for (int64_t pp : {1, 2, 4, 8, 16})
        for (int64_t ep : {1, 2, 4, 8})
          for (int64_t vpp : space.vpps)
            for (int64_t mb : space.micro_batches)
              for (const auto& rc : space.recompute)
                for (const int zero : {0, 1, 3})
                  for (const bool off : {false, true})
                    for (const bool two : {false, true}) {
                      if (tp * cp * pp > 16 || 16 % (tp * cp * pp) != 0) continue;
                      LayoutChoice l;
                      l.dp = 16 / (tp * cp * pp);
                      l.tp = tp;
                      l.pp = pp;
                      l.ep = ep;
                      l.cp = cp;
                      l.vpp = vpp;
                      l.micro_batch = mb;
                      l.recompute = rc;
                      l.zero1 = zero >= 1;
                      l.zero3 = zero >= 3;
                      l.offload = off;
                      l.tp_2d = two;
                      if (!m.misfit(l).empty()) continue;
                      const StepCost c = m.predict(l);
                      if (fits_memory(c, hw)) best = std::min(best, c.step_s);
                    }
  EXPECT_DOUBLE_EQ(r.plans.front().cost.step_s, best);
  // The best of each tp kind: the faster of them is the best plan.
  ASSERT_TRUE(r.found_by_tp_grid[0] && r.found_by_tp_grid[1]);
  EXPECT_FALSE(r.best_by_tp_grid[0].layout.tp_2d);
  EXPECT_TRUE(r.best_by_tp_grid[1].layout.tp_2d);
  EXPECT_DOUBLE_EQ(std::min(r.best_by_tp_grid[0].cost.step_s, r.best_by_tp_grid[1].cost.step_s),
                   best);
  // A device too small for any layout: no plan, and the leanest one named.
  hw.memory_bytes = 1 << 20;
  const SearchResult none = search_layouts(CostModel(w, hw), 16, 5);
  EXPECT_TRUE(none.plans.empty());
  EXPECT_GT(none.leanest_bytes, 1 << 20);
  EXPECT_EQ(none.fit, 0);
}

}  // namespace
}  // namespace moetron::planner
