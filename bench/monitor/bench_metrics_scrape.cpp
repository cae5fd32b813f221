// Latency of a Prometheus scrape of /metrics (issue 20): a registry holding
// the training catalogue as rank 0 of a 64-rank bench-moe job exposes it,
// served by MonitorServer on a free loopback port, scraped many times by a
// cpp-httplib client (a kept-alive connection, as Prometheus keeps one, and
// a new connection per scrape; plain text and gzip, which Prometheus asks
// for), with the registry idle and while a thread rewrites every series in a
// loop as the training thread would each step (a worst case: training writes
// once a step, seconds apart). Per case: p50/p90/p99/max latency and bytes
// on the wire per scrape; with the writer, how long one pass of its writes
// takes while scrapes hold the registry's lock.
//
//   build/bench/moetron_bench_metrics_scrape [--ranks 64] [--requests 400] [--json FILE]
//
// What the 64 ranks expose (bench-moe, ep 8 x dp 64, pp 1): every per-rank
// series for each rank, every MoE layer's per-expert loads and biases, the
// per-(layer, matrix group) norms of the whole model, the activation RMS per
// layer, memory per tag, and communication counters for every axis and op
// the communicators count (an upper bound: a real rank uses fewer pairs).
// Every scrape must answer 200 with the whole exposition (its sample count
// is checked), or the benchmark fails.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "moetron/core/error.h"
#include "moetron/monitor/http_server.h"
#include "moetron/monitor/prometheus_text.h"
#include "moetron/nn/parameter_inventory.h"
#include "moetron/train/config.h"
#include "moetron/train/layer_stats.h"
#include "moetron/train/training_metrics.h"

namespace {

using namespace moetron;
using clock_type = std::chrono::steady_clock;

struct Options {
  std::string config = MOETRON_SOURCE_DIR "/configs/bench-moe.toml", json_path;
  int ranks = 64;
  int64_t requests = 400;
};

// What one "step" of the simulated job writes, built once.
struct Job {
  train::Config cfg;
  int ranks = 0;
  std::vector<std::string> moe_layers;
  std::vector<std::pair<std::string, std::string>> groups;  // (layer, matrix group)
};

Job make_job(const Options& o) {
  Job j;
  j.cfg = train::load_config(o.config);
  j.ranks = o.ranks;
  const nn::ParamInventory inv =
      nn::parameter_inventory(j.cfg.model, j.cfg.moe, nn::Precision::fp32(), nn::ExpertParallel{},
                              nn::TensorParallel{}, {});
  for (const nn::ParamInfo& p : inv.params) {
    const auto key = train::layer_group_of(p.name);
    if (std::find(j.groups.begin(), j.groups.end(), key) == j.groups.end()) j.groups.push_back(key);
  }
  for (int64_t l = 0; l < j.cfg.model.n_layers; ++l) {
    if (nn::layer_is_moe(j.cfg.moe, l)) j.moe_layers.push_back(std::to_string(l));
  }
  return j;
}

// Every series the job exposes, values varying with `step`.
void write_step(train::TrainingMetrics& m, monitor::Registry& r, const Job& j, int64_t step) {
  const double s = static_cast<double>(step);
  train::StepRecord rec;
  rec.step = step;
  rec.loss = 3 + 1 / (1 + s);
  rec.lr = 1e-3;
  rec.grad_norm = 0.5;
  rec.tokens = 4096 * j.ranks;
  rec.step_s = 5 + 0.01 * std::sin(s);
  rec.forward_s = 1.5;
  rec.backward_s = 3;
  m.record_step(rec);
  const int64_t experts = j.cfg.moe.num_experts;
  for (const std::string& l : j.moe_layers) {
    std::vector<int64_t> load;
    std::vector<double> bias;
    for (int64_t e = 0; e < experts; ++e) {
      load.push_back(1000 + (step + e) % 97);
      bias.push_back(1e-3 * static_cast<double>(e));
    }
    m.record_moe_layer(l, load, bias);
  }
  std::vector<train::GroupNorms> norms;
  for (const auto& [layer, group] : j.groups) {
    norms.push_back({layer, group, 0.1, 10 + 0.001 * s, 0.01, true, true});
  }
  m.record_layer_norms(norms);
  m.record_activation_rms(std::vector<double>(static_cast<size_t>(j.cfg.model.n_layers), 1.0));
  std::vector<train::RankTimes> ranks(static_cast<size_t>(j.ranks), {rec.step_s, 4.5, 0.01, 0.5});
  m.record_ranks(ranks, std::vector<bool>(ranks.size(), false));
  MemStats mem;
  mem.current.fill(1 << 20);
  mem.peak.fill(2 << 20);
  m.record_memory(mem, 64 << 20);
  // The counters record_comm would add to, for every axis and op.
  for (const char* axis :
       {"world", "tp", "ep", "pp", "stage", "moe_balance", "dp", "dp_partial", "expert_dp"}) {
    for (const char* op : {"allreduce", "allgather", "reduce_scatter", "alltoall", "alltoallv",
                           "broadcast", "send", "recv", "barrier"}) {
      r.get("moetron_comm_bytes_total").add({axis, op}, 1 << 20);
      r.get("moetron_comm_seconds_total").add({axis, op}, 1e-3);
      r.get("moetron_comm_calls_total").add({axis, op}, 1);
    }
  }
}

std::vector<std::pair<std::string, int64_t>> layout(int ranks) {
  return {{"world", ranks}, {"dp", ranks}, {"tp", 1},           {"pp", 1},
          {"vpp", 1},       {"ep", 8},     {"micro_batches", 1}};
}

double percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const auto i = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - 1;
  return v[std::min(i, v.size() - 1)];
}

