#include "moetron/train/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "moetron/core/error.h"
#include "util/test_util.h"

namespace moetron::train {
namespace {

using test::error_of;

TEST(Config, ParsesSectionsAndOverrides) {
  const Config c =
      parse_config(R"(
[model]
d_model = 256
n_heads = 4
n_kv_heads = 2
[moe]
num_experts = 4
router_score = "sigmoid"
aux_loss_coef = 0
[optim]
lr = 1e-3
)",
                   "test.toml", {"model.n_layers=3", "train.precision=fp32", "optim.lr=0.5"});
  EXPECT_EQ(c.model.d_model, 256);
  EXPECT_EQ(c.model.resolved_head_dim(), 64);
  EXPECT_EQ(c.model.n_layers, 3);
  EXPECT_EQ(c.moe.router_score, "sigmoid");
  EXPECT_EQ(c.moe.aux_loss_coef, 0.0);  // an integer is accepted for a float key
  EXPECT_EQ(c.train.precision, "fp32");
  EXPECT_EQ(c.optim.lr, 0.5);
}

TEST(Config, PrecisionMemoryModesAreValidatedByKey) {
  const auto msg = [](const std::vector<std::string>& sets) {
    return error_of([&] { parse_config("", "x.toml", sets); });
  };
  const Config d = parse_config("", "x.toml");
  EXPECT_EQ(d.optim.moment_dtype, "fp32");
  EXPECT_EQ(d.train.grad_dtype, "fp32");
  const Config c = parse_config(
      "", "x.toml", {"optim.moment_dtype=bf16", "train.precision=bf16", "train.grad_dtype=bf16"});
  EXPECT_EQ(c.optim.moment_dtype, "bf16");
  EXPECT_EQ(c.train.grad_dtype, "bf16");
  EXPECT_NE(msg({"optim.moment_dtype=fp16"})
                .find("'optim.moment_dtype': must be fp32, bf16 or int8, got \"fp16\""),
            std::string::npos);
  EXPECT_NE(msg({"train.grad_dtype=f32"}).find("'train.grad_dtype': must be fp32 or bf16"),
            std::string::npos);
  // bf16 gradients need bf16 compute, named explicitly ("auto" is fp32 on CPUs without
  // AVX512-BF16).
  for (const char* p : {"train.precision=fp32", "train.precision=auto", "train.precision=fp16"}) {
    const std::string e = msg({"train.grad_dtype=bf16", p});
    EXPECT_NE(e.find("'train.grad_dtype': = bf16 needs train.precision = bf16"), std::string::npos)
        << p << ": " << e;
  }
}

TEST(Config, Int8MomentsNeedWholeTensorsOnEachRank) {
  const auto msg = [](const std::vector<std::string>& sets) {
    return error_of([&] { parse_config("", "x.toml", sets); });
  };
  EXPECT_EQ(parse_config("", "x.toml", {"optim.moment_dtype=int8"}).optim.moment_dtype, "int8");
  EXPECT_NE(
      msg({"optim.second_moment=factored"})
          .find("'optim.second_moment': = factored is built for optim.moment_dtype = \"int8\""),
      std::string::npos);
  EXPECT_NE(msg({"optim.second_moment=diagonal"}).find("'optim.second_moment': must be"),
            std::string::npos);
  for (const char* key : {"parallel.zero=true", "parallel.tp=2"}) {
    const std::string e = msg({"optim.moment_dtype=int8", key});
    EXPECT_NE(e.find("'optim.moment_dtype': = int8 keeps one scale per 256 values"),
              std::string::npos)
        << key << ": " << e;
  }
}

TEST(Config, Bf16MastersNeedBf16ComputeAndNoZero) {
  const auto msg = [](const std::vector<std::string>& sets) {
    return error_of([&] { parse_config("", "x.toml", sets); });
  };
  EXPECT_EQ(parse_config("", "x.toml").optim.master_dtype, "fp32");
  EXPECT_EQ(parse_config("", "x.toml", {"optim.master_dtype=bf16", "train.precision=bf16"})
                .optim.master_dtype,
            "bf16");
  EXPECT_NE(msg({"optim.master_dtype=fp16"})
                .find("'optim.master_dtype': must be fp32 or bf16, got \"fp16\""),
            std::string::npos);
  for (const char* p : {"train.precision=fp32", "train.precision=auto"}) {
    const std::string e = msg({"optim.master_dtype=bf16", p});
    EXPECT_NE(e.find("'optim.master_dtype': = bf16 needs train.precision = bf16"),
              std::string::npos)
        << p << ": " << e;
  }
  const std::string z =
      msg({"optim.master_dtype=bf16", "train.precision=bf16", "parallel.zero=true"});
  EXPECT_NE(z.find("'optim.master_dtype': = bf16 is not built for parallel.zero"),
            std::string::npos)
      << z;
}

TEST(Config, UnknownKeyNamesTheNearestValidKey) {
  const std::string e1 = error_of([] { parse_config("[model]\nd_modle = 3\n", "a.toml"); });
  EXPECT_NE(e1.find("unknown config key 'model.d_modle'"), std::string::npos) << e1;
  EXPECT_NE(e1.find("did you mean 'model.d_model'"), std::string::npos) << e1;
  EXPECT_NE(e1.find("a.toml"), std::string::npos) << e1;
  const std::string e2 = error_of([] { parse_config("", "a.toml", {"moe.topk=2"}); });
  EXPECT_NE(e2.find("did you mean 'moe.top_k'"), std::string::npos) << e2;
}

TEST(Config, InvalidValuesNameTheKeyAndTheRule) {
  const auto msg = [](const std::string& set) {
    return error_of([&] { parse_config("", "x.toml", {set}); });
  };
  EXPECT_NE(msg("moe.top_k=9").find("'moe.top_k': must be in [1, moe.num_experts = 8]"),
            std::string::npos);
  EXPECT_NE(msg("model.n_heads=7").find("'model.n_heads': must divide model.d_model"),
            std::string::npos);
  EXPECT_NE(msg("model.n_kv_heads=3").find("'model.n_kv_heads': must divide model.n_heads"),
            std::string::npos);
  EXPECT_NE(msg("optim.lr=-1").find("'optim.lr': must be positive"), std::string::npos);
  EXPECT_NE(msg("train.precision=fp8").find("'train.precision'"), std::string::npos);
  EXPECT_NE(msg("model.d_model=\"big\"").find("'model.d_model' needs an integer"),
            std::string::npos);
  EXPECT_NE(msg("model.d_model").find("key=value"), std::string::npos);
}

TEST(Config, HybridAttentionSettingsAreValidatedByKey) {
  const auto msg = [](std::vector<std::string> sets) {
    return error_of([&] { parse_config("", "x.toml", sets); });
  };
  EXPECT_NE(msg({"attention.window=-1"}).find("'attention.window': must be >= 0"),
            std::string::npos);
  EXPECT_NE(msg({"attention.global_tokens=4"})
                .find("'attention.global_tokens': needs attention.window > 0"),
            std::string::npos);
  EXPECT_NE(msg({"attention.layer_pattern=LG"})
                .find("'attention.layer_pattern': needs attention.window > 0"),
            std::string::npos);
  EXPECT_NE(msg({"attention.window=8", "attention.layer_pattern=LLx"})
                .find("'attention.layer_pattern': must be letters L (local) and G (global)"),
            std::string::npos);
  EXPECT_NE(msg({"attention.window=8", "attention.layer_pattern=GG"})
                .find("'attention.layer_pattern': has no local layer"),
            std::string::npos);
  const Config c = parse_config("", "x.toml",
                                {"attention.window=8", "attention.global_tokens=2",
                                 "attention.layer_pattern=LLG", "model.n_layers=4"});
  EXPECT_EQ(c.model.attention_window, 8);
  EXPECT_EQ(c.model.attention_global_tokens, 2);
  EXPECT_TRUE(nn::layer_is_local(c.model, 0));
  EXPECT_TRUE(nn::layer_is_local(c.model, 1));
  EXPECT_FALSE(nn::layer_is_local(c.model, 2));
  EXPECT_TRUE(nn::layer_is_local(c.model, 3));  // the pattern repeats
  EXPECT_FALSE(nn::layer_is_local(parse_config("", "x.toml", {}).model, 0));
}

TEST(Config, SequenceChunkSettingsAreValidatedByKey) {
  const auto msg = [](std::vector<std::string> sets) {
    return error_of([&] { parse_config("", "x.toml", sets); });
  };
  EXPECT_NE(msg({"train.seq_chunk=-4"}).find("'train.seq_chunk': must be >= 0"), std::string::npos);
  EXPECT_NE(msg({"train.seq_len=64", "train.seq_chunk=16", "parallel.pp=2"})
                .find("'train.seq_chunk': needs parallel.pp = 1"),
            std::string::npos);
  // 1 row x chunks of 5 positions do not split over tp 2.
  EXPECT_NE(msg({"train.seq_len=16", "train.seq_chunk=5", "train.micro_batch=1", "parallel.tp=2"})
                .find("'train.seq_chunk': = 5: train.micro_batch times each chunk's positions"),
            std::string::npos);
  const Config c = parse_config("", "x.toml", {"train.seq_len=64", "train.seq_chunk=16"});
  EXPECT_EQ(c.train.seq_chunk, 16);
  // A chunk as long as the sequence is no chunking, on any layout.
  EXPECT_EQ(parse_config("", "x.toml", {"train.seq_len=64", "train.seq_chunk=64", "parallel.pp=2"})
                .train.seq_chunk,
            64);
}

TEST(Config, RecomputeModulesTakeAnArrayOrAList) {
  const Config c = parse_config(
      "[recompute]\npolicy = \"custom\"\nmodules = [\"norm\", \"moe_act\"]\n", "r.toml");
  EXPECT_EQ(c.recompute.modules, "norm,moe_act");
  const nn::RecomputePolicy p = recompute_policy(c);
  EXPECT_TRUE(p.drops(nn::Recompute::norm) && p.drops(nn::Recompute::moe_act));
  EXPECT_FALSE(p.drops(nn::Recompute::attn_core) || p.drops(nn::Recompute::moe_dispatch));
  const Config d = parse_config(
      "", "r.toml", {"recompute.policy=custom", "recompute.modules=attn_core, moe_dispatch"});
  EXPECT_EQ(recompute_policy(d).modules, 9u);
  EXPECT_EQ(
      recompute_policy(parse_config("", "r.toml", {"recompute.policy=sqrt", "model.n_layers=9"}))
          .segment,
      3);
  EXPECT_NE(error_of([] {
              parse_config("[recompute]\npolicy = \"custom\"\nmodules = [\"mlp\"]\n", "r.toml");
            }).find("'recompute.modules': unknown module \"mlp\""),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_config("[recompute]\nmodules = [1]\n", "r.toml");
            }).find("array of strings"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              parse_config("", "r.toml", {"recompute.policy=half"});
            }).find("'recompute.policy'"),
            std::string::npos);
  // A list written by to_toml reads back the same.
  EXPECT_EQ(parse_config(to_toml(c), "saved.toml").recompute.modules, "norm,moe_act");
}

