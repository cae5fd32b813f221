// The moetron binary as a new user meets it: --version, --help with
// defaults, errors as sentences (the location with --verbose), refused bad
// input, a run directory where a checkpoint is asked for, export's
// architecture, a simulated `srun` task, and the README's usage block.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"
#include "moetron/planner/cost_model.h"
#include "moetron/planner/hardware_profile.h"
#include "moetron/train/config.h"

namespace moetron {
namespace {

namespace fs = std::filesystem;

const std::string& root() {
  static const std::string dir = [] {
    const std::string r =
        (fs::temp_directory_path() / ("moetron_cli_" + std::to_string(::getpid()))).string();
    remove_tree(r);
    fs::create_directories(r + "/text");
    std::ofstream f(r + "/text/notes");
    const char* words[] = {"red",  "fox",   "runs", "past", "old",
                           "barn", "under", "grey", "sky",  "slowly"};
    for (int d = 0; d < 300; ++d) {
      f << words[d % 10] << " " << words[(d * 7) % 10] << " " << words[(d * 3 + 1) % 10]
        << ".\n%\n";
    }
    return r;
  }();
  return dir;
}

std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

struct Outcome {
  int code = -1;
  std::string out, err;
};

Outcome run(const std::string& args, const std::string& env = "") {
  static int n = 0;
  const std::string base = root() + "/cmd" + std::to_string(n++);
  const int status = std::system(
      (env + " " + MOETRON_BINARY + " " + args + " >" + base + ".out 2>" + base + ".err").c_str());
  Outcome r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = slurp(base + ".out");
  r.err = slurp(base + ".err");
  return r;
}

const std::string& corpus() {
  static const std::string dir = [] {
    const std::string d = root() + "/prepared";
    const Outcome r = run("prepare-data --input " + root() + "/text --out " + d +
                          " --vocab-size 300 --val-fraction 0.1");
    if (r.code != 0) throw Error("prepare-data failed: " + r.err);
    return d;
  }();
  return dir;
}

std::string train_args(const std::string& out, const std::string& extra = "") {
  return "train --config " MOETRON_SOURCE_DIR "/configs/tiny.toml --out " + out +
         " --set data.path=" + corpus() + " --set train.steps=2 --set train.eval_batches=1 " +
         extra;
}

TEST(Cli, VersionAndHelpWithDefaults) {
  Outcome r = run("--version");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("moetron 0."), std::string::npos) << r.out;
  r = run("generate --help");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("=0.8"), std::string::npos) << "no default shown: " << r.out;
  EXPECT_NE(r.out.find("=40"), std::string::npos) << r.out;
  r = run("launch --help");
  EXPECT_NE(r.out.find("=600"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--hostfile"), std::string::npos) << r.out;
}

TEST(Cli, ErrorsAreSentencesAndVerboseAddsTheLocation) {
  const std::string dir = root() + "/a_directory";
  fs::create_directories(dir);
  Outcome r = run("train --config " + dir + " --out " + root() + "/never");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("error: config '" + dir + "' is a directory"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("check failed"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(".cpp:"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(root() + "/never"));
  r = run("train --verbose --config " + dir + " --out " + root() + "/never");
  EXPECT_NE(r.err.find("config.cpp:"), std::string::npos) << r.err;
  const std::string empty = root() + "/empty.toml";
  std::ofstream(empty).close();
  r = run("train --config " + empty + " --out " + root() + "/never");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("is empty"), std::string::npos) << r.err;
  r = run("train --config " MOETRON_SOURCE_DIR "/configs/tiny.toml --out x --set model.foo=3");
  EXPECT_NE(r.err.find("did you mean 'model."), std::string::npos) << r.err;
}

TEST(Cli, GenerateTakesARunDirectoryAndRefusesANegativeTemperature) {
  const std::string out = root() + "/gen_run";
  Outcome r = run(train_args(out));
  ASSERT_EQ(r.code, 0) << r.err;
  r = run("generate --checkpoint " + out + " --prompt 'red fox' --max-new-tokens 4");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("red fox"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("checkpoints/step-2"), std::string::npos) << r.err;
  r = run("generate --checkpoint " + out + " --prompt x --temperature -1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--temperature: must be 0 or more, got -1"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("17976931348623157"), std::string::npos) << r.err;  // no DBL_MAX range
  r = run("generate --checkpoint " + out + " --prompt x --top-k=-2");
  EXPECT_NE(r.err.find("--top-k: must be 0 or more, got -2"), std::string::npos) << r.err;
  r = run("generate --checkpoint " + root() + " --prompt x");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("neither a checkpoint"), std::string::npos) << r.err;
}

TEST(Cli, ExportNamesTheArchitectureItCanRepresent) {
  // tiny.toml has a dense first layer: not a Mixtral.
  const std::string dense = root() + "/export_dense";
  ASSERT_EQ(run(train_args(dense)).code, 0);
  Outcome r = run("export --checkpoint " + dense + " --out " + dense + "/hf");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("cannot export"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("dense layers ('model.layers.0.mlp."), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dense + "/hf"));
  r = run("export --tensors-only --checkpoint " + dense + " --out " + dense + "/raw");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(dense + "/raw/model.safetensors"));
  EXPECT_FALSE(fs::exists(dense + "/raw/config.json"));
  // Every layer routed: Mixtral, as before.
  const std::string moe = root() + "/export_moe";
  ASSERT_EQ(run(train_args(moe, "--set moe.first_dense_layers=0")).code, 0);
  r = run("export --checkpoint " + moe + " --out " + moe + "/hf");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(slurp(moe + "/hf/config.json").find("MixtralForCausalLM"), std::string::npos);
}

