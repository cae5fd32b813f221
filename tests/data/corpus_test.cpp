#include "moetron/data/corpus.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "moetron/core/error.h"
#include "moetron/core/manifest.h"
#include "moetron/core/rng.h"
#include "moetron/core/staged_dir.h"
#include "moetron/data/text_file.h"
#include "moetron/data/token_dataset.h"
#include "moetron/data/tokenizer.h"

namespace moetron::data {
namespace {

namespace fs = std::filesystem;

// A small synthetic corpus in fortune format: documents separated by "%" lines.
std::string make_corpus_dir(const std::string& name) {
  const std::string dir =
      (fs::temp_directory_path() / ("moetron_" + name + "_" + std::to_string(::getpid()))).string();
  remove_tree(dir);
  fs::create_directories(dir + "/text");
  const char* words[] = {"the",   "cat",   "sat",  "on",    "a",     "mat",
                         "while", "dogs",  "bark", "at",    "night", "and",
                         "stars", "shine", "over", "quiet", "hills", "river"};
  std::ofstream f(dir + "/text/quotes");
  PhiloxStream rng(5, "corpus");
  for (int d = 0; d < 400; ++d) {
    const int lines = 1 + static_cast<int>(rng.next_u32() % 3);
    for (int l = 0; l < lines; ++l) {
      const int n = 3 + static_cast<int>(rng.next_u32() % 8);
      for (int w = 0; w < n; ++w) f << (w ? " " : "") << words[rng.next_u32() % 18];
      f << (l == 0 ? "." : ",") << "\n";
    }
    f << "%\n";
  }
  std::ofstream(dir + "/text/index.dat") << std::string("\0\1\2binary", 9);
  return dir;
}

TEST(Corpus, SplitsFortuneFilesOnPercentLines) {
  const std::string dir = make_corpus_dir("docs");
  std::ofstream(dir + "/text/fort") << "first one\nline two\n%\nsecond\n%\n";
  int64_t files = 0;
  const auto docs = read_documents(dir + "/text/fort", &files);
  ASSERT_EQ(docs.size(), 2u);
  EXPECT_EQ(docs[0], "first one\nline two");
  EXPECT_EQ(docs[1], "second");
  EXPECT_THROW(read_documents(dir + "/missing"), Error);
  remove_tree(dir);
}

TEST(Corpus, PrepareTrainsTokenizerSplitsAndPublishesAtomically) {
  const std::string dir = make_corpus_dir("prepare");
  PrepareOptions opts;
  opts.input = dir + "/text";
  opts.out_dir = dir + "/prepared";
  opts.vocab_size = 320;
  opts.val_fraction = 0.1;
  const PrepareReport rep = prepare_data(opts);
  EXPECT_EQ(rep.files, 1);  // the binary .dat file is skipped
  EXPECT_EQ(rep.documents, 400);
  EXPECT_EQ(rep.vocab_size, 320);
  EXPECT_GT(rep.train_tokens, 5 * rep.val_tokens);
  EXPECT_GT(rep.val_tokens, 0);
  const auto state = verify_manifest(opts.out_dir);
  EXPECT_EQ(state.at("train_tokens").get<int64_t>(), rep.train_tokens);

  Tokenizer tok(opts.out_dir + "/tokenizer.model");
  const std::string text = "the cat sat,\nover quiet hills.";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);  // newlines survive the round trip

