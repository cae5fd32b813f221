// The rows MultimodalBatcher lays out for each fusion (train/multimodal_batches.h):
// prefix and both start a media row with one placeholder per media token
// (modality-marked, no target), then the task prompt; cross_attention
// starts it with the prompt (no media positions, every token text) and
// predicts the same target tokens, shifted left by the placeholders.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "moetron/nn/media_fusion.h"
#include "moetron/train/multimodal_batches.h"
#include "util/tiny_multimodal.h"

namespace moetron::train {
namespace {

namespace fs = std::filesystem;

const std::string& corpus() {
  static const std::string dir = [] {
    const std::string d =
        (fs::temp_directory_path() / ("moetron_mm_fusion_" + std::to_string(::getpid()))).string();
    fs::remove_all(d);
    test::make_tiny_multimodal_corpus(d + "/corpus");
    return d + "/corpus";
  }();
  return dir;
}

struct Rows {
  Tensor in, tgt;
  std::shared_ptr<nn::MultimodalBatch> mm;
};

Rows caption_rows(const std::string& fusion) {
  Config c = test::tiny_multimodal_config(
      corpus(), {"multimodal.mix=caption:1", "multimodal.fusion=" + fusion});
  const MultimodalBatcher b(corpus(), c.multimodal.model,
                            parse_task_mix(c.multimodal.mix, "multimodal.mix"), c.train.seq_len,
                            c.multimodal.audio_frames, 5);
  Rows r;
  r.in = Tensor::empty({2, c.train.seq_len}, DType::i32);
  r.tgt = Tensor::empty({2, c.train.seq_len}, DType::i32);
  r.mm = b.build(data::Split::train, {0, 1}, r.in, r.tgt);
  return r;
}

TEST(MultimodalFusionLayout, CrossAttentionRowsCarryNoPlaceholders) {
  const Rows prefix = caption_rows("prefix"), both = caption_rows("both"),
             cross = caption_rows("cross_attention");
  ASSERT_EQ(prefix.mm->media.size(), 1u);
  const Config c = test::tiny_multimodal_config(corpus());
  const Tensor& image = prefix.mm->media[0].input;
  const int64_t n = nn::image_tokens(c.multimodal.model.vision, image.dim(2), image.dim(3));
  ASSERT_GT(n, 0);
  const int64_t s = prefix.in.dim(1);
  for (int64_t row = 0; row < 2; ++row) {
    SCOPED_TRACE(row);
    const int32_t* pin = prefix.in.data<int32_t>() + row * s;
    const int32_t* ptg = prefix.tgt.data<int32_t>() + row * s;
    const int32_t* cin = cross.in.data<int32_t>() + row * s;
    const int32_t* ctg = cross.tgt.data<int32_t>() + row * s;
    const int32_t* pmod = prefix.mm->token_modality.data<int32_t>() + row * s;
    const int32_t* cmod = cross.mm->token_modality.data<int32_t>() + row * s;
    for (int64_t p = 0; p < s; ++p) {
      EXPECT_EQ(both.in.data<int32_t>()[row * s + p], pin[p]);  // "both" lays out as prefix
      EXPECT_EQ(pmod[p], p < n ? static_cast<int32_t>(nn::Modality::image) : 0) << p;
      EXPECT_EQ(cmod[p], 0) << p;
      if (p < n) {
        EXPECT_EQ(ptg[p], -1) << p;
      }
      // The cross-attention row is the prefix row without its placeholders.
      if (p + n < s) {
        EXPECT_EQ(cin[p], pin[p + n]) << p;
        EXPECT_EQ(ctg[p], ptg[p + n]) << p;
      }
    }
  }
  EXPECT_EQ(cross.mm->media[0].rows, prefix.mm->media[0].rows);
}

}  // namespace
}  // namespace moetron::train