TEST(Cli, ExportKeepsASlidingWindowMixtralReadsAndRefusesOneItCannot) {
  // Every layer local, no global tokens: Mixtral's own sliding_window.
  const std::string local = root() + "/export_local";
  ASSERT_EQ(run(train_args(local, "--set moe.first_dense_layers=0 --set attention.window=3")).code,
            0);
  Outcome r = run("export --checkpoint " + local + " --out " + local + "/hf");
  EXPECT_EQ(r.code, 0) << r.err;
  const std::string config = slurp(local + "/hf/config.json");
  EXPECT_NE(config.find("\"sliding_window\": 3"), std::string::npos) << config;
  EXPECT_NE(config.find("\"sliding_attention\""), std::string::npos) << config;
  // A local and a global layer: Mixtral would window both.
  const std::string mixed = root() + "/export_mixed";
  ASSERT_EQ(run(train_args(mixed,
                           "--set moe.first_dense_layers=0 --set attention.window=3 "
                           "--set attention.layer_pattern=LG"))
                .code,
            0);
  r = run("export --checkpoint " + mixed + " --out " + mixed + "/hf");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("mixes sliding-window and full-attention layers"), std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(mixed + "/hf"));
  EXPECT_NE(slurp(mixed + "/checkpoints/step-2/config.json").find("\"full_attention\""),
            std::string::npos);
}

TEST(Cli, ASrunTaskIsDetectedAsARank) {
  // What `srun -n 1 moetron train ...` sets (no mpirun): the task joins MPI
  // as rank 0 of 1 and reports for the job.
  const std::string out = root() + "/srun_run";
  const Outcome r = run(train_args(out), "SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_LOCALID=0");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("trained 2 steps"), std::string::npos) << r.out;
}

// prepare-data's new options: a bad value is named and nothing is written;
// good ones print what was made (document lengths, the retrieval layout).
TEST(Cli, PrepareDataRefusesBadDocumentsAndRetrievalOptionsWritingNothing) {
  const std::string out = root() + "/never";
  Outcome r = run("prepare-data --input " + root() + "/text --out " + out + " --documents lines");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--documents"), std::string::npos) << r.err;
  r = run("prepare-data --task retrieval --seq-len 40 --out " + out);  // key within 64
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--seq-len 40 is too small"), std::string::npos) << r.err;
  r = run("prepare-data --task tokens --input " + root() + "/text --out " + out);
  EXPECT_NE(r.err.find("--task"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(out));
  for (const auto& e : fs::directory_iterator(root()))
    EXPECT_EQ(e.path().filename().string().find("never"), std::string::npos) << e.path();

  fs::create_directories(root() + "/two");
  fs::copy_file(root() + "/text/notes", root() + "/two/a");
  std::ofstream(root() + "/two/b") << slurp(root() + "/text/notes") << "one more line\n";
  r = run("prepare-data --input " + root() + "/two --out " + root() +
          "/whole --documents whole-file --vocab-size 280");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("documents (whole-file): 2, tokens per document mean"), std::string::npos)
      << r.out;
  r = run("prepare-data --task retrieval --seq-len 80 --examples 20 --vocab-size 128 --out " +
          root() + "/retrieval");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("19 train + 1 validation examples of seq_len 80"), std::string::npos)
      << r.out;
}