TEST(Config, RoundTripsThroughToml) {
  Config c = parse_config("", "x",
                          {"model.d_model=128", "moe.capacity_factor=1.25", "data.path=some dir"});
  const Config d = parse_config(to_toml(c), "roundtrip");
  EXPECT_EQ(to_toml(c), to_toml(d));
  EXPECT_EQ(d.moe.capacity_factor, 1.25);
  EXPECT_EQ(d.data.path, "some dir");
}

TEST(Config, MissingFileAndSyntaxErrorsNameTheFile) {
  const std::string e1 = error_of([] { load_config("/nonexistent/cfg.toml"); });
  EXPECT_NE(e1.find("/nonexistent/cfg.toml"), std::string::npos) << e1;
  const std::string path =
      (std::filesystem::temp_directory_path() / "moetron_bad_cfg.toml").string();
  std::ofstream(path) << "[model]\nd_model = = 3\n";
  const std::string e2 = error_of([&] { load_config(path); });
  EXPECT_NE(e2.find(path + ":2"), std::string::npos) << e2;
  std::filesystem::remove(path);
}

TEST(Config, ADirectoryOrAnEmptyFileIsNotAConfig) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("moetron_cfg_dir_" + std::to_string(::getpid())))
          .string();
  std::filesystem::create_directories(dir);
  const std::string e1 = error_of([&] { load_config(dir); });
  EXPECT_NE(e1.find("config '" + dir + "' is a directory"), std::string::npos) << e1;
  for (const char* text : {"", "# only a comment\n\n"}) {
    const std::string path = dir + "/empty.toml";
    std::ofstream(path) << text;
    const std::string e2 = error_of([&] { load_config(path); });
    EXPECT_NE(e2.find("config file '" + path + "' is empty"), std::string::npos) << e2;
  }
  std::filesystem::remove_all(dir);
}

