#include "moetron/train/resume_check.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "moetron/core/error.h"

namespace moetron::train {

namespace fs = std::filesystem;

std::vector<std::string> model_config_keys() {
  static const std::vector<std::string> not_model = {"model.init_std", "moe.aux_loss_coef",
                                                     "moe.z_loss_coef", "moe.bias_update_rate"};
  std::vector<std::string> keys;
  for (const std::string& k : config_keys()) {
    const bool model =
        k.starts_with("model.") || k.starts_with("moe.") || k.starts_with("attention.");
    if (model && std::find(not_model.begin(), not_model.end(), k) == not_model.end())
      keys.push_back(k);
  }
  return keys;
}

std::string model_signature(const Config& cfg) {
  std::string s;
  for (const std::string& k : model_config_keys()) s += k + " = " + config_value(cfg, k) + "\n";
  return s;
}

std::vector<std::string> changed_model_keys(const Config& saved, const Config& now,
                                            const std::vector<std::string>& allowed) {
  std::vector<std::string> out;
  for (const std::string& k : model_config_keys()) {
    const std::string a = config_value(saved, k), b = config_value(now, k);
    if (a != b && std::find(allowed.begin(), allowed.end(), k) == allowed.end())
      out.push_back(k + ": " + a + " -> " + b);
  }
  return out;
}

void check_resume_config(const Config& saved, const Config& now,
                         const std::vector<std::string>& allowed, const std::string& checkpoint) {
  for (const std::string& k : allowed) (void)config_value(now, k, "--allow-config-change");
  const std::vector<std::string> changed = changed_model_keys(saved, now, allowed);
  if (changed.empty()) return;
  std::string list, keys;
  for (const std::string& c : changed) {
    if (!list.empty()) {
      list.append("; ");
      keys.append(",");
    }
    list.append(c);
    keys.append(c, 0, c.find(':'));
  }
  MOETRON_FAIL("--resume: this run's config builds another model than checkpoint '", checkpoint,
               "' holds (", list,
               "); resume with the checkpoint's values, train into a new --out, ",
               "or allow the change explicitly with --allow-config-change ", keys);
}

std::vector<std::string> existing_run_files(const std::string& run_dir) {
  std::vector<std::string> found;
  const fs::path ckpts = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  if (fs::is_directory(ckpts, ec)) {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(ckpts, ec)) {
      const std::string name = e.path().filename().string();
      if (name.starts_with("step-") && name.find(".tmp-") == std::string::npos)
        names.push_back("checkpoints/" + name);
    }
    std::sort(names.begin(), names.end());
    found.insert(found.end(), names.begin(), names.end());
  }
  const fs::path metrics = fs::path(run_dir) / "metrics.jsonl";
  if (fs::is_regular_file(metrics, ec) && fs::file_size(metrics, ec) > 0) {
    std::ifstream f(metrics);
    const auto lines = std::count(std::istreambuf_iterator<char>(f), {}, '\n');
    found.push_back("metrics.jsonl (" + std::to_string(lines) + " lines)");
  }
  return found;
}

}  // namespace moetron::train
