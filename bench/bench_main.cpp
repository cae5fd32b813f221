// moetron_bench_kernels [--quick] [--filter SUBSTR] [--threads 1,2] [--json FILE] [--warmup N]
//   long_sequence (opt-in: --filter long_sequence) also reads
//   [--long-modes full,hybrid,hybrid_chunked] [--long-seqs 4096,8192,...] [--long-chunk C]
//   [--long-window W] [--long-pattern LLLLLG] [--long-max-gb G] [--long-max-seconds T]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "bench_util.h"
#include "moetron/core/error.h"
#include "moetron/core/threading.h"

namespace moetron::bench {

std::vector<Family>& registry() {
  static std::vector<Family> r;
  return r;
}

Registration::Registration(const char* name, BenchFn fn, bool opt_in) {
  registry().push_back({name, std::move(fn), opt_in});
}

double Runner::time_median(const std::function<void()>& fn, double min_seconds) const {
  using clock = std::chrono::steady_clock;
  if (quick_) min_seconds = std::min(min_seconds, 0.05);
  for (int i = 0; i < opts_.warmup; ++i) fn();
  std::vector<double> t;
  const auto start = clock::now();
  while (t.size() < 3 ||
         std::chrono::duration<double>(clock::now() - start).count() < min_seconds) {
    const auto a = clock::now();
    fn();
    t.push_back(std::chrono::duration<double>(clock::now() - a).count());
    if (t.size() >= 1000) break;
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

void Runner::record(Result r) {
  r.labels["threads"] = std::to_string(threads_);
  std::ostringstream line;
  line << r.name;
  for (const auto& [k, v] : r.labels) line << "  " << k << "=" << v;
  line << "  |";
  for (const auto& [k, v] : r.metrics) line << "  " << k << "=" << v;
  std::cout << line.str() << std::endl;
  results_.push_back(std::move(r));
}

namespace {

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  std::string tok;
  while (std::getline(ss, tok, ',')) out.push_back(tok);
  return out;
}

}  // namespace

}  // namespace moetron::bench

int main(int argc, char** argv) {
  using namespace moetron::bench;
  bool quick = false;
  std::string filter, json_path;
  std::vector<int> threads = {1, 2};
  Options opts;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "error: " << a << " needs a value\n";
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--quick") {
      quick = true;
    } else if (a == "--filter") {
      filter = value();
    } else if (a == "--json") {
      json_path = value();
    } else if (a == "--threads") {
      threads.clear();
      for (const auto& tok : split(value())) threads.push_back(std::stoi(tok));
    } else if (a == "--warmup") {
      opts.warmup = std::stoi(value());
    } else if (a == "--long-modes") {
      opts.long_seq.modes = split(value());
    } else if (a == "--long-seqs") {
      opts.long_seq.seqs.clear();
      for (const auto& tok : split(value())) opts.long_seq.seqs.push_back(std::stoll(tok));
    } else if (a == "--long-chunk") {
      opts.long_seq.chunk = std::stoll(value());
    } else if (a == "--long-pattern") {
      opts.long_seq.pattern = value();
    } else if (a == "--long-window") {
      opts.long_seq.window = std::stoll(value());
    } else if (a == "--long-max-gb") {
      opts.long_seq.max_gb = std::stod(value());
    } else if (a == "--long-max-seconds") {
      opts.long_seq.max_seconds = std::stod(value());
    } else {
      std::cerr << "error: unknown argument '" << a
                << "' (expected --quick, --filter SUBSTR, --threads LIST, --json FILE, --warmup N,"
                   " --long-modes LIST, --long-seqs LIST, --long-chunk C, --long-window W, "
                   "--long-pattern P,"
                   " --long-max-gb G, --long-max-seconds T)\n";
      return 2;
    }
  }
  nlohmann::json out = nlohmann::json::array();
  try {
    for (int t : threads) {
      moetron::init_compute_threads(t);
      Runner runner(quick, t, opts);
      for (auto& fam : registry()) {
        if (fam.opt_in ? filter != fam.name
                       : !filter.empty() && fam.name.find(filter) == std::string::npos)
          continue;
        fam.fn(runner);
      }
      for (const auto& r : runner.results()) {
        out.push_back({{"name", r.name}, {"labels", r.labels}, {"metrics", r.metrics}});
      }
    }
  } catch (const moetron::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
    std::cout << "wrote " << json_path << "\n";
  } else {
    std::cout << out.dump() << "\n";
  }
  return 0;
}
