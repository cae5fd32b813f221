// The mask predicate every attention backend shares, pinned by explicit
// truth tables: CPU-vs-reference tests cannot catch a bug here, since both
// backends would inherit it.
#include <gtest/gtest.h>

#include "moetron/kernels/attention.h"

namespace moetron::kernels {
namespace {

std::string table(const AttentionMask& m, int rows, int cols) {
  std::string s;
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) s += attention_visible(m, i, j) ? '1' : '.';
    s += '\n';
  }
  return s;
}

TEST(AttentionMask, CausalSeesItselfAndThePast) {
  EXPECT_EQ(table({true, 0, 0, 0}, 4, 4), "1...\n11..\n111.\n1111\n");
}

TEST(AttentionMask, NonCausalSeesEverything) {
  EXPECT_EQ(table({false, 0, 0, 0}, 2, 3), "111\n111\n");
}

TEST(AttentionMask, SlidingWindowKeepsTheLastWKeys) {
  EXPECT_EQ(table({true, 2, 0, 0}, 5, 5), "1....\n11...\n.11..\n..11.\n...11\n");
  EXPECT_EQ(table({false, 2, 0, 0}, 4, 4), "11..\n111.\n.111\n..11\n");
}

TEST(AttentionMask, GlobalTokensSeeAndAreSeenByEveryone) {
  // Causal, window 1, one global token: every query sees key 0 and itself;
  // query 0 (global) sees what causality allows.
  EXPECT_EQ(table({true, 1, 1, 0}, 4, 4), "1...\n11..\n1.1.\n1..1\n");
  // Non-causal, window 1, one global token: the global query sees all keys.
  EXPECT_EQ(table({false, 1, 1, 0}, 3, 3), "111\n11.\n1.1\n");
}

TEST(AttentionMask, QueryOffsetPlacesAChunkInALongerSequence) {
  // Queries are rows 2 and 3 of a 4-token sequence.
  EXPECT_EQ(table({true, 0, 0, 2}, 2, 4), "111.\n1111\n");
}

TEST(AttentionMask, PackedDocumentsSeeOnlyThemselvesAndHaveTheirOwnGlobalTokens) {
  // Documents [0, 3) and [3, 7).
  const int32_t starts[] = {0, 0, 0, 3, 3, 3, 3};
  AttentionMask m{true, 0, 0, 0};
  m.doc_start = starts;
  m.doc_stride = 7;
  EXPECT_EQ(table(m, 7, 7), "1......\n11.....\n111....\n...1...\n...11..\n...111.\n...1111\n");
  // Window 1 with one global token per document: its first token.
  m.window = 1;
  m.num_global = 1;
  EXPECT_EQ(table(m, 7, 7), "1......\n11.....\n1.1....\n...1...\n...11..\n...1.1.\n...1..1\n");
  // A chunk of queries (rows 5, 6) keeps the documents of its positions.
  m.q_offset = 5;
  EXPECT_EQ(table(m, 2, 7), "...1.1.\n...1..1\n");
}

TEST(AttentionMask, SequenceMaskPicksItsSequencesStarts) {
  const int32_t starts[] = {0, 0, 0, 0, 1, 1};  // sequence 1: documents [0, 1), [1, 3)
  AttentionMask m{true, 0, 0, 0};
  m.doc_start = starts;
  m.doc_stride = 3;
  EXPECT_EQ(table(sequence_mask(m, 0), 3, 3), "1..\n11.\n111\n");
  EXPECT_EQ(table(sequence_mask(m, 1), 3, 3), "1..\n.1.\n.11\n");
}

}  // namespace
}  // namespace moetron::kernels
