// The multimodal corpus on disk (written by `moetron prepare-data
// --multimodal`, data/multimodal_prepare.h) and its reader.
//
// DIR/
//   manifest.json          every file's size and xxHash64, and under "state":
//                          format "moetron-multimodal/1", seed, tokenizer,
//                          options, per task: modality, shape, per split the
//                          record count and shard names (see multimodal_prepare.cpp)
//   text/                  the text task exactly as `prepare-data` writes it
//                          (tokenizer.model, train.bin, val.bin, manifest.json);
//                          its tokenizer encodes every target below
//   <task>-<split>-NNNNN.bin   records, one after another, each 8-byte aligned
//   <task>-<split>-NNNNN.idx   "MMIDX001", u64 count, count + 1 u64 offsets
//                              (the last one is the .bin file's size)
// A record (little-endian):
//   RecordHeader (64 bytes, below), then the media (image u8 [H, W, C] or
//   log-mel features f32 [frames, n_mels]), zero padding to 4 bytes, the
//   target token ids (i32, no BOS/EOS), the target text (UTF-8, no NUL),
//   zero padding to 8 bytes. `checksum` is XXH3_64bits of the header (with
//   checksum = 0) followed by the rest of the record; it is verified each
//   time a record is read.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace moetron::data {

enum class Task : uint8_t { text, caption, ocr, asr };
enum class Modality : uint8_t { text, image, audio };
// heldout: only the caption task has one (scenes with colour-shape
// combinations that never occur in train or val).
enum class Split : uint8_t { train, val, heldout };
inline constexpr std::array<Task, 4> kAllTasks = {Task::text, Task::caption, Task::ocr, Task::asr};
inline constexpr std::array<Split, 3> kAllSplits = {Split::train, Split::val, Split::heldout};

const char* task_name(Task t);               // "text", "caption", "ocr", "asr"
const char* modality_name(Modality m);       // "text", "image", "audio"
const char* split_name(Split s);             // "train", "val", "heldout"
Task parse_task(const std::string& name);    // throws naming the allowed values
Split parse_split(const std::string& name);  // throws naming the allowed values
Modality modality_of(Task t);                // caption, ocr: image; asr: audio; text: text

// One record to write (owning).
struct RecordData {
  Task task = Task::caption;
  int64_t height = 0, width = 0, channels = 0;  // image records
  std::vector<uint8_t> image;                   // [height, width, channels]
  int64_t frames = 0, n_mels = 0;               // audio records
  std::vector<float> features;                  // [frames, n_mels]
  std::vector<int32_t> tokens;                  // target ids
  std::string text;                             // target text
};

// One record read (a view into the memory-mapped shard; valid while the
// dataset lives). Image fields are 0/empty for audio records and vice versa.
struct Record {
  Task task = Task::caption;
  Modality modality = Modality::image;
  int64_t height = 0, width = 0, channels = 0;
  std::span<const uint8_t> image;
  int64_t frames = 0, n_mels = 0;
  std::span<const float> features;
  std::span<const int32_t> tokens;
  std::string_view text;
};

// Writes the shards of one (task, split) into `dir`: a new shard every
// `records_per_shard` records. Throws naming the file on a failed write.
class ShardWriter {
 public:
  ShardWriter(std::string dir, Task task, Split split, int64_t records_per_shard);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;
  void append(const RecordData& r);  // throws if r.task differs or the shapes disagree
  // Closes the last shard; returns the shard names (without .bin/.idx).
  std::vector<std::string> finish();
  int64_t records() const { return records_; }

 private:
  struct Open;
  void close_shard();
  std::string dir_;
  Task task_;
  Split split_;
  int64_t per_shard_, records_ = 0;
  std::vector<std::string> names_;
  std::unique_ptr<Open> open_;
};

// What manifest.json says, parsed once.
struct MultimodalManifest {
  std::string dir;
  uint64_t seed = 0;
  std::string tokenizer_path;  // absolute: DIR/text/tokenizer.model
  std::string text_dir;        // DIR/text (TokenFile on train.bin / val.bin)
  int64_t vocab_size = 0;
  int32_t eos_id = 0;
  // Per task (indexed by Task): image [H, W, C] for caption and ocr,
  // [max_frames, n_mels, 0] for asr.
  std::array<std::array<int64_t, 3>, 4> shape{};
  std::array<std::array<int64_t, 3>, 4> records{};  // [task][split]
  nlohmann::json state;                             // the whole "state" object
};

// The reader. open() parses the manifest and maps every shard, checking each
// index against its shard's size (a truncated file is an error naming it);
// record() checks the record's header and checksum and throws
// moetron::Error naming the shard file and the record's index in it (and in
// its task and split) when they do not match. Thread-safe for reading.
class MultimodalDataset {
 public:
  static MultimodalDataset open(const std::string& dir);
  MultimodalDataset(MultimodalDataset&&) noexcept;
  MultimodalDataset& operator=(MultimodalDataset&&) noexcept;
  ~MultimodalDataset();

  // Records of a task and split (0 for Task::text: read its tokens with
  // TokenFile from manifest().text_dir, data/token_dataset.h).
  int64_t size(Task t, Split s) const;
  // Record i in [0, size(t, s)); throws naming the file and index if corrupt.
  Record record(Task t, Split s, int64_t i) const;
  // Reads every record (a full integrity check); throws at the first bad one.
  void verify() const;
  const MultimodalManifest& manifest() const { return manifest_; }

 private:
  struct Shards;
  MultimodalDataset() = default;
  MultimodalManifest manifest_;
  std::unique_ptr<Shards> shards_;
};

}  // namespace moetron::data