// Samples a full exposition of `snapshot` has: one per series, a histogram
// one per bucket (+Inf included) plus _sum and _count.
int64_t expected_samples(const monitor::Snapshot& snapshot) {
  int64_t n = 0;
  for (const monitor::MetricSnapshot& m : snapshot) {
    const int64_t per = m.def.kind == monitor::MetricKind::histogram
                            ? static_cast<int64_t>(m.def.buckets.size()) + 3
                            : 1;
    n += per * static_cast<int64_t>(m.series.size());
  }
  return n;
}

struct Case {
  bool keep_alive = true, writing = false, gzip = false;
};

struct CaseResult {
  std::vector<double> latency_s;
  size_t bytes = 0;                  // on the wire (compressed under gzip)
  std::vector<double> write_pass_s;  // the writer's passes during the case
};

httplib::Headers encoding(bool gzip) {
  return {{"Accept-Encoding", gzip ? "gzip" : "identity"}};
}

// Scrapes `n` times, timing until the last byte arrived (the body is left
// compressed, as a scraper receives it); throws on any answer that is not
// 200 with a body.
CaseResult scrape(int port, int64_t n, const Case& c) {
  CaseResult out;
  httplib::Client kept("127.0.0.1", port);
  kept.set_keep_alive(true);
  kept.set_decompress(false);
  for (int64_t i = 0; i < n; ++i) {
    const auto t0 = clock_type::now();
    httplib::Result res = [&] {
      if (c.keep_alive) return kept.Get("/metrics", encoding(c.gzip));
      httplib::Client fresh("127.0.0.1", port);
      fresh.set_decompress(false);
      return fresh.Get("/metrics", encoding(c.gzip));
    }();
    out.latency_s.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
    MOETRON_CHECK(res && res->status == 200 && !res->body.empty(), "scrape ", i,
                  " failed: ", res ? std::to_string(res->status) : "no answer");
    out.bytes = res->body.size();
  }
  return out;
}

// One scrape as Prometheus asks for it (gzip), decompressed by the client:
// it must parse and hold every sample of the registry.
void check_exposition(int port, const monitor::Registry& r) {
  httplib::Client c("127.0.0.1", port);
  httplib::Result res = c.Get("/metrics", encoding(true));
  MOETRON_CHECK(res && res->status == 200, "the check scrape failed");
  const int64_t want = expected_samples(r.snapshot());
  const auto got = static_cast<int64_t>(monitor::parse_prometheus_text(res->body).samples.size());
  MOETRON_CHECK(got == want, "the scrape has ", got, " samples, the registry ", want);
}

// Runs one case: a writer thread (if asked) rewriting every series while the
// client scrapes.
CaseResult run_case(int port, int64_t n, const Case& c, train::TrainingMetrics& m,
                    monitor::Registry& r, const Job& j) {
  std::atomic<bool> stop{false};
  std::vector<double> passes;
  std::thread writer;
  if (c.writing) {
    writer = std::thread([&] {
      for (int64_t step = 1; !stop; ++step) {
        const auto t0 = clock_type::now();
        write_step(m, r, j, step);
        passes.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
      }
    });
  }
  CaseResult out = scrape(port, n, c);
  stop = true;
  if (writer.joinable()) writer.join();
  out.write_pass_s = std::move(passes);
  return out;
}

