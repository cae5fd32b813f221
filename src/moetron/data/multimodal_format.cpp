#include "moetron/data/multimodal_format.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <fstream>

#include "moetron/core/error.h"

namespace moetron::data {

namespace {

constexpr char kRecordMagic[4] = {'M', 'R', 'E', 'C'};
constexpr char kIndexMagic[8] = {'M', 'M', 'I', 'D', 'X', '0', '0', '1'};
constexpr uint16_t kRecordVersion = 1;

struct RecordHeader {
  char magic[4];
  uint8_t task, modality;
  uint16_t version;
  uint32_t header_bytes, reserved;
  int64_t dim0, dim1, dim2;  // image: H, W, C; audio: frames, n_mels, 0
  uint64_t media_bytes;
  uint32_t n_tokens, text_bytes;
  uint64_t checksum;
};
static_assert(sizeof(RecordHeader) == 64);

constexpr uint64_t round_up(uint64_t n, uint64_t to) {
  return (n + to - 1) / to * to;
}

uint64_t record_bytes(const RecordHeader& h) {
  return sizeof(RecordHeader) +
         round_up(round_up(h.media_bytes, 4) + 4ull * h.n_tokens + h.text_bytes, 8);
}

uint64_t checksum_of(const RecordHeader& h, const uint8_t* payload, uint64_t payload_bytes) {
  RecordHeader zeroed = h;
  zeroed.checksum = 0;
  XXH3_state_t* st = XXH3_createState();
  XXH3_64bits_reset(st);
  XXH3_64bits_update(st, &zeroed, sizeof(zeroed));
  XXH3_64bits_update(st, payload, payload_bytes);
  const uint64_t sum = XXH3_64bits_digest(st);
  XXH3_freeState(st);
  return sum;
}

std::string shard_name(Task t, Split s, size_t n) {
  char num[16];
  std::snprintf(num, sizeof(num), "%05zu", n);
  return str_cat(task_name(t), "-", split_name(s), "-", num);
}

// A file mapped read-only for the dataset's lifetime.
class MappedFile {
 public:
  explicit MappedFile(const std::string& path) : path_(path) {
    const int fd = ::open(path.c_str(), O_RDONLY);
    MOETRON_CHECK(fd >= 0, "cannot open multimodal shard '", path, "': ", std::strerror(errno));
    struct stat st {};
    ::fstat(fd, &st);
    bytes_ = static_cast<size_t>(st.st_size);
    if (bytes_ > 0) map_ = ::mmap(nullptr, bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    MOETRON_CHECK(map_ != MAP_FAILED, "cannot map multimodal shard '", path, "'");
  }
  ~MappedFile() {
    if (map_ && map_ != MAP_FAILED) ::munmap(map_, bytes_);
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return static_cast<const uint8_t*>(map_); }
  size_t size() const { return bytes_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

const char* task_name(Task t) {
  switch (t) {
    case Task::text:
      return "text";
    case Task::caption:
      return "caption";
    case Task::ocr:
      return "ocr";
    case Task::asr:
      return "asr";
  }
  return "?";
}

const char* modality_name(Modality m) {
  switch (m) {
    case Modality::text:
      return "text";
    case Modality::image:
      return "image";
    case Modality::audio:
      return "audio";
  }
  return "?";
}

const char* split_name(Split s) {
  switch (s) {
    case Split::train:
      return "train";
    case Split::val:
      return "val";
    case Split::heldout:
      return "heldout";
  }
  return "?";
}

Task parse_task(const std::string& name) {
  for (const Task t : kAllTasks)
    if (name == task_name(t)) return t;
  MOETRON_FAIL("unknown task '", name, "': expected text, caption, ocr or asr");
}

Split parse_split(const std::string& name) {
  for (const Split s : kAllSplits)
    if (name == split_name(s)) return s;
  MOETRON_FAIL("unknown split '", name, "': expected train, val or heldout");
}

Modality modality_of(Task t) {
  switch (t) {
    case Task::caption:
    case Task::ocr:
      return Modality::image;
    case Task::asr:
      return Modality::audio;
    case Task::text:
      return Modality::text;
  }
  return Modality::text;
}

// ---- writing ----------------------------------------------------------------

struct ShardWriter::Open {
  std::string bin_path;
  std::ofstream bin;
  std::vector<uint64_t> offsets;
  uint64_t bytes = 0;
};

ShardWriter::ShardWriter(std::string dir, Task task, Split split, int64_t records_per_shard)
    : dir_(std::move(dir)), task_(task), split_(split), per_shard_(records_per_shard) {
  MOETRON_CHECK(task != Task::text, "the text task is not written as multimodal shards");
  MOETRON_CHECK(records_per_shard > 0, "records per shard must be positive, got ",
                records_per_shard);
}

ShardWriter::~ShardWriter() = default;

void ShardWriter::append(const RecordData& r) {
  MOETRON_CHECK(r.task == task_, "a ", task_name(r.task), " record given to the ", task_name(task_),
                " shard writer");
  RecordHeader h{};
  std::memcpy(h.magic, kRecordMagic, 4);
  h.task = static_cast<uint8_t>(r.task);
  h.modality = static_cast<uint8_t>(modality_of(r.task));
  h.version = kRecordVersion;
  h.header_bytes = sizeof(RecordHeader);
  const uint8_t* media = nullptr;
  if (modality_of(r.task) == Modality::image) {
    MOETRON_CHECK(r.image.size() == static_cast<size_t>(r.height * r.width * r.channels),
                  "image record of ", r.image.size(), " bytes is not ", r.height, "x", r.width, "x",
                  r.channels);
    h.dim0 = r.height, h.dim1 = r.width, h.dim2 = r.channels;
    h.media_bytes = r.image.size();
    media = r.image.data();
  } else {
    MOETRON_CHECK(r.features.size() == static_cast<size_t>(r.frames * r.n_mels), "audio record of ",
                  r.features.size(), " values is not ", r.frames, "x", r.n_mels);
    h.dim0 = r.frames, h.dim1 = r.n_mels;
    h.media_bytes = r.features.size() * sizeof(float);
    media = reinterpret_cast<const uint8_t*>(r.features.data());
  }
  h.n_tokens = static_cast<uint32_t>(r.tokens.size());
  h.text_bytes = static_cast<uint32_t>(r.text.size());
  std::vector<uint8_t> payload(record_bytes(h) - sizeof(RecordHeader), 0);
  std::memcpy(payload.data(), media, h.media_bytes);
  const uint64_t tokens_at = round_up(h.media_bytes, 4);
  std::memcpy(payload.data() + tokens_at, r.tokens.data(), 4 * r.tokens.size());
  std::memcpy(payload.data() + tokens_at + 4 * r.tokens.size(), r.text.data(), r.text.size());
  h.checksum = checksum_of(h, payload.data(), payload.size());

  if (!open_) {
    open_ = std::make_unique<Open>();
    names_.push_back(shard_name(task_, split_, names_.size()));
    open_->bin_path = dir_ + "/" + names_.back() + ".bin";
    open_->bin.open(open_->bin_path, std::ios::binary | std::ios::trunc);
  }
  open_->offsets.push_back(open_->bytes);
  open_->bin.write(reinterpret_cast<const char*>(&h), sizeof(h));
  open_->bin.write(reinterpret_cast<const char*>(payload.data()),
                   static_cast<std::streamsize>(payload.size()));
  open_->bytes += sizeof(h) + payload.size();
  MOETRON_CHECK(open_->bin.good(), "cannot write multimodal shard '", open_->bin_path, "'");
  ++records_;
  if (static_cast<int64_t>(open_->offsets.size()) == per_shard_) close_shard();
}

void ShardWriter::close_shard() {
  if (!open_) return;
  open_->bin.flush();
  MOETRON_CHECK(open_->bin.good(), "cannot write multimodal shard '", open_->bin_path, "'");
  open_->bin.close();
  const std::string idx_path = dir_ + "/" + names_.back() + ".idx";
  std::ofstream idx(idx_path, std::ios::binary | std::ios::trunc);
  const uint64_t count = open_->offsets.size();
  open_->offsets.push_back(open_->bytes);
  idx.write(kIndexMagic, 8);
  idx.write(reinterpret_cast<const char*>(&count), 8);
  idx.write(reinterpret_cast<const char*>(open_->offsets.data()),
            static_cast<std::streamsize>(8 * open_->offsets.size()));
  idx.flush();
  MOETRON_CHECK(idx.good(), "cannot write multimodal shard index '", idx_path, "'");
  open_.reset();
}

std::vector<std::string> ShardWriter::finish() {
  close_shard();
  return names_;
}

// ---- reading ----------------------------------------------------------------

namespace {

struct Shard {
  std::unique_ptr<MappedFile> bin;
  std::vector<uint64_t> offsets;  // count + 1
  int64_t first = 0;              // index of its first record in its task and split
};

std::vector<uint64_t> read_index(const std::string& idx_path, const MappedFile& bin) {
  std::ifstream in(idx_path, std::ios::binary);
  MOETRON_CHECK(in.good(), "cannot read multimodal shard index '", idx_path, "'");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t count = 0;
  if (bytes.size() >= 16) std::memcpy(&count, bytes.data() + 8, 8);
  MOETRON_CHECK(bytes.size() >= 16 && std::memcmp(bytes.data(), kIndexMagic, 8) == 0 &&
                    bytes.size() == 16 + 8 * (count + 1),
                "multimodal shard index '", idx_path, "' is corrupt or truncated (", bytes.size(),
                " bytes)");
  std::vector<uint64_t> offsets(count + 1);
  std::memcpy(offsets.data(), bytes.data() + 16, 8 * offsets.size());
  for (uint64_t i = 0; i < count; ++i) {
    MOETRON_CHECK(offsets[i] % 8 == 0 && offsets[i] + sizeof(RecordHeader) <= offsets[i + 1],
                  "multimodal shard index '", idx_path, "' is corrupt at record ", i);
  }
  MOETRON_CHECK(offsets[0] == 0 && offsets[count] == bin.size(), "multimodal shard '", bin.path(),
                "' has ", bin.size(), " bytes but its index says ", offsets[count],
                offsets[count] > bin.size() ? " (the file is truncated)" : "");
  return offsets;
}

MultimodalManifest parse_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  std::ifstream f(path);
  MOETRON_CHECK(f.good(), "'", dir, "' is not a prepared multimodal corpus: cannot read '", path,
                "'");
  MultimodalManifest m;
  m.dir = dir;
  try {
    const nlohmann::json j = nlohmann::json::parse(f);
    m.state = j.at("state");
    MOETRON_CHECK(m.state.value("format", "") == "moetron-multimodal/1", "'", path,
                  "' is not a multimodal corpus manifest (format '", m.state.value("format", ""),
                  "', expected 'moetron-multimodal/1')");
    m.seed = m.state.at("seed").get<uint64_t>();
    m.tokenizer_path = dir + "/" + m.state.at("tokenizer").get<std::string>();
    m.text_dir = dir + "/" + m.state.at("text_dir").get<std::string>();
    m.vocab_size = m.state.at("vocab_size").get<int64_t>();
    m.eos_id = m.state.at("eos_id").get<int32_t>();
    for (const auto& [name, task] : m.state.at("tasks").items()) {
      const auto t = static_cast<size_t>(parse_task(name));
      const auto shape = task.at("shape").get<std::vector<int64_t>>();
      for (size_t d = 0; d < 3 && d < shape.size(); ++d) m.shape[t][d] = shape[d];
      for (const auto& [split, info] : task.at("splits").items())
        m.records[t][static_cast<size_t>(parse_split(split))] = info.at("records").get<int64_t>();
    }
  } catch (const nlohmann::json::exception& e) {
    MOETRON_FAIL("multimodal corpus manifest '", path, "' is malformed: ", e.what());
  }
  return m;
}

}  // namespace

struct MultimodalDataset::Shards {
  std::array<std::array<std::vector<Shard>, 3>, 4> of;  // [task][split]
};

MultimodalDataset::MultimodalDataset(MultimodalDataset&&) noexcept = default;
MultimodalDataset& MultimodalDataset::operator=(MultimodalDataset&&) noexcept = default;
MultimodalDataset::~MultimodalDataset() = default;

MultimodalDataset MultimodalDataset::open(const std::string& dir) {
  MultimodalDataset ds;
  ds.manifest_ = parse_manifest(dir);
  ds.shards_ = std::make_unique<Shards>();
  for (const auto& [name, task] : ds.manifest_.state.at("tasks").items()) {
    const Task t = parse_task(name);
    for (const auto& [split, info] : task.at("splits").items()) {
      const Split s = parse_split(split);
      auto& list = ds.shards_->of[static_cast<size_t>(t)][static_cast<size_t>(s)];
      int64_t first = 0;
      for (const auto& shard : info.at("shards")) {
        const std::string base = dir + "/" + shard.get<std::string>();
        Shard sh;
        sh.bin = std::make_unique<MappedFile>(base + ".bin");
        sh.offsets = read_index(base + ".idx", *sh.bin);
        sh.first = first;
        first += static_cast<int64_t>(sh.offsets.size()) - 1;
        list.push_back(std::move(sh));
      }
      MOETRON_CHECK(first == ds.size(t, s), "multimodal corpus '", dir, "': the ", name, "/", split,
                    " shards hold ", first, " records, the manifest says ", ds.size(t, s));
    }
  }
  return ds;
}

int64_t MultimodalDataset::size(Task t, Split s) const {
  return manifest_.records[static_cast<size_t>(t)][static_cast<size_t>(s)];
}

Record MultimodalDataset::record(Task t, Split s, int64_t i) const {
  MOETRON_CHECK(i >= 0 && i < size(t, s), task_name(t), "/", split_name(s), " record ", i,
                " is out of range [0, ", size(t, s), ")");
  const auto& list = shards_->of[static_cast<size_t>(t)][static_cast<size_t>(s)];
  size_t k = 0;
  while (k + 1 < list.size() && list[k + 1].first <= i) ++k;
  const Shard& sh = list[k];
  const auto j = static_cast<size_t>(i - sh.first);
  const uint8_t* at = sh.bin->data() + sh.offsets[j];
  const uint64_t bytes = sh.offsets[j + 1] - sh.offsets[j];
  auto corrupt = [&](const char* what) {
    MOETRON_FAIL("multimodal shard '", sh.bin->path(), "': record ", j, " (", task_name(t), "/",
                 split_name(s), " record ", i, ") is corrupt: ", what);
  };
  RecordHeader h;
  std::memcpy(&h, at, sizeof(h));
  if (std::memcmp(h.magic, kRecordMagic, 4) != 0 || h.version != kRecordVersion ||
      h.header_bytes != sizeof(RecordHeader))
    corrupt("bad record header");
  if (h.task != static_cast<uint8_t>(t) || h.modality != static_cast<uint8_t>(modality_of(t)))
    corrupt("wrong task or modality");
  const bool image = modality_of(t) == Modality::image;
  if (h.dim0 < 0 || h.dim1 < 0 || h.dim2 < 0 || h.dim0 > (1 << 20) || h.dim1 > (1 << 20) ||
      h.dim2 > 16 ||
      h.media_bytes != static_cast<uint64_t>(h.dim0 * h.dim1 * (image ? h.dim2 : 4)) ||
      record_bytes(h) != bytes)
    corrupt("its sizes disagree with the index");
  if (checksum_of(h, at + sizeof(h), bytes - sizeof(h)) != h.checksum) corrupt("checksum mismatch");
  Record r;
  r.task = t;
  r.modality = modality_of(t);
  const uint8_t* media = at + sizeof(h);
  if (image) {
    r.height = h.dim0, r.width = h.dim1, r.channels = h.dim2;
    r.image = {media, h.media_bytes};
  } else {
    r.frames = h.dim0, r.n_mels = h.dim1;
    r.features = {reinterpret_cast<const float*>(media), h.media_bytes / 4};
  }
  const uint8_t* tokens = media + round_up(h.media_bytes, 4);
  r.tokens = {reinterpret_cast<const int32_t*>(tokens), h.n_tokens};
  r.text = {reinterpret_cast<const char*>(tokens) + 4ull * h.n_tokens, h.text_bytes};
  return r;
}

void MultimodalDataset::verify() const {
  for (const Task t : kAllTasks)
    for (const Split s : kAllSplits)
      for (int64_t i = 0; i < size(t, s); ++i) record(t, s, i);
}

}  // namespace moetron::data
