// The synthetic key-retrieval corpus (prepare-data --task retrieval):
// deterministic, fixed-length examples whose query repeats the key, key and
// filler vocabularies disjoint, bad options refused before anything is written.
#include "moetron/data/retrieval.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <set>

#include "moetron/core/error.h"
#include "moetron/core/manifest.h"
#include "moetron/core/staged_dir.h"
#include "moetron/data/token_dataset.h"

namespace moetron::data {
namespace {

namespace fs = std::filesystem;

std::string scratch(const std::string& name) {
  const std::string dir =
      (fs::temp_directory_path() / ("moetron_retrieval_" + name + "_" + std::to_string(::getpid())))
          .string();
  remove_tree(dir);
  fs::create_directories(dir);
  return dir;
}

RetrievalOptions small_options(const std::string& out) {
  RetrievalOptions o;
  o.out_dir = out;
  o.seq_len = 40;
  o.examples = 50;
  o.seed = 3;
  o.vocab_size = 100;
  o.key_len = 4;
  o.key_within = 12;
  o.key_vocab = 16;
  o.val_fraction = 0.1;
  return o;
}

// Checks one example against the layout of data/retrieval.h.
void expect_well_formed(const int32_t* ex, const RetrievalOptions& o) {
  const RetrievalVocab v = retrieval_vocab(o);
  const int64_t k = o.key_len, query_at = o.seq_len - k;
  int64_t key_at = -1;
  for (int64_t i = 0; i < o.seq_len + 1; ++i) {
    if (ex[i] == v.key_marker) {
      ASSERT_EQ(key_at, -1) << "two KEY markers";
      key_at = i;
    }
  }
  ASSERT_GE(key_at, 0) << "no KEY marker";
  ASSERT_LE(key_at + k, o.key_within - 1) << "the key leaves the first --key-within positions";
  ASSERT_EQ(ex[query_at], v.query_marker);
  for (int64_t j = 1; j <= k; ++j) {
    EXPECT_EQ(ex[query_at + j], ex[key_at + j]) << "key token " << j;
    EXPECT_GE(ex[key_at + j], v.key_first);
    EXPECT_LT(ex[key_at + j], v.key_first + v.key_count);
  }
  for (int64_t i = 0; i < o.seq_len + 1; ++i) {
    const bool key_part = (i >= key_at && i <= key_at + k) || i >= query_at;
    if (key_part) continue;
    EXPECT_GE(ex[i], v.filler_first) << "position " << i;
    EXPECT_LT(ex[i], v.filler_first + v.filler_count) << "position " << i;
  }
}

TEST(Retrieval, VocabulariesAreDisjointAndCoverTheIds) {
  const RetrievalVocab v = retrieval_vocab(small_options("unused"));
  EXPECT_EQ(v.key_first, 3);
  EXPECT_EQ(v.key_count, 16);
  EXPECT_EQ(v.filler_first, v.key_first + v.key_count);  // filler starts where keys end
  EXPECT_EQ(v.filler_first + v.filler_count, 100);
  for (int32_t special : {v.eos, v.key_marker, v.query_marker}) EXPECT_LT(special, v.key_first);
}

TEST(Retrieval, EveryExampleHasSeqLenPlusOneTokensAndRepeatsItsKey) {
  const std::string dir = scratch("layout");
  const RetrievalOptions o = small_options(dir + "/data");
  const RetrievalReport rep = prepare_retrieval(o);
  EXPECT_EQ(rep.val_examples, 5);
  EXPECT_EQ(rep.train_examples, 45);
  const auto state = verify_manifest(o.out_dir, "corpus");
  EXPECT_EQ(state.at("task"), "retrieval");
  EXPECT_EQ(state.at("example_tokens").get<int64_t>(), 41);
  EXPECT_EQ(state.at("key_id").get<int32_t>(), 1);
  EXPECT_EQ(state.at("query_id").get<int32_t>(), 2);
  EXPECT_EQ(state.at("min_key_query_distance").get<int64_t>(), 28);
  const TokenFile train(o.out_dir + "/train.bin", o.vocab_size),
      val(o.out_dir + "/val.bin", o.vocab_size);
  ASSERT_EQ(train.size(), 45 * 41);
  ASSERT_EQ(val.size(), 5 * 41);
  for (int64_t i = 0; i < 45; ++i) expect_well_formed(train.data() + i * 41, o);
  for (int64_t i = 0; i < 5; ++i) expect_well_formed(val.data() + i * 41, o);
  // The key moves around its window and differs between examples.
  std::set<int32_t> first_key_tokens;
  for (int64_t i = 0; i < 45; ++i) first_key_tokens.insert(train.data()[i * 41 + 41 - 4]);
  EXPECT_GT(first_key_tokens.size(), 8u);
  remove_tree(dir);
}

TEST(Retrieval, TheCorpusIsAFunctionOfTheSeed) {
  const std::string dir = scratch("seed");
  RetrievalOptions a = small_options(dir + "/a"), b = small_options(dir + "/b"),
                   c = small_options(dir + "/c");
  c.seed = 4;
  prepare_retrieval(a);
  prepare_retrieval(b);
  prepare_retrieval(c);
  EXPECT_EQ(file_checksum(a.out_dir + "/train.bin"), file_checksum(b.out_dir + "/train.bin"));
  EXPECT_EQ(file_checksum(a.out_dir + "/val.bin"), file_checksum(b.out_dir + "/val.bin"));
  EXPECT_NE(file_checksum(a.out_dir + "/train.bin"), file_checksum(c.out_dir + "/train.bin"));
  EXPECT_EQ(retrieval_example(a, 7), retrieval_example(b, 7));
  EXPECT_NE(retrieval_example(a, 7), retrieval_example(a, 8));
  remove_tree(dir);
}

// Each bad option is named in the error and leaves no directory behind.
TEST(Retrieval, BadOptionsNameTheOptionAndWriteNothing) {
  const std::string dir = scratch("bad");
  const auto expect_refused = [&](RetrievalOptions o, const std::string& option) {
    o.out_dir = dir + "/out";
    try {
      prepare_retrieval(o);
      ADD_FAILURE() << "accepted a bad " << option;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(option), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(o.out_dir)) << option;
    EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 0) << option;
  };
  RetrievalOptions o = small_options("");
  o.seq_len = 15;  // KEY + key within 12, QUERY + key: needs 16
  expect_refused(o, "--seq-len");
  o = small_options("");
  o.key_within = 4;  // KEY and 4 key tokens need 5
  expect_refused(o, "--key-within");
  o = small_options("");
  o.vocab_size = 19;  // 3 special + 16 key ids: no filler
  expect_refused(o, "--vocab-size");
  o = small_options("");
  o.key_len = 0;
  expect_refused(o, "--key-len");
  o = small_options("");
  o.examples = 1;
  expect_refused(o, "--examples");
  o = small_options("");
  o.seq_len = 16;  // the smallest that fits
  o.out_dir = dir + "/ok";
  EXPECT_NO_THROW(prepare_retrieval(o));
  remove_tree(dir);
}

}  // namespace
}  // namespace moetron::data