  TokenFile train(opts.out_dir + "/train.bin", tok.vocab_size());
  EXPECT_EQ(train.size(), rep.train_tokens);
  // Refuses to overwrite the prepared directory.
  EXPECT_THROW(prepare_data(opts), Error);
  // A given tokenizer is reused, not retrained: identical token streams.
  PrepareOptions again = opts;
  again.out_dir = dir + "/prepared2";
  again.tokenizer_model = opts.out_dir + "/tokenizer.model";
  const PrepareReport rep2 = prepare_data(again);
  EXPECT_EQ(rep2.train_tokens, rep.train_tokens);
  EXPECT_EQ(file_checksum(again.out_dir + "/train.bin"),
            file_checksum(opts.out_dir + "/train.bin"));
  remove_tree(dir);
}

// `lines` lines of random words, a blank line after every fifth: paragraphs
// for the default mode, one document for whole-file.
std::string long_text(uint64_t seed, int lines) {
  const char* words[] = {"free",   "software", "license", "copy", "modify", "terms",
                         "source", "code",     "program", "work", "notice", "rights"};
  PhiloxStream rng(seed, "long_text");
  std::string text;
  for (int l = 0; l < lines; ++l) {
    const int n = 4 + static_cast<int>(rng.next_u32() % 8);
    for (int w = 0; w < n; ++w) text += std::string(w ? " " : "") + words[rng.next_u32() % 12];
    text += l % 5 == 4 ? ".\n\n" : "\n";
  }
  return text;
}

void write_gzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// Three long files, one gzip-compressed and longer (escaped) than
// SentencePiece's longest training sentence: the tokenizer sees it in pieces.
std::vector<std::string> make_long_files(const std::string& dir) {
  fs::create_directories(dir + "/long");
  const std::vector<std::string> texts = {long_text(1, 60), long_text(2, 90), long_text(3, 2400)};
  std::ofstream(dir + "/long/a.txt") << texts[0];
  std::ofstream(dir + "/long/b") << texts[1];
  write_gzip(dir + "/long/c.gz", texts[2]);
  EXPECT_GT(escape_newlines(texts[2]).size(), 65536u);
  std::vector<std::string> docs;
  for (const auto& t : texts) docs.push_back(t.substr(0, t.find_last_not_of('\n') + 1));
  return docs;
}

// The documents of a split: the ids between EOS markers, each ending in EOS.
std::vector<std::vector<int32_t>> split_on_eos(const TokenFile& f, int32_t eos) {
  std::vector<std::vector<int32_t>> docs(1);
  for (int64_t i = 0; i < f.size(); ++i) {
    if (f.data()[i] == eos) {
      docs.emplace_back();
    } else {
      docs.back().push_back(f.data()[i]);
    }
  }
  EXPECT_TRUE(docs.back().empty()) << f.path() << " does not end in EOS";
  docs.pop_back();
  return docs;
}

TEST(Corpus, WholeFileModeMakesEachFileOneDocumentGzipIncluded) {
  const std::string dir = make_corpus_dir("whole");
  const std::vector<std::string> texts = make_long_files(dir);
  int64_t files = 0;
  const auto docs = read_documents(dir + "/long", &files, DocumentMode::whole_file);
  EXPECT_EQ(files, 3);
  EXPECT_EQ(docs, texts);  // sorted file order: a.txt, b, c.gz (decompressed)
  // The default mode still splits the same files into paragraphs.
  EXPECT_GT(read_documents(dir + "/long").size(), 400u);
  EXPECT_EQ(read_text_file(dir + "/long/c.gz"), texts[2] + "\n\n");
}

TEST(Corpus, WholeFilePrepareSeparatesFilesByEosAndRecordsTheirLengths) {
  const std::string dir = make_corpus_dir("whole_prepare");
  const std::vector<std::string> texts = make_long_files(dir);
  PrepareOptions opts;
  opts.input = dir + "/long";
  opts.out_dir = dir + "/prepared";
  opts.vocab_size = 300;
  opts.documents = DocumentMode::whole_file;
  const PrepareReport rep = prepare_data(opts);
  EXPECT_EQ(rep.documents, 3);
  Tokenizer tok(opts.out_dir + "/tokenizer.model");
  // Three documents cannot split 5% by hash: one still goes to validation.
  const TokenFile train(opts.out_dir + "/train.bin"), val(opts.out_dir + "/val.bin");
  auto got = split_on_eos(train, tok.eos_id());
  const auto held_out = split_on_eos(val, tok.eos_id());
  EXPECT_EQ(held_out.size(), 1u);
  got.insert(got.end(), held_out.begin(), held_out.end());
  ASSERT_EQ(got.size(), 3u);
  int64_t longest = 0, total = 0;
  std::vector<std::string> decoded;
  for (const auto& d : got) {
    decoded.push_back(tok.decode(d));
    longest = std::max<int64_t>(longest, static_cast<int64_t>(d.size()));
    total += static_cast<int64_t>(d.size());
  }
  std::sort(decoded.begin(), decoded.end());
  std::vector<std::string> want = texts;
  std::sort(want.begin(), want.end());
  EXPECT_EQ(decoded, want);  // each file whole, exactly once
  EXPECT_EQ(rep.lengths.count, 3);
  EXPECT_EQ(rep.lengths.max, longest);
  EXPECT_GT(longest, 10000);
  const auto state = verify_manifest(opts.out_dir);
  EXPECT_EQ(state.at("document_mode"), "whole-file");
  EXPECT_EQ(state.at("document_tokens").at("count").get<int64_t>(), 3);
  EXPECT_EQ(state.at("document_tokens").at("max").get<int64_t>(), longest);
  EXPECT_DOUBLE_EQ(state.at("document_tokens").at("mean").get<double>(), total / 3.0);
  remove_tree(dir);
}

TEST(Corpus, AnUnknownDocumentModeNamesTheOption) {
  EXPECT_EQ(parse_document_mode("auto"), DocumentMode::split);
  EXPECT_EQ(parse_document_mode("whole-file"), DocumentMode::whole_file);
  try {
    parse_document_mode("paragraphs");
    FAIL() << "accepted --documents paragraphs";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--documents"), std::string::npos) << msg;
    EXPECT_NE(msg.find("whole-file"), std::string::npos) << msg;
    EXPECT_NE(msg.find("'paragraphs'"), std::string::npos) << msg;
  }
}

TEST(TextFile, ADamagedGzipFileIsAnErrorNamingIt) {
  const std::string path = (fs::temp_directory_path() / "moetron_damaged.gz").string();
  write_gzip(path, long_text(4, 200));
  const auto size = fs::file_size(path);
  fs::resize_file(path, size / 2);
  try {
    read_text_file(path);
    FAIL() << "a truncated gzip file was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  fs::remove(path);
}

TEST(TokenFile, RejectsOutOfVocabularyIdsAndOddSizes) {
  const std::string path = (fs::temp_directory_path() / "moetron_tokens.bin").string();
  const int32_t ids[] = {1, 2, 3, 99};
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(ids), sizeof(ids));
  EXPECT_NO_THROW(TokenFile(path, 100));
  try {
    TokenFile f(path, 50);
    FAIL() << "id 99 accepted with vocab 50";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("position 3"), std::string::npos) << e.what();
  }
  std::ofstream(path, std::ios::binary | std::ios::app).write("x", 1);
  EXPECT_THROW(TokenFile(path, 100), Error);
  fs::remove(path);
}

