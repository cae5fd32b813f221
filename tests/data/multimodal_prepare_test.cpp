// `prepare-data --multimodal`: determinism, the reader, corruption.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "moetron/core/error.h"
#include "moetron/core/staged_dir.h"
#include "moetron/data/multimodal_prepare.h"
#include "moetron/data/tokenizer.h"

namespace moetron::data {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFortunes = "/usr/share/games/fortunes/pets";

std::string scratch() {
  static const std::string dir = [] {
    const std::string d =
        (fs::temp_directory_path() / ("moetron_mmprep_" + std::to_string(::getpid()))).string();
    remove_tree(d);
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

// Removes the scratch folder when the test program ends.
class RemoveScratch : public ::testing::Environment {
 public:
  void TearDown() override { remove_tree(scratch()); }
};
const auto* const kRemoveScratch = ::testing::AddGlobalTestEnvironment(new RemoveScratch);

MultimodalOptions tiny_options(const std::string& name, uint64_t seed) {
  MultimodalOptions o;
  o.input = kFortunes;
  o.out_dir = scratch() + "/" + name;
  o.seed = seed;
  o.vocab_size = 400;
  o.per_task = 10;
  o.records_per_shard = 4;  // several shards per split
  o.mel.n_mels = 40;
  o.export_samples = 2;
  return o;
}

// Prepared once per process: seed 5 (twice) and seed 6.
const std::string& prepared(const std::string& name, uint64_t seed) {
  static std::map<std::string, std::string> done;
  auto it = done.find(name);
  if (it == done.end()) {
    const MultimodalOptions o = tiny_options(name, seed);
    prepare_multimodal(o);
    it = done.emplace(name, o.out_dir).first;
  }
  return it->second;
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::map<std::string, std::string> files_under(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out[fs::relative(e.path(), dir).string()] = bytes_of(e.path());
  return out;
}

class MultimodalPrepare : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(kFortunes)) GTEST_SKIP() << kFortunes << " missing (Debian package fortunes)";
  }
};

TEST_F(MultimodalPrepare, SameSeedGivesByteIdenticalFilesAnotherSeedDiffers) {
  const auto a = files_under(prepared("a", 5));
  const auto b = files_under(prepared("b", 5));
  const auto c = files_under(prepared("c", 6));
  ASSERT_EQ(a.size(), b.size());
  // The top manifest names the corpus folder (absolute paths): compared by
  // its state. Everything else, the tokenizer included, is byte-identical.
  const std::set<std::string> path_bearing = {"manifest.json"};
  for (const auto& [name, bytes] : a) {
    ASSERT_TRUE(b.count(name)) << name;
    if (path_bearing.count(name)) continue;
    EXPECT_TRUE(bytes == b.at(name)) << name << " differs between two runs with the same seed";
  }
  EXPECT_EQ(nlohmann::json::parse(a.at("manifest.json")).at("state"),
            nlohmann::json::parse(b.at("manifest.json")).at("state"));
  const Tokenizer ta(prepared("a", 5) + "/text/tokenizer.model");
  const Tokenizer tb(prepared("b", 5) + "/text/tokenizer.model");
  for (int32_t id = 0; id < ta.vocab_size(); ++id)
    ASSERT_EQ(ta.decode({id}), tb.decode({id})) << id;
  // Shards of 4 records: caption 3 + 1 + 1, ocr 3 + 1, asr 3 + 1.
  int shards = 0;
  for (const auto& [name, bytes] : a) {
    if (name.ends_with(".bin") && name.find('/') == std::string::npos) {
      ++shards;
      EXPECT_TRUE(c.count(name) && bytes != c.at(name)) << name << " is the same for seeds 5 and 6";
    }
  }
  EXPECT_EQ(shards, 13);
  EXPECT_TRUE(a.count("samples/caption-0001.png") && a.count("samples/asr-0001.wav") &&
              a.count("samples/ocr-0000.png") && a.count("samples/index.tsv"));
}

TEST_F(MultimodalPrepare, ReaderGivesRecordsWhoseTokensAreTheirText) {
  const auto ds = MultimodalDataset::open(prepared("a", 5));
  const auto& m = ds.manifest();
  EXPECT_EQ(m.seed, 5u);
  ds.verify();
  const Tokenizer tok(m.tokenizer_path);
  EXPECT_EQ(m.vocab_size, tok.vocab_size());
  EXPECT_EQ(ds.size(Task::caption, Split::train), 10);
  EXPECT_EQ(ds.size(Task::caption, Split::heldout), 1);
  EXPECT_EQ(ds.size(Task::ocr, Split::val), 1);
  EXPECT_EQ(ds.size(Task::ocr, Split::heldout), 0);
  EXPECT_EQ(ds.size(Task::text, Split::train), 0);
  EXPECT_TRUE(fs::exists(m.text_dir + "/train.bin"));
  for (const Task t : {Task::caption, Task::ocr, Task::asr}) {
    const auto shape = m.shape[static_cast<size_t>(t)];
    for (const Split s : kAllSplits) {
      for (int64_t i = 0; i < ds.size(t, s); ++i) {
        const Record r = ds.record(t, s, i);
        EXPECT_EQ(r.task, t);
        EXPECT_EQ(tok.decode({r.tokens.begin(), r.tokens.end()}), r.text) << task_name(t);
        EXPECT_FALSE(r.text.empty());
        if (t == Task::asr) {
          EXPECT_EQ(r.modality, Modality::audio);
          EXPECT_EQ(r.n_mels, 40);
          EXPECT_GT(r.frames, 20);
          EXPECT_LE(r.frames, shape[0]);
          EXPECT_EQ(static_cast<int64_t>(r.features.size()), r.frames * 40);
        } else {
          EXPECT_EQ(r.modality, Modality::image);
          EXPECT_EQ(r.height, shape[0]);
          EXPECT_EQ(r.width, shape[1]);
          EXPECT_EQ(r.channels, shape[2]);
        }
      }
    }
  }
  // Held-out colour-shape combinations appear in every held-out caption and no other.
  const auto combos = m.state.at("tasks").at("caption").at("heldout_combinations");
  auto mentions_heldout = [&](std::string_view caption) {
    for (const auto& c : combos)
      if (caption.find(c.get<std::string>()) != std::string_view::npos) return true;
    return false;
  };
  for (const Split s : kAllSplits)
    for (int64_t i = 0; i < ds.size(Task::caption, s); ++i)
      EXPECT_EQ(mentions_heldout(ds.record(Task::caption, s, i).text), s == Split::heldout);
}

TEST_F(MultimodalPrepare, FlippedByteIsAnErrorNamingFileAndRecord) {
  const std::string dir = scratch() + "/corrupt";
  fs::copy(prepared("a", 5), dir, fs::copy_options::recursive);
  const std::string shard = dir + "/caption-train-00001.bin";  // records 4..7
  std::string bytes = bytes_of(shard);
  const std::string idx = bytes_of(dir + "/caption-train-00001.idx");
  uint64_t second = 0;
  std::memcpy(&second, idx.data() + 16 + 8, 8);  // offset of its record 1 (record 5 of the split)
  bytes[second + 64 + 100] ^= 0x01;              // one image byte
  std::ofstream(shard, std::ios::binary | std::ios::trunc) << bytes;
  const auto ds = MultimodalDataset::open(dir);
  EXPECT_NO_THROW(ds.record(Task::caption, Split::train, 4));
  EXPECT_NO_THROW(ds.record(Task::caption, Split::train, 6));
  try {
    ds.record(Task::caption, Split::train, 5);
    ADD_FAILURE() << "a flipped byte was not noticed";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(shard), std::string::npos) << msg;
    EXPECT_NE(msg.find("record 1 "), std::string::npos) << msg;
    EXPECT_NE(msg.find("caption/train record 5"), std::string::npos) << msg;
  }
  EXPECT_THROW(ds.verify(), Error);
}

