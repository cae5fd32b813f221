// Checkpoint pieces: tp blocks, ranges of blocks (ZeRO-1 chunks under tp)
// and flat ranges, saved by one layout and cut for another, must copy every
// element to its place exactly once, whatever the sizes.
#include "moetron/ckpt/pieces.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "moetron/core/error.h"

namespace moetron::ckpt {
namespace {

// The full tensor's element that position k of piece p holds.
int64_t full_index(const Piece& p, int64_t k) {
  if (!p.is_block()) return p.offset + k;
  const int64_t b = p.offset + k, r = b / p.cols, c = b % p.cols;
  return (p.row0 + r) * p.full_cols + p.col0 + c;
}

// A piece's values when the full tensor holds its own flat index (exact in f32 below 2^24).
Tensor values_of(const Piece& p) {
  Tensor t = Tensor::empty({p.numel()}, DType::f32);
  for (int64_t k = 0; k < p.numel(); ++k) t.data<float>()[k] = static_cast<float>(full_index(p, k));
  return t;
}

// One layout's pieces of an [r, c] tensor: `tp` blocks cut along rows or
// columns at random points, each cut into `dp` random element ranges (dp 1:
// whole blocks), or, without tp, `dp` flat ranges of the whole tensor.
std::vector<Piece> layout(int64_t r, int64_t c, int tp, int dp, bool by_rows, std::mt19937& rng) {
  const auto cuts = [&](int64_t n, int parts) {
    std::vector<int64_t> at = {0, n};
    for (int i = 1; i < parts; ++i) at.push_back(std::uniform_int_distribution<int64_t>(0, n)(rng));
    std::sort(at.begin(), at.end());
    return at;
  };
  std::vector<Piece> out;
  if (tp == 1) {
    const std::vector<int64_t> at = cuts(r * c, dp);
    for (size_t i = 0; i + 1 < at.size(); ++i)
      out.push_back(Piece::flat(at[i], at[i + 1] - at[i], r * c));
    return out;
  }
  const std::vector<int64_t> blocks = cuts(by_rows ? r : c, tp);
  for (size_t b = 0; b + 1 < blocks.size(); ++b) {
    const int64_t lo = blocks[b], n = blocks[b + 1] - blocks[b];
    if (n == 0) continue;
    const Shape local = by_rows ? Shape({n, c}) : Shape({r, n});
    const std::vector<int64_t> at = cuts(local.numel(), dp);
    for (size_t i = 0; i + 1 < at.size(); ++i) {
      out.push_back(Piece::block_range(Shape({r, c}), by_rows ? lo : 0, by_rows ? 0 : lo, local,
                                       at[i], at[i + 1] - at[i]));
    }
  }
  return out;
}

TEST(Pieces, AnyLayoutIsCutFromAnyOtherExactlyOnce) {
  std::mt19937 rng(7);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {7, 13}, {1, 33}, {130, 3}, {5, 1}, {64, 64}};
  for (const auto& [r, c] : shapes) {
    for (int trial = 0; trial < 20; ++trial) {
      const int tp_a = 1 + trial % 4, dp_a = 1 + (trial / 4) % 3, tp_b = 1 + (trial + 1) % 3,
                dp_b = 1 + trial % 5;
      const std::vector<Piece> saved = layout(r, c, tp_a, dp_a, trial % 2 == 0, rng);
      const std::vector<Piece> wanted = layout(r, c, tp_b, dp_b, trial % 3 == 0, rng);
      std::vector<Tensor> saved_values;
      for (const Piece& p : saved) saved_values.push_back(values_of(p));
      for (const Piece& w : wanted) {
        Tensor got = Tensor::empty({w.numel()}, DType::f32);
        got.fill(-1.0);
        int64_t copied = 0;
        for (size_t i = 0; i < saved.size(); ++i)
          copied += copy_overlap(saved[i], saved_values[i], w, got);
        ASSERT_EQ(copied, w.numel()) << r << "x" << c << " trial " << trial;
        for (int64_t k = 0; k < w.numel(); ++k) {
          ASSERT_EQ(got.data<float>()[k], static_cast<float>(full_index(w, k)))
              << r << "x" << c << " trial " << trial << " element " << k;
        }
      }
    }
  }
}

TEST(Pieces, MetadataRoundTrips) {
  const Shape full({12, 10});
  const Piece whole_block = Piece::block(full, 4, 0, Shape({4, 10}));
  const Piece range = Piece::block_range(full, 0, 5, Shape({12, 5}), 7, 23);
  const Piece flat = Piece::flat(30, 50, 120);
  EXPECT_EQ(whole_block.metadata(), "block:4,0,12,10");
  EXPECT_EQ(range.metadata(), "block:0,5,12,10,12,5,7");
  EXPECT_EQ(flat.metadata(), "30,120");
  EXPECT_EQ(Piece::whole(120).metadata(), "");
  const auto same = [](const Piece& a, const Piece& b) {
    return a.total == b.total && a.full_cols == b.full_cols && a.row0 == b.row0 &&
           a.col0 == b.col0 && a.rows == b.rows && a.cols == b.cols && a.offset == b.offset &&
           a.count == b.count;
  };
  EXPECT_TRUE(same(Piece::parse(whole_block.metadata(), Shape({4, 10}), "t"), whole_block));
  EXPECT_TRUE(same(Piece::parse(range.metadata(), Shape({23}), "t"), range));
  EXPECT_TRUE(same(Piece::parse(flat.metadata(), Shape({50}), "t"), flat));
  EXPECT_TRUE(same(Piece::parse(std::nullopt, Shape({3, 4}), "t"), Piece::whole(12)));
  // A flat range that records its tensor's shape (ZeRO-1 chunks of masters).
  Piece shaped = Piece::flat(30, 50, 120);
  shaped.shape = full;
  EXPECT_EQ(shaped.metadata(), "flat:30,12,10");
  const Piece back = Piece::parse(shaped.metadata(), Shape({50}), "t");
  EXPECT_TRUE(same(back, shaped));
  EXPECT_EQ(back.shape, full);
}

TEST(Pieces, CopiesConvertTheDtype) {
  const Piece src = Piece::block(Shape({2, 4}), 0, 0, Shape({2, 2})), dst = Piece::whole(8);
  Tensor s = Tensor::empty({4}, DType::f32);
  for (int i = 0; i < 4; ++i) s.data<float>()[i] = 1.0f + static_cast<float>(i) / 3.0f;
  Tensor d = Tensor::zeros({8}, DType::bf16);
  EXPECT_EQ(copy_overlap(src, s, dst, d), 4);
  const auto* bits = static_cast<const uint16_t*>(d.raw());
  EXPECT_EQ(bits[0], f32_to_bf16(1.0f));
  EXPECT_EQ(bits[1], f32_to_bf16(1.0f + 1.0f / 3.0f));
  EXPECT_EQ(bits[4], f32_to_bf16(1.0f + 2.0f / 3.0f));  // row 1 of the block: full element 4
  EXPECT_EQ(bits[2], 0);
}

TEST(Pieces, BadDescriptionsNameTheTensor) {
  const std::vector<std::pair<std::string, Shape>> bad = {
      {"block:0,0,4", Shape({2, 2})},       // too few fields
      {"block:3,0,4,4", Shape({2, 4})},     // rows 3..5 of 4
      {"block:0,0,4,4,2,4,5", Shape({4})},  // elements 5..9 of an 8-element block
      {"block:0,0,4,4", Shape({16})},       // a whole block saved 1-D
      {"90,100", Shape({20})},              // past the end
      {"1,x", Shape({2})},                  // not a number
      {"flat:10,3,4", Shape({5})},          // elements 10..14 of 12
      {"flat:0,0,4", Shape({1})},           // an empty dimension
  };
  for (const auto& [meta, shape] : bad) {
    try {
      (void)Piece::parse(meta, shape, "'f.safetensors', tensor 'w'");
      ADD_FAILURE() << meta << " accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("tensor 'w'"), std::string::npos)
          << meta << ": " << e.what();
    }
  }
}

}  // namespace
}  // namespace moetron::ckpt
