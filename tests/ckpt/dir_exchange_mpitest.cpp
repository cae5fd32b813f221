// ckpt::exchange_directory on 2 and 4 real ranks: every rank sends its
// directory to the next and receives the previous one's, in chunks smaller
// than the files (awkward sizes, empty files first and last, a rank with
// no files at all), byte for byte; a rank that cannot write finishes the
// transfer and throws, and nobody hangs.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "moetron/ckpt/dir_exchange.h"
#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"
#include "util/mpi_test_main.h"
#include "util/subprocess.h"
#include "util/tiny_corpus.h"

namespace moetron::ckpt {
namespace {

namespace fs = std::filesystem;

comm::Communicator& world() {
  return test::mpi_world();
}

constexpr int64_t kChunk = 1000;

// What rank r's directory holds: name -> bytes, known to every rank.
std::vector<std::pair<std::string, std::string>> files_of(int rank) {
  std::vector<std::pair<std::string, std::string>> out;
  if (rank == 1) return out;  // a rank with nothing to send
  const std::vector<int64_t> sizes = {0, 1, 7, kChunk - 1, kChunk, kChunk + 1, 3 * kChunk + 5, 0};
  std::mt19937 rng(1000 + static_cast<unsigned>(rank));
  for (size_t i = 0; i < sizes.size(); i += 1 + static_cast<size_t>(rank) % 2) {
    std::string bytes(static_cast<size_t>(sizes[i]), '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    // Sorted names: "a-" first and "z-" last hold the empty files.
    const std::string name = (i == 0                  ? "a-"
                              : i + 1 == sizes.size() ? "z-"
                                                      : "m-") +
                             std::to_string(i) + ".bin";
    out.push_back({name, bytes});
  }
  return out;
}

std::string scratch(const std::string& name) {
  const std::string d = test::tiny_corpus_root() + "/dir_exchange/" + name;
  remove_tree(d);
  fs::create_directories(d + "/out");
  fs::create_directories(d + "/in");
  return d;
}

TEST(DirExchange, EveryRankGetsItsPredecessorsFilesByteForByte) {
  const int n = world().size(), me = world().rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  const std::string d = scratch("ring");
  int64_t sent = 0;
  for (const auto& [name, bytes] : files_of(me)) {
    std::ofstream(d + "/out/" + name, std::ios::binary) << bytes;
    sent += static_cast<int64_t>(bytes.size());
  }
  const ExchangeStats st = exchange_directory(world(), d + "/out", next, d + "/in", prev, kChunk);
  EXPECT_EQ(st.sent_bytes, sent);
  int64_t expected_in = 0;
  const auto theirs = files_of(prev);
  for (const auto& [name, bytes] : theirs) {
    const std::string got = d + "/in/" + name;
    ASSERT_TRUE(fs::is_regular_file(got)) << "rank " << me << ": " << got << " missing";
    EXPECT_TRUE(test::read_text_file(got) == bytes) << "rank " << me << ": " << got << " differs";
    expected_in += static_cast<int64_t>(bytes.size());
  }
  EXPECT_EQ(st.received_bytes, expected_in);
  EXPECT_EQ(static_cast<size_t>(
                std::distance(fs::directory_iterator(d + "/in"), fs::directory_iterator())),
            theirs.size());
}

TEST(DirExchange, ARankThatCannotWriteFinishesTheTransferAndThrowsNamingTheFile) {
  const int n = world().size(), me = world().rank();
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  const std::string d = scratch("unwritable");
  for (const auto& [name, bytes] : files_of(me))
    std::ofstream(d + "/out/" + name, std::ios::binary) << bytes;
  const int victim = n - 1;  // receives from rank n - 2, which has files at n = 2 and 4
  if (me == victim) remove_tree(d + "/in");
  std::string error;
  try {
    exchange_directory(world(), d + "/out", next, d + "/in", prev, kChunk);
  } catch (const Error& e) {
    error = e.what();
  }
  const bool gets_files = !files_of(prev).empty();
  if (me == victim && gets_files) {
    EXPECT_NE(error.find(d + "/in/"), std::string::npos) << error;
  } else {
    EXPECT_EQ(error, "") << "rank " << me;
  }
  world().barrier();  // every rank got here: nobody hangs
}

}  // namespace
}  // namespace moetron::ckpt
