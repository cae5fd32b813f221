#include "moetron/ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "moetron/core/error.h"
#include "moetron/core/manifest.h"
#include "moetron/core/staged_dir.h"
#include "util/test_util.h"

namespace moetron::ckpt {
namespace {

using moetron::remove_tree;
using moetron::StagedDir;

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  const std::string d =
      (fs::temp_directory_path() / ("moetron_" + name + "_" + std::to_string(::getpid()))).string();
  remove_tree(d);
  fs::create_directories(d);
  return d;
}

TEST(Safetensors, RoundTripsEveryDtypeWithMetadata) {
  const std::string dir = temp_dir("st_roundtrip");
  Tensor a = test::random_tensor({3, 5}, DType::f32, "a");
  Tensor b = test::random_tensor({7}, DType::bf16, "b");
  Tensor c = Tensor::empty({2, 2}, DType::i64);
  for (int i = 0; i < 4; ++i) c.data<int64_t>()[i] = (int64_t{1} << 40) + i;
  Tensor e = Tensor::empty({0, 4}, DType::f32);
  const std::string path = dir + "/m.safetensors";
  write_safetensors(path, {{"model.a", a}, {"model.b", b}, {"c", c}, {"empty", e}},
                    {{"format", "pt"}});
  SafetensorsReader r(path);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"model.a", "model.b", "c", "empty"}));
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.shape("model.a"), Shape({3, 5}));
  EXPECT_EQ(r.dtype("model.b"), DType::bf16);
  EXPECT_TRUE(test::all_close(r.view("model.a"), a, {0, 0}));
  EXPECT_TRUE(test::all_close(r.view("model.b"), b, {0, 0}));
  EXPECT_EQ(r.view("c").data<int64_t>()[3], (int64_t{1} << 40) + 3);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(r.view("c").raw()) % 8, 0u);
  // Conversion on read: bf16 file -> f32 tensor.
  Tensor bf = Tensor::empty({7}, DType::f32);
  r.read_into("model.b", bf);
  EXPECT_TRUE(test::all_close(bf, b, {0, 0}));
  EXPECT_THROW(r.view("missing"), Error);
  Tensor wrong = Tensor::empty({5, 3}, DType::f32);
  EXPECT_THROW(r.read_into("model.a", wrong), Error);
  remove_tree(dir);
}

TEST(Safetensors, HeaderMatchesTheHuggingFaceLayout) {
  const std::string dir = temp_dir("st_layout");
  Tensor a = Tensor::zeros({2, 3}, DType::f32);
  write_safetensors(dir + "/x.safetensors", {{"w", a}});
  std::ifstream f(dir + "/x.safetensors", std::ios::binary);
  unsigned char len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  std::string json(n, '\0');
  f.read(json.data(), static_cast<std::streamsize>(n));
  EXPECT_NE(json.find(R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]})"),
            std::string::npos)
      << json;
  EXPECT_EQ(fs::file_size(dir + "/x.safetensors"), 8 + n + 24);
  remove_tree(dir);
}

TEST(Safetensors, TruncatedAndGarbageFilesAreRejectedNamingTheFile) {
  const std::string dir = temp_dir("st_bad");
  const std::string path = dir + "/m.safetensors";
  write_safetensors(path, {{"w", test::random_tensor({64}, DType::f32, "w")}});
  fs::resize_file(path, fs::file_size(path) - 10);
  try {
    SafetensorsReader r(path);
    FAIL() << "truncated file accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  std::ofstream(dir + "/g.safetensors") << "\x10\0\0\0\0\0\0\0{not json at all";
  EXPECT_THROW(SafetensorsReader(dir + "/g.safetensors"), Error);
  EXPECT_THROW(SafetensorsReader(dir + "/none.safetensors"), Error);
  remove_tree(dir);
}

TEST(StagedDir, PublishesAtomicallyAndNeverOverwrites) {
  const std::string dir = temp_dir("staged");
  const std::string final_path = dir + "/step-10";
  {
    StagedDir staged(final_path);
    std::ofstream(staged.file("a.txt")) << "hello";
    EXPECT_FALSE(fs::exists(final_path));
    staged.commit();
  }
  EXPECT_TRUE(fs::exists(final_path + "/a.txt"));
  EXPECT_THROW(StagedDir{final_path}, Error);
  {
    // A save that fails half way (exception before commit) leaves nothing behind.
    StagedDir staged(dir + "/step-20");
    std::ofstream(staged.file("partial.bin")) << "xx";
  }
  EXPECT_FALSE(fs::exists(dir + "/step-20"));
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
  }
  remove_tree(dir);
}

TEST(Manifest, DetectsCorruptionTruncationAndMissingFiles) {
  const std::string dir = temp_dir("manifest");
  write_safetensors(dir + "/model.safetensors",
                    {{"w", test::random_tensor({100}, DType::f32, "w")}});
  std::ofstream(dir + "/trainer.json") << R"({"step": 3})";
  write_manifest(dir, {"model.safetensors", "trainer.json"}, {{"step", 3}});
  EXPECT_EQ(verify_manifest(dir).at("step"), 3);
  {  // flip one byte in the data section
    std::fstream f(dir + "/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-5, std::ios::end);
    f.put('\x7f');
  }
  try {
    verify_manifest(dir);
    FAIL() << "corruption not detected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("corrupt"), std::string::npos);
  }
  write_manifest(dir, {"model.safetensors", "trainer.json"}, {});
  fs::resize_file(dir + "/trainer.json", 3);
  EXPECT_THROW(verify_manifest(dir), Error);
  fs::remove(dir + "/trainer.json");
  EXPECT_THROW(verify_manifest(dir), Error);
  remove_tree(dir);
}

}  // namespace
}  // namespace moetron::ckpt