TEST_F(MultimodalPrepare, TruncatedShardIsAnErrorNamingIt) {
  const std::string dir = scratch() + "/truncated";
  fs::copy(prepared("a", 5), dir, fs::copy_options::recursive);
  const std::string shard = dir + "/asr-train-00000.bin";
  fs::resize_file(shard, fs::file_size(shard) - 10);
  try {
    MultimodalDataset::open(dir);
    ADD_FAILURE() << "a truncated shard was not noticed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(shard), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
}

TEST_F(MultimodalPrepare, NeverOverwritesAndFailsWithoutLeavingADirectory) {
  const std::string good = prepared("a", 5);
  const std::string before = bytes_of(good + "/manifest.json");
  EXPECT_THROW(prepare_multimodal(tiny_options("a", 9)), Error);
  EXPECT_EQ(bytes_of(good + "/manifest.json"), before);
  MultimodalOptions bad = tiny_options("no-fonts", 5);
  bad.font_dir = scratch() + "/no-such-fonts";  // fails after the text and caption tasks
  EXPECT_THROW(prepare_multimodal(bad), Error);
  EXPECT_FALSE(fs::exists(bad.out_dir));
  for (const auto& e : fs::directory_iterator(scratch()))
    EXPECT_EQ(e.path().filename().string().find("no-fonts"), std::string::npos) << e.path();
  MultimodalOptions zero = tiny_options("zero", 5);
  zero.per_task = 0;
  EXPECT_THROW(prepare_multimodal(zero), Error);
}

TEST_F(MultimodalPrepare, TaskRecordsSizeOneTaskAndKeepTheOthersAtPerTask) {
  MultimodalOptions o = tiny_options("sized", 5);
  o.task_records = parse_task_records("caption=23,ocr=12");
  o.export_samples = 0;
  prepare_multimodal(o);
  const MultimodalDataset d = MultimodalDataset::open(o.out_dir);
  EXPECT_EQ(d.size(Task::caption, Split::train), 23);
  EXPECT_EQ(d.size(Task::caption, Split::val), 2);
  EXPECT_EQ(d.size(Task::caption, Split::heldout), 2);
  EXPECT_EQ(d.size(Task::ocr, Split::train), 12);
  EXPECT_EQ(d.size(Task::asr, Split::train), 10);
  // The first records are those of the default corpus: sizes extend, never reshuffle.
  const MultimodalDataset base = MultimodalDataset::open(prepared("a", 5));
  EXPECT_EQ(d.record(Task::caption, Split::train, 3).text,
            base.record(Task::caption, Split::train, 3).text);
}

TEST(MultimodalTaskRecords, BadEntriesNameTheOptionAndTheEntry) {
  const auto r = parse_task_records("asr=7,caption=20000");
  EXPECT_EQ(r[static_cast<size_t>(Task::caption)], 20000);
  EXPECT_EQ(r[static_cast<size_t>(Task::asr)], 7);
  EXPECT_EQ(r[static_cast<size_t>(Task::ocr)], 0);
  for (const char* bad :
       {"caption", "caption=0", "caption=-3", "caption=12x", "text=5", "speech=5"}) {
    try {
      parse_task_records(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(std::string(bad).substr(0, 4)), std::string::npos) << what;
    }
  }
  try {
    parse_task_records("caption=1,zzz=2");
    ADD_FAILURE() << "zzz was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--task-records: unknown task 'zzz'"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace moetron::data