TEST(Config, AnUnknownKeySuggestsAKeyOfItsOwnSection) {
  const std::string e = error_of([] { parse_config("", "a.toml", {"model.foo=3"}); });
  EXPECT_NE(e.find("unknown config key 'model.foo'"), std::string::npos) << e;
  EXPECT_NE(e.find("did you mean 'model."), std::string::npos) << e;
  // An unknown section still gets the nearest key of any section.
  const std::string e2 = error_of([] { parse_config("", "a.toml", {"modle.d_model=3"}); });
  EXPECT_NE(e2.find("did you mean 'model.d_model'"), std::string::npos) << e2;
}

TEST(Config, DivergenceLimitsAreValidated) {
  const Config d = parse_config("", "x.toml");
  EXPECT_EQ(d.train.max_skipped_steps, 10);
  EXPECT_EQ(d.train.max_skipped_fraction, 0.5);
  const auto msg = [](const std::string& set) {
    return error_of([&] { parse_config("", "x.toml", {set}); });
  };
  EXPECT_NE(msg("train.max_skipped_steps=-1").find("'train.max_skipped_steps'"), std::string::npos);
  EXPECT_NE(msg("train.max_skipped_fraction=1.5").find("'train.max_skipped_fraction'"),
            std::string::npos);
  EXPECT_NE(msg("train.loss_spike_factor=0.5").find("'train.loss_spike_factor'"),
            std::string::npos);
}