TEST(Cli, TheReadmeUsageBlockListsEveryCommand) {
  const std::string readme = slurp(MOETRON_SOURCE_DIR "/README.md");
  const size_t start = readme.find("The binary, `build/moetron`:");
  ASSERT_NE(start, std::string::npos);
  const size_t end = readme.find("```", readme.find("```", start) + 3);
  const std::string block = readme.substr(start, end - start);
  for (const char* cmd : {"moetron prepare-data", "moetron train", "moetron generate",
                          "moetron eval", "moetron plan", "moetron memory", "moetron launch",
                          "moetron export", "MOETRON_INJECT_FAILURE", "--version"}) {
    EXPECT_NE(block.find(cmd), std::string::npos) << cmd << " missing from:\n" << block;
  }
}

// `moetron calibrate` under mpirun writes a profile the planner reads, and
// `moetron plan --cluster` searches with it; without mpirun it says how to run.
TEST(Cli, CalibrateWritesAProfileThatPlanSearchesWith) {
  const Outcome alone = run("calibrate --out " + root() + "/never.toml");
  EXPECT_NE(alone.code, 0);
  EXPECT_NE(alone.err.find("mpirun -n 2"), std::string::npos) << alone.err;
  EXPECT_FALSE(std::filesystem::exists(root() + "/never.toml"));
  const std::string profile = root() + "/calibrated.toml";
  const Outcome cal = run("calibrate --seq-len 128 --out " + profile,
                          "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                          "mpirun -n 2 --oversubscribe --bind-to none");
  ASSERT_EQ(cal.code, 0) << cal.err;
  const planner::HardwareProfile p = planner::load_hardware_profile(profile);
  EXPECT_GT(p.peak_flops, 1e9);
  EXPECT_GT(p.intra.bandwidth, 0);
  EXPECT_EQ(p.sources.size(), 16u);
  const Outcome plan =
      run("plan --config " MOETRON_SOURCE_DIR "/configs/tiny.toml --cluster 1x2 --device " +
          profile + " --top 3 --json " + root() + "/plans.json");
  ASSERT_EQ(plan.code, 0) << plan.err;
  EXPECT_NE(plan.out.find("exhaustive: "), std::string::npos) << plan.out;
  const nlohmann::json j = nlohmann::json::parse(slurp(root() + "/plans.json"));
  ASSERT_FALSE(j.at("plans").empty());
  EXPECT_LE(j.at("plans").size(), 3u);
  // One given layout that the model cannot split: the reason, and no file.
  const Outcome bad = run("plan --config " MOETRON_SOURCE_DIR
                          "/configs/scale/moe-1.6t.toml --cluster 2x8 --device h200 "
                          "--layout tp=3,pp=1,dp=1,cp=1 --json " +
                          root() + "/bad.json");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("dp x tp x pp x cp"), std::string::npos) << bad.err;
  EXPECT_FALSE(std::filesystem::exists(root() + "/bad.json"));
}

