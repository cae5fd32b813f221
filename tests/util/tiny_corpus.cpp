#include "util/tiny_corpus.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "moetron/core/rng.h"
#include "moetron/data/corpus.h"

namespace moetron::test {

namespace fs = std::filesystem;

const std::string& tiny_corpus_root() {
  static const std::string dir = [] {
    const std::string root =
        (fs::temp_directory_path() / ("moetron_trainer_" + std::to_string(::getpid()))).string();
    fs::remove_all(root);
    fs::create_directories(root + "/text");
    const char* words[] = {"the",   "cat",   "sat",  "on",    "a",     "mat",
                           "while", "dogs",  "bark", "at",    "night", "and",
                           "stars", "shine", "over", "quiet", "hills", "river"};
    std::ofstream f(root + "/text/quotes");
    PhiloxStream rng(5, "corpus");
    for (int d = 0; d < 600; ++d) {
      // A learnable structure: each document repeats a short pattern.
      const int a = static_cast<int>(rng.next_u32() % 18),
                b = static_cast<int>(rng.next_u32() % 18);
      for (int l = 0; l < 3; ++l)
        f << words[a] << " " << words[b] << " " << words[(a + b) % 18] << ".\n";
      f << "%\n";
    }
    f.close();
    data::PrepareOptions o;
    o.input = root + "/text";
    o.out_dir = root + "/prepared";
    o.vocab_size = 300;
    o.val_fraction = 0.1;
    data::prepare_data(o);
    return root;
  }();
  return dir;
}

train::Config tiny_train_config(const std::vector<std::string>& extra) {
  std::vector<std::string> sets = {"data.path=" + tiny_corpus_root() + "/prepared"};
  sets.insert(sets.end(), extra.begin(), extra.end());
  return train::load_config(MOETRON_SOURCE_DIR "/configs/tiny.toml", sets);
}

}  // namespace moetron::test
