// moetron_bench_kernels [--quick] [--filter SUBSTR] [--threads 1,2] [--json FILE]
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

std::vector<std::pair<std::string, BenchFn>>& registry() {
  static std::vector<std::pair<std::string, BenchFn>> r;
  return r;
}

Registration::Registration(const char* name, BenchFn fn) {
  registry().emplace_back(name, std::move(fn));
}

double Runner::time_median(const std::function<void()>& fn, double min_seconds) const {
  using clock = std::chrono::steady_clock;
  if (quick_) min_seconds = std::min(min_seconds, 0.05);
  fn();
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

}  // namespace moetron::bench

int main(int argc, char** argv) {
  using namespace moetron::bench;
  bool quick = false;
  std::string filter, json_path;
  std::vector<int> threads = {1, 2};
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
      std::stringstream ss(value());
      std::string tok;
      while (std::getline(ss, tok, ',')) threads.push_back(std::stoi(tok));
    } else {
      std::cerr << "error: unknown argument '" << a
                << "' (expected --quick, --filter SUBSTR, --threads LIST, --json FILE)\n";
      return 2;
    }
  }
  nlohmann::json out = nlohmann::json::array();
  try {
    for (int t : threads) {
      moetron::init_compute_threads(t);
      Runner runner(quick, t);
      for (auto& [name, fn] : registry()) {
        if (!filter.empty() && name.find(filter) == std::string::npos) continue;
        fn(runner);
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
