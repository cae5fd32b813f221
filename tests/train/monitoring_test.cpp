// The trainer's monitoring on one rank: every metrics.jsonl line carries the
// registry's series (equal to the line's own fields), events.jsonl records
// the run, per-layer statistics add up to the global gradient norm (and the
// update norms to the parameters' change), and monitor.enabled = false
// writes none of it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "moetron/comm/communicator.h"
#include "moetron/core/error.h"
#include "moetron/kernels/elementwise.h"
#include "moetron/monitor/http_server.h"
#include "moetron/monitor/metric_registry.h"
#include "moetron/train/layer_stats.h"
#include "moetron/train/trainer.h"
#include "moetron/train/training_metrics.h"
#include "util/test_util.h"
#include "util/tiny_corpus.h"

namespace moetron::train {
namespace {

namespace fs = std::filesystem;

std::string fresh_run(const std::string& name) {
  const std::string d = test::tiny_corpus_root() + "/runs/" + name;
  fs::remove_all(d);
  return d;
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(LayerGroups, ParameterNamesMapToLayerAndMatrixGroup) {
  using P = std::pair<std::string, std::string>;
  EXPECT_EQ(layer_group_of("model.layers.3.self_attn.q_proj.weight"), P("3", "self_attn.q_proj"));
  EXPECT_EQ(layer_group_of("model.layers.12.block_sparse_moe.experts.5.w1.weight"),
            P("12", "experts.w1"));
  EXPECT_EQ(layer_group_of("model.layers.1.block_sparse_moe.gate.weight"), P("1", "gate"));
  EXPECT_EQ(layer_group_of("model.layers.1.mlp.shared_experts.up_proj.weight"),
            P("1", "mlp.shared_experts.up_proj"));
  EXPECT_EQ(layer_group_of("model.layers.0.input_layernorm.weight"), P("0", "input_layernorm"));
  EXPECT_EQ(layer_group_of("model.embed_tokens.weight"), P("embed", "embed_tokens"));
  EXPECT_EQ(layer_group_of("model.norm.weight"), P("head", "norm"));
  EXPECT_EQ(layer_group_of("lm_head.weight"), P("head", "lm_head"));
}

// The update norm is the change of the group's parameters since
// keep_parameters, in full precision, and zero for the groups that did not move.
TEST(LayerStatistics, UpdateNormsAreEachGroupsParameterChange) {
  Trainer t(test::tiny_train_config({"train.steps=1"}), fresh_run("layer-stats"), false);
  LayerStatistics stats(t.config().model, t.config().moe, t.rank_plan().coords);
  const nn::ParameterSet& params = t.model().params();
  const std::unique_ptr<comm::Communicator> one = comm::make_local_communicator();
  const std::pair<std::string, std::string> moved("1", "experts.w1");
  stats.keep_parameters(params);
  double squares = 0;
  for (const auto& p : params.all()) {
    if (layer_group_of(p->name) != moved) continue;
    const Tensor before = test::to_dtype(p->value, DType::f32);
    kernels::scale(t.context(), p->value, 1.5f, p->value);
    const Tensor after = test::to_dtype(p->value, DType::f32);
    for (int64_t i = 0; i < before.numel(); ++i) {
      const double d = static_cast<double>(before.data<float>()[i]) - after.data<float>()[i];
      squares += d * d;
    }
  }
  ASSERT_GT(squares, 0);
  int found = 0;
  for (const GroupNorms& g : stats.measure(t.context(), params, 1.0, *one, {})) {
    EXPECT_TRUE(g.has_update) << g.layer << " " << g.group;
    if (std::make_pair(g.layer, g.group) == moved) {
      ++found;
      EXPECT_NEAR(g.update, std::sqrt(squares), 1e-12 * std::sqrt(squares));
    } else {
      EXPECT_EQ(g.update, 0.0) << g.layer << " " << g.group;
    }
  }
  EXPECT_EQ(found, 1);
  // The copy is spent: the next measure has no update norms.
  for (const GroupNorms& g : stats.measure(t.context(), params, 1.0, *one, {})) {
    EXPECT_FALSE(g.has_update) << g.layer << " " << g.group;
  }
}

TEST(TrainingMetrics, TheCatalogueIsWellFormed) {
  monitor::Registry r;
  define_training_metrics(r);
  const auto defs = r.definitions();
  EXPECT_GE(defs.size(), 40u);
  for (const monitor::MetricDef* d : defs) {
    EXPECT_EQ(d->name.rfind("moetron_", 0), 0u) << d->name;
    EXPECT_FALSE(d->help.empty()) << d->name;
    // Prometheus base units: a metric named _seconds or _bytes says so.
    if (d->name.find("_seconds") != std::string::npos) {
      EXPECT_EQ(d->unit, "seconds") << d->name;
    }
    if (d->name.find("_bytes") != std::string::npos) {
      EXPECT_EQ(d->unit, "bytes") << d->name;
    }
  }
  EXPECT_THROW(define_training_metrics(r), Error);  // each metric is defined once
}

TEST(Monitoring, MetricsLinesCarryTheSeriesAndEventsTheRun) {
  const std::string dir = fresh_run("monitor");
  Trainer t(
      test::tiny_train_config({"train.steps=4", "checkpoint.every=2", "monitor.layer_stats_every=2",
                               "monitor.update_stats=true", "moe.bias_update_rate=0.001"}),
      dir, false);
  const TrainResult res = t.run();
  ASSERT_EQ(res.steps_done, 4);
  const std::vector<nlohmann::json> lines = read_lines(dir + "/metrics.jsonl");
  ASSERT_EQ(lines.size(), 4u);
  double tokens = 0;
  for (const nlohmann::json& l : lines) {
    ASSERT_TRUE(l.contains("series")) << l.dump();
    const nlohmann::json& s = l.at("series");
    const int64_t step = l.at("step").get<int64_t>();
    tokens += l.at("tokens").get<double>();
    EXPECT_EQ(s.at("moetron_step").get<double>(), static_cast<double>(step));
    EXPECT_DOUBLE_EQ(s.at("moetron_loss").get<double>(), l.at("loss").get<double>());
    EXPECT_DOUBLE_EQ(s.at("moetron_learning_rate").get<double>(), l.at("lr").get<double>());
    EXPECT_DOUBLE_EQ(s.at("moetron_tokens_total").get<double>(), tokens);
    EXPECT_GT(s.at(R"(moetron_phase_seconds{phase="forward"})").get<double>(), 0);
    EXPECT_GT(s.at(R"(moetron_phase_seconds{phase="backward"})").get<double>(), 0);
    EXPECT_GT(s.at(R"(moetron_memory_peak_bytes{tag="params"})").get<double>(), 0);
    EXPECT_GT(l.at("time").get<double>(), 1.7e9);
    // Each MoE layer's loads are shares of its routed slots.
    std::map<std::string, double> per_layer;
    for (const auto& [key, v] : s.items()) {
      if (key.rfind("moetron_expert_load_ratio{", 0) == 0) {
        per_layer[key.substr(0, key.find(','))] += v.get<double>();
      }
    }
    ASSERT_EQ(per_layer.size(), 3u);  // tiny: 3 of its 4 layers are MoE
    for (const auto& [layer, sum] : per_layer) EXPECT_NEAR(sum, 1.0, 1e-12) << layer;
    if (step % 2 != 0) continue;
    // The per-group gradient norms add up to the global one (before clipping).
    double squares = 0;
    int groups = 0;
    for (const auto& [key, v] : s.items()) {
      if (key.rfind("moetron_param_grad_norm{", 0) == 0) {
        squares += v.get<double>() * v.get<double>();
        ++groups;
      }
      if (key.rfind("moetron_param_update_ratio{", 0) == 0) {
        EXPECT_GT(v.get<double>(), 0) << key;
        EXPECT_LT(v.get<double>(), 1) << key;
      }
    }
    EXPECT_GT(groups, 20);
    EXPECT_NEAR(std::sqrt(squares), l.at("grad_norm").get<double>(),
                1e-9 * l.at("grad_norm").get<double>());
    EXPECT_GT(s.at(R"(moetron_activation_rms{layer="3"})").get<double>(), 0);
    EXPECT_TRUE(s.contains(R"(moetron_router_bias{layer="1",expert="0"})"));
  }
  const std::vector<nlohmann::json> events = read_lines(dir + "/events.jsonl");
  std::vector<std::string> kinds;
  for (const nlohmann::json& e : events) kinds.push_back(e.at("kind").get<std::string>());
  EXPECT_EQ(kinds, (std::vector<std::string>{"start", "checkpoint", "checkpoint", "stop"}));
  EXPECT_EQ(events[1].at("step").get<int64_t>(), 2);
  EXPECT_GT(events[1].at("bytes").get<int64_t>(), 0);
  EXPECT_EQ(events[0].at("layout").at("dp").get<int64_t>(), 1);
  // The last save is in the registry too.
  EXPECT_EQ(t.monitor().registry().get("moetron_checkpoints_total").value(), 2);
}

TEST(Monitoring, ResumeIsAnEventWithItsLoadTime) {
  const std::string dir = fresh_run("monitor-resume");
  { Trainer(test::tiny_train_config({"train.steps=2"}), dir, false).run(); }
  Trainer t(test::tiny_train_config({"train.steps=3"}), dir, true);
  t.run();
  const std::vector<nlohmann::json> events = read_lines(dir + "/events.jsonl");
  ASSERT_GE(events.size(), 4u);
  const nlohmann::json& resume = events[3];
  EXPECT_EQ(resume.at("kind"), "resume");
  EXPECT_EQ(resume.at("step").get<int64_t>(), 2);
  EXPECT_GT(t.monitor().registry().get("moetron_checkpoint_load_seconds").value(), 0);
}

TEST(Monitoring, DisabledWritesNoSeriesAndNoEvents) {
  const std::string dir = fresh_run("monitor-off");
  Trainer t(test::tiny_train_config({"train.steps=2", "monitor.enabled=false"}), dir, false);
  t.run();
  for (const nlohmann::json& l : read_lines(dir + "/metrics.jsonl")) {
    EXPECT_FALSE(l.contains("series"));
  }
  EXPECT_FALSE(fs::exists(dir + "/events.jsonl"));
}

// A port another server holds: the run stops naming the port, unless
// monitor.required = false, when it trains without a server.
TEST(Monitoring, APortInUseStopsTheRunUnlessTheServerIsNotRequired) {
  monitor::Registry other;
  monitor::ServerOptions opts;
  opts.port = 0;
  const monitor::MonitorServer holder(other, opts);
  const std::string port = std::to_string(holder.port());
  const std::string refused = test::error_of([&] {
    Trainer t(
        test::tiny_train_config({"train.steps=1", "monitor.serve=true", "monitor.port=" + port}),
        fresh_run("port-in-use"), false);
  });
  EXPECT_NE(refused.find("monitor.port " + port), std::string::npos) << refused;
  const std::string dir = fresh_run("port-in-use-not-required");
  Trainer t(test::tiny_train_config({"train.steps=2", "monitor.serve=true", "monitor.port=" + port,
                                     "monitor.required=false"}),
            dir, false);
  EXPECT_EQ(t.monitor().server_url(), "");
  t.run();
  EXPECT_EQ(read_lines(dir + "/metrics.jsonl").size(), 2u);
  EXPECT_FALSE(fs::exists(dir + "/monitor.url"));
}

TEST(Monitoring, SettingsAreChecked) {
  EXPECT_NE(
      test::error_of([] { test::tiny_train_config({"monitor.port=70000"}); }).find("monitor.port"),
      std::string::npos);
  EXPECT_NE(test::error_of([] {
              test::tiny_train_config({"monitor.serve=true", "monitor.enabled=false"});
            }).find("monitor.serve"),
            std::string::npos);
  EXPECT_NE(test::error_of([] {
              test::tiny_train_config({"monitor.straggler_margin=0"});
            }).find("monitor.straggler_margin"),
            std::string::npos);
}

}  // namespace
}  // namespace moetron::train
