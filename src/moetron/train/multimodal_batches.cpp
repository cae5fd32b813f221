#include "moetron/train/multimodal_batches.h"

#include <algorithm>
#include <array>
#include <map>
#include <numeric>

#include "moetron/core/error.h"
#include "moetron/data/tokenizer.h"
#include "moetron/nn/media_fusion.h"
#include "moetron/train/config.h"
#include "moetron/train/media_inputs.h"

namespace moetron::train {

TaskMix parse_task_mix(const std::string& spec, const std::string& key) {
  TaskMix mix;
  for (const std::string& item : split_list(spec)) {
    const size_t colon = item.find(':');
    const std::string name = item.substr(0, colon);
    const data::Task t = [&] {
      try {
        return data::parse_task(name);
      } catch (const Error& e) {
        MOETRON_FAIL(key, ": ", e.what());
      }
    }();
    MOETRON_CHECK(std::find(mix.tasks.begin(), mix.tasks.end(), t) == mix.tasks.end(), key,
                  " names task '", name, "' twice");
    double share = 1;
    if (colon != std::string::npos) {
      try {
        size_t used = 0;
        share = std::stod(item.substr(colon + 1), &used);
        MOETRON_CHECK(used == item.size() - colon - 1, "trailing characters");
      } catch (const std::exception&) {
        MOETRON_FAIL(key, ": '", item, "' is not task:share (e.g. caption:2)");
      }
    }
    MOETRON_CHECK(share > 0, key, ": task '", name, "' has share ", share, "; shares must be > 0");
    mix.tasks.push_back(t);
    mix.values.push_back(share);
  }
  MOETRON_CHECK(!mix.tasks.empty(), key, " names no task (e.g. \"text:1,caption:1,ocr:1,asr:1\")");
  const double total = std::accumulate(mix.values.begin(), mix.values.end(), 0.0);
  for (double v : mix.values) mix.shares.push_back(v / total);
  return mix;
}

std::vector<std::string> task_names(const TaskMix& mix) {
  std::vector<std::string> names;
  for (data::Task t : mix.tasks) names.emplace_back(data::task_name(t));
  return names;
}

struct MultimodalBatcher::Row {
  int32_t task = 0;
  std::vector<int32_t> window;  // S + 1 ids
  int64_t first_target = 1;     // window positions [first_target, end) are predicted
  int64_t end = 0;
  nn::Modality modality = nn::Modality::text;
  std::array<int64_t, 3> shape{};  // image C, H, W; audio frames, n_mels, 0
  std::vector<float> media;
  int64_t media_tokens = 0;
};

MultimodalBatcher::MultimodalBatcher(const std::string& data_dir,
                                     const nn::MultimodalModelConfig& model, TaskMix mix,
                                     int64_t seq_len, int64_t audio_frames, uint64_t seed)
    : model_(model), mix_(std::move(mix)), seq_(seq_len), audio_frames_(audio_frames) {
  dataset_ = std::make_unique<data::MultimodalDataset>(data::MultimodalDataset::open(data_dir));
  const data::MultimodalManifest& m = dataset_->manifest();
  eos_ = m.eos_id;
  task_key_ = philox_key(seed, "multimodal.task");
  record_key_ = philox_key(seed, "multimodal.record");
  const data::Tokenizer tok(m.tokenizer_path);
  prompts_.resize(4);
  for (data::Task t : {data::Task::caption, data::Task::ocr, data::Task::asr})
    prompts_[static_cast<size_t>(t)] = tok.encode(task_prompt_text(t));
  for (data::Task t : mix_.tasks) {
    if (t == data::Task::text) {
      text_train_ = std::make_unique<data::TokenFile>(m.text_dir + "/train.bin", m.vocab_size);
      text_val_ = std::make_unique<data::TokenFile>(m.text_dir + "/val.bin", m.vocab_size);
      text_train_windows_ = std::make_unique<data::WindowSampler>(*text_train_, seq_ + 1, seed);
      text_val_windows_ = std::make_unique<data::WindowSampler>(*text_val_, seq_ + 1, seed);
      continue;
    }
    MOETRON_CHECK(dataset_->size(t, data::Split::train) > 0, "multimodal.mix names task '",
                  data::task_name(t), "' but '", data_dir, "' has no train records of it");
  }
}

MultimodalBatcher::~MultimodalBatcher() = default;

const std::vector<int32_t>& MultimodalBatcher::prompt(data::Task t) const {
  return prompts_[static_cast<size_t>(t)];
}

int32_t MultimodalBatcher::task_of(uint64_t index) const {
  const double u = uniform_at(task_key_, index);
  double acc = 0;
  for (size_t i = 0; i + 1 < mix_.shares.size(); ++i) {
    acc += mix_.shares[i];
    if (u < acc) return static_cast<int32_t>(i);
  }
  return static_cast<int32_t>(mix_.shares.size() - 1);
}

void MultimodalBatcher::fill_media_row(const data::Record& r, Row& row) const {
  MediaInput in = media_input(r, model_, audio_frames_);
  row.modality = in.modality;
  row.shape = in.shape;
  row.media = std::move(in.values);
  row.media_tokens = row.modality == nn::Modality::image
                         ? nn::image_tokens(model_.vision, row.shape[1], row.shape[2])
                         : nn::audio_tokens(model_.audio, row.shape[0]);
}

int64_t MultimodalBatcher::placeholders(const Row& row) const {
  // Cross-attention alone reads the media beside the row: no positions.
  return model_.prefix_fusion() ? row.media_tokens : 0;
}

MultimodalBatcher::Row MultimodalBatcher::make_row(data::Split split, uint64_t index) const {
  Row row;
  row.task = task_of(index);
  const data::Task task = mix_.tasks[static_cast<size_t>(row.task)];
  row.window.assign(static_cast<size_t>(seq_ + 1), eos_);
  if (task == data::Task::text) {
    const bool train = split == data::Split::train;
    (train ? *text_train_windows_ : *text_val_windows_).fill(index, row.window.data());
    row.end = seq_ + 1;
    return row;
  }
  const int64_t n = dataset_->size(task, split);
  MOETRON_CHECK(n > 0, "the multimodal corpus has no ", data::split_name(split),
                " records of task '", data::task_name(task), "'");
  const PhiloxCounter bits = philox4x32_10(
      {static_cast<uint32_t>(index), static_cast<uint32_t>(index >> 32), 0, 0}, record_key_);
  const uint64_t draw = (static_cast<uint64_t>(bits[0]) << 32) | bits[1];
  const data::Record rec =
      dataset_->record(task, split, static_cast<int64_t>(draw % static_cast<uint64_t>(n)));
  fill_media_row(rec, row);
  const std::vector<int32_t>& p = prompt(task);
  const int64_t slots = placeholders(row);
  const int64_t head = slots + static_cast<int64_t>(p.size());
  MOETRON_CHECK(head < seq_, "a ", data::task_name(task), " row needs ", slots,
                " media tokens and a prompt of ", p.size(), ": more than train.seq_len = ", seq_);
  // The placeholders keep eos (any id would do: their embeddings are replaced).
  std::copy(p.begin(), p.end(), row.window.begin() + slots);
  const auto room = static_cast<size_t>(seq_ + 1 - head - 1);  // the eos needs one slot
  const size_t kept = std::min(room, rec.tokens.size());
  if (kept < rec.tokens.size()) ++truncated_;
  std::copy(rec.tokens.begin(), rec.tokens.begin() + static_cast<std::ptrdiff_t>(kept),
            row.window.begin() + head);
  row.first_target = head;
  row.end = head + static_cast<int64_t>(kept) + 1;  // through the eos
  return row;
}

std::shared_ptr<nn::MultimodalBatch> MultimodalBatcher::build(data::Split split,
                                                              const std::vector<uint64_t>& indices,
                                                              const Tensor& inputs,
                                                              const Tensor& targets) const {
  const auto b = static_cast<int64_t>(indices.size());
  MOETRON_CHECK(inputs.dim(0) == b && inputs.dim(1) == seq_ && targets.shape() == inputs.shape(),
                "multimodal rows ", inputs.str(), " / ", targets.str(), " for ", b, " samples of ",
                seq_);
  std::vector<Row> rows;
  rows.reserve(indices.size());
  for (uint64_t i : indices) rows.push_back(make_row(split, i));
  std::stable_sort(rows.begin(), rows.end(),
                   [](const Row& a, const Row& c) { return a.task < c.task; });
  auto mm = std::make_shared<nn::MultimodalBatch>();
  mm->task_grad_scale.assign(mix_.tasks.size(), 0.0);
  mm->token_modality = Tensor::zeros({b * seq_}, DType::i32);
  std::map<std::pair<nn::Modality, std::array<int64_t, 3>>, std::vector<int64_t>> groups;
  for (int64_t r = 0; r < b; ++r) {
    const Row& row = rows[static_cast<size_t>(r)];
    mm->row_task.push_back(row.task);
    int32_t* in = inputs.data<int32_t>() + r * seq_;
    int32_t* tg = targets.data<int32_t>() + r * seq_;
    for (int64_t p = 0; p < seq_; ++p) {
      in[p] = row.window[static_cast<size_t>(p)];
      const bool predicted = p + 1 >= row.first_target && p + 1 < row.end;
      tg[p] = predicted ? row.window[static_cast<size_t>(p + 1)] : -1;
    }
    if (row.modality == nn::Modality::text) continue;
    std::fill_n(mm->token_modality.data<int32_t>() + r * seq_, placeholders(row),
                static_cast<int32_t>(row.modality));
    groups[{row.modality, row.shape}].push_back(r);
  }
  for (const auto& [key, members] : groups) {
    const auto& [modality, shape] = key;
    nn::MediaGroup g;
    g.modality = modality;
    const auto n = static_cast<int64_t>(members.size());
    g.input = modality == nn::Modality::image
                  ? Tensor::empty({n, shape[0], shape[1], shape[2]}, DType::f32)
                  : Tensor::empty({n, shape[0], shape[1]}, DType::f32);
    const int64_t item = g.input.numel() / n;
    for (int64_t i = 0; i < n; ++i) {
      const Row& row = rows[static_cast<size_t>(members[static_cast<size_t>(i)])];
      std::copy(row.media.begin(), row.media.end(), g.input.data<float>() + i * item);
    }
    g.rows = members;
    mm->media.push_back(std::move(g));
  }
  return mm;
}

}  // namespace moetron::train