// parallel.auto under mpirun: the planner's layout is printed before
// training, and the run trains with it (the checkpoint's config says so).
TEST(Cli, TrainWithParallelAutoPrintsAndRunsThePlannersLayout) {
  const std::string out = root() + "/auto";
  const Outcome r = run(train_args(out, "--set parallel.auto=true --set train.global_batch=8"),
                        "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                        "OMP_NUM_THREADS=1 mpirun -n 2 --oversubscribe --bind-to none");
  ASSERT_EQ(r.code, 0) << r.err;
  const size_t at = r.out.find("parallel.auto: dp=");
  ASSERT_NE(at, std::string::npos) << r.out;
  EXPECT_LT(at, r.out.find("trained 2 steps")) << r.out;
  const std::string layout = r.out.substr(at + 15, r.out.find(' ', at + 15) - at - 15);
  const planner::LayoutChoice l = planner::parse_layout(layout, 2);
  std::string saved;
  for (const auto& e : std::filesystem::recursive_directory_iterator(out)) {
    if (e.path().filename() == "moetron.toml") saved = e.path().string();
  }
  ASSERT_FALSE(saved.empty()) << "no checkpoint config under " << out;
  const train::Config cfg = train::load_config(saved);
  EXPECT_EQ(cfg.parallel.tp, l.tp);
  EXPECT_EQ(cfg.parallel.pp, l.pp);
  EXPECT_EQ(cfg.parallel.cp, l.cp);
  EXPECT_EQ(cfg.parallel.zero, l.zero1);
  EXPECT_EQ(cfg.train.micro_batch, l.micro_batch);
}

TEST(Cli, PlanTakesAPresetAndSearchesWithReinforcementLearning) {
  const Outcome rl =
      run("plan --model mixtral-8x7b --cluster 8x8 --device h200 --top 1 "
          "--search both --seed 3 --json " +
          root() + "/rl.json");
  ASSERT_EQ(rl.code, 0) << rl.err;
  const nlohmann::json j = nlohmann::json::parse(slurp(root() + "/rl.json"));
  EXPECT_GT(j.at("rl").at("evaluations").get<int64_t>(), 0);
  EXPECT_LT(j.at("rl").at("evaluations").get<int64_t>(),
            j.at("exhaustive").at("evaluated").get<int64_t>());
  EXPECT_LE(j.at("rl").at("gap_to_exhaustive").get<double>(), 0.02);
  EXPECT_EQ(j.at("plans").size(), 1u);
  EXPECT_NE(rl.out.find("4.67e+10 parameters"), std::string::npos) << rl.out;
  const Outcome unknown = run("plan --model mixtral-8x9b --cluster 8x8");
  EXPECT_NE(unknown.code, 0);
  EXPECT_NE(unknown.err.find("configs/scale/mixtral-8x9b.toml"), std::string::npos) << unknown.err;
  // --fix, --muon: the best layout without ep, and Muon's two updates.
  const Outcome fixed =
      run("plan --model mixtral-8x7b --cluster 8x8 --device h200 --top 1 "
          "--fix ep=1 --muon --json " +
          root() + "/fixed.json");
  ASSERT_EQ(fixed.code, 0) << fixed.err;
  const nlohmann::json f = nlohmann::json::parse(slurp(root() + "/fixed.json"));
  EXPECT_EQ(f.at("plans").at(0).at("ep").get<int64_t>(), 1);
  EXPECT_LE(f.at("muon_update").at("owner_s").get<double>(),
            f.at("muon_update").at("replicated_s").get<double>());
  EXPECT_NE(fixed.out.find("1-D vs 2-D tp: "), std::string::npos) << fixed.out;
  // moetron simulate: the same preset's best plan as a Chrome trace.
  const Outcome sim = run("simulate --model mixtral-8x7b --cluster 2x8 --device h100 --trace " +
                          root() + "/trace.json");
  ASSERT_EQ(sim.code, 0) << sim.err;
  const nlohmann::json trace = nlohmann::json::parse(slurp(root() + "/trace.json"));
  EXPECT_GT(trace.at("traceEvents").size(), 10u);
  EXPECT_NEAR(trace.at("otherData").at("timeline_end_s").get<double>(),
              trace.at("otherData").at("predicted_step_s").get<double>(), 1e-9);
  EXPECT_NE(sim.out.find("trace: "), std::string::npos) << sim.out;
  const Outcome bad_sim = run("simulate --model mixtral-8x7b --cluster 2x8 --layout tp=5 --trace " +
                              root() + "/bad_trace.json");
  EXPECT_NE(bad_sim.code, 0);
  EXPECT_FALSE(std::filesystem::exists(root() + "/bad_trace.json"));
  const Outcome neither = run("plan --cluster 8x8");
  EXPECT_NE(neither.code, 0);
  EXPECT_NE(neither.err.find("--config FILE or --model PRESET"), std::string::npos) << neither.err;
}

}  // namespace
}  // namespace moetron