TEST(WindowSampler, IsAPureFunctionOfTheSampleIndex) {
  const std::string path = (fs::temp_directory_path() / "moetron_tokens2.bin").string();
  std::vector<int32_t> ids(1000);
  for (int i = 0; i < 1000; ++i) ids[static_cast<size_t>(i)] = i;
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(ids.data()), 4000);
  TokenFile f(path);
  WindowSampler a(f, 65, 11), b(f, 65, 11), c(f, 65, 12);
  int differ = 0;
  for (uint64_t i = 0; i < 200; ++i) {
    const int64_t s = a.start_of(i);
    ASSERT_GE(s, 0);
    ASSERT_LE(s, 1000 - 65);
    ASSERT_EQ(s, b.start_of(i));
    differ += s != c.start_of(i);
  }
  EXPECT_GT(differ, 190);
  std::vector<int32_t> w(65);
  a.fill(17, w.data());
  EXPECT_EQ(w[0], a.start_of(17));
  EXPECT_EQ(w[64], a.start_of(17) + 64);
  fs::remove(path);
}

TEST(WindowSampler, AlignedWindowsStartOnExampleBoundaries) {
  const std::string path = (fs::temp_directory_path() / "moetron_tokens3.bin").string();
  std::vector<int32_t> ids(10 * 17);  // ten examples of 17 tokens
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()),
             static_cast<std::streamsize>(ids.size() * 4));
  TokenFile f(path);
  WindowSampler s(f, 17, 3, 17);
  std::vector<int> seen(10);
  for (uint64_t i = 0; i < 300; ++i) {
    const int64_t start = s.start_of(i);
    ASSERT_EQ(start % 17, 0) << start;
    ASSERT_LE(start, 9 * 17);
    ++seen[static_cast<size_t>(start / 17)];
  }
  for (int n : seen) EXPECT_GT(n, 10);  // every example is drawn
  fs::remove(path);
}

// The fortune files hold more distinct characters than a small vocabulary
// has room for beside its 256 byte pieces ("Vocabulary size is smaller than
// required_chars"): the rarest are spelled in bytes instead.
TEST(Corpus, ASmallVocabularyPreparesACorpusOfManyCharacters) {
  const std::string dir = make_corpus_dir("many_chars");
  {
    std::ofstream f(dir + "/text/quotes", std::ios::app);
    // 100 rare distinct characters (Greek and Cyrillic letters), three of each.
    for (int d = 0; d < 3; ++d) {
      for (int c = 0; c < 100; ++c) {
        const int cp = (c < 50 ? 0x391 : 0x410 - 50) + c;
        f << static_cast<char>(0xC0 | (cp >> 6)) << static_cast<char>(0x80 | (cp & 0x3F));
        if (c % 10 == 9) f << " ";
      }
      f << "\n%\n";
    }
  }
  PrepareOptions opts;
  opts.input = dir + "/text";
  opts.out_dir = dir + "/out";
  opts.vocab_size = 320;
  testing::internal::CaptureStderr();
  const PrepareReport r = prepare_data(opts);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(r.vocab_size, 320);
  EXPECT_NE(err.find("spelled in bytes"), std::string::npos) << err;
  Tokenizer tok(opts.out_dir + "/tokenizer.model");
  const std::string text = "the cat \xce\x91\xce\x92 sat";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);  // byte fallback round-trips every character
  remove_tree(dir);
}

}  // namespace
}  // namespace moetron::data