// The writer alone: one pass of every series' writes with nobody scraping.
double idle_write_pass(train::TrainingMetrics& m, monitor::Registry& r, const Job& j) {
  std::vector<double> t;
  for (int64_t step = 1; step <= 200; ++step) {
    const auto t0 = clock_type::now();
    write_step(m, r, j, step);
    t.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  return percentile(t, 0.5);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--ranks") {
      o.ranks = std::stoi(v);
    } else if (a == "--requests") {
      o.requests = std::stoll(v);
    } else if (a == "--json") {
      o.json_path = v;
    } else if (a == "--config") {
      o.config = v;
    } else {
      MOETRON_FAIL("unknown option ", a);
    }
  }
  MOETRON_CHECK(o.ranks >= 1 && o.requests >= 10, "--ranks must be >= 1 and --requests >= 10");
  return o;
}

nlohmann::json case_json(const Case& c, const CaseResult& res) {
  nlohmann::json row = {{"connection", c.keep_alive ? "keep-alive" : "new"},
                        {"encoding", c.gzip ? "gzip" : "identity"},
                        {"writer", c.writing},
                        {"requests", res.latency_s.size()},
                        {"p50_ms", 1e3 * percentile(res.latency_s, 0.5)},
                        {"p90_ms", 1e3 * percentile(res.latency_s, 0.9)},
                        {"p99_ms", 1e3 * percentile(res.latency_s, 0.99)},
                        {"max_ms", 1e3 * percentile(res.latency_s, 1.0)},
                        {"bytes", res.bytes}};
  if (c.writing && !res.write_pass_s.empty()) {
    row["write_passes"] = res.write_pass_s.size();
    row["write_pass_p50_ms"] = 1e3 * percentile(res.write_pass_s, 0.5);
    row["write_pass_p99_ms"] = 1e3 * percentile(res.write_pass_s, 0.99);
  }
  return row;
}

int run(const Options& o) {
  const Job job = make_job(o);
  monitor::Registry registry;
  train::TrainingMetrics metrics(registry);
  metrics.record_layout(layout(o.ranks), "bf16", job.cfg.optim.name);
  write_step(metrics, registry, job, 0);
  const double idle_pass = idle_write_pass(metrics, registry, job);
  monitor::ServerOptions so;
  so.port = 0;
  monitor::MonitorServer server(registry, so);
  check_exposition(server.port(), registry);
  const std::string text = monitor::prometheus_text(registry.snapshot());
  const int64_t samples = expected_samples(registry.snapshot());
  nlohmann::json rows = nlohmann::json::array();
  for (const bool gzip : {false, true}) {
    for (const bool writing : {false, true}) {
      for (const bool keep_alive : {true, false}) {
        const Case c{keep_alive, writing, gzip};
        rows.push_back(
            case_json(c, run_case(server.port(), o.requests, c, metrics, registry, job)));
      }
    }
  }
  const nlohmann::json res = {{"bench", "metrics_scrape"},
                              {"ranks", o.ranks},
                              {"series", registry.series_count()},
                              {"samples", samples},
                              {"write_pass_idle_ms", 1e3 * idle_pass},
                              {"cases", rows}};
  std::printf("/metrics of %d simulated ranks (bench-moe): %lld series, %lld samples, %zu bytes\n",
              o.ranks, static_cast<long long>(registry.series_count()),
              static_cast<long long>(samples), text.size());
  std::printf("one pass of every series' writes, nobody scraping: %.3f ms\n", 1e3 * idle_pass);
  std::printf("%-9s %-11s %-7s %9s %9s %9s %9s %9s %12s\n", "encoding", "connection", "writer",
              "p50 ms", "p90 ms", "p99 ms", "max ms", "bytes", "write p99 ms");
  for (const nlohmann::json& r : rows) {
    std::printf("%-9s %-11s %-7s %9.3f %9.3f %9.3f %9.3f %9zu %12s\n",
                r["encoding"].get<std::string>().c_str(),
                r["connection"].get<std::string>().c_str(), r["writer"].get<bool>() ? "yes" : "no",
                r["p50_ms"].get<double>(), r["p90_ms"].get<double>(), r["p99_ms"].get<double>(),
                r["max_ms"].get<double>(), r["bytes"].get<size_t>(),
                r.contains("write_pass_p99_ms")
                    ? std::to_string(r["write_pass_p99_ms"].get<double>()).c_str()
                    : "-");
  }
  std::cout << res.dump() << "\n";
  if (!o.json_path.empty()) std::ofstream(o.json_path) << res.dump(2) << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