TEST(Config, CompressionRecipeSettingsAreValidatedByKey) {
  const auto msg = [](const std::vector<std::string>& sets) {
    return error_of([&] { parse_config("", "x.toml", sets); });
  };
  EXPECT_NE(msg({"parallel.compression=sparse"}).find("'parallel.compression'"), std::string::npos);
  EXPECT_NE(msg({"parallel.compression_keep=0"}).find("'parallel.compression_keep'"),
            std::string::npos);
  EXPECT_NE(msg({"parallel.compression_start=later"}).find("'parallel.compression_start'"),
            std::string::npos);
  EXPECT_NE(msg({"parallel.compression_start_tolerance=0"})
                .find("'parallel.compression_start_tolerance'"),
            std::string::npos);
  // Frozen after step 0 the second moment would be zeros: a warm-up is needed.
  EXPECT_NE(msg({"parallel.compression=sparse_sign", "parallel.freeze_variance=true"})
                .find("'parallel.freeze_variance'"),
            std::string::npos);
  const Config ok =
      parse_config("", "x.toml",
                   {"parallel.compression=sparse_sign", "parallel.compression_start=auto",
                    "parallel.freeze_variance=true"});
  EXPECT_EQ(ok.parallel.compression_keep, 0.75);
  EXPECT_EQ(ok.parallel.compression_space, "gradient");
  EXPECT_NE(msg({"parallel.compression_space=update"}).find("'parallel.compression_space'"),
            std::string::npos);
  // The preconditioner is built by the automatic start, and a live v must be whole on every rank.
  EXPECT_NE(msg({"parallel.compression=sparse_sign", "parallel.compression_space=preconditioned"})
                .find("'parallel.compression_space'"),
            std::string::npos);
  EXPECT_NE(msg({"parallel.compression=sparse_sign", "parallel.compression_start=auto",
                 "parallel.compression_space=preconditioned", "parallel.zero=true"})
                .find("'parallel.compression_space'"),
            std::string::npos);
  EXPECT_NO_THROW(
      parse_config("", "x.toml",
                   {"parallel.compression=sparse_sign", "parallel.compression_start=auto",
                    "parallel.compression_space=preconditioned", "parallel.zero=true",
                    "parallel.freeze_variance=true"}));
}

TEST(Config, EveryShippedConfigLoadsAndNamesTheTextToPrepareItsCorpusFrom) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(MOETRON_SOURCE_DIR "/configs")) {
    if (e.path().extension() != ".toml") continue;
    const Config c = load_config(e.path().string());
    EXPECT_FALSE(c.data.source.empty()) << e.path() << ": data.path is prepared by nothing";
    ++n;
  }
  EXPECT_GE(n, 3);
}

TEST(Config, ErrorsAreSentencesWithTheLocationApart) {
  try {
    parse_config("", "x.toml", {"model.d_model=0"});
    FAIL() << "d_model = 0 accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find("check failed"), std::string::npos) << what;
    EXPECT_EQ(what.find(".cpp:"), std::string::npos) << what;
    EXPECT_NE(e.where().find("config.cpp:"), std::string::npos) << e.where();
  }
  try {
    load_config("/nonexistent/cfg.toml");
    FAIL() << "a missing file accepted";
  } catch (const Error& e) {
    EXPECT_NE(e.where().find("check failed: "), std::string::npos) << e.where();
    EXPECT_EQ(std::string(e.what()).find("check failed"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace moetron::train
