#include "util/tiny_multimodal.h"

#include "moetron/data/multimodal_prepare.h"

namespace moetron::test {

void make_tiny_multimodal_corpus(const std::string& dir) {
  data::MultimodalOptions o;
  o.input = "/usr/share/games/fortunes/debian";
  o.out_dir = dir;
  o.vocab_size = 320;
  o.per_task = 12;
  o.scene.size = 16;
  o.ocr.height = 16;
  o.ocr.width = 32;
  o.max_ocr_chars = 6;
  o.max_audio_seconds = 1.5;
  o.mel.n_mels = 16;
  data::prepare_multimodal(o);
}

train::Config tiny_multimodal_config(const std::string& dir,
                                     const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {"multimodal.enabled=true",
                                   "multimodal.data=" + dir,
                                   "multimodal.mix=text:1,caption:1,ocr:1,asr:1",
                                   "multimodal.audio_frames=32",
                                   "model.max_seq_len=40",
                                   "train.seq_len=40",
                                   "vision.d_model=16",
                                   "vision.n_layers=1",
                                   "vision.n_heads=2",
                                   "vision.ffn_hidden=24",
                                   "vision.patch=8",
                                   "vision.max_rows=4",
                                   "vision.max_cols=4",
                                   "audio.d_model=16",
                                   "audio.n_layers=1",
                                   "audio.n_heads=2",
                                   "audio.ffn_hidden=24",
                                   "audio.n_mels=16",
                                   "audio.conv1_stride=2",
                                   "audio.conv2_stride=2"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return train::load_config(MOETRON_SOURCE_DIR "/configs/tiny.toml", sets);
}

}  // namespace moetron::test
