// Folded state (error-feedback residuals across an elastic resize): every
// saved part lands on exactly one rank of the new group, so the group's sum
// is kept, and at the same size each rank gets exactly its own part back.
#include "moetron/ckpt/folded_state.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "moetron/ckpt/rank_files.h"
#include "moetron/ckpt/safetensors.h"
#include "moetron/core/error.h"
#include "moetron/core/manifest.h"

namespace moetron::ckpt {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kNumel = 11;  // not a multiple of any group size below
constexpr int kSaved = 4;       // ranks that saved

struct Saved {
  std::string dir;
  std::vector<std::vector<float>> first, second;  // by saved rank: whole, and its chunk (else 0)
};

// Saved rank i holds "ef.w#i" (whole) and "ef2.w#i", the elements
// [3i, 3i + 3) of w (a chunk, as allreduce mode's second hop holds), plus
// tensors that must be left alone: another base, and a name without "#i".
Saved save_parts(const std::string& name) {
  Saved s;
  s.dir = (fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()))).string();
  fs::remove_all(s.dir);
  fs::create_directories(s.dir);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (int i = 0; i < kSaved; ++i) {
    std::vector<float> whole(kNumel), chunk(kNumel, 0.0f);
    for (auto& v : whole) v = normal(rng);
    const int64_t lo = 3 * i, hi = std::min<int64_t>(lo + 3, kNumel);
    Tensor piece = Tensor::empty({hi - lo}, DType::f32);
    for (int64_t k = lo; k < hi; ++k) piece.data<float>()[k - lo] = chunk[k] = normal(rng);
    Tensor w = Tensor::wrap(whole.data(), {kNumel}, DType::f32);
    Tensor other = Tensor::empty({kNumel}, DType::f32);
    other.fill(1000.0);
    const std::string idx = std::to_string(i);
    write_safetensors(
        s.dir + "/" + optimizer_file(i),
        {{"ef.w#" + idx, w}, {"ef2.w#" + idx, piece}, {"ef.v#" + idx, other}, {"ef.w", other}},
        {{"ef.w#" + idx, "0," + std::to_string(kNumel)},
         {"ef2.w#" + idx, std::to_string(lo) + "," + std::to_string(kNumel)},
         {"ef.v#" + idx, "0," + std::to_string(kNumel)}});
    s.first.push_back(whole);
    s.second.push_back(chunk);
  }
  std::ofstream(s.dir + "/" + kManifestName)
      << nlohmann::json{{"state", {{"optimizer_ranks", kSaved}}}}.dump();
  return s;
}

TEST(FoldedState, ShrinkingKeepsTheGroupSumAndEachPartLandsOnce) {
  const Saved s = save_parts("moetron_fold_shrink");
  for (const int size : {1, 3}) {
    std::vector<double> total(kNumel, 0.0);
    for (int j = 0; j < size; ++j) {
      Tensor got = Tensor::zeros({kNumel}, DType::f32);
      const int64_t parts = load_folded(s.dir, {{{"ef.w", "ef2.w"}, got}}, j, size);
      int64_t want_parts = 0;
      for (int i = 0; i < kSaved; ++i) want_parts += (i % size == j) ? 2 : 0;
      EXPECT_EQ(parts, want_parts) << "size " << size << " rank " << j;
      for (int64_t k = 0; k < kNumel; ++k) {
        double want = 0;
        for (int i = j; i < kSaved; i += size) want += s.first[i][k] + s.second[i][k];
        EXPECT_NEAR(got.data<float>()[k], want, 1e-5) << "size " << size << " rank " << j;
        total[k] += got.data<float>()[k];
      }
    }
    for (int64_t k = 0; k < kNumel; ++k) {
      double want = 0;
      for (int i = 0; i < kSaved; ++i) want += s.first[i][k] + s.second[i][k];
      EXPECT_NEAR(total[k], want, 1e-5) << "size " << size << " element " << k;
    }
  }
  fs::remove_all(s.dir);
}

TEST(FoldedState, AtTheSameSizeEachRankGetsItsOwnPartBitForBit) {
  const Saved s = save_parts("moetron_fold_same");
  for (int j = 0; j < kSaved; ++j) {
    Tensor got = Tensor::zeros({kNumel}, DType::f32);
    EXPECT_EQ(load_folded(s.dir, {{{"ef.w"}, got}}, j, kSaved), 1);
    for (int64_t k = 0; k < kNumel; ++k) EXPECT_EQ(got.data<float>()[k], s.first[j][k]);
  }
  // Growing: the ranks past the saved ones get nothing (their part starts at zero).
  Tensor extra = Tensor::zeros({kNumel}, DType::f32);
  EXPECT_EQ(load_folded(s.dir, {{{"ef.w", "ef2.w"}, extra}}, 5, 6), 0);
  for (int64_t k = 0; k < kNumel; ++k) EXPECT_EQ(extra.data<float>()[k], 0.0f);
  fs::remove_all(s.dir);
}

TEST(FoldedState, APartOfAnotherLengthNamesTheFileAndTheTensor) {
  const Saved s = save_parts("moetron_fold_bad");
  Tensor wrong = Tensor::zeros({kNumel + 1}, DType::f32);
  try {
    load_folded(s.dir, {{{"ef.w"}, wrong}}, 0, 2);
    FAIL() << "a part of another length was folded";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(optimizer_file(0)), std::string::npos) << what;
    EXPECT_NE(what.find("'ef.w#0'"), std::string::npos) << what;
  }
  fs::remove_all(s.dir);
}

}  // namespace
}  // namespace moetron::ckpt
